//! Observability end to end: each process serves Prometheus text on its own metrics listener,
//! the counters move with real work, one trace id follows a sandbox from the API log to the
//! worker log, and no secret ever reaches a log.

use std::time::Duration;

use differently_core::{SandboxId, SandboxStatus};
use reqwest::Method;
use serde_json::json;

use crate::harness::{free_port, Cluster, Opts};
use crate::tenancy::tenant;

const AUDIT_KEY: &str = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9";
const SECRETS_KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
/// A pool credential handed to the processes by environment variable (by reference, by name).
const CREDENTIAL: &str = "pool-cred-7d41c9e0ab";

/// The value of the first sample of `name` whose labels contain every `label`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

async fn scrape(port: u16) -> String {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("metrics listener answers");
    assert_eq!(r.status(), 200);
    r.text().await.expect("metrics body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_and_one_trace_id_spans_api_to_worker() {
    let mut c = Cluster::new(Opts::default()).await;
    let ports = [free_port(), free_port(), free_port()];
    let listen: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    c.spawn("api", "api", &[("DIFFERENTLY_METRICS_LISTEN", &listen[0])]);
    c.spawn(
        "scheduler",
        "scheduler",
        &[("DIFFERENTLY_METRICS_LISTEN", &listen[1])],
    );
    c.spawn(
        "worker",
        "worker",
        &[("DIFFERENTLY_METRICS_LISTEN", &listen[2])],
    );
    c.wait_ready().await;

    // The API is not the metrics listener.
    let r = c.req(Method::GET, "/metrics").send().await.unwrap();
    assert_eq!(r.status(), 404);

    let trace_id = "5e1f0c2d3b4a59687786950a1b2c3d4e";
    let traceparent = format!("00-{trace_id}-1122334455667788-01");
    let r = c
        .req(Method::POST, "/v1/sandboxes")
        .header("traceparent", &traceparent)
        .header("idempotency-key", "obs-1")
        .json(&json!({"ttlSeconds": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(
        r.headers().get("traceparent").and_then(|v| v.to_str().ok()),
        Some(traceparent.as_str())
    );
    let created: serde_json::Value = r.json().await.unwrap();
    let id = SandboxId::parse(created["id"].as_str().unwrap()).unwrap();
    // The same request again is a replay.
    let r = c
        .req(Method::POST, "/v1/sandboxes")
        .header("idempotency-key", "obs-1")
        .json(&json!({"ttlSeconds": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // A request without a valid traceparent gets a fresh one.
    let r = c
        .req(Method::GET, "/healthz")
        .header("traceparent", "garbage")
        .send()
        .await
        .unwrap();
    let fresh = r.headers().get("traceparent").unwrap().to_str().unwrap();
    assert!(fresh.starts_with("00-") && fresh.len() == 55 && !fresh.contains(trace_id));

    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let r = c
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
        .json(&json!({"command": ["echo", "hi"], "timeoutSeconds": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .req(Method::DELETE, &format!("/v1/sandboxes/{id}"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;

    let api = scrape(ports[0]).await;
    let sched = scrape(ports[1]).await;
    let worker = scrape(ports[2]).await;
    let at_least_one = |text: &str, name: &str, labels: &[&str]| {
        let v = sample(text, name, labels).unwrap_or(0.0);
        assert!(v >= 1.0, "{name}{labels:?} = {v}\n{text}");
    };
    at_least_one(
        &api,
        "differently_admissions_total",
        &[r#"outcome="admitted""#],
    );
    at_least_one(
        &api,
        "differently_admissions_total",
        &[r#"outcome="replayed""#],
    );
    at_least_one(
        &api,
        "differently_adapter_calls_total",
        &[r#"pool="fake""#, r#"op="exec"#, r#"outcome="ok""#],
    );
    at_least_one(&api, "differently_bus_publish_seconds_count", &[]);
    at_least_one(&sched, "differently_activations_total", &[r#"pool="fake""#]);
    at_least_one(&sched, "differently_placement_decision_seconds_count", &[]);
    at_least_one(
        &sched,
        "differently_bus_consume_lag_seconds_count",
        &[r#"stream="admit""#],
    );
    assert!(sched.contains("differently_queue_depth"), "{sched}");
    for op in ["create", "delete"] {
        at_least_one(
            &worker,
            "differently_adapter_calls_total",
            &[
                r#"pool="fake""#,
                &format!(r#"op="{op}""#),
                r#"outcome="ok""#,
            ],
        );
        at_least_one(
            &worker,
            "differently_adapter_call_seconds_count",
            &[&format!(r#"op="{op}""#)],
        );
    }
    at_least_one(
        &worker,
        "differently_bus_consume_lag_seconds_count",
        &[r#"stream="work""#],
    );

    // One trace id in every process's log line about this sandbox's create.
    let has = |log: &str, what: &str| {
        log.lines()
            .any(|l| l.contains(trace_id) && l.contains(&id.to_string()) && l.contains(what))
    };
    assert!(has(&c.log("api"), "sandbox admitted"), "{}", c.log("api"));
    assert!(
        has(&c.log("scheduler"), "placement: activated"),
        "{}",
        c.log("scheduler")
    );
    assert!(
        has(&c.log("worker"), "worker: instance created"),
        "{}",
        c.log("worker")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_any_log() {
    let mut c = Cluster::new(Opts::default()).await;
    let env = [
        ("DIFFERENTLY_AUDIT_KEY", AUDIT_KEY),
        ("DIFFERENTLY_SECRETS_KEY", SECRETS_KEY),
        ("OBS_POOL_CREDENTIAL", CREDENTIAL),
        ("DIFFERENTLY_LOG", "debug"),
    ];
    c.spawn("api", "api", &env);
    c.spawn("scheduler", "scheduler", &env);
    c.spawn("worker", "worker", &env);
    c.wait_ready().await;

    let t = tenant(&c, "obs-secrets").await;
    let secret_value = "sealed-value-3e9b1f77c2";
    let (s, body) = c
        .call(
            &c.key,
            Method::PUT,
            "/v1/admin/secrets/obs-cred",
            Some(json!({"value": secret_value})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    // Work with a secret-looking env value, so every role logs about it.
    let env_value = "env-secret-0a7c5d";
    let (s, created) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"env": {"TOKEN": env_value}, "ttlSeconds": 600})),
        )
        .await;
    assert_eq!(s, 202, "{created}");
    let id = SandboxId::parse(created["id"].as_str().unwrap()).unwrap();
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    // A failed authentication with a wrong secret of the right shape is logged, never its value.
    let wrong = format!("{}x", &t.key[..t.key.len() - 1]);
    let (s, _) = c.call(&wrong, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(s, 401);

    let logs = c.logs();
    assert!(logs.contains(&id.to_string()), "the logs are real: {logs}");
    for (what, secret) in [
        ("bootstrap key", c.key.as_str()),
        ("tenant key", t.key.as_str()),
        ("wrong key", wrong.as_str()),
        ("sealed secret", secret_value),
        ("sandbox env value", env_value),
        ("pool credential", CREDENTIAL),
        ("audit key", AUDIT_KEY),
        ("secrets key", SECRETS_KEY),
    ] {
        assert!(!logs.contains(secret), "{what} leaked into a log");
    }
}
