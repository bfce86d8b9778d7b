//! Observability end to end: each process serves Prometheus text on its own metrics listener,
//! the counters move with real work, one trace id follows a sandbox from the API log to the
//! worker log, and no secret ever reaches a log.

use std::time::Duration;

use differently_core::{SandboxId, SandboxStatus};
use reqwest::Method;
use serde_json::json;

use crate::dataplane::{running, FAKE_CAPS};
use crate::harness::{eventually, free_port, Cluster, Opts};
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

/// The `/metrics` text of the listener on `port` (it must answer 200).
pub(crate) async fn scrape(port: u16) -> String {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("metrics listener answers");
    assert_eq!(r.status(), 200);
    r.text().await.expect("metrics body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_and_one_trace_id_spans_api_to_worker() {
    // Through the leader, so the create crosses all three processes.
    let mut c = Cluster::new(Opts {
        extra_toml: crate::crash::LEADER_PLACES_ALL.into(),
        ..Opts::default()
    })
    .await;
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
    // A row created before the scheduler leads is taken by its first rebuild from the
    // store, under a trace of its own (`feed::rebuild_from_store`): wait for the lead, so
    // the create's admission message is what places it. (Seen on a busy machine.)
    let leads = eventually(Duration::from_secs(30), || {
        c.log("scheduler").contains("scheduler: leading")
    })
    .await;
    assert!(
        leads,
        "the scheduler did not lead within 30 s\n{}",
        c.logs()
    );

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
    // The delete of a row this process served a call on is one statement with no read.
    at_least_one(&api, "differently_transition_patches_total", &[]);
    at_least_one(&sched, "differently_activations_total", &[r#"pool="fake""#]);
    at_least_one(&sched, "differently_placement_decision_seconds_count", &[]);
    at_least_one(
        &sched,
        "differently_bus_consume_lag_seconds_count",
        &[r#"stream="admit""#],
    );
    // Present even though the queue is empty by now: `other` is always exported.
    assert_eq!(
        sample(&sched, "differently_queue_depth", &[r#"org="other""#]),
        Some(0.0),
        "{sched}"
    );
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
    let has = |log: &str, what: &str| logged_with_trace(log, trace_id, &id, what);
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

/// A create placed in its admission skips the scheduler: its trace goes from the API's
/// activation straight to the worker, and the API counts the activation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_placed_in_its_admission_keeps_its_trace_to_the_worker() {
    let mut c = Cluster::new(Opts::default()).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    c.spawn("api", "api", &[("DIFFERENTLY_METRICS_LISTEN", &listen)]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let r = c
        .req(Method::POST, "/v1/sandboxes")
        .header("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let created: serde_json::Value = r.json().await.unwrap();
    assert_eq!(created["status"], "provisioning", "{created}");
    let id = SandboxId::parse(created["id"].as_str().unwrap()).unwrap();
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    let has = |log: &str, what: &str| logged_with_trace(log, trace_id, &id, what);
    assert!(
        has(&c.log("api"), "placement: activated in admission"),
        "{}",
        c.log("api")
    );
    assert!(
        has(&c.log("worker"), "worker: instance created"),
        "{}",
        c.log("worker")
    );
    assert!(
        !c.log("scheduler")
            .lines()
            .any(|l| l.contains(&id.to_string()) && l.contains("placement: activated")),
        "the leader did not place it:\n{}",
        c.log("scheduler")
    );
    let metrics = scrape(port).await;
    let placed = sample(
        &metrics,
        "differently_activations_total",
        &[r#"pool="fake""#],
    );
    assert_eq!(placed, Some(1.0), "{metrics}");
}

/// Whether a line of `log` about sandbox `id` says `what` under `trace_id`.
fn logged_with_trace(log: &str, trace_id: &str, id: &SandboxId, what: &str) -> bool {
    let id = id.to_string();
    log.lines()
        .any(|l| l.contains(trace_id) && l.contains(&id) && l.contains(what))
}

/// The `trace_id` of the first line of `log` that contains every one of `parts`.
fn trace_of(log: &str, parts: &[&str]) -> Option<String> {
    let line = log.lines().find(|l| parts.iter().all(|p| l.contains(p)))?;
    let at = line.find("\"trace_id\":\"")? + "\"trace_id\":\"".len();
    let id = line.get(at..at + 32)?;
    id.bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| id.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_work_starts_its_own_trace_and_is_counted() {
    let mut c = Cluster::new(Opts {
        more_pools: FAKE_CAPS.to_owned(),
        ..Opts::default()
    })
    .await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    c.spawn("api", "api", &[]);
    c.spawn(
        "scheduler",
        "scheduler",
        &[("DIFFERENTLY_METRICS_LISTEN", &listen)],
    );
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;

    // The idle sweep pauses a sandbox: a work message no request asked for.
    let idle = running(&c, json!({"idleTimeoutSeconds": 2})).await;
    c.wait_status(&idle, SandboxStatus::Paused, Duration::from_secs(30))
        .await;
    // The TTL sweep ends another.
    let (s, created) = c.create(json!({"ttlSeconds": 3})).await;
    assert_eq!(s, 202, "{created}");
    let expiring = SandboxId::parse(created["id"].as_str().unwrap()).unwrap();
    c.wait_status(
        &expiring,
        SandboxStatus::Terminated,
        Duration::from_secs(30),
    )
    .await;

    // Each action has a fresh trace id, unlike the request that created the sandbox, and the
    // worker that ran the pause logged under the same id.
    let idle_id = idle.to_string();
    let sched = c.log("scheduler");
    let sweep_trace = trace_of(&sched, &["sweep: idle sandbox", &idle_id])
        .unwrap_or_else(|| panic!("no trace on the idle sweep's line\n{sched}"));
    let create_trace = trace_of(&sched, &["placement: activated", &idle_id]);
    assert_ne!(Some(&sweep_trace), create_trace.as_ref());
    let seen = eventually(Duration::from_secs(10), || {
        c.log("worker").lines().any(|l| {
            l.contains(&sweep_trace)
                && l.contains(&idle_id)
                && l.contains("worker: operation finished")
        })
    })
    .await;
    assert!(
        seen,
        "the worker ran the pause under another trace\n{}",
        c.log("worker")
    );
    let ttl_trace = trace_of(&sched, &["ttl expired", &expiring.to_string()]);
    assert!(ttl_trace.is_some_and(|t| t != sweep_trace), "{sched}");

    let text = scrape(port).await;
    for action in ["idle", "ttl_expired"] {
        let v = sample(
            &text,
            "differently_reconcile_actions_total",
            &[r#"pool="fake""#, &format!(r#"action="{action}""#)],
        )
        .unwrap_or(0.0);
        assert!(v >= 1.0, "{action} = {v}\n{text}");
    }
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

    // An OpenSandbox pool whose API key is that stored secret. Its server answers every call
    // with a 500 that echoes the key, as a careless server might; it records what it got.
    let backend = EchoingBackend::start().await;
    let (s, body) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(
                json!({"name": "sealed", "kind": "opensandbox", "trust": "private",
                "settings": {"apiURL": backend.url(), "trust": "private",
                             "apiKeySecret": "obs-cred"}}),
            ),
        )
        .await;
    assert_eq!(s, 201, "{body}");
    // The worker's health probe (another process than the API) reads the stored secret.
    backend.wait_for(secret_value, &c).await;
    // Replaced at runtime: the next probes carry the new value, without a restart.
    let rotated = "sealed-rotated-91c0d4e2";
    let (s, put) = c
        .call(
            &c.key,
            Method::PUT,
            "/v1/admin/secrets/obs-cred",
            Some(json!({"value": rotated})),
        )
        .await;
    assert_eq!(s, 200, "{put}");
    backend.wait_for(rotated, &c).await;
    // The trust report shows the reference, the fingerprint and who changed it.
    let (s, report) = c
        .call(&c.key, Method::GET, "/v1/admin/trust-report", None)
        .await;
    assert_eq!(s, 200, "{report}");
    let pool = report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sealed")
        .unwrap();
    let cred = &pool["credentials"][0];
    assert_eq!(cred["kind"], "secret", "{report}");
    assert_eq!(cred["name"], "obs-cred");
    assert_eq!(cred["fingerprint"], put["fingerprint"]);
    assert_eq!(cred["updatedBy"], put["updatedBy"]);
    // The probe's error, stored and served, has the echoed key scrubbed.
    let (_, info) = c
        .call(&c.key, Method::GET, "/v1/admin/pools/sealed", None)
        .await;
    let health_error = info["health"]["error"].as_str().unwrap_or_default();
    assert!(health_error.contains("***"), "{info}");
    for served in [report.to_string(), info.to_string(), put.to_string()] {
        assert!(!served.contains(secret_value) && !served.contains(rotated));
    }

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
    // Its last character is changed to one it is not, so it can never be the real key.
    let last = if t.key.ends_with('x') { 'y' } else { 'x' };
    let wrong = format!("{}{last}", &t.key[..t.key.len() - 1]);
    assert_ne!(wrong, t.key);
    let (s, _) = c.call(&wrong, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(s, 401);

    let logs = c.logs();
    assert!(logs.contains(&id.to_string()), "the logs are real: {logs}");
    for (what, secret) in [
        ("bootstrap key", c.key.as_str()),
        ("tenant key", t.key.as_str()),
        ("wrong key", wrong.as_str()),
        ("sealed secret", secret_value),
        ("rotated sealed secret", rotated),
        ("sandbox env value", env_value),
        ("pool credential", CREDENTIAL),
        ("audit key", AUDIT_KEY),
        ("secrets key", SECRETS_KEY),
    ] {
        assert!(!logs.contains(secret), "{what} leaked into a log");
    }
}

/// A stand-in OpenSandbox server that answers every request with a 500 echoing the API key
/// it was sent, and remembers the keys.
struct EchoingBackend {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl EchoingBackend {
    async fn start() -> EchoingBackend {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let record = record.clone();
            async move {
                let key = headers
                    .get("open-sandbox-api-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                record.lock().unwrap().push(key.clone());
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(
                        json!({"code": "INTERNAL", "message": format!("broken, key {key}")}),
                    ),
                )
            }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        EchoingBackend { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    async fn wait_for(&self, key: &str, c: &Cluster) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.seen.lock().unwrap().iter().any(|k| k == key) {
            assert!(
                std::time::Instant::now() < deadline,
                "the backend never received the current key\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
