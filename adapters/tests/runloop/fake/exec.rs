//! Executions: `execute_async` runs the command with bash on the test host; reads, the
//! completion long poll, kill, and the two output tails as server-sent events.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::devboxes::running_home;
use super::{error, hold, poll_timeout, statuses, Inner};
use crate::support::http::{json_resp, lock, Req};

/// Longest hold of an execution status poll (`EXEC_LONG_POLL_SERVER_MAX_SECONDS`).
const EXEC_HOLD_MAX_S: u64 = 25;

/// Lines of each stream a view carries unless `last_n` says otherwise.
const DEFAULT_LAST_N: usize = 100;

/// Which output tail.
#[derive(Debug, Clone, Copy)]
pub enum Which {
    Stdout,
    Stderr,
}

/// What a running command shares with its reader tasks.
#[derive(Default)]
struct Live {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<i32>,
}

pub struct Execution {
    id: String,
    devbox_id: String,
    live: Arc<Mutex<Live>>,
    /// The process group to kill.
    pgid: Option<u32>,
    /// As given to `execute_async`.
    command: String,
}

impl Execution {
    pub fn completed(&self) -> bool {
        lock(&self.live).exit.is_some()
    }

    fn view(&self, last_n: usize) -> Value {
        let live = lock(&self.live);
        let mut v = json!({
            "devbox_id": self.devbox_id,
            "execution_id": self.id,
            "status": if live.exit.is_some() { "completed" } else { "running" },
            "shell_name": null,
        });
        if let Some(code) = live.exit {
            let (out, out_cut) = tail_lines(&live.stdout, last_n);
            let (err, err_cut) = tail_lines(&live.stderr, last_n);
            v["exit_status"] = json!(code);
            v["stdout"] = json!(out);
            v["stderr"] = json!(err);
            v["stdout_truncated"] = json!(out_cut);
            v["stderr_truncated"] = json!(err_cut);
        }
        v
    }
}

/// The last `n` lines of `bytes` as text, and whether lines were left out.
fn tail_lines(bytes: &[u8], n: usize) -> (String, bool) {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let cut = lines.len() > n;
    (lines[lines.len().saturating_sub(n)..].concat(), cut)
}

impl Inner {
    /// Kills every command of devbox `id` (a shutdown or suspend ends its processes).
    pub(super) fn kill_all_of(&self, id: &str) {
        for e in lock(&self.executions).values() {
            if e.devbox_id == id && !e.completed() {
                kill_group(e.pgid);
            }
        }
    }
}

fn kill_group(pgid: Option<u32>) {
    if let Some(pid) = pgid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

async fn pump(mut from: impl AsyncRead + Unpin, live: Arc<Mutex<Live>>, which: Which) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut l = lock(&live);
        match which {
            Which::Stdout => l.stdout.extend_from_slice(&buf[..n]),
            Which::Stderr => l.stderr.extend_from_slice(&buf[..n]),
        }
    }
}

/// `POST /v1/devboxes/{id}/execute_async {command}`.
pub(super) fn start(inner: &Arc<Inner>, id: &str, r: &Req) -> Response {
    let body = r.json();
    let Some(command) = body.get("command").and_then(Value::as_str) else {
        return error(400, "command: required");
    };
    let home = match running_home(inner, id) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let env = lock(&inner.devboxes)
        .get(id)
        .map(|d| d.env.clone())
        .unwrap_or_default();
    inner.record().commands.push(command.to_owned());
    let mut child = match tokio::process::Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(&home)
        .envs(&env)
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return error(500, &format!("spawn: {e}")),
    };
    let live = Arc::new(Mutex::new(Live::default()));
    let pgid = child.id();
    // Output is there for the tails as it comes, while the command runs.
    let out = child
        .stdout
        .take()
        .map(|o| tokio::spawn(pump(o, live.clone(), Which::Stdout)));
    let err = child
        .stderr
        .take()
        .map(|e| tokio::spawn(pump(e, live.clone(), Which::Stderr)));
    let done = live.clone();
    tokio::spawn(async move {
        let status = child.wait().await;
        if let Some(o) = out {
            let _ = o.await;
        }
        if let Some(e) = err {
            let _ = e.await;
        }
        use std::os::unix::process::ExitStatusExt;
        let code = match status {
            Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9)),
            Err(_) => 255,
        };
        lock(&done).exit = Some(code);
    });
    let exe = Execution {
        id: inner.next_id("exe"),
        devbox_id: id.to_owned(),
        live,
        pgid,
        command: command.to_owned(),
    };
    let v = exe.view(DEFAULT_LAST_N);
    lock(&inner.executions).insert(exe.id.clone(), exe);
    json_resp(200, v)
}

fn last_n(r: &Req) -> Result<usize, Response> {
    match r.q("last_n").map(str::parse) {
        None => Ok(DEFAULT_LAST_N),
        Some(Ok(n)) => Ok(n),
        Some(Err(_)) => Err(error(400, "last_n: must be a whole number")),
    }
}

