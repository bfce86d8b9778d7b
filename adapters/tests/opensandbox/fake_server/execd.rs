//! The fake execd: commands run for real (`bash -c` on the test host) in the foreground with
//! their output streamed as the variant frames it, or in the background with their logs kept;
//! signals and timeouts reach the command's process group.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::Utc;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::http::{lock, Req};

use super::files::{download, file_info, file_not_found, list_dir, upload};
use super::{bad_gateway, json_resp, next_id, Cmd, Inner, Variant};

pub(super) async fn execd_entry(inner: &Arc<Inner>, id: &str, rest: &str, r: Req) -> Response {
    let state = lock(&inner.sandboxes).get(id).map(|s| s.state.clone());
    if state.is_none() {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    }
    if state.as_deref() != Some("Running") {
        return json_resp(
            502,
            json!({"code": "BACKEND_CONNECTION_FAILED", "message": "sandbox not reachable"}),
        );
    }
    let token = lock(&inner.knobs).execd_token.clone();
    if let Some(t) = token {
        let got = r
            .headers
            .get("x-execd-access-token")
            .and_then(|v| v.to_str().ok());
        if got != Some(t.as_str()) {
            return json_resp(
                401,
                json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}),
            );
        }
    }
    match (r.method.clone(), rest) {
        (Method::GET, "/ping") => StatusCode::OK.into_response(),
        (Method::POST, "/command") => command(inner, id, &r).await,
        (Method::DELETE, "/command") => {
            lock(&inner.record).interrupts += 1;
            let found = r.q("id").and_then(|i| {
                lock(&inner.commands).get_mut(i).map(|c| {
                    c.interrupted = c.running;
                    c.pgid.filter(|_| c.running)
                })
            });
            match found {
                Some(pgid) => {
                    if let Some(p) = pgid {
                        signal_group(p, "-TERM");
                    }
                    StatusCode::OK.into_response()
                }
                // Recorded (sic).
                None if inner.variant == Variant::Real => json_resp(
                    500,
                    json!({"code": "RUNTIME_ERROR", "message": "error interruptting code context. no such session"}),
                ),
                None => StatusCode::OK.into_response(),
            }
        }
        (Method::GET, p) if p.starts_with("/command/status/") => {
            let cid = &p["/command/status/".len()..];
            match lock(&inner.commands).get(cid) {
                Some(c) => {
                    // Recorded: `exit_code`, `error` and `finished_at` are omitted, not null,
                    // while it runs (and `error` on success).
                    let mut v = json!({"id": cid, "content": c.content, "running": c.running,
                                       "started_at": c.started_at.to_rfc3339()});
                    if let Some(code) = c.exit_code {
                        v["exit_code"] = json!(code);
                    }
                    if let Some(e) = &c.error {
                        v["error"] = json!(e);
                    }
                    if let Some(f) = c.finished_at {
                        v["finished_at"] = json!(f.to_rfc3339());
                    }
                    json_resp(200, v)
                }
                None => json_resp(
                    404,
                    json!({"code": "INVALID_REQUEST_BODY", "message": "command not found"}),
                ),
            }
        }
        (Method::GET, p) if p.starts_with("/command/") && p.ends_with("/logs") => {
            let cid = &p["/command/".len()..p.len() - "/logs".len()];
            command_logs(inner, cid, &r)
        }
        // execd's own reverse proxy to another port of the sandbox, where nothing listens.
        (_, p) if p.starts_with("/proxy/") && inner.variant == Variant::Real => bad_gateway(),
        (Method::GET, "/metrics") => json_resp(
            200,
            json!({"cpu_count": 2, "cpu_used_pct": 1.5, "mem_total_mib": 2048.0,
                   "mem_used_mib": 100.0, "timestamp": now_ms()}),
        ),
        (Method::POST, "/files/upload") => upload(inner, &r).await,
        (Method::GET, "/files/download") => download(inner, &r).await,
        (Method::GET, "/directories/list") => list_dir(&r),
        (Method::GET, "/files/info") => {
            let mut out = serde_json::Map::new();
            for p in r.qs("path") {
                match file_info(Path::new(p)) {
                    Some(i) => {
                        out.insert(p.to_owned(), i);
                    }
                    // Recorded: a path below a regular file is execd's 500, not a 404.
                    None if std::fs::symlink_metadata(p)
                        .err()
                        .and_then(|e| e.raw_os_error())
                        == Some(20) =>
                    {
                        return json_resp(
                            500,
                            json!({"code": "RUNTIME_ERROR", "message": format!(
                                "error accessing file: error accessing file {p}: lstat {p}: not a directory"
                            )}),
                        );
                    }
                    None => return file_not_found(p),
                }
            }
            json_resp(200, Value::Object(out))
        }
        (Method::DELETE, "/files") => {
            let p = r.q("path").unwrap_or("");
            match std::fs::symlink_metadata(p) {
                // Recorded on the real execd: deleting a missing path answers 200.
                Err(_) => StatusCode::OK.into_response(),
                Ok(m) if m.is_dir() => json_resp(
                    400,
                    json!({"code": "INVALID_FILE", "message": "is a directory"}),
                ),
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                    StatusCode::OK.into_response()
                }
            }
        }
        // `{path: {mode, owner?, group?}}`, mode as octal digits read as decimal (755):
        // `mkdir -p`, then the mode on the last directory.
        (Method::POST, "/directories") => make_dirs(&r),
        (Method::DELETE, "/directories") => {
            let p = r.q("path").unwrap_or("");
            let _ = std::fs::remove_dir_all(p);
            StatusCode::OK.into_response()
        }
        // Recorded: gin's own 404.
        _ if inner.variant == Variant::Real => (
            StatusCode::NOT_FOUND,
            [("content-type", "text/plain")],
            "404 page not found",
        )
            .into_response(),
        _ => json_resp(
            404,
            json!({"code": "NOT_FOUND", "message": "no such route"}),
        ),
    }
}
/// `POST /directories`, as execd 1.1 answers it (probed on a real one): `MkdirAll`, then the
/// mode only on a directory that was not there before and only when it is not 0, the
/// setuid, setgid and sticky bits dropped; a mode that is not octal digits fails after the
/// directory was made (at 755); what is in the way is named in a 500 `RUNTIME_ERROR`.
fn make_dirs(r: &Req) -> Response {
    use std::os::unix::fs::PermissionsExt;
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&r.body) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": "bad json"}),
        );
    };
    let failed = |why: String| {
        json_resp(
            500,
            json!({"code": "RUNTIME_ERROR", "message": format!("error accessing file: {why}")}),
        )
    };
    for (path, perm) in m {
        let p = Path::new(&path);
        let existed = p.exists();
        // What `MkdirAll` trips on: an ancestor (or the path) that is there but no directory,
        // or a symlink at the path that leads nowhere.
        let blocker = p
            .ancestors()
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .find(|a| std::fs::metadata(a).is_ok_and(|m| !m.is_dir()));
        if let Some(b) = blocker {
            return failed(format!("mkdir {}: not a directory", b.display()));
        }
        if !existed && std::fs::symlink_metadata(p).is_ok() {
            return failed(format!("mkdir {path}: file exists"));
        }
        if let Err(e) = std::fs::create_dir_all(p) {
            return failed(format!("mkdir {path}: {e}"));
        }
        let digits = perm["mode"].as_u64().unwrap_or(0).to_string();
        let Ok(mode) = u32::from_str_radix(&digits, 8) else {
            return failed(format!(
                "strconv.ParseUint: parsing \"{digits}\": invalid syntax"
            ));
        };
        if !existed && mode != 0 {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o777));
        }
    }
    StatusCode::OK.into_response()
}
/// `GET /command/{id}/logs?cursor=N`: the merged output from byte N, and the byte offset
/// reached in `EXECD-COMMANDS-TAIL-CURSOR` (recorded: a byte offset, echoed unclamped).
fn command_logs(inner: &Inner, cid: &str, r: &Req) -> Response {
    let cmds = lock(&inner.commands);
    let Some(c) = cmds.get(cid) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": format!("command not found: {cid}")}),
        );
    };
    let cursor: usize = r.q("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let rest = c.output.get(cursor..).unwrap_or(&[]).to_vec();
    let next = cursor.max(c.output.len());
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; charset=utf-8")
        .header("execd-commands-tail-cursor", next.to_string())
        .body(Body::from(rest))
        .unwrap()
}
fn kill_group(pgid: u32) {
    signal_group(pgid, "-KILL");
}
fn signal_group(pgid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status();
}
fn frame(variant: Variant, v: &Value) -> Bytes {
    match variant {
        Variant::Real => Bytes::from(format!("{v}\n\n")),
        Variant::Spec => Bytes::from(format!("data: {v}\n\n")),
    }
}
fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}
async fn command(inner: &Arc<Inner>, sandbox: &str, r: &Req) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": "bad json"}),
        );
    };
    lock(&inner.record).command_bodies.push(body.clone());
    let Some(cmdline) = body["command"].as_str().map(str::to_owned) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": "command is required"}),
        );
    };
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c")
        .arg(&cmdline)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = body["cwd"].as_str() {
        if !Path::new(cwd).is_dir() {
            return json_resp(
                400,
                json!({"code": "INVALID_REQUEST_BODY", "message": format!(
                    "invalid request, validation error working directory does not exist: \
                     {cwd}: stat {cwd}: no such file or directory"
                )}),
            );
        }
        cmd.current_dir(cwd);
    }
    let sandbox_env = lock(&inner.sandboxes)
        .get(sandbox)
        .map(|s| s.env.clone())
        .unwrap_or_default();
    cmd.envs(sandbox_env);
    if let Some(envs) = body["envs"].as_object() {
        for (k, v) in envs {
            cmd.env(k, v.as_str().unwrap_or(""));
        }
    }
    let timeout = body["timeout"].as_u64().filter(|t| *t > 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return json_resp(
                500,
                json!({"code": "RUNTIME_ERROR", "message": e.to_string()}),
            )
        }
    };
    let cid = next_id(inner, "cmd-");
    let pgid = child.id();
    lock(&inner.commands).insert(
        cid.clone(),
        Cmd {
            content: cmdline,
            running: true,
            exit_code: None,
            pgid,
            started_at: Utc::now(),
            finished_at: None,
            error: None,
            output: Vec::new(),
            interrupted: false,
        },
    );
    if body["background"].as_bool() == Some(true) {
        return background(inner, cid, child);
    }
    let variant = inner.variant;
    let (truncate, frame_delay, stall, evalue_text) = {
        let k = lock(&inner.knobs);
        (
            k.truncate_after_frames,
            k.frame_delay_ms,
            k.stall_ms,
            k.evalue_text,
        )
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let (ev_tx, mut ev_rx) = tokio::sync::mpsc::channel::<(&'static str, String)>(64);
    for (kind, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let ev_tx = ev_tx.clone();
        let inner3 = inner.clone();
        let cid3 = cid.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(pipe);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Some(c) = lock(&inner3.commands).get_mut(&cid3) {
                    c.output.extend_from_slice(&line);
                }
                let text = match variant {
                    Variant::Real => {
                        // execd 1.1 tails line-wise: the terminator is stripped, and a blank
                        // line arrives as the text "\n" (recorded).
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        if line.is_empty() {
                            "\n".to_owned()
                        } else {
                            String::from_utf8_lossy(&line).into_owned()
                        }
                    }
                    Variant::Spec => String::from_utf8_lossy(&line).into_owned(),
                };
                if ev_tx.send((kind, text)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(ev_tx);
    let inner2 = inner.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut sent = 0usize;
        let grace = if variant == Variant::Real { 1000 } else { 0 };
        // Sends one frame; false when the client is gone or the stream is to be cut.
        let send = |v: Value, sent: &mut usize| {
            let tx = tx.clone();
            let cut = truncate.is_some_and(|n| *sent >= n);
            *sent += 1;
            async move {
                if cut {
                    return Err(true);
                }
                if frame_delay > 0 {
                    tokio::time::sleep(Duration::from_millis(frame_delay)).await;
                }
                tx.send(Ok(frame(variant, &v))).await.map_err(|_| false)
            }
        };
        let fail = |inner: &Arc<Inner>, cut: bool| {
            if let Some(p) = pgid {
                kill_group(p);
            }
            if !cut {
                lock(&inner.record).cancelled += 1;
            }
        };
        let mut detached = false;
        // Sends a frame unless the client is gone. Real execd keeps a foreground command
        // running when its client goes away; the spec variant (and a deliberate cut) ends it.
        macro_rules! emit {
            ($v:expr) => {
                if !detached {
                    if let Err(cut) = send($v, &mut sent).await {
                        if cut || variant != Variant::Real {
                            return fail(&inner2, cut);
                        }
                        detached = true;
                        lock(&inner2.record).abandoned += 1;
                    }
                }
            };
        }
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        let ts = now_ms();
        emit!(json!({"type": "init", "text": cid, "timestamp": ts}));
        emit!(json!({"type": "ping", "text": "pong", "timestamp": ts}));
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
        let mut ping = tokio::time::interval(Duration::from_secs(3));
        ping.tick().await;
        let mut timed_out = false;
        loop {
            let sleep = async {
                match deadline {
                    Some(d) if !timed_out => tokio::time::sleep_until(d).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = ev_rx.recv() => match ev {
                    Some((kind, text)) => {
                        emit!(json!({"type": kind, "text": text, "timestamp": now_ms()}));
                    }
                    None => break,
                },
                _ = ping.tick() => {
                    emit!(json!({"type": "ping", "text": "pong", "timestamp": now_ms()}));
                }
                _ = sleep => {
                    timed_out = true;
                    if let Some(p) = pgid { kill_group(p); }
                }
            }
        }
        let status = child.wait().await.ok();
        let code = status.and_then(|s| s.code());
        let elapsed = started.elapsed().as_millis() as i64;
        let end = match code {
            Some(0) if !timed_out => {
                json!({"type": "execution_complete", "execution_time": elapsed, "timestamp": now_ms()})
            }
            Some(n) if !timed_out => {
                let evalue = if evalue_text {
                    format!("exit status {n}")
                } else {
                    n.to_string()
                };
                json!({"type": "error", "error": {"ename": "CommandExecError", "evalue": evalue, "traceback": [format!("exit status {n}")]}, "timestamp": now_ms()})
            }
            _ => {
                let interrupted = lock(&inner2.commands)
                    .get(&cid)
                    .is_some_and(|c| c.interrupted);
                let signal = if interrupted && !timed_out {
                    "signal: terminated"
                } else {
                    "signal: killed"
                };
                json!({"type": "error", "error": {"ename": "CommandExecError", "evalue": "-1", "traceback": [signal]}, "timestamp": now_ms()})
            }
        };
        finish(&inner2, &cid, code.filter(|_| !timed_out));
        emit!(end);
        if !detached {
            tokio::time::sleep(Duration::from_millis(grace)).await;
        }
        drop(tx);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}
/// Marks a command finished: `exit_code`, `finished_at`, and execd's `error` text.
fn finish(inner: &Inner, cid: &str, code: Option<i32>) {
    if let Some(c) = lock(&inner.commands).get_mut(cid) {
        c.running = false;
        c.finished_at = Some(Utc::now());
        c.exit_code = Some(code.unwrap_or(-1));
        c.error = match code {
            Some(0) => None,
            Some(n) => Some(format!("exit status {n}")),
            None if c.interrupted => Some("signal: terminated".to_owned()),
            None => Some("signal: killed".to_owned()),
        };
    }
}
/// `background: true`: the stream is init, ping, execution_complete at once (recorded); the
/// command runs on, its merged output kept for `/command/{id}/logs`.
fn background(inner: &Arc<Inner>, cid: String, mut child: tokio::process::Child) -> Response {
    let pipes = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    ];
    let mut readers = Vec::new();
    for pipe in pipes.into_iter().flatten() {
        let inner = inner.clone();
        let cid = cid.clone();
        readers.push(tokio::spawn(async move {
            let mut reader = BufReader::new(pipe);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Some(c) = lock(&inner.commands).get_mut(&cid) {
                    c.output.extend_from_slice(&line);
                }
            }
        }));
    }
    let inner2 = inner.clone();
    let cid2 = cid.clone();
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        for r in readers {
            let _ = r.await;
        }
        finish(&inner2, &cid2, status.and_then(|s| s.code()));
    });
    let ts = now_ms();
    let variant = inner.variant;
    let body: Vec<u8> = [
        json!({"type": "init", "text": cid, "timestamp": ts}),
        json!({"type": "ping", "text": "pong", "timestamp": ts}),
        json!({"type": "execution_complete", "execution_time": 1, "timestamp": now_ms()}),
    ]
    .iter()
    .flat_map(|v| frame(variant, v).to_vec())
    .collect();
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from(body))
        .unwrap()
}
