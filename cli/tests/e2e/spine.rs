//! One sandbox end to end through three separate processes.

use std::time::{Duration, Instant};

use differently_adapters::fake::{created_count, live_instances, LedgerOp};
use differently_core::SandboxStatus;
use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_run_exec_delete_across_three_processes() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[("DIFFERENTLY_LOG", "info")]);
    c.wait_ready().await;

    let (status, created) = c
        .create(json!({"labels": {"team": "e2e"}, "env": {"SECRET_TOKEN": "hunter2"}, "ttlSeconds": 600}))
        .await;
    assert_eq!(status, 202, "{created}");
    // Nothing of the org waits and the pool is uncapped: placed in its own admission.
    assert_eq!(created["status"], "provisioning", "{created}");
    assert_eq!(created["pool"], "fake");
    assert_eq!(created["envKeys"], json!(["SECRET_TOKEN"]));
    assert!(
        !created.to_string().contains("hunter2"),
        "env values must never be served"
    );
    let id = differently_core::SandboxId::parse(created["id"].as_str().unwrap()).unwrap();

    let running = c
        .wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert_eq!(running["pool"], "fake");
    assert!(running["startedAt"].is_string());
    assert!(running["expiresAt"].is_string());

    let r = c
        .req(reqwest::Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&json!({"command": ["echo", "hi"], "env": {}, "cwd": "/", "timeoutSeconds": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let out: Value = r.json().await.unwrap();
    assert_eq!(out["exitCode"], 0);
    assert_eq!(out["stdout"], "hi\n");
    assert_eq!(out["stderr"], "");

    // Listing filters by label and status.
    let r = c
        .req(
            reqwest::Method::GET,
            "/v1/sandboxes?label=team=e2e&status=running",
        )
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let r = c
        .req(reqwest::Method::GET, "/v1/sandboxes?label=team=other")
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 0);

    let r = c
        .req(reqwest::Method::DELETE, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "terminating");
    let done = c
        .wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;
    assert!(done["endedAt"].is_string());

    let ledger = c.ledger();
    assert_eq!(
        created_count(&ledger, &id),
        1,
        "exactly one backend instance"
    );
    assert!(
        live_instances(&ledger).is_empty(),
        "the backend instance was deleted"
    );
    let exec = ledger
        .iter()
        .find(|e| e.op == LedgerOp::Exec)
        .expect("exec reached the backend");
    assert_eq!(exec.program.as_deref(), Some("echo"));
    // Each role really ran in its own process.
    // (The scheduler's reaper also lists instances; only mutations and exec count here.)
    let pids: std::collections::HashSet<u32> = ledger
        .iter()
        .filter(|e| matches!(e.op, LedgerOp::Create | LedgerOp::Delete | LedgerOp::Exec))
        .map(|e| e.pid)
        .collect();
    assert_eq!(
        pids.len(),
        2,
        "create/delete from the worker, exec from the api: {ledger:?}"
    );
    for name in ["api", "scheduler", "worker"] {
        c.assert_alive(name);
        assert!(
            !c.log(name).contains("hunter2"),
            "{name} logged an env value"
        );
        assert!(!c.log(name).contains(&c.key), "{name} logged the API key");
    }
    // The admission's record, then the activation's, both by the API process.
    let (_, log) = crate::audit::audit_page(&c, &c.key, &format!("?resource={id}&limit=100")).await;
    let items = log["items"].as_array().expect("audit items");
    let of =
        |action: &str| -> Vec<&Value> { items.iter().filter(|i| i["action"] == action).collect() };
    assert_eq!(of("sandbox.admit").len(), 1, "{log}");
    let activations = of("sandbox.activate");
    assert_eq!(activations.len(), 1, "{log}");
    assert_eq!(activations[0]["actor"], "system:admission", "{log}");
    assert_eq!(activations[0]["detail"]["direct"], true, "{log}");
    assert_placed_on_fake(&c, &id).await;
    // Records written by all three processes (admit, activate, running, exec, delete) form
    // chains that verify under the one audit key the cluster shares.
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_places_every_create_when_direct_placement_is_off() {
    let c = Cluster::started(Opts {
        extra_toml: crate::crash::LEADER_PLACES_ALL.into(),
        ..Opts::default()
    })
    .await;
    let (status, created) = c.create(json!({})).await;
    assert_eq!(
        (status, created["status"].as_str()),
        (202, Some("queued")),
        "{created}"
    );
    let id = differently_core::SandboxId::parse(created["id"].as_str().unwrap()).unwrap();
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let (_, log) = crate::audit::audit_page(
        &c,
        &c.key,
        &format!("?resource={id}&action=sandbox.activate&limit=10"),
    )
    .await;
    let items = log["items"].as_array().expect("audit items");
    assert_eq!(items.len(), 1, "{log}");
    assert_eq!(items[0]["actor"], "system:scheduler", "{log}");
    assert!(items[0]["detail"].get("direct").is_none(), "{log}");
    // Both paths store the same explanation shape.
    assert_placed_on_fake(&c, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_replays_and_conflicts() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.wait_ready().await;
    let post = |body: Value, key: &'static str| {
        c.req(reqwest::Method::POST, "/v1/sandboxes")
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let a: Value = post(json!({"ttlSeconds": 100}), "k1")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = post(json!({"ttlSeconds": 100}), "k1").await.unwrap();
    assert_eq!(r.status(), 202);
    let b: Value = r.json().await.unwrap();
    assert_eq!(a["id"], b["id"], "a replay returns the original sandbox");
    let r = post(json!({"ttlSeconds": 200}), "k1").await.unwrap();
    assert_eq!(r.status(), 409);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "conflict");
    let r = c
        .req(reqwest::Method::GET, "/v1/sandboxes")
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        1,
        "nothing else was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sandboxes_reach_running_and_pages_cover_them_once() {
    let c = Cluster::started(Opts::default()).await;
    let mut latencies = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let id = c.create_ok().await;
        c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
            .await;
        latencies.push(t.elapsed());
        ids.push(id);
    }
    latencies.sort();
    eprintln!(
        "create->running through three processes: median {:?}, max {:?}",
        latencies[10], latencies[19]
    );

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(cur) => format!("/v1/sandboxes?limit=7&cursor={cur}"),
            None => "/v1/sandboxes?limit=7".to_owned(),
        };
        let page: Value = c
            .req(reqwest::Method::GET, &q)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for item in page["items"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(cur) => cursor = Some(cur.to_owned()),
            None => break,
        }
    }
    let expected: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(
        seen, expected,
        "every sandbox exactly once, in creation order"
    );
    let ledger = c.ledger();
    for id in &ids {
        assert_eq!(created_count(&ledger, id), 1);
    }
}

/// The stored explanation: placed on `fake`, with the policy it was decided under and when.
async fn assert_placed_on_fake(c: &Cluster, id: &differently_core::SandboxId) {
    let (s, explained) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}/placement"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{explained}");
    assert_eq!(
        (explained["decision"].as_str(), explained["pool"].as_str()),
        (Some("placed"), Some("fake")),
        "{explained}"
    );
    assert!(explained["policy"].is_object(), "{explained}");
    assert!(explained["decidedAt"].is_string(), "{explained}");
}
