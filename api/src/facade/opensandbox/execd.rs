//! OpenSandbox's execd API served per sandbox at `/opensandbox/execd/{id}/...`: ping and
//! commands. Every call is authorised by the endpoint's token (or, in server-proxy mode, the
//! API key) and runs as a `/v1` call of the key the token names. Commands are `/v1` processes
//! ([`commands`]).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::routes::exec::frames::{FrameDecoder, FrameType};

use super::commands;
use super::error::{OsbError, OsbResult};
use super::inner::Caller;
use super::lifecycle::live_sandbox;
use super::mapping::Asked;
use super::token;
use super::Facade;

/// The caller of an execd request: the token's key, or the API key (server-proxy mode).
pub fn execd_caller(f: &Facade, headers: &HeaderMap, sandbox_id: &str) -> OsbResult<Caller> {
    if let Some(t) = headers.get(token::HEADER).and_then(|v| v.to_str().ok()) {
        let claims = f
            .sealer
            .open(t.trim(), sandbox_id, chrono::Utc::now().timestamp())
            .map_err(|e| OsbError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", e.to_string()))?;
        return Ok(Caller::Delegated(claims.key_id));
    }
    match Caller::from_headers(headers) {
        Caller::Anonymous => Err(OsbError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            format!(
                "missing {}: use the headers of GET /v1/sandboxes/{{id}}/endpoints/44772",
                token::HEADER
            ),
        )),
        c => Ok(c),
    }
}

/// `GET /ping`: 200 once the sandbox runs; 409 while it is queued or starting (the SDK keeps
/// polling on anything but 401/403, and a 409 is not retried with backoff by its transport).
pub async fn ping(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let sbx = live_sandbox(&f, &caller, &id).await?;
    match sbx["status"].as_str() {
        Some("running") => Ok(StatusCode::OK),
        other => Err(OsbError::new(
            StatusCode::CONFLICT,
            "SANDBOX_NOT_READY",
            format!(
                "sandbox is {}{}",
                other.unwrap_or("unknown"),
                sbx["statusReason"]
                    .as_str()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ),
        )),
    }
}

/// `POST /command` body (execd's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunCommand {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    /// Milliseconds.
    timeout: Option<u64>,
    uid: Option<u32>,
    gid: Option<u32>,
    envs: Option<std::collections::BTreeMap<String, String>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One execd stream frame: bare JSON and a blank line, as execd sends (the SDK accepts both
/// this and `data:` SSE).
fn frame(mut ev: Value) -> Bytes {
    ev["timestamp"] = json!(now_ms());
    let mut s = ev.to_string();
    s.push_str("\n\n");
    Bytes::from(s)
}

/// Splits output into execd's per-line events (newline stripped, empty lines dropped).
#[derive(Default)]
struct Lines {
    carry: Vec<u8>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.carry.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(n) = self.carry.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.carry.drain(..=n).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            let text = text.strip_suffix('\r').unwrap_or(&text);
            if !text.is_empty() {
                out.push(text.to_owned());
            }
        }
        out
    }

    fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.carry);
        let t = String::from_utf8_lossy(&rest).into_owned();
        (!t.is_empty()).then_some(t)
    }
}

/// How the Python SDK's `commands.set_env` script begins (1.1.1). It appends `KEY=VALUE` to
/// the sandbox env file `$EXECD_ENVS` names, which real execd sets and loads for every
/// command and session. `/v1` processes take their env per call and no file is loaded, so
/// the script would fail inside the sandbox with the SDK's own "EXECD_ENVS is not set".
const SET_ENV_SCRIPT: &str = r#"if [ -z "${EXECD_ENVS:-}" ]; then "#;
/// What the script appends with, to tell it from a command that merely tests the variable.
const SET_ENV_APPEND: &str = r#">> "$EXECD_ENVS""#;

/// Whether `command` is the SDKs' `commands.set_env` script.
fn is_set_env(command: &str) -> bool {
    command.starts_with(SET_ENV_SCRIPT) && command.contains(SET_ENV_APPEND)
}

