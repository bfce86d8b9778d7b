//! `GET /v1/sandboxes/{id}/snapshots` pages like every other list.

use axum::http::{Method, StatusCode};
use chrono::Utc;
use differently_core::ids::SnapshotId;
use differently_core::SandboxId;
use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};
use serde_json::Value;

use crate::support::{api, assert_error};

#[tokio::test]
async fn a_sandboxs_snapshots_honour_limit_and_cursor() {
    let api = api().await;
    let id = api.sandbox().await;
    let sandbox = api
        .store
        .get_sandbox(&SandboxId::parse(&id).unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let now = Utc::now();
        let s = SnapshotRecord {
            id: SnapshotId::new(),
            org_id: sandbox.org_id.clone(),
            project_id: sandbox.project_id.clone(),
            sandbox_id: sandbox.id.clone(),
            pool: "fake".into(),
            name: None,
            status: SnapshotStatus::Ready,
            status_reason: None,
            backend_ref: None,
            created_at: now,
            updated_at: now,
        };
        api.store.insert_snapshot(&s).await.unwrap();
        ids.push(s.id.to_string());
    }
    ids.sort();
    let path = format!("/v1/sandboxes/{id}/snapshots");
    let served = |a: &crate::support::Answer| -> Vec<String> {
        a.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = api
        .admin(Method::GET, &format!("{path}?limit=2"), Value::Null)
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(served(&first), ids[..2]);
    assert_eq!(first.body["nextCursor"], ids[1].as_str());
    let second = api
        .admin(
            Method::GET,
            &format!("{path}?limit=2&cursor={}", ids[1]),
            Value::Null,
        )
        .await;
    assert_eq!(served(&second), ids[2..]);
    assert!(second.body["nextCursor"].is_null(), "{}", second.body);
    // Paging parameters are checked like every list's.
    for bad in ["limit=0", "limit=1001", "cursor=nope", "bogus=1"] {
        let a = api
            .admin(Method::GET, &format!("{path}?{bad}"), Value::Null)
            .await;
        assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    }
}
