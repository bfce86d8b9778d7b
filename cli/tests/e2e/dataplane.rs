//! The data plane end to end: exec (collected, streamed as SSE and as binary frames), files
//! and the event stream, against a `devhost` pool (real processes) and a `fake` pool (the
//! ledger as witness), each run by separate api, scheduler and worker processes.

use std::time::{Duration, Instant};

use differently_adapters::fake::{LedgerOp, LedgerOutcome};
use differently_api::routes::exec::frames::{Frame, FrameDecoder, FrameType, MEDIA_TYPE};
use differently_core::{SandboxId, SandboxStatus};
use serde_json::{json, Value};

use crate::harness::{eventually, Cluster, Opts};

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
    let cancelled = eventually(Duration::from_secs(10), || {
        c.ledger().iter().any(|e| {
            e.op == LedgerOp::Exec
                && e.outcome == LedgerOutcome::Cancelled
                && e.sandbox_id.as_ref() == Some(&id)
        })
    })
    .await;
    assert!(
        cancelled,
        "disconnect did not cancel the command\n{}",
        c.logs()
    );
}

/// Reads a binary exec stream to its end with the API's reference decoder (which also
/// checks that exactly one exit or error frame ends it); returns the frames.
async fn read_frames(mut resp: reqwest::Response) -> Vec<Frame> {
    let mut decoder = FrameDecoder::default();
    let mut frames = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("frame chunk") {
        frames.extend(decoder.push(&chunk).expect("valid frames"));
    }
    decoder
        .finish()
        .expect("a complete, terminated frame stream");
    frames
}

/// The concatenated payloads of `kind` frames.
fn payload_of(frames: &[Frame], kind: FrameType) -> Vec<u8> {
    frames
        .iter()
        .filter(|f| f.kind == kind)
        .flat_map(|f| f.payload.iter().copied())
        .collect()
}

