//! The data plane end to end: exec (collected, streamed as SSE and as binary frames), files
//! and the event stream, against a `devhost` pool (real processes) and a `fake` pool (the
//! ledger as witness), each run by separate api, scheduler and worker processes.
//! Here the helpers other e2e modules share and exec's semantics and bounds; binary frames,
//! files, events and remembered rows in the submodules.

use std::time::{Duration, Instant};

use differently_adapters::fake::{LedgerOp, LedgerOutcome};
use differently_core::{SandboxId, SandboxStatus};
use serde_json::{json, Value};

use crate::harness::{eventually, Cluster, Opts};

mod binary_frames;
mod events;
mod files;
mod remembered_rows;

/// Capabilities the `fake` pool advertises in these clusters: everything but `files`, so a
/// sandbox asking for `files` lands on the devhost pool and one asking for `lifecycle.stop`
/// lands on the fake.
pub const FAKE_CAPS: &str = r#"capabilities = ["exec", "exec.stream", "lifecycle.pause", "lifecycle.stop", "snapshots", "ports.expose"]"#;

/// A cluster with the `fake` pool (all operations but files) and a `devhost` pool `dev`.
pub async fn cluster(opts: Opts) -> Cluster {
    let root = tempfile::tempdir().expect("tempdir").keep();
    let more = format!(
        r#"{FAKE_CAPS}

[[pools]]
name = "dev"
kind = "devhost"
[pools.settings]
root = "{}"
isolation = "none"
"#,
        root.display()
    );
    let c = Cluster::started(Opts {
        more_pools: more,
        ..opts
    })
    .await;
    c
}

/// Creates a sandbox with `body` and waits until it runs; returns its id.
pub async fn running(c: &Cluster, body: Value) -> SandboxId {
    let (status, created) = c.create(body).await;
    assert_eq!(status, 202, "{created}\n{}", c.logs());
    let id = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    c.wait_status(&id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    id
}

/// `POST path` with a JSON body; (status, json).
pub async fn post(c: &Cluster, path: &str, body: Value) -> (u16, Value) {
    c.call(&c.key, reqwest::Method::POST, path, Some(body))
        .await
}

/// Reads one SSE response to its end; returns `(event, data)` pairs (comments skipped).
pub async fn read_sse(resp: reqwest::Response) -> Vec<(String, String)> {
    let mut parser = SseParser::default();
    let mut resp = resp;
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("sse chunk") {
        for ev in parser.push(&chunk) {
            out.push((ev.event, ev.data));
        }
    }
    out
}

/// One parsed SSE event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Incremental SSE parser (events separated by a blank line; `:` lines are comments).
#[derive(Debug, Default)]
pub struct SseParser {
    buf: String,
    pub comments: usize,
}

impl SseParser {
    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.push_str(&String::from_utf8_lossy(bytes));
        let mut out = Vec::new();
        while let Some(i) = self.buf.find("\n\n") {
            let block: String = self.buf.drain(..i + 2).collect();
            let mut ev = SseEvent::default();
            let mut any = false;
            for line in block.lines() {
                if line.starts_with(':') {
                    self.comments += 1;
                } else if let Some(v) = line.strip_prefix("event:") {
                    ev.event = v.trim_start().to_owned();
                    any = true;
                } else if let Some(v) = line.strip_prefix("data:") {
                    ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    any = true;
                } else if let Some(v) = line.strip_prefix("id:") {
                    ev.id = Some(v.trim_start().to_owned());
                }
            }
            if any {
                out.push(ev);
            }
        }
        out
    }
}

/// Resident memory (KiB) of the process whose command line names `config` and `role`.
/// Waits until the fake backend's ledger records `id`'s exec as cancelled (the client hung up
/// on its stream); fails with the cluster's logs after 10 s.
pub async fn assert_cancelled_on_backend(c: &Cluster, id: &SandboxId) {
    let cancelled = eventually(Duration::from_secs(10), || {
        c.ledger().iter().any(|e| {
            e.op == LedgerOp::Exec
                && e.outcome == LedgerOutcome::Cancelled
                && e.sandbox_id.as_ref() == Some(id)
        })
    })
    .await;
    assert!(
        cancelled,
        "disconnect did not cancel the command\n{}",
        c.logs()
    );
}

