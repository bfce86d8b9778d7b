//! A hung NATS server must not hang the API: after the commit a request waits for its publish
//! acknowledgements at most a short bound (`api::control::after_commit::PUBLISH_BOUND`, 250 ms), and
//! whatever was not acknowledged reaches the workers once the server answers again (the
//! detached publish, or the scheduler's repair from Postgres). Issue #27, cause 3.

use std::process::Command;
use std::time::{Duration, Instant};

use differently_core::SandboxStatus;
use reqwest::Method;
use serde_json::json;

use crate::harness::{Cluster, Opts};

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_nats_server_costs_a_request_at_most_the_publish_bound() {
    // Every create queues (no direct placement), so each is the two-publish path.
    let c = Cluster::started(Opts {
        extra_toml: "[api]\ndirect_placement = false\n".into(),
        ..Opts::default()
    })
    .await;
    let warm = c.create_ok().await;
    c.wait_status(&warm, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let pid = c._nats.pid().expect("nats-server runs");

    signal(pid, "-STOP");
    let mut created = vec![];
    let mut slowest = Duration::ZERO;
    for i in 0..3 {
        let started = Instant::now();
        let (status, body) = c
            .call(
                &c.key,
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"labels": {"n": i.to_string()}})),
            )
            .await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 202, "{body}");
        created.push(body["id"].as_str().expect("id").to_owned());
    }
    let started = Instant::now();
    let (status, body) = c
        .call(
            &c.key,
            Method::DELETE,
            &format!("/v1/sandboxes/{warm}"),
            None,
        )
        .await;
    slowest = slowest.max(started.elapsed());
    signal(pid, "-CONT");
    assert_eq!(status, 202, "{body}");
    // 250 ms for the acknowledgements plus the commit, with room for a loaded machine; the
    // client's own publish timeout (seconds) would blow through it.
    assert!(
        slowest < Duration::from_millis(1500),
        "a request took {slowest:?} while NATS was stopped"
    );

    for id in &created {
        let id = id.parse().expect("sandbox id");
        c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(60))
            .await;
    }
    c.wait_status(&warm, SandboxStatus::Terminated, Duration::from_secs(60))
        .await;
}
