//! Differently end to end on a real OpenSandbox server: api, scheduler and worker processes
//! on Postgres and nats-server, with an `opensandbox` pool registered through
//! `POST /v1/admin/pools` and the harness's `fake` pool denied by the global policy, so every
//! sandbox lands on the real server.
//!
//! Opt in with the adapter live test's variables, then run it ignored:
//! `DIFFERENTLY_TEST_OPENSANDBOX_URL` (the lifecycle API, ending in `/v1`, on loopback),
//! `DIFFERENTLY_TEST_OPENSANDBOX_KEY`, optionally `DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS`
//! (JSON merged into the pool settings), and
//! `cargo test -p differently --test e2e -- --ignored opensandbox_live --nocapture`.
//! `docs/opensandbox.md` ("Live checks") says how to bring up a server.

use std::io::Write;
use std::time::{Duration, Instant};

use differently_core::{SandboxId, SandboxStatus};
use reqwest::Method;
use serde_json::{json, Value};

use crate::dataplane::{post, read_sse};
use crate::harness::{Cluster, Opts};

/// The pool's name in this cluster.
const POOL: &str = "osb";

/// The server under test, reached directly for what happens behind Differently's back.
struct Server {
    api: String,
    key: String,
    http: reqwest::Client,
}

impl Server {
    /// From the environment; fails (never skips) when the variables are missing or the
    /// server does not answer, saying what to start.
    async fn from_env() -> Server {
        let (Ok(api), Ok(key)) = (
            std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_URL"),
            std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_KEY"),
        ) else {
            panic!("the OpenSandbox e2e test was requested but DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY are not both set");
        };
        let url = reqwest::Url::parse(&api).expect("DIFFERENTLY_TEST_OPENSANDBOX_URL is a URL");
        let host = url.host_str().unwrap_or_default();
        assert!(
            matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1"),
            "this test only talks to an OpenSandbox server on loopback, not {host}"
        );
        let s = Server {
            api: api.trim_end_matches('/').to_owned(),
            key,
            http: reqwest::Client::new(),
        };
        let probe = s
            .req(Method::GET, "/sandboxes?pageSize=1")
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match probe {
            Ok(r) if r.status().is_success() => s,
            Ok(r) => panic!(
                "the OpenSandbox server at {api} answered {} to an authenticated list: check DIFFERENTLY_TEST_OPENSANDBOX_KEY",
                r.status()
            ),
            Err(e) => panic!(
                "no OpenSandbox server answers at {api} ({e}): start one (opensandbox-server 1.1.1 with the Docker runtime, see docs/opensandbox.md, \"Live checks\") or unset DIFFERENTLY_TEST_OPENSANDBOX_URL"
            ),
        }
    }

    fn req(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .timeout(Duration::from_secs(120))
    }

    /// The server's sandboxes tagged with Differently's sandbox id.
    async fn tagged(&self, id: &SandboxId) -> Vec<Value> {
        let r = self
            .req(
                Method::GET,
                &format!("/sandboxes?metadata=differently-sandbox-id%3D{id}&pageSize=50"),
            )
            .send()
            .await
            .expect("list tagged");
        assert!(r.status().is_success(), "list tagged: {}", r.status());
        let v: Value = r.json().await.expect("list body");
        v["items"].as_array().cloned().unwrap_or_default()
    }

    async fn status(&self, path: &str) -> u16 {
        self.req(Method::GET, path)
            .send()
            .await
            .expect("GET")
            .status()
            .as_u16()
    }
}

/// One case's outcome and time, printed for the record (`--nocapture`).
fn done(case: &str, since: Instant) {
    eprintln!("e2e case {case}: ok in {} ms", since.elapsed().as_millis());
}

async fn wait_for(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(check().await, "{what} within {within:?}");
}

