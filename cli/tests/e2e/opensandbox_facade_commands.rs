//! execd's command status, logs and interrupt through the OpenSandbox facade across two API
//! processes on one nats-server (as behind a load balancer without affinity): a command (a
//! `/v1` process) started through one is read and interrupted through the other, whose
//! process routes ask the supervisor over NATS request/reply; once the supervisor is killed,
//! its commands are gone (404, saying so).

use std::time::{Duration, Instant};

use differently_core::SandboxStatus;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{free_port, Cluster, Opts};

/// A fake pool with streamed exec (the harness's `fake` pool has plain exec only).
const STREAM_POOL: &str = r#"[[pools]]
name = "streams"
kind = "fake"
cost_per_cpu_hour = 1.0
[pools.settings]
ledger = "{ledger}.streams"
capabilities = ["exec", "exec.stream"]
"#;

const TOKEN: &str = "x-differently-execd-token";

/// An execd call on `base`: status, the tail cursor header (if any) and the body.
async fn execd(
    http: &reqwest::Client,
    base: &str,
    tok: &str,
    m: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Option<String>, String) {
    let mut r = http.request(m, format!("{base}{path}")).header(TOKEN, tok);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let cursor = resp
        .headers()
        .get("execd-commands-tail-cursor")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, cursor, resp.text().await.unwrap())
}

/// Starts `argv` in the background through `base`; the command id from `init`.
async fn start(http: &reqwest::Client, base: &str, tok: &str, argv: &[&str]) -> String {
    let (s, _, text) = execd(
        http,
        base,
        tok,
        Method::POST,
        "/command",
        Some(json!({"argv": argv, "background": true})),
    )
    .await;
    assert_eq!(s, 200, "{text}");
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| serde_json::from_str::<Value>(f).unwrap())
        .find(|ev| ev["type"] == "init")
        .and_then(|ev| ev["text"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no init event in {text}"))
}

/// The status of `cmd` through `base` once it stopped running (within 15 s).
async fn finished(http: &reqwest::Client, base: &str, tok: &str, cmd: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, _, text) = execd(
            http,
            base,
            tok,
            Method::GET,
            &format!("/command/status/{cmd}"),
            None,
        )
        .await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        if v["running"] == false {
            return v;
        }
        assert!(Instant::now() < deadline, "still running: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_status_logs_and_interrupt_answer_through_another_api_process_over_nats() {
    let mut c = Cluster::new(Opts {
        more_pools: STREAM_POOL.into(),
        ..Opts::default()
    })
    .await;
    let port2 = free_port();
    let listen2 = format!("127.0.0.1:{port2}");
    c.spawn("api", "api", &[]);
    c.spawn("api2", "api", &[("DIFFERENTLY_LISTEN", &listen2)]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let key = c.key.clone();
    c.deny_fake_pool().await;
    let id = c.create_ok().await;
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let ep: Value = http
        .get(format!(
            "{}/opensandbox/v1/sandboxes/{id}/endpoints/44772?use_server_proxy=false",
            c.url()
        ))
        .header("OPEN-SANDBOX-API-KEY", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tok = ep["headers"][TOKEN].as_str().unwrap().to_owned();
    let one = format!("{}/opensandbox/execd/{id}", c.url());
    let two = format!("http://{listen2}/opensandbox/execd/{id}");

    // Output started through one process, read through the other, page by page.
    let cmd = start(&http, &one, &tok, &["fake-output", "600000"]).await;
    let st = finished(&http, &two, &tok, &cmd).await;
    assert_eq!(st["exit_code"], 0, "{st}");
    let (s, cursor, first) = execd(
        &http,
        &two,
        &tok,
        Method::GET,
        &format!("/command/{cmd}/logs"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first.len(), 512 << 10);
    assert_eq!(cursor.as_deref(), Some("524288"));
    let (_, cursor, rest) = execd(
        &http,
        &two,
        &tok,
        Method::GET,
        &format!("/command/{cmd}/logs?cursor=524288"),
        None,
    )
    .await;
    assert_eq!(first.len() + rest.len(), 600_000);
    assert_eq!(cursor.as_deref(), Some("600000"));
    assert!(rest.ends_with("y\n"), "{}", &rest[rest.len() - 10..]);

    // Interrupted through the other process.
    let sleeper = start(&http, &one, &tok, &["sleep", "60"]).await;
    let (s, _, text) = execd(
        &http,
        &two,
        &tok,
        Method::DELETE,
        &format!("/command?id={sleeper}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{text}");
    let st = finished(&http, &two, &tok, &sleeper).await;
    assert_eq!(st["exit_code"], -1, "{st}");

    // The owner is killed: the other process says its commands are gone. Until it knows
    // (the owner's liveness record runs out), a question to the dead owner times out and is
    // answered 503 COMMAND_OWNER_UNAVAILABLE, "retry": a true answer meanwhile, two seconds
    // each, so the deadline is a generous one.
    c.kill9("api");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, _, text) = execd(
            &http,
            &two,
            &tok,
            Method::GET,
            &format!("/command/status/{cmd}"),
            None,
        )
        .await;
        if s == 404 {
            assert!(
                text.contains("the API process that ran it is gone"),
                "{text}"
            );
            break;
        }
        let retry = s == 503 && text.contains("COMMAND_OWNER_UNAVAILABLE");
        assert!(s == 200 || retry, "{s} {text}");
        assert!(
            Instant::now() < deadline,
            "still answered after the owner died\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.assert_alive("api2");
}
