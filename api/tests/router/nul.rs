//! A NUL character anywhere a store would keep it is refused at the boundary, naming the
//! field (issue #20, defect 3: a 500 on Postgres, accepted by the memory store).

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_field_error, Answer};

const NUL: &str = "a\u{0}b";

fn assert_refused(a: &Answer, status: StatusCode, code: &str, field: &str) {
    assert_field_error(a, status, code, field);
    // The field is named once (it was once `name: name: …`).
    let message = a.body["error"]["message"].as_str().unwrap_or("");
    assert_eq!(
        message,
        format!("{field}: {}", differently_api::requests::nul::MESSAGE),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn a_nul_in_a_create_body_is_422_naming_the_field() {
    let api = api().await;
    let cases = [
        (json!({ "labels": { "k": NUL } }), "labels.k"),
        (json!({ "labels": { NUL: "v" } }), "labels"),
        (json!({ "env": { "TOKEN": NUL } }), "env.TOKEN"),
        (json!({ "template": NUL }), "template"),
        (json!({ "region": NUL }), "region"),
        (json!({ "capabilities": ["exec", NUL] }), "capabilities[1]"),
    ];
    for (body, field) in cases {
        let a = api.admin(Method::POST, "/v1/sandboxes", body).await;
        assert_refused(
            &a,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            field,
        );
    }
    let a = api.admin(Method::GET, "/v1/sandboxes", Value::Null).await;
    assert_eq!(
        a.body["items"],
        json!([]),
        "nothing was admitted: {}",
        a.body
    );
}

#[tokio::test]
async fn a_nul_in_other_bodies_is_422_naming_the_field() {
    let api = api().await;
    let id = api.sandbox().await;
    let sandbox = format!("/v1/sandboxes/{id}");
    let cases = [
        (
            Method::PATCH,
            sandbox.clone(),
            json!({ "labels": { "k": NUL } }),
            "labels.k",
        ),
        (
            Method::POST,
            format!("{sandbox}/snapshots"),
            json!({ "name": NUL }),
            "name",
        ),
        (
            Method::POST,
            format!("{sandbox}/exec"),
            json!({ "command": ["ls"], "cwd": format!("/{NUL}") }),
            "cwd",
        ),
        (
            Method::POST,
            format!("{sandbox}/exec"),
            json!({ "command": ["ls"], "env": { "A": NUL } }),
            "env.A",
        ),
        (
            Method::POST,
            format!("{sandbox}/exec"),
            json!({ "command": [NUL] }),
            "command[0]",
        ),
        (
            Method::POST,
            "/v1/admin/pools".into(),
            json!({ "name": "extra", "kind": "fake", "settings": {}, "region": NUL }),
            "region",
        ),
        (
            Method::POST,
            "/v1/orgs".into(),
            json!({ "name": NUL }),
            "name",
        ),
    ];
    for (method, path, body, field) in cases {
        let a = api.admin(method.clone(), &path, body).await;
        assert_refused(
            &a,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            field,
        );
    }
    let a = api.admin(Method::GET, &sandbox, Value::Null).await;
    assert_eq!(a.body["labels"], json!({}), "{}", a.body);
}

#[tokio::test]
async fn a_nul_in_a_query_parameter_is_400_naming_it() {
    let api = api().await;
    let cases = [
        ("/v1/sandboxes?label=k%3Da%00b", "label"),
        ("/v1/audit?action=sandbox.create%00", "action"),
        ("/v1/audit?actor=%00", "actor"),
        ("/v1/audit?limit=5&resource=sbx%00", "resource"),
    ];
    for (path, field) in cases {
        let a = api.admin(Method::GET, path, Value::Null).await;
        assert_refused(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
    // An escaped percent sign is not a NUL.
    let a = api
        .admin(Method::GET, "/v1/audit?actor=a%2500", Value::Null)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
}

/// Exec env names are checked like a sandbox's (issue #20, defect 7): `A=B` and `""` are
/// 422 naming the field, before anything runs.
#[tokio::test]
async fn exec_env_names_are_checked_like_a_sandboxes() {
    let api = api().await;
    let id = api.sandbox().await;
    for (name, field) in [("A=B", "env.A=B"), ("", "env."), ("1X", "env.1X")] {
        let a = api
            .admin(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                json!({ "command": ["ls"], "env": { name: "v" } }),
            )
            .await;
        assert_field_error(
            &a,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            field,
        );
    }
}
