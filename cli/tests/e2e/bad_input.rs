//! Bad input is refused at the boundary with a stable code and the field named, and
//! nothing is written.

use differently_store::prelude::*;
use differently_store::SandboxFilter;
use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

async fn send_raw(c: &Cluster, body: &str) -> (u16, Value) {
    let r = c
        .req(reqwest::Method::POST, "/v1/sandboxes")
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_create_requests_are_refused_and_write_nothing() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.wait_ready().await;

    let cases: &[(&str, u16, &str, &str)] = &[
        ("{not json", 400, "invalid_argument", ""),
        (r#"{"bogus": 1}"#, 400, "invalid_argument", ""),
        (
            r#"{"resources": {"cpu": "two"}}"#,
            400,
            "invalid_argument",
            "resources.cpu",
        ),
        // A number its field's type cannot hold is out of the field's bound (docs/api.md,
        // Bounds), not a malformed body.
        (
            r#"{"resources": {"cpu": -1}}"#,
            422,
            "validation_failed",
            "resources.cpu",
        ),
        (
            r#"{"resources": {"gpu": 1}}"#,
            400,
            "invalid_argument",
            "resources.gpu",
        ),
        (r#"{"bogus": 1}"#, 400, "invalid_argument", "bogus"),
        (
            r#"{"ttlSeconds": "soon"}"#,
            400,
            "invalid_argument",
            "ttlSeconds",
        ),
        (
            r#"{"resources": {"cpu": 100000}}"#,
            422,
            "validation_failed",
            "resources.cpu",
        ),
        (
            r#"{"resources": {"memoryMiB": 1}}"#,
            422,
            "validation_failed",
            "resources.memoryMiB",
        ),
        (
            r#"{"ttlSeconds": 0}"#,
            422,
            "validation_failed",
            "ttlSeconds",
        ),
        (
            r#"{"labels": {"differently.dev/x": "y"}}"#,
            422,
            "validation_failed",
            "labels.differently.dev/x",
        ),
        (
            r#"{"capabilities": ["teleport"]}"#,
            422,
            "unsupported_capability",
            "",
        ),
        (
            r#"{"capabilities": ["snapshots"]}"#,
            422,
            "unsupported_capability",
            "",
        ),
    ];
    for (body, status, code, field) in cases {
        let (got, json) = send_raw(&c, body).await;
        assert_eq!(got, *status, "{body} -> {json}");
        assert_eq!(json["error"]["code"], *code, "{body} -> {json}");
        assert!(json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        if !field.is_empty() {
            assert_eq!(
                json["error"]["details"]["field"], *field,
                "{body} -> {json}"
            );
        }
    }
    let (got, json) = send_raw(&c, r#"{"bogus": 1}"#).await;
    assert!(
        json["error"]["message"].as_str().unwrap().contains("bogus"),
        "{got} {json}"
    );

    // Authentication and query validation.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/sandboxes", c.url()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = reqwest::Client::new()
        .get(format!("{}/v1/sandboxes", c.url()))
        .bearer_auth("dly_key_01J00000000000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    for (q, field) in [
        ("status=sleeping", "status"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("cursor=zzz", "cursor"),
        ("label=novalue", "label"),
    ] {
        let r = c
            .req(reqwest::Method::GET, &format!("/v1/sandboxes?{q}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{q}");
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"]["details"]["field"], field, "{q}");
    }
    let r = c
        .req(reqwest::Method::GET, "/v1/sandboxes/sbx_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .req(
            reqwest::Method::POST,
            "/v1/sandboxes/sbx_01J00000000000000000000000/exec",
        )
        .json(&json!({"command": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        422,
        "an empty command is refused before the lookup"
    );

    let rows =
        c.db.store()
            .list_sandboxes(&SandboxFilter {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
    assert!(rows.is_empty(), "bad requests wrote {} rows", rows.len());
}