/// The execution's view, or the error of a missing devbox or execution.
fn view_of(inner: &Inner, id: &str, eid: &str, n: usize) -> Result<(Value, bool), Response> {
    if !lock(&inner.devboxes).contains_key(id) {
        return Err(error(404, &format!("devbox {id} not found")));
    }
    let all = lock(&inner.executions);
    match all.get(eid).filter(|e| e.devbox_id == id) {
        Some(e) => Ok((e.view(n), e.completed())),
        None => Err(error(404, &format!("execution {eid} not found"))),
    }
}

/// `GET /v1/devboxes/{id}/executions/{eid}?last_n=`.
pub(super) fn get(inner: &Inner, id: &str, eid: &str, r: &Req) -> Response {
    let n = match last_n(r) {
        Ok(n) => n,
        Err(e) => return e,
    };
    match view_of(inner, id, eid, n) {
        Ok((v, _)) => json_resp(200, v),
        Err(e) => e,
    }
}

/// `POST …/executions/{eid}/wait_for_status {statuses, timeout_seconds}`.
pub(super) async fn wait_for_status(inner: &Arc<Inner>, id: &str, eid: &str, r: &Req) -> Response {
    let body = r.json();
    let want = match statuses(&body, &["queued", "running", "completed"]) {
        Ok(w) => w,
        Err(e) => return e,
    };
    let n = match last_n(r) {
        Ok(n) => n,
        Err(e) => return e,
    };
    let deadline = Instant::now() + hold(&body, EXEC_HOLD_MAX_S);
    loop {
        let (v, _) = match view_of(inner, id, eid, n) {
            Ok(x) => x,
            Err(e) => return e,
        };
        let status = v["status"].as_str().unwrap_or("").to_owned();
        if want.contains(&status) {
            return json_resp(200, v);
        }
        if Instant::now() >= deadline {
            return poll_timeout();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `POST …/executions/{eid}/kill {kill_process_group}`.
pub(super) fn kill(inner: &Inner, id: &str, eid: &str, _r: &Req) -> Response {
    let running = {
        let all = lock(&inner.executions);
        match all.get(eid).filter(|e| e.devbox_id == id) {
            Some(e) if !e.completed() => Some((e.pgid, e.command.clone())),
            Some(_) => None,
            None => return error(404, &format!("execution {eid} not found")),
        }
    };
    if let Some((pgid, command)) = running {
        let mut record = inner.record();
        record.kills += 1;
        record.killed.push(command);
        drop(record);
        kill_group(pgid);
    }
    match view_of(inner, id, eid, DEFAULT_LAST_N) {
        Ok((v, _)) => json_resp(200, v),
        Err(e) => e,
    }
}

/// How much of `bytes` to send now: everything once the command ended; while it runs, not a
/// UTF-8 sequence cut at the end (its rest is still to come).
fn sendable(bytes: &[u8], ended: bool) -> usize {
    if ended {
        return bytes.len();
    }
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

fn event(data: &Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// `GET …/executions/{eid}/stream_{stdout,stderr}_updates?offset=`: server-sent events.
pub(super) fn tail(inner: &Arc<Inner>, id: &str, eid: &str, r: &Req, which: Which) -> Response {
    let live = {
        let all = lock(&inner.executions);
        match all.get(eid).filter(|e| e.devbox_id == id) {
            Some(e) => e.live.clone(),
            None => return error(404, &format!("execution {eid} not found")),
        }
    };
    let mut pos: usize = match r.q("offset").map(str::parse) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return error(400, "offset: must be a byte offset"),
    };
    let hold = inner.knobs().stream_hold_ms.map(Duration::from_millis);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let inner = inner.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        loop {
            let (chunk, ended) = {
                let l = lock(&live);
                let all = match which {
                    Which::Stdout => &l.stdout,
                    Which::Stderr => &l.stderr,
                };
                let ended = l.exit.is_some();
                let from = pos.min(all.len());
                let n = sendable(&all[from..], ended);
                (all[from..from + n].to_vec(), ended)
            };
            if !chunk.is_empty() {
                let data = json!({
                    "output": String::from_utf8_lossy(&chunk),
                    "offset": pos,
                });
                pos += chunk.len();
                if tx.send(Ok(event(&data))).await.is_err() {
                    return;
                }
                continue;
            }
            if ended {
                return;
            }
            if hold.is_some_and(|h| started.elapsed() >= h) {
                inner.record().stream_timeouts += 1;
                let e = json!({"code": 408, "message": "stream hold elapsed; reconnect"});
                let _ = tx
                    .send(Ok(Bytes::from(format!("event: error\ndata: {e}\n\n"))))
                    .await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let body = Body::from_stream(tokio_stream_of(rx));
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
