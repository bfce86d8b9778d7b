//! Crash tests: `kill -9` a process at the worst moment, then check through Postgres (via the
//! API) and the fake backend's ledger that nothing was lost and nothing ran twice.

use std::time::Duration;

use differently_adapters::fake::{
    created_count, live_instances, read_ledger, LedgerOp, LedgerOutcome,
};
use differently_adapters::InstanceState;
use differently_core::{SandboxId, SandboxStatus};
use differently_store::prelude::*;
use differently_store::SandboxFilter;

use crate::dataplane::{post, running, FAKE_CAPS};
use crate::harness::{eventually, Cluster, Opts};

/// Config that sends every create through the placement leader.
pub const LEADER_PLACES_ALL: &str = "[api]\ndirect_placement = false\n";

/// A cluster whose only worker, `worker1`, pauses for two minutes at fault point `point`
/// (long enough for the test to `kill -9` it there).
async fn with_paused_worker(opts: Opts, point: &str) -> Cluster {
    let mut c = Cluster::new(opts).await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    let fault = format!("{point}:120000");
    c.spawn("worker1", "worker", &[("DIFFERENTLY_FAULT_PAUSE", &fault)]);
    c.wait_ready().await;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_after_backend_create_before_commit() {
    // This worker pauses right after the backend create, before recording it.
    let mut c = with_paused_worker(
        Opts {
            ack_wait_seconds: 2,
            ..Opts::default()
        },
        "worker.after_create",
    )
    .await;

    let id = c.create_ok().await;
    let ledger_path = c.ledger.clone();
    let created = eventually(Duration::from_secs(30), || {
        read_ledger(&ledger_path)
            .map(|l| created_count(&l, &id) == 1)
            .unwrap_or(false)
    })
    .await;
    assert!(created, "the backend create never happened\n{}", c.logs());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        c.get(&id).await["status"],
        "provisioning",
        "commit must not have happened yet"
    );
    c.kill9("worker1");

    c.spawn("worker2", "worker", &[]);
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;

    let ledger = c.ledger();
    assert_eq!(
        created_count(&ledger, &id),
        1,
        "exactly one backend instance: {ledger:?}"
    );
    assert!(
        ledger.iter().any(|e| e.op == LedgerOp::Create
            && e.outcome == LedgerOutcome::Existing
            && e.sandbox_id.as_ref() == Some(&id)),
        "the redelivered create found the existing instance"
    );
    let live: Vec<_> = live_instances(&ledger)
        .into_iter()
        .filter(|i| i.sandbox_id == id)
        .collect();
    assert_eq!(live.len(), 1);
    let body = c.get(&id).await;
    assert_eq!(body["status"], "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_killed_between_commit_and_publish() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn(
        "api1",
        "api",
        &[("DIFFERENTLY_FAULT_PAUSE", "api.after_admit_commit:120000")],
    );
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;

    // The request commits, then hangs at the fault point; the client never gets an answer.
    let pending = {
        let req = c
            .req(reqwest::Method::POST, "/v1/sandboxes")
            .json(&serde_json::json!({}));
        tokio::spawn(async move { req.send().await })
    };
    let store = c.db.store();
    let mut found: Option<SandboxId> = None;
    for _ in 0..200 {
        let rows = store
            .list_sandboxes(&SandboxFilter {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            found = Some(row.id.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = found.unwrap_or_else(|| panic!("the admission was never committed\n{}", c.logs()));
    c.kill9("api1");
    let answer = pending.await.unwrap();
    assert!(answer.is_err(), "the killed API cannot have answered");

    // Nothing was published, yet the committed sandbox must reach running.
    c.spawn("api2", "api", &[]);
    c.wait_ready().await;
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    // It was placed in its admission, so its create was the lost message: the leader's
    // sweep re-sent it (long before the provisioning timeout).
    assert!(
        c.log("scheduler")
            .lines()
            .any(|l| l.contains(&id.to_string()) && l.contains("create_resent")),
        "{}",
        c.log("scheduler")
    );
    assert_eq!(created_count(&c.ledger(), &id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_leader_killed_standby_takes_over() {
    // Every create through the leader (none placed in its admission), so the standby must
    // take over for them to run.
    let mut c = Cluster::new(Opts {
        extra_toml: LEADER_PLACES_ALL.into(),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.spawn("sched1", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let first = c.create_ok().await;
    c.wait_status(&first, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert!(
        c.log("sched1").contains("scheduler: leading"),
        "{}",
        c.logs()
    );

    c.spawn("sched2", "scheduler", &[]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !c.log("sched2").contains("scheduler: leading"),
        "two leaders at once\n{}",
        c.logs()
    );

    c.kill9("sched1");
    // Work queued after the leader died still proceeds.
    let ids = [
        c.create_ok().await,
        c.create_ok().await,
        c.create_ok().await,
    ];
    for id in &ids {
        c.wait_status(id, SandboxStatus::Running, Duration::from_secs(30))
            .await;
    }
    assert!(
        c.log("sched2").contains("scheduler: leading"),
        "{}",
        c.logs()
    );
    let ledger = c.ledger();
    for id in ids.iter().chain([&first]) {
        assert_eq!(created_count(&ledger, id), 1);
    }
}

/// Starting a stopped sandbox records `running` first (that is its quota reservation), then
/// starts the backend. A worker killed in between leaves a `running` row over a stopped
/// instance and a pending operation; the redelivered work must start the instance, not take
/// the row's status as proof that it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_after_a_starts_reservation_before_the_backend_start() {
    let mut c = with_paused_worker(
        Opts {
            more_pools: FAKE_CAPS.into(),
            ..Opts::default()
        },
        "worker.after_start_reserve",
    )
    .await;
    let id = running(&c, serde_json::json!({"capabilities": ["lifecycle.stop"]})).await;
    let (s, b) = post(
        &c,
        &format!("/v1/sandboxes/{id}/stop"),
        serde_json::json!({}),
    )
    .await;
    assert_eq!((s, b["status"].as_str()), (200, Some("stopped")), "{b}");
    let starts = |c: &Cluster| {
        c.ledger()
            .iter()
            .filter(|e| e.op == LedgerOp::Start && e.sandbox_id.as_ref() == Some(&id))
            .count()
    };

    let start = {
        let req = c
            .req(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/start"))
            .json(&serde_json::json!({}));
        tokio::spawn(async move { req.send().await })
    };
    // The reservation is committed; the worker sits at the fault point before the backend.
    let mut reserved = false;
    for _ in 0..400 {
        if c.get(&id).await["status"] == "running" {
            reserved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(reserved, "the start never reserved\n{}", c.logs());
    assert_eq!(
        starts(&c),
        0,
        "the backend start must not have happened yet"
    );
    c.kill9("worker1");

    c.spawn("worker2", "worker", &[]);
    let answer = start
        .await
        .expect("join")
        .expect("the API answers the start");
    assert!(
        matches!(answer.status().as_u16(), 200 | 202),
        "{}",
        answer.status()
    );
    let started = eventually(Duration::from_secs(30), || starts(&c) == 1).await;
    assert!(
        started,
        "the redelivered start never reached the backend\n{}",
        c.logs()
    );
    let instance = live_instances(&c.ledger())
        .into_iter()
        .find(|i| i.sandbox_id == id)
        .expect("the instance is live");
    assert_eq!(instance.state, InstanceState::Running);
    let (s, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        serde_json::json!({"command": ["echo", "up"]}),
    )
    .await;
    assert_eq!((s, out["stdout"].as_str()), (200, Some("up\n")), "{out}");
    assert_eq!(c.get(&id).await["status"], "running");
}