/// The `/v1` process body of an execd command, and its tag.
fn exec_body(req: &RunCommand) -> OsbResult<(Value, &'static str)> {
    if req.uid.is_some() || req.gid.is_some() {
        return Err(OsbError::field(
            if req.uid.is_some() { "uid" } else { "gid" },
            "running as another user is not supported by the Differently facade",
        ));
    }
    if req.command.as_deref().is_some_and(is_set_env) {
        return Err(OsbError::new(
            StatusCode::NOT_IMPLEMENTED,
            "NOT_SUPPORTED",
            "commands.set_env (the sandbox env file EXECD_ENVS) is not supported by the \
             Differently facade: give env when creating the sandbox, or envs per command",
        ));
    }
    let (argv, tag) = match (&req.command, &req.argv) {
        (Some(c), None) => (
            vec!["/bin/sh".to_owned(), "-c".to_owned(), c.clone()],
            commands::TAG_COMMAND,
        ),
        (None, Some(a)) if !a.is_empty() => (a.clone(), commands::TAG_ARGV),
        (None, Some(_)) => return Err(OsbError::field("argv", "must name a program")),
        (Some(_), Some(_)) => {
            return Err(OsbError::field("command", "give command or argv, not both"))
        }
        (None, None) => return Err(OsbError::field("command", "required")),
    };
    let mut body = json!({ "command": argv });
    if let Some(env) = &req.envs {
        body["env"] = json!(env);
    }
    if let Some(cwd) = &req.cwd {
        body["cwd"] = json!(cwd);
    }
    if let Some(ms) = req.timeout.filter(|ms| *ms > 0) {
        body["timeoutSeconds"] = json!(ms.div_ceil(1000));
    }
    Ok((body, tag))
}

/// `POST /command` → 200 event stream. Unlike execd, the stream ends at the terminal event
/// (no 1 s grace hold).
pub async fn run_command(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req: RunCommand = crate::requests::body::read(&body)
        .map_err(|e| OsbError::json("INVALID_REQUEST_BODY", e))?;
    let (v1_body, tag) = exec_body(&req)?;
    stream_exec(&f, &caller, &id, v1_body, tag, req.background).await
}

/// Starts `v1_body` as a `/v1` process of sandbox `id` tagged `tag` and answers execd's event
/// stream for it: `init` with the command id (the pid) first; a background command answers
/// `execution_complete` at once (its output is read with `/command/{id}/logs`), a foreground
/// one streams its output until it ends. Commands and session runs share it, so both have
/// status, logs and interrupt, through any API process.
pub(super) async fn stream_exec(
    f: &Arc<Facade>,
    caller: &Caller,
    id: &str,
    mut v1_body: Value,
    tag: &str,
    background: bool,
) -> OsbResult<Response> {
    v1_body["tag"] = json!(tag);
    let process = commands::start(f, caller, id, &v1_body)
        .await
        .map_err(|e| e.named_for(Asked::Command))?;
    let cmd_id = commands::command_id(process.pid);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let _ = tx.try_send(frame(json!({ "type": "init", "text": cmd_id })));
    if background {
        let _ = tx.try_send(frame(
            json!({ "type": "execution_complete", "execution_time": 0 }),
        ));
    } else {
        let mut guard = KillUnlessEnded {
            f: f.clone(),
            caller: caller.clone(),
            sandbox: id.to_owned(),
            cmd: cmd_id.clone(),
            ended: false,
        };
        let body = commands::output(f, caller, id, &cmd_id, 0, true).await?;
        tokio::spawn(async move {
            pump(body, tx, &mut guard).await;
        });
    }
    let stream = tokio_stream_of(rx);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(resp)
}

fn tokio_stream_of(
    rx: mpsc::Receiver<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

/// Kills a foreground command whose stream ends before the command does (the client went
/// away, or its output stream broke): a foreground command lives as long as its request, as
/// a streamed `/v1` exec does, and is not left running unwatched.
struct KillUnlessEnded {
    f: Arc<Facade>,
    caller: Caller,
    sandbox: String,
    cmd: String,
    ended: bool,
}

impl Drop for KillUnlessEnded {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (f, caller) = (self.f.clone(), self.caller.clone());
        let (sandbox, cmd) = (
            std::mem::take(&mut self.sandbox),
            std::mem::take(&mut self.cmd),
        );
        runtime.spawn(async move {
            if let Err(e) = commands::interrupt(&f, &caller, &sandbox, &cmd).await {
                tracing::warn!(command = %cmd, code = %e.code, "opensandbox facade: cannot end an abandoned command");
            }
        });
    }
}