/// The JSON of the exit frame, which must be the last frame.
fn exit_of(frames: &[Frame]) -> Value {
    let last = frames.last().expect("frames");
    assert_eq!(last.kind, FrameType::Exit, "{frames:?}");
    serde_json::from_slice(&last.payload).expect("exit payload json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_exec_as_binary_frames() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    assert_eq!(c.get(&id).await["pool"], "fake");
    let path = format!("/v1/sandboxes/{id}/exec/stream");
    let stream = |accept: &'static str, body: Value| {
        c.req(reqwest::Method::POST, &path)
            .header("accept", accept)
            .json(&body)
            .send()
    };
    use base64::Engine;
    let all: Vec<u8> = (0..=255u8).rev().chain(0..=255u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&all);

    // Every byte value arrives raw (not valid UTF-8, no encoding), then the exit frame.
    // `outputEncoding` is ignored by frames.
    for enc in ["utf8", "base64"] {
        let resp = stream(
            MEDIA_TYPE,
            json!({"command": ["cat"], "stdinBase64": b64, "outputEncoding": enc}),
        )
        .await
        .expect("stream");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], MEDIA_TYPE);
        let frames = read_frames(resp).await;
        assert_eq!(payload_of(&frames, FrameType::Stdout), all, "{enc}");
        assert!(payload_of(&frames, FrameType::Stderr).is_empty());
        let exit = exit_of(&frames);
        assert_eq!(exit["exitCode"], 0);
        assert!(exit["durationMs"].is_u64(), "{exit}");
    }

    // Several frames of the adapter's chunks (≤ 64 KiB each, none empty), exact bytes.
    const N: usize = 300 * 1024 + 3;
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", N.to_string()]}),
    )
    .await
    .expect("stream");
    let frames = read_frames(resp).await;
    let out = payload_of(&frames, FrameType::Stdout);
    let want: Vec<u8> = (0..N)
        .map(|i| if i % 2 == 0 { b'y' } else { b'\n' })
        .collect();
    assert!(out == want, "{} bytes arrived, {N} expected", out.len());
    let outputs: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.kind == FrameType::Stdout)
        .collect();
    assert_eq!(outputs.len(), N.div_ceil(64 * 1024));
    assert!(outputs
        .iter()
        .all(|f| !f.payload.is_empty() && f.payload.len() <= 64 * 1024));
    assert_eq!(exit_of(&frames)["exitCode"], 0);

    // Stderr is type 2; exit codes and the timeout's 124 arrive in the exit frame.
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", "6", "stderr"]}),
    )
    .await
    .expect("stream");
    let frames = read_frames(resp).await;
    assert_eq!(payload_of(&frames, FrameType::Stderr), b"y\ny\ny\n");
    assert!(payload_of(&frames, FrameType::Stdout).is_empty());
    let resp = stream(MEDIA_TYPE, json!({"command": ["fake-exit", "3"]}))
        .await
        .expect("stream");
    let frames = read_frames(resp).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(exit_of(&frames)["exitCode"], 3);
    let started = Instant::now();
    let resp = stream(
        MEDIA_TYPE,
        json!({"command": ["sleep", "30"], "timeoutSeconds": 1}),
    )
    .await
    .expect("stream");
    assert_eq!(exit_of(&read_frames(resp).await)["exitCode"], 124);
    assert!(started.elapsed() < Duration::from_secs(10));

    // Errors before the stream starts stay JSON errors.
    let missing = SandboxId::new();
    let resp = c
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{missing}/exec/stream"),
        )
        .header("accept", MEDIA_TYPE)
        .json(&json!({"command": ["true"]}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 404);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let resp = stream(MEDIA_TYPE, json!({"command": []}))
        .await
        .expect("stream");
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.expect("error json");
    assert_eq!(body["error"]["code"], "validation_failed", "{body}");

    // Any other Accept still gets SSE.
    for accept in ["text/event-stream", "*/*"] {
        let resp = stream(
            accept,
            json!({"command": ["cat"], "stdinBase64": b64, "outputEncoding": "base64"}),
        )
        .await
        .expect("stream");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let events = read_sse(resp).await;
        let mut out = Vec::new();
        for (ev, data) in &events[..events.len() - 1] {
            assert_eq!(ev, "stdout", "{accept}: {events:?}");
            let v: Value = serde_json::from_str(data).expect("event json");
            out.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(v["data"].as_str().unwrap())
                    .expect("base64 data"),
            );
        }
        assert_eq!(out, all, "{accept}");
        assert_eq!(events.last().expect("exit").0, "exit");
    }

    // Audited like SSE: the program name only.
    let (s, log) = crate::audit::audit_page(
        &c,
        &c.key,
        &format!("?resource={id}&action=sandbox.exec_stream&limit=100"),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    let items = log["items"].as_array().expect("audit items");
    assert_eq!(
        items
            .iter()
            .filter(|i| i["detail"]["program"] == "fake-output")
            .count(),
        2,
        "{log}"
    );
    assert!(
        !log.to_string().contains(&b64),
        "stdin leaked into the audit log"
    );

    // Hanging up on a frame stream cancels the command on the backend.
    let mut resp = stream(
        MEDIA_TYPE,
        json!({"command": ["fake-output", (10u64 << 30).to_string()]}),
    )
    .await
    .expect("stream");
    assert!(resp.chunk().await.expect("chunk").is_some());
    drop(resp);
    let cancelled = eventually(Duration::from_secs(10), || {
        c.ledger().iter().any(|e| {
            e.op == LedgerOp::Exec
                && e.outcome == LedgerOutcome::Cancelled
                && e.sandbox_id.as_ref() == Some(&id)
        })
    })
    .await;
    assert!(
        cancelled,
        "disconnect did not cancel the command\n{}",
        c.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_ranges_and_traversal() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let files = format!("/v1/sandboxes/{id}/files");

    // 100 MB up and down, byte for byte.
    let size = 100 * 1024 * 1024;
    let data: Vec<u8> = (0..size)
        .map(|i: usize| (i.wrapping_mul(31) ^ (i >> 13)) as u8)
        .collect();
    let r = c
        .req(
            reqwest::Method::PUT,
            &format!("{files}?path=/big/blob.bin&mode=600"),
        )
        .body(data.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap_or_default());
    let r = c
        .req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
        .send()
        .await
        .expect("download");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], size.to_string().as_str());
    let back = r.bytes().await.expect("body");
    assert_eq!(back.len(), data.len());
    assert!(back[..] == data[..], "downloaded bytes differ");
    // The command side sees the same file.
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["sh", "-c", "wc -c < big/blob.bin; stat -c %a big/blob.bin"]}),
    )
    .await;
    assert_eq!(out["stdout"], format!("{size}\n600\n"));

    // Ranges.
    let range = |h: &'static str| {
        c.req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
            .header("range", h)
            .send()
    };
    let r = range("bytes=10-19").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 10-19/{size}").as_str()
    );
    assert_eq!(&r.bytes().await.unwrap()[..], &data[10..20]);
    let r = range("bytes=-5").await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(&r.bytes().await.unwrap()[..], &data[size - 5..]);
    let r = range("bytes=104857600-").await.unwrap();
    assert_eq!(r.status(), 416);

    // Listing and deleting.
    let (s, list) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("{files}/list?path=/big"),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(list["items"][0]["path"], "/big/blob.bin");
    assert_eq!(list["items"][0]["size"], size);
    assert_eq!(list["items"][0]["type"], "file");

    // Traversal is refused at the edge and in the adapter.
    for bad in ["/../../etc/passwd", "etc/passwd", "/a/../../b"] {
        let r = c
            .req(reqwest::Method::GET, &format!("{files}?path={bad}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["ln", "-s", "/etc", "escape"]}),
    )
    .await;
    assert_eq!(out["exitCode"], 0);
    let r = c
        .req(
            reqwest::Method::GET,
            &format!("{files}?path=/escape/hostname"),
        )
        .send()
        .await
        .unwrap();
    // The link is followed as inside the sandbox's root (its `/etc` there holds no
    // `hostname`), never out of it through the API process.
    assert_eq!(
        r.status(),
        404,
        "a symlink must never lead the files API out of the sandbox"
    );

    let r = c
        .req(
            reqwest::Method::DELETE,
            &format!("{files}?path=/big/blob.bin"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = c
        .req(reqwest::Method::GET, &format!("{files}?path=/big/blob.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // The fake pool has no files: 501, never a silent degrade.
    let other = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let (s, e) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{other}/files/list?path=/"),
            None,
        )
        .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (501, Some("unsupported_operation"))
    );
}

/// Reads events from `/v1/events` until `until` holds for the ones read so far or the time is
/// up; returns them.
pub async fn read_events(
    c: &Cluster,
    query: &str,
    last_id: Option<u64>,
    until: impl Fn(&[SseEvent]) -> bool,
) -> Vec<SseEvent> {
    let mut r = c.req(reqwest::Method::GET, &format!("/v1/events{query}"));
    if let Some(id) = last_id {
        r = r.header("last-event-id", id.to_string());
    }
    let mut resp = r.send().await.expect("events");
    assert_eq!(resp.status(), 200);
    let mut parser = SseParser::default();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !until(&got) && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => got.extend(parser.push(&chunk)),
            Ok(_) => break,
            Err(_) => {}
        }
    }
    got
}

fn statuses(evs: &[SseEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            let v: Value = serde_json::from_str(&e.data).expect("event json");
            v["status"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_from_last_event_id_without_gaps_or_repeats() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let q = format!("?sandboxId={id}");
    // Everything so far, from the start of the stream.
    let first = read_events(&c, &q, Some(0), |evs| {
        statuses(evs).contains(&"running".to_owned())
    })
    .await;
    // Placed in its admission: it was never committed `queued`, so no event says it was.
    assert_eq!(statuses(&first), vec!["provisioning", "running"]);
    let last: u64 = first
        .last()
        .unwrap()
        .id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();

    // Changes while nobody listens.
    for op in ["pause", "resume", "stop", "start"] {
        let (s, b) = post(&c, &format!("/v1/sandboxes/{id}/{op}"), json!({})).await;
        assert_eq!(s, 200, "{op}: {b}");
    }
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;

    // Resuming misses nothing and repeats nothing.
    let rest = read_events(&c, &q, Some(last), |evs| {
        statuses(evs).contains(&"terminated".to_owned())
    })
    .await;
    assert_eq!(
        statuses(&rest),
        vec![
            "paused",
            "running",
            "stopped",
            "running",
            "terminating",
            "terminated"
        ]
    );
    let ids: Vec<u64> = first
        .iter()
        .chain(&rest)
        .map(|e| e.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids strictly increase: {ids:?}"
    );
    // Another tenant's filter sees none of it; a bad id is a 400.
    let (s, _) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            "/v1/events?sandboxId=nope",
            None,
        )
        .await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_over_the_configured_limit_are_refused() {
    let root = tempfile::tempdir().expect("tempdir").keep();
    let mut c = Cluster::new(Opts {
        more_pools: format!(
            "{FAKE_CAPS}\n\n[[pools]]\nname = \"dev\"\nkind = \"devhost\"\n[pools.settings]\nroot = \"{}\"\nisolation = \"none\"\n",
            root.display()
        ),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[("DIFFERENTLY_MAX_UPLOAD_BYTES", "1000")]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let put = |n: usize| {
        c.req(
            reqwest::Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/f.bin"),
        )
        .body(vec![7u8; n])
        .send()
    };
    let r = put(1000).await.expect("at the limit");
    assert_eq!(r.status(), 204);
    let r = put(1001).await.expect("over the limit");
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(body["error"]["details"]["limitBytes"], 1000);
    // The refused upload left the earlier file as it was.
    let r = c
        .req(
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/f.bin"),
        )
        .send()
        .await
        .expect("download");
    assert_eq!(r.bytes().await.expect("body").len(), 1000);
}

/// The second exec on a sandbox uses the row the first one read (its audit record guarded on
/// that row); once the sandbox moves on, a call is refused however recently its row was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_row_serves_execs_only_while_it_holds() {
    // The fake pool only, so its ledger witnesses every exec that reached a backend.
    let c = Cluster::started(Opts::default()).await;
    let id = running(&c, json!({})).await;
    let path = format!("/v1/sandboxes/{id}/exec");
    let exec = |n: &str| {
        post(
            &c,
            &path,
            json!({"command": ["echo", n], "timeoutSeconds": 10}),
        )
    };
    for n in ["1", "2", "3"] {
        let (s, out) = exec(n).await;
        assert_eq!(
            (s, out["stdout"].as_str()),
            (200, Some(&*format!("{n}\n"))),
            "{out}"
        );
    }
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    // At once: the deletion's event may not have reached the API yet; the guard refuses.
    let (s, refused) = exec("4").await;
    assert_eq!(s, 409, "{refused}");
    let execs = c
        .ledger()
        .iter()
        .filter(|e| e.op == LedgerOp::Exec && e.sandbox_id.as_ref() == Some(&id))
        .count();
    assert_eq!(execs, 3, "the refused exec never reached the backend");
    let items = crate::audit::records_of(&c, &id, "sandbox.exec").await;
    assert_eq!(items.len(), 3, "one record per exec that ran: {items:?}");
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}

/// The status event that starts a sandbox carries its client view and where it runs: a wait it
/// ends answers with the row as committed, and this replica's first data-plane call on it
/// needs no read. Shown by pointing the stored rows at a pool this replica does not have,
/// behind the API's back: only a call that reads its row notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_that_starts_a_sandbox_answers_its_wait_and_serves_the_first_exec() {
    // Creates take 400 ms on the backend, so the wait below is registered before the start.
    let c = Cluster::started(Opts {
        latency_ms: 400,
        ..Opts::default()
    })
    .await;
    let (s, created) = c.create(json!({})).await;
    assert_eq!(s, 202, "{created}");
    let waited_on = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let answered = c
        .wait_status(&waited_on, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert_eq!(
        answered,
        c.get(&waited_on).await,
        "the event's view is the row's"
    );

    // Started while nobody here waited on it: polled with plain reads.
    let (s, created) = c.create(json!({})).await;
    assert_eq!(s, 202, "{created}");
    let polled = SandboxId::parse(created["id"].as_str().expect("id")).expect("sandbox id");
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.get(&polled).await["status"] != "running" {
        assert!(Instant::now() < deadline, "{polled} never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let moved = sqlx::query(
        "UPDATE sandboxes SET doc = jsonb_set(doc, '{pool}', '\"elsewhere\"') WHERE id = ANY($1)",
    )
    .bind(vec![waited_on.to_string(), polled.to_string()])
    .execute(c.db.store().pool())
    .await
    .expect("point the rows elsewhere")
    .rows_affected();
    assert_eq!(moved, 2);
    let exec = |id: &SandboxId| {
        let path = format!("/v1/sandboxes/{id}/exec");
        let c = &c;
        async move {
            post(
                c,
                &path,
                json!({"command": ["echo", "hi"], "timeoutSeconds": 10}),
            )
            .await
        }
    };
    let (s, out) = exec(&waited_on).await;
    assert_eq!((s, out["stdout"].as_str()), (200, Some("hi\n")), "{out}");
    let (s, out) = exec(&polled).await;
    assert_eq!(
        (s, out["error"]["code"].as_str()),
        (503, Some("provider_unavailable")),
        "this call read its row: {out}"
    );
}

/// A delete first tries the row this process remembers running, without reading it; a row that
/// moved behind that memory is refused by the change's compare-and-set and deleted from a
/// fresh read, so the record says where it really came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_of_a_remembered_row_that_moved_deletes_it_from_a_fresh_read() {
    let c = Cluster::started(Opts::default()).await;
    let id = running(&c, json!({})).await;
    let (s, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["echo", "hi"], "timeoutSeconds": 10}),
    )
    .await;
    assert_eq!(s, 200, "{out}");
    // Stopped behind the API's back: no event tells it, so it still remembers `running`.
    let moved = sqlx::query(
        "UPDATE sandboxes SET status = 'stopped', status_version = status_version + 1,
             doc = jsonb_set(jsonb_set(doc, '{status}', '\"stopped\"'),
                             '{statusVersion}', to_jsonb(status_version + 1))
         WHERE id = $1 AND status = 'running'",
    )
    .bind(id.to_string())
    .execute(c.db.store().pool())
    .await
    .expect("stop the row")
    .rows_affected();
    assert_eq!(moved, 1);
    let (s, body) = c.delete(&id).await;
    assert_eq!(
        (s, body["status"].as_str()),
        (202, Some("terminating")),
        "{body}"
    );
    let done = c
        .wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;
    // The worker deleted from the work message alone and kept the reason it carried.
    assert_eq!(done["statusReason"], "deleted", "{done}");
    let items = crate::audit::records_of(&c, &id, "sandbox.terminating").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["detail"]["from"], "stopped", "{items:?}");
    let report = crate::audit::verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
}

/// An exec's two public events are sent together (neither waits for the other's
/// acknowledgement), yet the public stream holds `started` before `finished` for every exec,
/// as `docs/events.md` promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_exec_stores_started_before_finished() {
    use differently_bus::Bus;
    use differently_bus_schema::public::{EventData, PublicEvent};
    use futures::StreamExt;

    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["files"]})).await;
    let path = format!("/v1/sandboxes/{id}/exec");
    const EXECS: usize = 20;
    for _ in 0..EXECS {
        let (s, r) = post(&c, &path, json!({"command": ["echo", "hi"]})).await;
        assert_eq!(s, 200, "{r}");
    }
    let bus = differently_bus::jetstream::connect(&c._nats.url(), 1)
        .await
        .expect("connect to the test's nats-server");
    let naming = differently_bus_schema::Naming::default();
    let mut events = bus
        .events(
            &naming.public_stream().name,
            &format!("{}.pub.>", naming.prefix()),
            Some(0),
        )
        .await
        .expect("read the public stream");
    let mut order: Vec<(String, &str)> = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while order.len() < 2 * EXECS {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(Some(ev)) = tokio::time::timeout(left, events.next()).await else {
            panic!("only {} exec events in the stream: {order:?}", order.len());
        };
        let ev = ev.expect("public event");
        match PublicEvent::decode(&ev.payload).expect("decodes").data {
            EventData::ExecStarted(s) => order.push((s.exec_id, "started")),
            EventData::ExecFinished(f) => order.push((f.exec_id, "finished")),
            _ => {}
        }
    }
    let mut execs: Vec<&String> = order.iter().map(|(id, _)| id).collect();
    execs.sort();
    execs.dedup();
    assert_eq!(execs.len(), EXECS, "{order:?}");
    for exec in execs {
        let at = |kind: &str| order.iter().position(|(id, k)| id == exec && *k == kind);
        let (started, finished) = (at("started"), at("finished"));
        assert!(
            started.is_some() && started < finished,
            "{exec}: started at {started:?}, finished at {finished:?}"
        );
    }
}