fn rss_kib(c: &Cluster, role: &str) -> u64 {
    let config = c.dir.path().join("differently.toml");
    let config = config.to_string_lossy();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let Ok(entry) = entry else { continue };
        let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(config.as_ref()) && cmd.contains(&format!("--role {role}")) {
            let status = std::fs::read_to_string(entry.path().join("status")).expect("proc status");
            let line = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .expect("VmRSS");
            return line
                .split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .expect("rss number");
        }
    }
    panic!("no {role} process for {config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_semantics_on_real_processes() {
    let c = cluster(Opts::default()).await;
    let id = running(
        &c,
        json!({"capabilities": ["files"], "env": {"FROM_SANDBOX": "s", "BOTH": "sandbox"}}),
    )
    .await;
    assert_eq!(c.get(&id).await["pool"], "dev");
    let path = format!("/v1/sandboxes/{id}/exec");
    let exec = |body: Value| post(&c, &path, body);

    // Exit codes and separate stdout/stderr.
    let (s, r) = exec(json!({"command": ["sh", "-c", "echo out; echo err >&2; exit 3"]})).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (
            r["exitCode"].as_i64(),
            r["stdout"].as_str(),
            r["stderr"].as_str()
        ),
        (Some(3), Some("out\n"), Some("err\n"))
    );
    // A missing program is 127, as a shell says.
    let (_, r) = exec(json!({"command": ["no-such-program-xyz"]})).await;
    assert_eq!(r["exitCode"], 127);
    // stdin.
    let (_, r) = exec(json!({"command": ["cat"], "stdin": "line one\nline two"})).await;
    assert_eq!(r["stdout"], "line one\nline two");
    // Env precedence: request over sandbox over defaults.
    let (_, r) = exec(json!({"command": ["sh", "-c", "echo \"$FROM_SANDBOX|$BOTH|$LANG\""], "env": {"BOTH": "request"}})).await;
    assert_eq!(r["stdout"], "s|request|C.UTF-8\n");
    // cwd inside the sandbox.
    let (_, r) = exec(json!({"command": ["mkdir", "-p", "work/sub"]})).await;
    assert_eq!(r["exitCode"], 0);
    let (_, r) =
        exec(json!({"command": ["sh", "-c", "basename \"$PWD\""], "cwd": "/work/sub"})).await;
    assert_eq!(r["stdout"], "sub\n");
    for cwd in ["relative", "/no/such/dir"] {
        let (s, r) = exec(json!({"command": ["pwd"], "cwd": cwd})).await;
        assert_eq!(
            (s, r["error"]["details"]["field"].as_str()),
            (422, Some("cwd")),
            "cwd {cwd:?}: {r}"
        );
    }
    // Timeout is 124 and does not wait for the command.
    let started = Instant::now();
    let (_, r) = exec(json!({"command": ["sleep", "30"], "timeoutSeconds": 1})).await;
    assert_eq!(r["exitCode"], 124);
    assert!(started.elapsed() < Duration::from_secs(10));
    // Binary bytes survive both ways (every byte value through cat).
    use base64::Engine;
    let all: Vec<u8> = (0..=255u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&all);
    let (_, r) =
        exec(json!({"command": ["cat"], "stdinBase64": b64, "outputEncoding": "base64"})).await;
    let back = base64::engine::general_purpose::STANDARD
        .decode(r["stdout"].as_str().expect("stdout"))
        .expect("base64 stdout");
    assert_eq!(back, all);
    // Output over the cap is truncated, and says so.
    let (_, r) =
        exec(json!({"command": ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' a"]})).await;
    assert_eq!(
        (
            r["stdoutTruncated"].as_bool(),
            r["stdout"].as_str().map(str::len)
        ),
        (Some(true), Some(1024 * 1024))
    );

    // Audited with the program name only, never arguments or env values.
    let (s, log) = crate::audit::audit_page(
        &c,
        &c.key,
        &format!("?resource={id}&action=sandbox.exec&limit=100"),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    let items = log["items"].as_array().expect("audit items");
    assert!(
        items.iter().any(|i| i["detail"]["program"] == "cat"),
        "{log}"
    );
    assert!(
        !log.to_string().contains("line one"),
        "stdin leaked into the audit log"
    );
    assert!(
        !log.to_string().contains("\"request\""),
        "env values leaked into the audit log"
    );

    // Streamed: stdout and stderr events, then exit.
    let resp = c
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/exec/stream"),
        )
        .json(&json!({"command": ["sh", "-c", "echo a; echo b >&2; exit 7"]}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = read_sse(resp).await;
    let mut out = String::new();
    let mut err = String::new();
    for (ev, data) in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(data).expect("event json");
        match ev.as_str() {
            "stdout" => out.push_str(v["data"].as_str().unwrap()),
            "stderr" => err.push_str(v["data"].as_str().unwrap()),
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!((out.as_str(), err.as_str()), ("a\n", "b\n"));
    let (last, data) = events.last().expect("exit event");
    assert_eq!(last, "exit");
    let exit: Value = serde_json::from_str(data).unwrap();
    assert_eq!(exit["exitCode"], 7);
    assert!(exit["durationMs"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_exec_is_bounded_and_cancelled_on_disconnect() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    assert_eq!(c.get(&id).await["pool"], "fake");
    let stream = |n: u64| {
        c.req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/exec/stream"),
        )
        .json(&json!({"command": ["fake-output", n.to_string()]}))
        .send()
    };

    // 50 MB of output arrives whole.
    const N: u64 = 50 * 1024 * 1024;
    let before = rss_kib(&c, "api");
    let mut resp = stream(N).await.expect("stream");
    assert_eq!(resp.status(), 200);
    let mut parser = SseParser::default();
    let (mut bytes, mut exit) = (0u64, None);
    let mut peak = before;
    let mut chunks = 0u64;
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        for ev in parser.push(&chunk) {
            let v: Value = serde_json::from_str(&ev.data).expect("json");
            match ev.event.as_str() {
                "stdout" => bytes += v["data"].as_str().unwrap().len() as u64,
                "exit" => exit = Some(v),
                other => panic!("unexpected {other}: {}", ev.data),
            }
        }
        chunks += 1;
        if chunks == 200 {
            chunks = 0;
            peak = peak.max(rss_kib(&c, "api"));
        }
    }
    assert_eq!(bytes, N);
    assert_eq!(exit.expect("exit event")["exitCode"], 0);
    let grew_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grew_mib < 32,
        "api memory grew {grew_mib} MiB while streaming 50 MiB"
    );

    // A reader that stops reading: the command waits (memory stays flat), and hanging up
    // cancels it on the backend.
    let before = rss_kib(&c, "api");
    let mut resp = stream(10 * 1024 * 1024 * 1024).await.expect("stream");
    let first = resp.chunk().await.expect("chunk");
    assert!(first.is_some());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stalled = rss_kib(&c, "api");
    assert!(
        stalled.saturating_sub(before) / 1024 < 32,
        "a stalled reader must not make the api buffer output ({before} -> {stalled} KiB)"
    );
    drop(resp);
    assert_cancelled_on_backend(&c, &id).await;
}
