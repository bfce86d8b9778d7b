//! The statuses a hostile probe saw the server answer without the OpenAPI document listing
//! them. Each call here is checked against the document by `support::assert_documented`;
//! the assertions say the server really answers them.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::api;

const NO_PROJECT: &str = "prj_01ARZ3NDEKTSV4RRFFQ69G5FAV";
const NO_ORG: &str = "org_01ARZ3NDEKTSV4RRFFQ69G5FAV";

#[tokio::test]
async fn creates_and_filtered_lists_naming_a_missing_thing_are_documented_404s() {
    let api = api().await;
    let cases = [
        (
            Method::POST,
            "/v1/sandboxes".to_owned(),
            json!({ "projectId": NO_PROJECT }),
        ),
        (
            Method::POST,
            "/v1/placement/dry-run".to_owned(),
            json!({ "projectId": NO_PROJECT }),
        ),
        (
            Method::POST,
            "/v1/projects".to_owned(),
            json!({ "orgId": NO_ORG, "name": "p" }),
        ),
        (
            Method::POST,
            "/v1/keys".to_owned(),
            json!({ "orgId": NO_ORG, "name": "k", "scopes": ["sandboxes:read"] }),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes?projectId={NO_PROJECT}"),
            json!(null),
        ),
        (
            Method::GET,
            format!("/v1/snapshots?projectId={NO_PROJECT}"),
            json!(null),
        ),
        (
            Method::GET,
            format!("/v1/projects?orgId={NO_ORG}"),
            json!(null),
        ),
        (Method::GET, format!("/v1/keys?orgId={NO_ORG}"), json!(null)),
    ];
    for (method, path, body) in cases {
        let a = api.admin(method.clone(), &path, body).await;
        // A filtered list may also answer an empty page (an admin's view of nothing); a
        // create naming a missing thing is always 404.
        let list = method == Method::GET && a.status == StatusCode::OK;
        assert!(
            a.status == StatusCode::NOT_FOUND || list,
            "{method} {path}: {} {}",
            a.status,
            a.body
        );
    }
}

#[tokio::test]
async fn renames_onto_a_taken_name_and_reused_idempotency_keys_are_documented_409s() {
    let api = api().await;
    let org = |name: &str| json!({ "name": name });
    let a = api.admin(Method::POST, "/v1/orgs", org("one")).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let b = api.admin(Method::POST, "/v1/orgs", org("two")).await;
    let b_id = b.body["id"].as_str().unwrap().to_owned();
    let a = api
        .admin(Method::PATCH, &format!("/v1/orgs/{b_id}"), org("one"))
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    let p = json!({ "orgId": b_id, "name": "p1" });
    let first = api.admin(Method::POST, "/v1/projects", p).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let second = api
        .admin(
            Method::POST,
            "/v1/projects",
            json!({ "orgId": b_id, "name": "p2" }),
        )
        .await;
    let p2 = second.body["id"].as_str().unwrap().to_owned();
    let a = api
        .admin(
            Method::PATCH,
            &format!("/v1/projects/{p2}"),
            json!({ "name": "p1" }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    let key = api.key.clone();
    let idem = [("idempotency-key", "same")];
    let a = api
        .call(Method::POST, "/v1/orgs", Some(&key), org("three"), &idem)
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a = api
        .call(Method::POST, "/v1/orgs", Some(&key), org("four"), &idem)
        .await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
}

#[tokio::test]
async fn an_unacceptable_exec_is_a_documented_422() {
    let api = api().await;
    let id = api.sandbox().await;
    for path in [
        format!("/v1/sandboxes/{id}/exec"),
        format!("/v1/sandboxes/{id}/exec/stream"),
    ] {
        let a = api
            .admin(
                Method::POST,
                &path,
                json!({ "command": ["true"], "timeoutSeconds": 0 }),
            )
            .await;
        assert_eq!(
            a.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path}: {}",
            a.body
        );
    }
}

#[tokio::test]
async fn an_empty_body_is_accepted_where_the_document_does_not_require_one() {
    let api = api().await;
    let key = api.key.clone();
    let a = api
        .call_raw(Method::POST, "/v1/sandboxes", Some(&key), Vec::new(), &[])
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let doc = differently_api::openapi::document();
    assert_eq!(
        doc["paths"]["/v1/sandboxes"]["post"]["requestBody"]["required"],
        false
    );
    assert_eq!(
        doc["paths"]["/v1/sandboxes/{id}/exec"]["post"]["requestBody"]["required"],
        true
    );
}