/// A cluster whose only usable pool is the real server's.
async fn cluster(server: &Server, key_file: &std::path::Path) -> Cluster {
    let c = Cluster::started(Opts {
        scheduler_toml: "reconcile_interval_seconds = 1".into(),
        ..Opts::default()
    })
    .await;
    let mut settings = json!({
        "apiURL": server.api, "trust": "private", "apiKeyFile": key_file,
        "timeouts": {"readySeconds": 300},
    });
    if let Ok(extra) = std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS") {
        let extra: Value = serde_json::from_str(&extra).expect("settings JSON");
        for (k, v) in extra.as_object().expect("settings object") {
            settings[k] = v.clone();
        }
    }
    let (s, p) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({"name": POOL, "kind": "opensandbox", "trust": "private", "settings": settings})),
        )
        .await;
    assert_eq!(s, 201, "register the pool: {p}");
    c.deny_fake_pool().await;
    c.wait_pool_health(POOL, true, Duration::from_secs(60))
        .await;
    c
}

/// Creates a sandbox (from `extra` merged into a small default) and waits until it runs on
/// the real pool.
async fn running(c: &Cluster, extra: Value) -> SandboxId {
    let mut body =
        json!({"resources": {"cpu": 1, "memoryMiB": 512, "diskGiB": 1}, "ttlSeconds": 900});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        body[k] = v;
    }
    let (s, created) = c.create(body).await;
    assert_eq!(s, 202, "{created}\n{}", c.logs());
    let id = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let row = c
        .wait_status(&id, SandboxStatus::Running, Duration::from_secs(300))
        .await;
    assert_eq!(row["pool"], POOL, "{row}");
    id
}

async fn exec(c: &Cluster, id: &SandboxId, argv: &[&str]) -> Value {
    let (s, out) = post(
        c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": argv}),
    )
    .await;
    assert_eq!(s, 200, "exec {argv:?}: {out}\n{}", c.logs());
    out
}