/// The execd event for how a foreground command ended.
fn exit_event(code: i64, ms: u64) -> Value {
    match commands::execd_ending(code) {
        (0, _) => json!({"type":"execution_complete","execution_time": ms}),
        (c, why) => json!({"type":"error","error":{"ename":"CommandExecError",
            "evalue": c.to_string(),"traceback":[why.unwrap_or_default()]}}),
    }
}

fn stream_error(msg: &str) -> Value {
    json!({"type":"error","error":{"ename":"StreamError","evalue": msg,"traceback":[]}})
}

/// Reads the `/v1` output frames of a foreground command and writes execd events, `ping`
/// every 3 s on a quiet command, and the terminal event. Returns early (the guard then kills
/// the command) when the client is gone.
async fn pump(body: Body, tx: mpsc::Sender<Bytes>, guard: &mut KillUnlessEnded) {
    let mut dec = FrameDecoder::default();
    let mut data = body.into_data_stream();
    let (mut out, mut err) = (Lines::default(), Lines::default());
    let started = std::time::Instant::now();
    let mut ping = tokio::time::interval(Duration::from_secs(3));
    ping.tick().await;
    let send = |ev: Value| {
        let tx = tx.clone();
        async move { tx.send(frame(ev)).await.is_ok() }
    };
    let last: Value = 'outer: loop {
        let chunk = tokio::select! {
            c = data.next() => c,
            // The client went away: noticed at once, not at the next event.
            () = tx.closed() => return,
            _ = ping.tick() => {
                if !send(json!({"type":"ping","text":"pong"})).await { return; }
                continue;
            }
        };
        let Some(Ok(chunk)) = chunk else {
            break stream_error("the command's stream ended early");
        };
        let frames = match dec.push(&chunk) {
            Ok(fr) => fr,
            Err(e) => {
                tracing::warn!(error = %e, "opensandbox facade: bad output frame");
                break stream_error("bad exec stream");
            }
        };
        for fr in frames {
            let (kind, payload) = (fr.kind, fr.payload);
            match kind {
                FrameType::Stdout | FrameType::Stderr => {
                    let (lines, name) = if kind == FrameType::Stdout {
                        (out.push(&payload), "stdout")
                    } else {
                        (err.push(&payload), "stderr")
                    };
                    for l in lines {
                        if !send(json!({"type": name, "text": l})).await {
                            return;
                        }
                    }
                }
                FrameType::Exit => {
                    guard.ended = true;
                    let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                    let code = v["exitCode"].as_i64().unwrap_or(-1);
                    let ms = v["durationMs"]
                        .as_u64()
                        .unwrap_or(started.elapsed().as_millis() as u64);
                    break 'outer exit_event(code, ms);
                }
                FrameType::Error => {
                    guard.ended = true;
                    let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                    let msg = v["message"].as_str().unwrap_or("command failed");
                    break 'outer json!({"type":"error","error":
                        {"ename": v["code"].as_str().unwrap_or("Error"), "evalue": msg, "traceback": []}});
                }
                FrameType::Heartbeat => {}
            }
        }
    };
    drop(data);
    for (lines, name) in [(&mut out, "stdout"), (&mut err, "stderr")] {
        if let Some(l) = lines.finish() {
            send(json!({"type": name, "text": l})).await;
        }
    }
    send(last).await;
}

#[derive(Debug, Deserialize)]
pub struct IdQuery {
    id: Option<String>,
}

/// `DELETE /command?id=`: interrupts a command (`KILL`), whichever API process runs it.
pub async fn interrupt(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(qr): Query<IdQuery>,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    live_sandbox(&f, &caller, &id).await?;
    let cmd = qr
        .id
        .ok_or_else(|| OsbError::new(StatusCode::BAD_REQUEST, "MISSING_QUERY", "id is required"))?;
    commands::interrupt(&f, &caller, &id, &cmd).await?;
    Ok(StatusCode::OK)
}

