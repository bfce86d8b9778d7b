//! `GET /v1/sandboxes/{id}/wait` right after the create that made the sandbox: the API
//! process that admitted it knows its status, so the wait starts from that without reading
//! the row. What it answers is still an event's committed view or a read, and the tenant
//! check is the same.

use axum::http::{Method, StatusCode};
use chrono::Utc;
use differently_bus::Announcer;
use differently_core::SandboxId;
use serde_json::{json, Value};

use crate::support::{api, assert_error, Api};

/// Activates sandbox `id` on the fake pool and marks it running in the store, as the leader
/// and a worker would; the running row.
async fn run(api: &Api, id: &str) -> differently_core::Sandbox {
    let sid = SandboxId::parse(id).expect("sandbox id");
    let slot = differently_store::PoolSlot {
        name: "fake".into(),
        max_concurrent: None,
    };
    api.store
        .activate(&sid, &slot, &Default::default(), Utc::now())
        .await
        .expect("activate");
    api.store
        .mark_running(&sid, "fake-ref", Utc::now())
        .await
        .expect("running")
}

fn wait_path(id: &str, status: &str) -> String {
    format!("/v1/sandboxes/{id}/wait?status={status}&timeoutSeconds=30")
}

#[tokio::test]
async fn a_wait_right_after_the_create_ends_with_the_running_event() {
    let api = api().await;
    let id = api.sandbox().await;
    let key = api.key.clone();
    let path = wait_path(&id, "running");
    let waiting = {
        let router = api.router.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let req = axum::http::Request::builder()
                .uri(path)
                .header("authorization", format!("Bearer {key}"))
                .body(axum::body::Body::empty())
                .expect("request");
            let res = tower::ServiceExt::oneshot(router, req)
                .await
                .expect("served");
            let status = res.status();
            let body = axum::body::to_bytes(res.into_body(), 1 << 20)
                .await
                .expect("body");
            (
                status,
                serde_json::from_slice::<Value>(&body).expect("json"),
            )
        })
    };
    let row = run(&api, &id).await;
    Announcer::new(api.bus.clone(), api.naming.clone())
        .status(&row)
        .await
        .expect("published");
    let (status, body) = waiting.await.expect("the wait ends");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], json!("running"), "{body}");
    // The event's view of the row as committed: started, on its pool.
    assert_eq!(body["pool"], json!("fake"), "{body}");
    assert_eq!(body["id"], json!(row.id.as_str()), "{body}");
    assert!(body["startedAt"].is_string(), "{body}");
}

#[tokio::test]
async fn a_change_nobody_announced_is_found_by_the_recheck() {
    let api = api().await;
    let id = api.sandbox().await;
    // Running in the store, and no event: the status this process knows (queued) is stale.
    let row = run(&api, &id).await;
    let a = api
        .call(
            Method::GET,
            &wait_path(&id, "running"),
            Some(&api.key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["status"], json!("running"));
    assert_eq!(a.body["id"], json!(row.id.as_str()));
    assert!(a.body["startedAt"].is_string(), "{}", a.body);
}

#[tokio::test]
async fn another_tenant_waiting_right_after_the_create_is_told_not_found() {
    let api = api().await;
    let id = api.sandbox().await;
    let org = api
        .admin(Method::POST, "/v1/orgs", json!({ "name": "other-waits" }))
        .await;
    assert_eq!(org.status, StatusCode::CREATED, "{}", org.body);
    let other_org = org.body["id"].as_str().expect("org id").to_owned();
    let other = api.key_with(Some(&other_org), &["sandboxes:read"]).await;
    let a = api
        .call(
            Method::GET,
            &wait_path(&id, "running"),
            Some(&other),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found");
}
