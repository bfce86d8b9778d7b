//! A queued sandbox's `statusReason` and its placement explanation's `reason` are the same
//! text, also for a candidate the leader parks behind a wall another candidate found (without
//! a transaction of its own).

use std::time::Duration;

use differently_core::SandboxStatus::*;
use differently_store::Actor;
use differently_workers::WorkerConfig;

use crate::{plane_tuned, Parts, Tuning, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_parked_behind_its_orgs_wall_has_the_explanations_reason() {
    // A long back-off: nothing wakes the parked candidates during the test, so the org's wall
    // stays known and every later candidate of the org is parked behind it.
    let p = plane_tuned(
        Parts::Memory,
        &[("fake", serde_json::json!({}))],
        WorkerConfig::default(),
        Tuning {
            waiting_backoff: Duration::from_secs(600),
            ..Tuning::default()
        },
    )
    .await;
    let quota = differently_core::tenancy::Quota {
        max_cpu: Some(2),
        ..Default::default()
    };
    p.store
        .put_quota(
            &differently_store::QuotaScope::Org(p.org.clone()),
            &quota,
            &Actor::System("test"),
        )
        .await
        .expect("quota");
    let first = p
        .admit(serde_json::json!({ "resources": { "cpu": 2 } }))
        .await;
    p.reaches(&first.id, Running).await;
    // The second's activation is refused by the store, which finds the wall.
    let second = p
        .admit(serde_json::json!({ "resources": { "cpu": 1 } }))
        .await;
    p.row_until(&second.id, "waited on the org quota", |r| {
        r.status_reason
            .as_deref()
            .is_some_and(|s| s.starts_with("waiting: org"))
    })
    .await;
    // The third is parked behind that wall.
    let third = p
        .admit(serde_json::json!({ "resources": { "cpu": 1 } }))
        .await;
    let row = p
        .row_until(&third.id, "had a statusReason", |r| {
            r.status_reason.is_some()
        })
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let doc = loop {
        if let Some(doc) = p.store.get_placement(&third.id).await.expect("placement") {
            break doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} was never explained",
            third.id
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(row.status, Queued, "{row:?}");
    assert_eq!(doc["decision"], "waiting", "{doc}");
    assert_eq!(doc["wall"], "org", "{doc}");
    assert_eq!(
        doc["reason"].as_str(),
        row.status_reason.as_deref(),
        "{doc} / {row:?}"
    );
}
