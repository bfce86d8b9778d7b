//! The audit log records only what happened (issue #20, defect 3).

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error};

/// A snapshot create that never started (the sandbox is busy) leaves the audit log saying
/// so: its request is followed by a `failed` record, and no snapshot is listed.
#[tokio::test]
async fn a_snapshot_never_made_is_audited_as_failed() {
    use differently_core::SandboxId;
    use differently_store::lifecycle::OpRecord;
    use differently_store::{Actor, PoolSlot, Quota};

    let api = api().await;
    let pool = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "snappy", "kind": "fake",
                    "settings": { "capabilities": ["exec", "snapshots"] } }),
        )
        .await;
    assert_eq!(pool.status, StatusCode::CREATED, "{}", pool.body);
    let id = api.sandbox().await;
    let sid = SandboxId::parse(&id).unwrap();
    let slot = PoolSlot {
        name: "snappy".into(),
        max_concurrent: None,
    };
    api.store
        .activate(&sid, &slot, &Quota::default(), chrono::Utc::now())
        .await
        .unwrap();
    let running = api
        .store
        .mark_running(&sid, "be", chrono::Utc::now())
        .await
        .unwrap();
    let pause = OpRecord::new(
        &running,
        "pause",
        true,
        json!({}),
        Actor::System("test").as_audit(),
        chrono::Utc::now(),
    );
    api.store.begin_op(&pause).await.unwrap();

    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            json!({}),
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    let listed = api
        .admin(
            Method::GET,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Value::Null,
        )
        .await;
    assert_eq!(listed.body["items"], json!([]), "{}", listed.body);
    let log = api
        .admin(Method::GET, "/v1/audit?action=snapshot.create", Value::Null)
        .await;
    assert_eq!(log.status, StatusCode::OK, "{}", log.body);
    let outcomes: Vec<&str> = log.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or(""))
        .collect();
    assert!(outcomes.contains(&"failed"), "{}", log.body);
}
