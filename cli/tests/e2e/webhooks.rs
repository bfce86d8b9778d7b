//! Webhooks across real processes: the delivering worker is killed with SIGKILL while a
//! request is in flight; another worker takes the delivery over once its lease runs out.
//! Nothing is lost, and the only duplicates are attempts the dead process had in flight when
//! it died (the documented at-least-once bound): the one it waited on, and any it was
//! answered but had not recorded. Everything first sent after the kill arrives exactly once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use differently_webhooks::signing::{verify, Secret};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{eventually, Cluster, Opts};

const SECRETS_KEY: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

/// Loopback and plain http for the test's receiver; 2 s requests, 1 s lease margin.
const WEBHOOKS_TOML: &str = "[webhooks]\nallow_private = true\nallow_http = true\n\
    timeout_seconds = 2\nlease_margin_seconds = 1\ninitial_backoff_ms = 200\n\
    max_backoff_seconds = 1\n";

/// One request as it came: headers and body.
type Request = (HeaderMap, Vec<u8>);

/// What the receiver saw: per event id, how many requests and how many it accepted.
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<HashMap<String, (u32, u32)>>>,
    bodies: Arc<Mutex<Vec<Request>>>,
    /// The first request is never answered (the worker is killed while it waits).
    hung: Arc<Mutex<Option<String>>>,
    /// When each event's first request arrived.
    first_at: Arc<Mutex<HashMap<String, tokio::time::Instant>>>,
}

async fn receive(State(s): State<Seen>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    s.bodies
        .lock()
        .unwrap()
        .push((headers.clone(), body.to_vec()));
    let hang = {
        let mut hung = s.hung.lock().unwrap();
        if hung.is_none() {
            *hung = Some(id.clone());
            true
        } else {
            false
        }
    };
    s.first_at
        .lock()
        .unwrap()
        .entry(id.clone())
        .or_insert_with(tokio::time::Instant::now);
    s.requests.lock().unwrap().entry(id.clone()).or_default().0 += 1;
    if hang {
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    s.requests.lock().unwrap().entry(id).or_default().1 += 1;
    StatusCode::NO_CONTENT
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_delivery_loses_nothing_and_duplicates_only_the_attempt_in_flight() {
    let keys = [("DIFFERENTLY_SECRETS_KEY", SECRETS_KEY)];
    let mut c = Cluster::new(Opts {
        extra_toml: WEBHOOKS_TOML.to_owned(),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &keys);
    c.spawn("scheduler", "scheduler", &keys);
    c.spawn("worker1", "worker", &keys);
    c.wait_ready().await;

    let seen = Seen::default();
    let app = Router::new()
        .route("/hook", post(receive))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (status, hook) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/webhooks",
            Some(json!({ "url": url, "eventTypes": ["sandbox.status.changed"] })),
        )
        .await;
    assert_eq!(status, 201, "{hook}");
    let secret = Secret::parse(hook["secret"].as_str().unwrap()).unwrap();
    let hook_id = hook["id"].as_str().unwrap().to_owned();

    let sandbox = c.create_ok().await;
    let hung = seen.hung.clone();
    assert!(
        eventually(Duration::from_secs(30), || hung.lock().unwrap().is_some()).await,
        "no delivery arrived\n{}",
        c.logs()
    );
    // The worker holds an unanswered request: kill it there, start another.
    c.kill9("worker1");
    // A request the dead process wrote just before it died may still be read a moment later.
    let killed_at = tokio::time::Instant::now() + Duration::from_millis(200);
    c.spawn("worker2", "worker", &keys);
    c.wait_status(
        &sandbox,
        differently_core::SandboxStatus::Running,
        Duration::from_secs(30),
    )
    .await;

    let path = format!("/v1/webhooks/{hook_id}/deliveries");
    let mut log = Value::Null;
    let until = tokio::time::Instant::now() + Duration::from_secs(40);
    while tokio::time::Instant::now() < until {
        log = c.call(&c.key, Method::GET, &path, None).await.1;
        let items = log["items"].as_array().cloned().unwrap_or_default();
        let running_seen = seen.bodies.lock().unwrap().iter().any(|(_, b)| {
            serde_json::from_slice::<Value>(b).is_ok_and(|e| e["data"]["status"] == "running")
        });
        // Settled: every delivery of the log succeeded and the receiver saw exactly the log's
        // events (an event stored after the log was read would otherwise look foreign).
        let logged: std::collections::HashSet<&str> =
            items.iter().filter_map(|d| d["eventId"].as_str()).collect();
        let received: std::collections::HashSet<String> =
            seen.requests.lock().unwrap().keys().cloned().collect();
        let same = logged.len() == received.len()
            && received.iter().all(|id| logged.contains(id.as_str()));
        if running_seen && same && items.iter().all(|d| d["status"] == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let items = log["items"].as_array().cloned().unwrap_or_default();
    assert!(
        !items.is_empty() && items.iter().all(|d| d["status"] == "succeeded"),
        "not every delivery succeeded: {log}\n{}",
        c.logs()
    );
    let hung_id = seen.hung.lock().unwrap().clone().unwrap();
    let requests = seen.requests.lock().unwrap().clone();
    let first_at = seen.first_at.lock().unwrap().clone();
    // Every event of the log reached the receiver. One the dead process had in flight may
    // come twice (its attempt, then the new process's once the lease ran out); every other
    // exactly once, accepted once.
    for d in &items {
        let id = d["eventId"].as_str().unwrap();
        let (got, accepted) = requests.get(id).copied().unwrap_or_default();
        let in_flight_at_kill = first_at.get(id).is_some_and(|t| *t < killed_at);
        if id == hung_id {
            assert_eq!(
                (got, accepted),
                (2, 1),
                "{id}: the hung attempt, then one more"
            );
        } else if in_flight_at_kill {
            assert!(
                (1..=2).contains(&got) && accepted == got,
                "{id}: {got} requests, {accepted} accepted (sent by the dead process)"
            );
        } else {
            assert_eq!((got, accepted), (1, 1), "{id}: first sent after the kill");
        }
    }
    assert!(items.iter().any(|d| d["eventId"] == json!(hung_id)));
    assert_eq!(
        requests.len(),
        items.len(),
        "an event outside the log: {requests:?}"
    );
    // The sandbox's way to running is all there (each status once).
    let mut statuses: Vec<String> = seen
        .bodies
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(_, b)| serde_json::from_slice::<Value>(b).ok())
        .filter(|e| e["sandboxId"] == json!(sandbox.to_string()))
        .map(|e| e["data"]["status"].as_str().unwrap_or("").to_owned())
        .collect();
    statuses.sort();
    statuses.dedup();
    assert!(statuses.contains(&"running".to_owned()), "{statuses:?}");
    // Every request, the one to the dead process included, was signed.
    let now = chrono::Utc::now().timestamp();
    for (h, body) in seen.bodies.lock().unwrap().iter() {
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(
            verify(
                &secret,
                get("webhook-id"),
                get("webhook-timestamp"),
                get("webhook-signature"),
                body,
                now
            )
            .is_ok(),
            "a request did not verify"
        );
    }
}
