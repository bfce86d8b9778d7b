//! Snapshots: their idempotency scope and their lifetime against their project's.

use axum::http::{Method, StatusCode};
use serde_json::Value;

use crate::support::api;

#[tokio::test]
async fn one_idempotency_key_on_two_sandboxes_makes_two_snapshots() {
    let api = api().await;
    let _ops = api.complete_ops();
    let (x, y) = (api.running_sandbox().await, api.running_sandbox().await);
    let key = api.key.clone();
    let snapshot = |id: String| {
        let key = key.clone();
        let api = &api;
        async move {
            api.call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(&key),
                Value::Null,
                &[("idempotency-key", "snap-1")],
            )
            .await
        }
    };
    let first = snapshot(x.clone()).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["sandboxId"], x.as_str(), "{}", first.body);
    let other = snapshot(y.clone()).await;
    assert_eq!(other.status, StatusCode::ACCEPTED, "{}", other.body);
    assert!(
        other.headers.get("idempotent-replayed").is_none(),
        "another sandbox's snapshot is not a replay: {}",
        other.body
    );
    assert_eq!(other.body["sandboxId"], y.as_str(), "{}", other.body);
    assert_ne!(other.body["id"], first.body["id"]);
    // The same key on the same sandbox still replays.
    let again = snapshot(x.clone()).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body["id"], first.body["id"]);
}
