//! Background processes (`/v1/sandboxes/{id}/processes`, docs/processes.md) in the production
//! topology: two API processes, a scheduler and a worker of the real binary on a real
//! Postgres and nats-server, on a `fake` pool with `exec.stdin`. A process started through
//! one API process is read, fed, listed, signalled and re-attached to through the other (the
//! supervisor's bus routing); another tenant sees none of it; a process outlives the
//! connection that attached to it; its supervisor's death ends its pids, not the sandbox.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{free_port, Cluster, Opts};
use crate::tenancy::tenant;

/// Generous bound for anything that waits on the cluster (2 shared cores).
const WITHIN: Duration = Duration::from_secs(90);

/// A fake pool that runs background processes with stdin.
const STDIN_POOL: &str = r#"
[[pools]]
name = "fakestdin"
kind = "fake"
cost_per_cpu_hour = 0.5
[pools.settings]
latencyMs = 0
ledger = "{ledger}"
capabilities = ["exec", "exec.stream", "exec.stdin"]
"#;

/// `method path` on the API at `base` with `key`; (status, body as text).
async fn raw(
    base: &str,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> (u16, String) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut r = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(key);
    if let Some(b) = body {
        r = r.body(b);
    }
    let resp = r.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// As [`raw`] with a JSON body and answer.
async fn call(
    base: &str,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let body = body.map(|b| serde_json::to_vec(&b).unwrap());
    let (s, text) = raw(base, key, method, path, body).await;
    (s, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Waits until the API at `base` answers `/readyz` with 200.
async fn wait_readyz(c: &Cluster, base: &str) {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Ok(r) = reqwest::get(format!("{base}/readyz")).await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base} never ready\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The output kept now (`follow=false`) as SSE text.
async fn output_now(base: &str, key: &str, sbx: &str, pid: u64, from: u64) -> (u16, String) {
    let path = format!("/v1/sandboxes/{sbx}/processes/{pid}/output?from={from}&follow=false");
    raw(base, key, Method::GET, &path, None).await
}

/// Waits until `pid`'s kept output (read through `base`) contains `want`.
async fn wait_output(
    c: &Cluster,
    base: &str,
    key: &str,
    sbx: &str,
    pid: u64,
    want: &str,
) -> String {
    let deadline = Instant::now() + WITHIN;
    loop {
        let (s, text) = output_now(base, key, sbx, pid, 0).await;
        assert_eq!(s, 200, "{text}");
        if text.contains(want) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {want:?} in process {pid}'s output: {text}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `pid` (read through `base`) is no longer running; returns it.
async fn wait_ended(c: &Cluster, base: &str, key: &str, sbx: &str, pid: u64) -> Value {
    let deadline = Instant::now() + WITHIN;
    loop {
        let path = format!("/v1/sandboxes/{sbx}/processes/{pid}");
        let (s, p) = call(base, key, Method::GET, &path, None).await;
        assert_eq!(s, 200, "{p}");
        if p["status"] != "running" {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} still runs\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_is_reached_through_any_api_process_and_only_by_its_tenant() {
    let mut c = Cluster::new(Opts {
        more_pools: STDIN_POOL.to_owned(),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    let api2 = format!("http://127.0.0.1:{}", free_port());
    c.spawn(
        "api2",
        "api",
        &[("DIFFERENTLY_LISTEN", api2.trim_start_matches("http://"))],
    );
    c.wait_ready().await;
    wait_readyz(&c, &api2).await;
    let api1 = c.url();
    let a = tenant(&c, "org-a").await;
    let b = tenant(&c, "org-b").await;

    let (s, sbx) = call(
        &api1,
        &a.key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"projectId": a.project, "capabilities": ["exec.stdin"]})),
    )
    .await;
    assert_eq!(s, 202, "{sbx}");
    let sbx = sbx["id"].as_str().unwrap().to_owned();
    let (s, waited) = call(
        &api1,
        &a.key,
        Method::GET,
        &format!("/v1/sandboxes/{sbx}/wait?status=running&timeoutSeconds=60"),
        None,
    )
    .await;
    assert_eq!((s, &waited["status"]), (200, &json!("running")), "{waited}");
    let procs = format!("/v1/sandboxes/{sbx}/processes");

    // Started through api1, with stdin; everything else through api2.
    let (s, p) = call(
        &api1,
        &a.key,
        Method::POST,
        &procs,
        Some(
            json!({"command": ["cat"], "stdin": true, "tag": "echo", "env": {"SECRET": "hunter2"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{p}\n{}", c.logs());
    assert_eq!(
        (&p["status"], &p["stdinOpen"], &p["tag"]),
        (&json!("running"), &json!(true), &json!("echo"))
    );
    assert!(
        !p.to_string().contains("hunter2"),
        "the env is never shown: {p}"
    );
    let pid = p["pid"].as_u64().unwrap();
    let one = format!("{procs}/{pid}");

    let (s, got) = call(&api2, &a.key, Method::GET, &one, None).await;
    assert_eq!((s, &got["pid"]), (200, &json!(pid)), "{got}");
    let (s, text) = raw(
        &api2,
        &a.key,
        Method::POST,
        &format!("{one}/stdin"),
        Some(b"hello\n".to_vec()),
    )
    .await;
    if s != 204 {
        let (_, now) = call(&api1, &a.key, Method::GET, &one, None).await;
        panic!("stdin: {s} {text}\nprocess: {now}\n{}", c.logs());
    }
    let seen = wait_output(&c, &api2, &a.key, &sbx, pid, "hello").await;
    assert!(seen.contains("event: stdout"), "{seen}");
    assert!(
        seen.contains("id: 6"),
        "SSE events carry the offset after them: {seen}"
    );
    // An offset past the end starts at the end, and the header says where.
    let resp = reqwest::Client::new()
        .get(format!("{api1}{one}/output?from=999999&follow=false"))
        .bearer_auth(&a.key)
        .send()
        .await
        .expect("attach");
    assert_eq!(resp.headers()["differently-output-from"], "6");
    // Re-attached from that offset: nothing before it again.
    let (s, later) = output_now(&api1, &a.key, &sbx, pid, 6).await;
    assert_eq!(s, 200);
    assert!(!later.contains("hello"), "{later}");

    let (s, list) = call(
        &api2,
        &a.key,
        Method::GET,
        &format!("{procs}?status=running"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{list}");
    let pids: Vec<u64> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert_eq!(pids, vec![pid], "{list}");

    // Tenant B: not found on every route, and nothing reaches A's process.
    for (method, path, body) in [
        (Method::GET, one.clone(), None),
        (Method::GET, format!("{one}/output?follow=false"), None),
        (
            Method::POST,
            format!("{one}/stdin"),
            Some(b"evil\n".to_vec()),
        ),
        (Method::DELETE, format!("{one}/stdin"), None),
        (
            Method::POST,
            format!("{one}/signal"),
            Some(br#"{"signal":"KILL"}"#.to_vec()),
        ),
        (Method::DELETE, one.clone(), None),
        (Method::GET, procs.clone(), None),
    ] {
        for base in [&api1, &api2] {
            let (s, text) = raw(base, &b.key, method.clone(), &path, body.clone()).await;
            assert_eq!(s, 404, "B {method} {path} via {base}: {text}");
        }
    }
    let (_, text) = output_now(&api1, &a.key, &sbx, pid, 0).await;
    assert!(!text.contains("evil"), "{text}");

    // Closing stdin through api2 ends `cat` with 0; a followed attach ends with the exit.
    let (s, text) = raw(&api2, &a.key, Method::DELETE, &format!("{one}/stdin"), None).await;
    assert_eq!(s, 204, "{text}");
    let ended = wait_ended(&c, &api2, &a.key, &sbx, pid).await;
    assert_eq!(
        (&ended["status"], &ended["exitCode"]),
        (&json!("exited"), &json!(0)),
        "{ended}"
    );
    let (s, text) = raw(&api2, &a.key, Method::GET, &format!("{one}/output"), None).await;
    assert_eq!(s, 200);
    assert!(
        text.contains("event: exit") && text.contains("\"exitCode\":0"),
        "{text}"
    );
    let (s, text) = raw(
        &api1,
        &a.key,
        Method::POST,
        &format!("{one}/stdin"),
        Some(b"late".to_vec()),
    )
    .await;
    assert_eq!(s, 409, "stdin after the end: {text}");

    // A process outlives the attach that watched it: a followed stream dropped mid-way
    // leaves it running; a signal through the other API process ends it with 128+15.
    let (s, p) = call(
        &api2,
        &a.key,
        Method::POST,
        &procs,
        Some(json!({"command": ["sleep", "600"]})),
    )
    .await;
    assert_eq!(s, 201, "{p}");
    let sleeper = p["pid"].as_u64().unwrap();
    let attach = reqwest::Client::new()
        .get(format!("{api1}{procs}/{sleeper}/output"))
        .bearer_auth(&a.key)
        .send()
        .await
        .expect("attach");
    assert_eq!(attach.status(), 200);
    drop(attach);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, still) = call(
        &api1,
        &a.key,
        Method::GET,
        &format!("{procs}/{sleeper}"),
        None,
    )
    .await;
    assert_eq!((s, &still["status"]), (200, &json!("running")), "{still}");
    let (s, text) = raw(
        &api1,
        &a.key,
        Method::POST,
        &format!("{procs}/{sleeper}/signal"),
        Some(br#"{"signal":"TERM"}"#.to_vec()),
    )
    .await;
    assert_eq!(s, 204, "{text}");
    let ended = wait_ended(&c, &api1, &a.key, &sbx, sleeper).await;
    assert_eq!(ended["exitCode"], json!(143), "{ended}");

    // Bad input names the field; the start is refused before anything runs.
    let (s, e) = call(
        &api1,
        &a.key,
        Method::POST,
        &procs,
        Some(json!({"command": ["sleep"], "cwd": "rel"})),
    )
    .await;
    assert_eq!(
        (s, &e["error"]["details"]["field"]),
        (422, &json!("cwd")),
        "{e}"
    );
    let (s, e) = call(
        &api1,
        &a.key,
        Method::POST,
        &format!("{procs}/{sleeper}/signal"),
        Some(json!({"signal": "USR9"})),
    )
    .await;
    // A body that does not decode (an unknown signal) is 400 naming the field, as everywhere.
    assert_eq!(
        (s, &e["error"]["details"]["field"]),
        (400, &json!("signal")),
        "{e}"
    );

    // The supervisor of a process dies: its pid is gone (404 through the other API
    // process), the sandbox is not.
    let (s, p) = call(
        &api2,
        &a.key,
        Method::POST,
        &procs,
        Some(json!({"command": ["sleep", "600"]})),
    )
    .await;
    assert_eq!(s, 201, "{p}");
    let orphan = p["pid"].as_u64().unwrap();
    c.kill9("api2");
    let (s, e) = call(
        &api1,
        &a.key,
        Method::GET,
        &format!("{procs}/{orphan}"),
        None,
    )
    .await;
    assert_eq!(s, 404, "{e}");
    let (s, sb) = call(
        &api1,
        &a.key,
        Method::GET,
        &format!("/v1/sandboxes/{sbx}"),
        None,
    )
    .await;
    assert_eq!((s, &sb["status"]), (200, &json!("running")), "{sb}");

    // The audit log has the start and the signal, with the program and never the env.
    let (s, audit) = call(
        &api1,
        &a.key,
        Method::GET,
        &format!("/v1/audit?resource={sbx}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{audit}");
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(actions.contains(&"sandbox.process.start"), "{actions:?}");
    assert!(actions.contains(&"sandbox.process.signal"), "{actions:?}");
    assert!(!audit.to_string().contains("hunter2"), "{audit}");
}