/// `GET /command/status/{cmd}`, whichever API process runs the command.
pub async fn status(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path((id, cmd)): Path<(String, String)>,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    live_sandbox(&f, &caller, &id).await?;
    let p = commands::get(&f, &caller, &id, &cmd).await?;
    Ok(Json(commands::status_of(&p)))
}

#[derive(Debug, Deserialize)]
pub struct CursorQuery {
    cursor: Option<String>,
}

/// `GET /command/{cmd}/logs?cursor=`: output (stdout and stderr merged) from a byte offset,
/// at most `commands::LOG_PAGE_BYTES` per answer; the next offset in
/// `EXECD-COMMANDS-TAIL-CURSOR`.
pub async fn logs(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path((id, cmd)): Path<(String, String)>,
    Query(qr): Query<CursorQuery>,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    live_sandbox(&f, &caller, &id).await?;
    let from: u64 = match qr.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => 0,
        Some(c) => c.parse().map_err(|_| {
            OsbError::field("cursor", "must be the value of EXECD-COMMANDS-TAIL-CURSOR")
        })?,
    };
    let (text, next) = commands::logs_page(&f, &caller, &id, &cmd, from).await?;
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&next.to_string()) {
        resp.headers_mut().insert("execd-commands-tail-cursor", v);
    }
    Ok(resp)
}

/// Routes of execd the facade does not serve: 501 `NOT_SUPPORTED`.
pub async fn unsupported(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(params): Path<Vec<(String, String)>>,
    uri: axum::http::Uri,
) -> OsbResult<StatusCode> {
    let id = params
        .iter()
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    execd_caller(&f, &headers, &id)?;
    let path = uri.path();
    let what = path
        .split_once(&format!("/execd/{id}"))
        .map(|(_, rest)| rest)
        .unwrap_or(path);
    Err(OsbError::not_supported(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_becomes_execd_lines() {
        let mut l = Lines::default();
        assert_eq!(l.push(b"a\n\nb"), vec!["a"]);
        assert_eq!(l.push(b"c\r\nd"), vec!["bc"]);
        assert_eq!(l.finish().as_deref(), Some("d"));
        assert_eq!(l.finish(), None);
    }

    #[test]
    fn commands_map_onto_v1_exec() {
        let r: RunCommand =
            serde_json::from_value(json!({"command":"echo $K","envs":{"K":"V"},"timeout":1500}))
                .unwrap();
        let (b, tag) = exec_body(&r).unwrap();
        assert_eq!(
            b,
            json!({"command":["/bin/sh","-c","echo $K"],"env":{"K":"V"},"timeoutSeconds":2})
        );
        assert_eq!(tag, commands::TAG_COMMAND);
        let r: RunCommand = serde_json::from_value(json!({"command":"id","uid":0})).unwrap();
        assert_eq!(exec_body(&r).unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_sdks_set_env_script_is_refused_and_other_commands_are_not() {
        // `opensandbox.adapters.converter.env_entry.build_set_env_command("A", "B")`, 1.1.1.
        let script = r#"if [ -z "${EXECD_ENVS:-}" ]; then printf '%s\n' 'EXECD_ENVS is not set; cannot persist environment variable A' >&2; exit 1; fi
mkdir -p "$(dirname "$EXECD_ENVS")"
printf '%s\n' 'A='\''B'\''' >> "$EXECD_ENVS""#;
        let r: RunCommand = serde_json::from_value(json!({ "command": script })).unwrap();
        let e = exec_body(&r).unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(e.code, "NOT_SUPPORTED");
        assert!(e.message.starts_with("commands.set_env"), "{}", e.message);
        for fine in [
            "echo $EXECD_ENVS",
            r#"if [ -z "${EXECD_ENVS:-}" ]; then echo none; fi"#,
        ] {
            let r: RunCommand = serde_json::from_value(json!({ "command": fine })).unwrap();
            assert!(exec_body(&r).is_ok(), "{fine}");
        }
    }
}