/// Ends every sandbox the scenario made (best effort) so a failed run leaves nothing behind.
async fn cleanup(c: &Cluster, server: &Server, ids: &[SandboxId]) {
    for id in ids {
        let _ = c.delete(id).await;
    }
    for id in ids {
        for sbx in server.tagged(id).await {
            if let Some(r) = sbx["id"].as_str() {
                let _ = server
                    .req(Method::DELETE, &format!("/sandboxes/{r}"))
                    .send()
                    .await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "live: set DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY and run with --ignored"]
async fn opensandbox_live_end_to_end() {
    let server = Server::from_env().await;
    let mut key_file = tempfile::NamedTempFile::new().expect("key file");
    writeln!(key_file, "{}", server.key).expect("write key file");
    let c = cluster(&server, key_file.path()).await;
    let mut made: Vec<SandboxId> = Vec::new();
    let scenario = scenario(&c, &server, &mut made);
    let result =
        std::panic::AssertUnwindSafe(tokio::time::timeout(Duration::from_secs(1200), scenario));
    let result = futures::FutureExt::catch_unwind(result).await;
    cleanup(&c, &server, &made).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("the OpenSandbox e2e scenario timed out\n{}", c.logs()),
        Err(p) => std::panic::resume_unwind(p),
    }
}

async fn scenario(c: &Cluster, server: &Server, made: &mut Vec<SandboxId>) {
    // Create → running, on the real pool.
    let t = Instant::now();
    let id = running(c, json!({"env": {"E2E_VAR": "from-create"}})).await;
    made.push(id.clone());
    assert_eq!(
        server.tagged(&id).await.len(),
        1,
        "one instance on the server"
    );
    done("create -> running", t);

    // Exec, collected.
    let t = Instant::now();
    let out = exec(
        c,
        &id,
        &["sh", "-c", "echo \"$E2E_VAR\"; echo err >&2; exit 3"],
    )
    .await;
    assert_eq!(out["exitCode"], 3, "{out}");
    assert_eq!(out["stdout"], "from-create\n", "{out}");
    assert_eq!(out["stderr"], "err\n", "{out}");
    done("exec", t);

    // Exec, streamed as SSE: three lines with gaps, then the exit event.
    let t = Instant::now();
    let resp = c
        .req(Method::POST, &format!("/v1/sandboxes/{id}/exec/stream"))
        .json(&json!({"command": ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 5"]}))
        .send()
        .await
        .expect("exec stream");
    assert_eq!(resp.status(), 200);
    let events = read_sse(resp).await;
    let stdout: String = events
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).expect("stdout data")["data"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(stdout, "line1\nline2\nline3\n", "{events:?}");
    let exit = events
        .iter()
        .find(|(e, _)| e == "exit")
        .unwrap_or_else(|| panic!("no exit event: {events:?}"));
    let exit: Value = serde_json::from_str(&exit.1).expect("exit data");
    assert_eq!(exit["exitCode"], 5, "{exit}");
    done("streamed exec", t);

    // A background process (over the pool's streamed exec): its output while it runs, then
    // TERM ends it on the server (execd's interrupt) and it exits 143.
    let t = Instant::now();
    let (s, p) = post(
        c,
        &format!("/v1/sandboxes/{id}/processes"),
        json!({"command": ["sh", "-c", "echo hi; sleep 30"]}),
    )
    .await;
    assert_eq!(s, 201, "start a process: {p}\n{}", c.logs());
    let pid = p["pid"].as_u64().expect("pid");
    let at = format!("/v1/sandboxes/{id}/processes/{pid}");
    wait_for(
        Duration::from_secs(60),
        "the process's first line",
        async || {
            let (_, p) = c.call(&c.key, Method::GET, &at, None).await;
            p["outputBytes"].as_u64().unwrap_or(0) >= 3
        },
    )
    .await;
    let (s, b) = post(c, &format!("{at}/signal"), json!({"signal": "TERM"})).await;
    assert_eq!(s, 204, "signal TERM: {b}");
    let resp = c
        .req(Method::GET, &format!("{at}/output"))
        .send()
        .await
        .expect("process output");
    assert_eq!(resp.status(), 200);
    let events = read_sse(resp).await;
    assert_eq!(
        events.first().map(|(e, _)| e.as_str()),
        Some("stdout"),
        "{events:?}"
    );
    let exit = events
        .iter()
        .find(|(e, _)| e == "exit")
        .unwrap_or_else(|| panic!("no exit event: {events:?}"));
    let exit: Value = serde_json::from_str(&exit.1).expect("exit data");
    assert_eq!(exit["exitCode"], 143, "{exit}");
    let (_, p) = c.call(&c.key, Method::GET, &at, None).await;
    assert_eq!(
        (&p["status"], &p["exitCode"]),
        (&json!("exited"), &json!(143)),
        "{p}"
    );
    // Ended on the server, not only here: no `sleep 30` is left in the sandbox.
    wait_for(
        Duration::from_secs(30),
        "the process gone from the sandbox",
        async || {
            let out = exec(
                c,
                &id,
                &["sh", "-c", "ps -eo args | grep -c '^sleep 30' || true"],
            )
            .await;
            out["stdout"] == "0\n"
        },
    )
    .await;
    done("background process: output, TERM -> 143", t);

    // Files: write, read back, list; a missing path is 404 (not 422, not "sandbox gone").
    let t = Instant::now();
    let data: Vec<u8> = (0..=255u8).cycle().take(50_000).collect();
    let r = c
        .req(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/e2e/data.bin&mode=600"),
        )
        .body(data.clone())
        .send()
        .await
        .expect("put file");
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
    let r = c
        .req(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/e2e/data.bin"),
        )
        .send()
        .await
        .expect("get file");
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.expect("file body").to_vec(), data);
    let (s, list) = c
        .call(
            &c.key,
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/list?path=/tmp/e2e&depth=1"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{list}");
    assert!(
        list["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|e| e["size"] == 50_000)),
        "{list}"
    );
    let (s, missing) = c
        .call(
            &c.key,
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/nope/missing"),
            None,
        )
        .await;
    assert_eq!(s, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
    done("files write/read/list, missing = 404", t);

    // Pause and resume keep the sandbox's memory and files.
    let t = Instant::now();
    exec(c, &id, &["sh", "-c", "echo kept > /tmp/e2e/state"]).await;
    let (s, b) = post(c, &format!("/v1/sandboxes/{id}/pause"), json!({})).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("paused")), "{b}");
    let state = server.tagged(&id).await;
    assert_eq!(state[0]["status"]["state"], "Paused", "{state:?}");
    let (s, b) = post(c, &format!("/v1/sandboxes/{id}/resume"), json!({})).await;
    assert_eq!((s, b["status"].as_str()), (200, Some("running")), "{b}");
    assert_eq!(
        exec(c, &id, &["cat", "/tmp/e2e/state"]).await["stdout"],
        "kept\n"
    );
    done("pause/resume", t);

    // Snapshot, then fork at once: the snapshot's answer waits for the backend's Ready, so
    // the fork right after it must succeed.
    let t = Instant::now();
    exec(c, &id, &["sh", "-c", "echo snap > /tmp/e2e-snapfile"]).await;
    let (s, snap) = post(
        c,
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({"name": "e2e"}),
    )
    .await;
    assert_eq!(s, 202, "{snap}");
    assert_eq!(snap["status"], "ready", "{snap}");
    let sid = snap["id"].as_str().expect("snapshot id").to_owned();
    let (s, forked) = c
        .create(json!({"fromSnapshot": sid, "ttlSeconds": 900}))
        .await;
    assert_eq!(s, 202, "fork right after the snapshot: {forked}");
    let fork = SandboxId::parse(forked["id"].as_str().expect("fork id")).expect("fork id");
    made.push(fork.clone());
    let row = c
        .wait_status(&fork, SandboxStatus::Running, Duration::from_secs(300))
        .await;
    assert_eq!(row["pool"], POOL);
    assert_eq!(
        exec(c, &fork, &["cat", "/tmp/e2e-snapfile"]).await["stdout"],
        "snap\n"
    );
    done("snapshot then immediate fork", t);

    // Deleting the snapshot while the fork uses it: not done, and the answer says why.
    let t = Instant::now();
    let (s, del) = c
        .call(
            &c.key,
            Method::DELETE,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    assert_ne!(s, 204, "a snapshot in use was reported deleted: {del}");
    let (_, now) = c
        .call(&c.key, Method::GET, &format!("/v1/snapshots/{sid}"), None)
        .await;
    eprintln!("e2e: delete of the snapshot in use answered {s} {del}; the snapshot is {now}");
    let said = format!("{del} {}", now["statusReason"]);
    assert!(
        said.contains("in use"),
        "the refusal says the snapshot is in use: {said}"
    );
    done("delete of the snapshot in use refused, clearly", t);

    // Delete the fork, then the snapshot goes (the refused delete is re-sent until the
    // backend confirms, or a new delete does it).
    let t = Instant::now();
    let (s, _) = c.delete(&fork).await;
    assert_eq!(s, 202);
    c.wait_status(&fork, SandboxStatus::Terminated, Duration::from_secs(120))
        .await;
    assert!(
        server.tagged(&fork).await.is_empty(),
        "the fork is gone on the server"
    );
    let (s, del) = c
        .call(
            &c.key,
            Method::DELETE,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    assert!(
        matches!(s, 202 | 204 | 404),
        "delete the snapshot: {s} {del}"
    );
    wait_for(
        Duration::from_secs(120),
        "the snapshot is deleted",
        async || {
            c.call(&c.key, Method::GET, &format!("/v1/snapshots/{sid}"), None)
                .await
                .0
                == 404
        },
    )
    .await;
    // On the server, the adapter names the snapshot after Differently's id.
    let source_ref = server.tagged(&id).await[0]["id"]
        .as_str()
        .expect("instance id")
        .to_owned();
    let r = server
        .req(
            Method::GET,
            &format!("/snapshots?sandboxId={source_ref}&pageSize=200"),
        )
        .send()
        .await
        .expect("list server snapshots");
    assert!(r.status().is_success(), "{}", r.status());
    let left: Value = r.json().await.expect("snapshots body");
    assert!(
        !left["items"]
            .as_array()
            .is_some_and(|i| i.iter().any(|s| s["name"] == sid.as_str())),
        "the snapshot is gone on the server: {left}"
    );
    done("delete of the fork, then the snapshot", t);

    // An instance deleted behind Differently's back: the reconciler fails its row.
    let t = Instant::now();
    let doomed = running(c, json!({})).await;
    made.push(doomed.clone());
    let on_server = server.tagged(&doomed).await;
    let doomed_ref = on_server[0]["id"].as_str().expect("instance id").to_owned();
    let r = server
        .req(Method::DELETE, &format!("/sandboxes/{doomed_ref}"))
        .send()
        .await
        .expect("delete behind our back");
    assert!(r.status().is_success(), "{}", r.status());
    let failed = c
        .wait_status(&doomed, SandboxStatus::Failed, Duration::from_secs(60))
        .await;
    // Which reason depends on when the reconciler's listing falls: the Docker runtime lists
    // a sandbox it is deleting as `Failed` (`CONTAINER_EXITED_ERROR`, exit 137) between killing
    // and removing its container, and as nothing after.
    let reason = failed["statusReason"].as_str().unwrap_or_default();
    assert!(
        matches!(
            reason,
            "backend instance vanished" | "backend instance failed"
        ),
        "{failed}"
    );
    eprintln!("e2e: the vanished instance's row failed with reason {reason:?}");
    done("instance deleted behind our back -> row failed", t);

    // An orphan with our tags (this installation, an id no row has): the reconciler deletes
    // it on the server and records it.
    let t = Instant::now();
    let installation = on_server_installation(server, &id).await;
    let orphan = SandboxId::new();
    let image = std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS")
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v["image"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "ubuntu:24.04".to_owned());
    let r = server
        .req(Method::POST, "/sandboxes")
        .json(&json!({
            "image": {"uri": image},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600,
            "resourceLimits": {"cpu": "1", "memory": "512Mi"},
            "metadata": {"differently-sandbox-id": orphan.as_str(), "differently-installation-id": installation},
        }))
        .send()
        .await
        .expect("create the orphan");
    let status = r.status();
    let created: Value = r.json().await.expect("orphan body");
    assert!(status.is_success(), "create the orphan: {status} {created}");
    let orphan_ref = created["id"].as_str().expect("orphan id").to_owned();
    wait_for(
        Duration::from_secs(60),
        "the orphan is deleted",
        async || server.status(&format!("/sandboxes/{orphan_ref}")).await == 404,
    )
    .await;
    let store = c.db.store();
    wait_for(
        Duration::from_secs(30),
        "the orphan delete is audited",
        async || {
            differently_store::audit::AuditStore::audit_tail(&store, 10_000)
                .await
                .expect("audit")
                .iter()
                .any(|r| r.action == "reconcile.orphan_deleted" && r.resource == orphan.as_str())
        },
    )
    .await;
    done("orphan with our tags deleted by the reconciler", t);

    // Delete: the row ends and the server has nothing left of it.
    let t = Instant::now();
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(120))
        .await;
    assert!(
        server.tagged(&id).await.is_empty(),
        "the instance is gone on the server"
    );
    done("delete", t);
}

/// The installation id the pool tags its instances with, read off the server.
async fn on_server_installation(server: &Server, id: &SandboxId) -> String {
    let tagged = server.tagged(id).await;
    tagged[0]["metadata"]["differently-installation-id"]
        .as_str()
        .expect("installation tag")
        .to_owned()
}
