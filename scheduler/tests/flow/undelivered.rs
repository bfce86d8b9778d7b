//! Creates and deletes the bus does not deliver (its work stream or consumer electing a
//! leader): each pool's workers find them in the store and make the call, and the bus's copy
//! and the scan never make one call twice. On Postgres and a real nats-server.

use std::time::Duration;

use differently_adapters::fake::{read_ledger, LedgerOp};
use differently_bus_schema::WorkOp;
use differently_core::{Sandbox, SandboxId, SandboxStatus::*};
use differently_store::{Actor, DirectPlacement, PoolSlot, Transition};
use differently_workers::WorkerConfig;

use crate::{plane_tuned, Parts, Plane, Tuning};

/// A plane whose leader repairs rarely (so only the scan can pick up a create the bus
/// never carried) and whose workers scan as `workers` says.
async fn plane_scanning(workers: WorkerConfig) -> Plane {
    plane_tuned(
        Parts::Real,
        &[("fake", serde_json::json!({ "latencyMs": 30 }))],
        workers,
        Tuning {
            repair_interval: Duration::from_secs(120),
            ..Tuning::default()
        },
    )
    .await
}

/// Admits a sandbox placed at once on `fake` in the admission (as an API process does when
/// nothing waits) and publishes nothing: its create work is lost, as when the work stream
/// had no leader at the publish.
async fn placed_without_work(p: &Plane) -> Sandbox {
    let direct = DirectPlacement {
        pool: PoolSlot {
            name: "fake".into(),
            max_concurrent: None,
        },
        explanation: serde_json::json!({}),
        warm_class: None,
        claim_call: false,
    };
    let s = p.admit_with(serde_json::json!({}), Some(direct)).await;
    assert_eq!(s.status, Provisioning, "placed in the admission: {s:?}");
    s
}

/// Backend create calls for `id`, whatever they found (a second concurrent create of the
/// fake finds the first's instance and is logged `existing`, not `created`).
fn create_calls(p: &Plane, id: &SandboxId) -> usize {
    calls(p, id, LedgerOp::Create)
}

/// Backend calls of kind `op` for `id`, whatever their outcome.
fn calls(p: &Plane, id: &SandboxId, op: LedgerOp) -> usize {
    read_ledger(&p.ledger)
        .unwrap_or_default()
        .iter()
        .filter(|e| e.op == op && e.sandbox_id.as_ref() == Some(id))
        .count()
}

/// Commits `terminating` for a running sandbox as the API's delete does, and publishes
/// nothing: its delete work is lost.
async fn terminating_without_work(p: &Plane, id: &SandboxId) -> Sandbox {
    p.store
        .transition(
            Transition {
                id: id.clone(),
                from: vec![Running],
                to: Terminating,
                reason: Some("deleted by the test".into()),
                actor: Actor::Key("key_test".into()),
            },
            chrono::Utc::now(),
        )
        .await
        .expect("terminating")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placed_create_the_bus_never_carried_is_created_from_the_store() {
    let p = plane_scanning(WorkerConfig {
        scan_every: Duration::from_millis(50),
        scan_after: Duration::from_millis(300),
        ..WorkerConfig::default()
    })
    .await;
    let s = placed_without_work(&p).await;
    let started = tokio::time::Instant::now();
    let running = p.reaches(&s.id, Running).await;
    let took = started.elapsed();
    assert_eq!(create_calls(&p, &s.id), 1, "one create");
    assert!(running.backend_ref.is_some(), "{running:?}");
    // Well before the leader's repair (120 s) could have re-sent it.
    assert!(took < Duration::from_secs(60), "took {took:?}");

    // Its delete, lost the same way, is made from the store too (the leader re-sends
    // terminating rows only after `terminating_retry`, 30 s by default).
    terminating_without_work(&p, &s.id).await;
    let started = tokio::time::Instant::now();
    let done = p.reaches(&s.id, Terminated).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(calls(&p, &s.id, LedgerOp::Delete), 1, "one delete");
    assert_eq!(done.status_reason.as_deref(), Some("deleted by the test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_scan_a_create_the_bus_never_carried_waits_for_repair() {
    let p = plane_scanning(WorkerConfig {
        scan_every: Duration::ZERO,
        ..WorkerConfig::default()
    })
    .await;
    let s = placed_without_work(&p).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(p.row(&s.id).await.status, Provisioning);
    assert_eq!(create_calls(&p, &s.id), 0);
}

/// A plane whose scan takes every row the moment it changes, so every create and delete
/// goes both ways at once, with `n` sandboxes admitted (over the bus) and running.
async fn racing_with_running(n: usize) -> (Plane, Vec<SandboxId>) {
    let p = plane_scanning(WorkerConfig {
        scan_every: Duration::from_millis(5),
        scan_after: Duration::ZERO,
        ..WorkerConfig::default()
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(p.admit(serde_json::json!({})).await.id);
    }
    for id in &ids {
        p.reaches(id, Running).await;
    }
    (p, ids)
}

/// Every delete goes both ways at once too: one backend delete per sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_and_the_scan_never_delete_one_sandbox_twice() {
    let (p, ids) = racing_with_running(16).await;
    for id in &ids {
        let t = terminating_without_work(&p, id).await;
        p.announcer
            .work(&t, WorkOp::Delete, "")
            .await
            .expect("publish the delete");
    }
    for id in &ids {
        p.reaches(id, Terminated).await;
    }
    let deletes: Vec<usize> = ids
        .iter()
        .map(|id| calls(&p, id, LedgerOp::Delete))
        .collect();
    assert!(
        deletes.iter().all(|&c| c == 1),
        "delete calls per sandbox: {deletes:?}"
    );
}

/// Every create goes both ways at once (the scan takes rows the moment they are placed):
/// the claim lets exactly one call the backend per activation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_and_the_scan_never_create_one_activation_twice() {
    let (p, ids) = racing_with_running(24).await;
    let calls: Vec<usize> = ids.iter().map(|id| create_calls(&p, id)).collect();
    assert!(
        calls.iter().all(|&c| c == 1),
        "create calls per sandbox: {calls:?}"
    );
}
