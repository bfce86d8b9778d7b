//! An exec's command waits for its audit record: the `opensandbox` adapter (the real one,
//! against the adapters' fake OpenSandbox server) opens its request to execd while the API
//! stages the record, and sends the command only once the record is staged. With the record
//! held back (its chain head locked), the request's head reaches execd and its command does
//! not until the lock goes. A row that moved behind the API's memory refuses the record, so
//! that early request is abandoned with the command unsent; the exec then runs from a fresh
//! read, once, or is refused. The same holds for both exec routes: collected and streamed
//! (which the OpenSandbox facade's commands use too).

use std::io::Write;
use std::time::Duration;

use differently_core::{SandboxId, SandboxStatus};
use reqwest::Method;
use serde_json::json;

use crate::dataplane::{post, read_sse};
use crate::fake_opensandbox::{FakeRuntime, FakeServer, Variant};
use crate::harness::{Cluster, Opts};

const KEY: &str = "osb_e2e_held_5c4d3e2f1a0b";
const POOL: &str = "osb";

/// `(command request heads, command bodies)` the fake's execd has seen.
fn seen(fake: &FakeServer) -> (usize, usize) {
    let record = fake.record();
    let heads = record
        .heads
        .iter()
        .filter(|(line, _)| line.starts_with("POST ") && line.ends_with("/command"))
        .count();
    (heads, record.command_bodies.len())
}

/// Moves the row on behind the API's back (no event tells it): `status` at a new version.
async fn move_row(c: &Cluster, id: &SandboxId, status: &str) {
    let moved = sqlx::query(
        "UPDATE sandboxes SET status = $2, status_version = status_version + 1,
             doc = jsonb_set(jsonb_set(doc, '{status}', to_jsonb($2::text)),
                             '{statusVersion}', to_jsonb(status_version + 1))
         WHERE id = $1",
    )
    .bind(id.to_string())
    .bind(status)
    .execute(c.db.store().pool())
    .await
    .expect("move the row")
    .rows_affected();
    assert_eq!(moved, 1);
}

/// The two exec routes, as a client calls them.
#[derive(Clone, Copy)]
enum Route {
    Collected,
    Streamed,
}

impl Route {
    /// The route's audit action.
    fn action(self) -> &'static str {
        match self {
            Route::Collected => "sandbox.exec",
            Route::Streamed => "sandbox.exec_stream",
        }
    }

    /// Runs `echo n` in `id`; `(status, stdout)` for a 200, `(status, error body)` otherwise.
    async fn exec(self, c: &Cluster, id: &SandboxId, n: &str) -> (u16, String) {
        let body = json!({"command": ["echo", n]});
        match self {
            Route::Collected => {
                let (s, out) = post(c, &format!("/v1/sandboxes/{id}/exec"), body).await;
                let stdout = out["stdout"].as_str().map(str::to_owned);
                (s, stdout.unwrap_or_else(|| out.to_string()))
            }
            Route::Streamed => {
                let resp = c
                    .req(Method::POST, &format!("/v1/sandboxes/{id}/exec/stream"))
                    .json(&body)
                    .send()
                    .await
                    .expect("exec stream");
                let s = resp.status().as_u16();
                if s != 200 {
                    return (s, resp.text().await.unwrap_or_default());
                }
                let events = read_sse(resp).await;
                let (last, _) = events.last().expect("an ending event");
                assert_eq!(last, "exit", "{events:?}");
                let mut stdout = String::new();
                for (ev, data) in &events {
                    if ev == "stdout" {
                        let v: serde_json::Value = serde_json::from_str(data).expect("json");
                        stdout.push_str(v["data"].as_str().expect("data"));
                    }
                }
                (s, stdout)
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_sends_its_command_only_once_its_record_is_staged() {
    held_commands(Route::Collected).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_exec_sends_its_command_only_once_its_record_is_staged() {
    held_commands(Route::Streamed).await;
}

async fn held_commands(route: Route) {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let mut key_file = tempfile::NamedTempFile::new().expect("key file");
    key_file.write_all(KEY.as_bytes()).expect("write key");
    let c = Cluster::started(Opts::default()).await;
    let (s, p) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({
                "name": POOL, "kind": "opensandbox", "trust": "private",
                "settings": {
                    "apiURL": fake.api_url(), "trust": "private", "apiKeyFile": key_file.path(),
                    "useServerProxy": false, "timeouts": {"pollMillis": 20},
                },
            })),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    c.deny_fake_pool().await;
    c.wait_pool_health(POOL, true, Duration::from_secs(30))
        .await;
    let (s, created) = c.create(json!({})).await;
    assert_eq!(s, 202, "{created}");
    let id = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let row = c
        .wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert_eq!(row["pool"], POOL, "{row}");
    let exec = |n: &'static str| route.exec(&c, &id, n);

    // The first exec reads the row; the second uses the remembered one, its request to
    // execd opened beside its record.
    for n in ["1", "2"] {
        let (s, out) = exec(n).await;
        assert_eq!((s, out.as_str()), (200, &*format!("{n}\n")));
    }
    assert_eq!(seen(&fake), (2, 2), "one request per exec");

    // The record held back (every chain head locked by another transaction, so the guarded
    // swap waits): the exec's request reaches execd, its head but not its command, and the
    // command follows once the record is staged. Released well inside the adapter's 1 s hold.
    let mut lock = c.db.store().pool().begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM audit_heads FOR UPDATE")
        .execute(&mut *lock)
        .await
        .expect("lock the chain heads");
    let fake_ref = &fake;
    let while_held = async move {
        let deadline = std::time::Instant::now() + Duration::from_millis(700);
        while seen(fake_ref).0 == 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "no request reached execd while the record was held back"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let during = seen(fake_ref);
        lock.rollback().await.expect("release the chain heads");
        during
    };
    let ((s, out), during) = tokio::join!(exec("held"), while_held);
    assert_eq!(during, (3, 2), "the head came first, the command did not");
    assert_eq!((s, out.as_str()), (200, "held\n"));
    assert_eq!(
        seen(&fake),
        (3, 3),
        "the command went once the record was staged"
    );

    // Moved on at a new version, still running: the remembered row's record is refused, the
    // early request abandoned unsent, and the exec runs once from a fresh read.
    move_row(&c, &id, "running").await;
    let (s, out) = exec("3").await;
    assert_eq!((s, out.as_str()), (200, "3\n"));
    // The early request's head reaches execd or not, as the refusal races its connection;
    // its body never does.
    let (heads, bodies) = seen(&fake);
    assert!((4..=5).contains(&heads), "{heads} command requests");
    assert_eq!(
        bodies, 4,
        "the refused early request carried no command; the exec ran once"
    );
    assert_eq!(fake.record().command_bodies[3]["command"], "echo 3");

    // Stopped behind the API's back: refused, and nothing reaches the sandbox.
    move_row(&c, &id, "stopped").await;
    let (s, out) = exec("4").await;
    assert_eq!(s, 409, "{out}");
    assert_eq!(
        seen(&fake).1,
        4,
        "the refused exec's command never reached execd"
    );

    let items = crate::audit::records_of(&c, &id, route.action()).await;
    assert_eq!(items.len(), 4, "one record per exec that ran: {items:?}");
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}
