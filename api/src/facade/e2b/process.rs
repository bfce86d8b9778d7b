//! envd's `process.Process` service: `Start` for commands, over `/v1`'s streamed exec.
//!
//! `Start` answers the start event (with a pid of the facade's) first, the command's output
//! as it arrives (base64, stdout and stderr as produced), keepalives after
//! `Keepalive-Ping-Interval` seconds of silence, and the end event with the exit code, then
//! the end envelope. `Connect-Timeout-Ms` is the command's deadline: at it the command is
//! cancelled and the stream ends with `deadline_exceeded`. The client hanging up cancels the
//! command (E2B's envd keeps it running: the facade has no process outliving its stream).
//!
//! Every other RPC (`Connect`, `List`, `SendInput`, `StreamInput`, `CloseStdin`,
//! `SendSignal`, `Update`) needs processes that outlive a stream, which `/v1` does not have
//! yet: they answer `unimplemented`, saying so. So does a PTY `Start`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::facade::opensandbox::inner::{q, read_all};
use crate::routes::exec::frames::{FrameDecoder, FrameType, MEDIA_TYPE};

use super::connect::{self, ConnectError};
use super::envd::{ctx, Ctx, EnvdError};
use super::Facade;

/// Largest `Start` request accepted.
const MAX_REQUEST: usize = 1 << 20;
/// Keepalive interval when the request names none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// `/v1` exec's longest timeout.
const MAX_EXEC_SECONDS: u64 = 86_400;

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Value>,
    #[serde(default)]
    stdin: bool,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The `/v1` exec body of a `Start`.
fn exec_body(c: &Ctx, p: &ProcessConfig, deadline: Option<Duration>) -> Value {
    let mut argv = vec![p.cmd.clone()];
    argv.extend(p.args.iter().cloned());
    // envd's order: the user's HOME, USER and LOGNAME, then the sandbox's env (applied by the
    // backend), then the request's.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("HOME".into(), c.home.clone());
    env.insert("USER".into(), c.user.clone());
    env.insert("LOGNAME".into(), c.user.clone());
    env.extend(p.envs.clone());
    let cwd = c.resolve(p.cwd.as_deref().unwrap_or(""));
    let mut body = json!({ "command": argv, "env": env, "cwd": cwd });
    if let Some(d) = deadline {
        // A backstop a second past the facade's own deadline, which ends the stream first.
        let secs = (d.as_millis().div_ceil(1000) as u64 + 1).clamp(1, MAX_EXEC_SECONDS);
        body["timeoutSeconds"] = json!(secs);
    }
    body
}

/// A Connect stream answer fed by `rx`.
pub(super) fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
    );
    r
}

/// A stream holding only the end envelope with `e` (how Connect answers an error found before
/// anything was sent).
pub(super) fn failed_stream(e: &ConnectError) -> Response {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(connect::end(Some(e)));
    stream_response(rx)
}

/// The caller's context and the decoded JSON body of a server-streaming call, or the answer
/// to give instead: envd's error before the stream opens (the caller), a stream's end envelope
/// after (a body over `limit.0` bytes, answered with `limit.1`; one that does not decode,
/// naming `field`).
pub(super) async fn stream_call<T: serde::de::DeserializeOwned>(
    f: &Facade,
    headers: &HeaderMap,
    body: Body,
    limit: (usize, &str),
    field: &str,
) -> Result<(Ctx, T), Response> {
    let c = ctx(f, headers, None).map_err(IntoResponse::into_response)?;
    let Ok(body) = axum::body::to_bytes(body, limit.0).await else {
        return Err(failed_stream(&ConnectError::new(
            "resource_exhausted",
            limit.1,
        )));
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    connect::request(ct, &body)
        .and_then(|v| serde_json::from_value(v).map_err(|e| ConnectError::field(field, e)))
        .map(|req| (c, req))
        .map_err(|e| failed_stream(&e))
}

/// `POST /process.Process/Start`.
pub async fn start(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (c, req): (_, StartRequest) = match stream_call(
        &f,
        &headers,
        body,
        (MAX_REQUEST, "the Start request is over 1 MiB"),
        "process",
    )
    .await
    {
        Ok(x) => x,
        Err(answer) => return answer,
    };
    if req.pty.as_ref().is_some_and(|p| !p.is_null()) {
        return failed_stream(&ConnectError::unimplemented(
            "PTY processes",
            "terminals need processes that outlive a stream, which /v1 exec does not have yet",
        ));
    }
    // `stdin: true` asks to keep stdin open for SendInput, which is not served: the command
    // gets an empty stdin either way.
    let _ = req.stdin;
    let deadline = header_u64(&headers, "connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let keepalive = header_u64(&headers, "keepalive-ping-interval")
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE);
    let started = Instant::now();
    let v1_body = exec_body(&c, &req.process, deadline);
    let inner =
        f.v1.call(
            &c.caller,
            Method::POST,
            &format!("/v1/sandboxes/{}/exec/stream", q(&c.sandbox)),
            &[
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (header::ACCEPT, HeaderValue::from_static(MEDIA_TYPE)),
            ],
            Body::from(v1_body.to_string()),
        )
        .await;
    let inner = match inner {
        Ok(r) => r,
        Err(e) => return failed_stream(&ConnectError::new("internal", e.message)),
    };
    let status = inner.status();
    if !status.is_success() {
        let bytes = read_all(inner).await.unwrap_or_default();
        return match EnvdError::from_v1(&c.sandbox, status, &bytes) {
            EnvdError::Rpc(e) => failed_stream(&e),
            gone => gone.into_response(),
        };
    }
    let pid = f.next_pid.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let _ = tx.try_send(connect::message(
        &json!({ "event": { "start": { "pid": pid } } }),
    ));
    let deadline_at = deadline.map(|d| started + d);
    tokio::spawn(pump(inner.into_body(), tx, keepalive, deadline_at));
    stream_response(rx)
}

/// How a command's stream ended.
enum Ending {
    Exit(i64),
    Failed(ConnectError),
}

/// Reads `/v1`'s binary frames and writes envd's events. Returns when the stream ends or
/// the client goes (dropping the inner body then cancels the command).
async fn pump(body: Body, tx: mpsc::Sender<Bytes>, keepalive: Duration, deadline: Option<Instant>) {
    let mut dec = FrameDecoder::default();
    let mut data = body.into_data_stream();
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut quiet_since = Instant::now();
    let far = Instant::now() + Duration::from_secs(10 * 365 * 86_400);
    let ending = 'outer: loop {
        let wake = (quiet_since + keepalive).min(deadline.unwrap_or(far));
        let chunk = tokio::select! {
            c = data.next() => c,
            _ = tokio::time::sleep_until(wake) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break Ending::Failed(ConnectError::new(
                        "deadline_exceeded",
                        "the command ran past its deadline (Connect-Timeout-Ms) and was cancelled",
                    ));
                }
                let ka = connect::message(&json!({ "event": { "keepalive": {} } }));
                if tx.send(ka).await.is_err() {
                    return;
                }
                quiet_since = Instant::now();
                continue;
            }
        };
        let Some(Ok(chunk)) = chunk else {
            break Ending::Failed(ConnectError::new(
                "unavailable",
                "the command's stream ended before its exit",
            ));
        };
        let frames = match dec.push(&chunk) {
            Ok(fr) => fr,
            Err(e) => break Ending::Failed(ConnectError::internal(format!("exec frames: {e}"))),
        };
        for fr in frames {
            match fr.kind {
                FrameType::Stdout | FrameType::Stderr => {
                    let name = if fr.kind == FrameType::Stdout {
                        "stdout"
                    } else {
                        "stderr"
                    };
                    let ev = json!({ "event": { "data": { name: b64.encode(&fr.payload) } } });
                    if tx.send(connect::message(&ev)).await.is_err() {
                        return;
                    }
                    quiet_since = Instant::now();
                }
                FrameType::Exit => {
                    let v: Value = serde_json::from_slice(&fr.payload).unwrap_or(Value::Null);
                    break 'outer Ending::Exit(v["exitCode"].as_i64().unwrap_or(-1));
                }
                FrameType::Error => {
                    let v: Value = serde_json::from_slice(&fr.payload).unwrap_or(Value::Null);
                    let code = ConnectError::code_of_v1(v["code"].as_str().unwrap_or(""));
                    let msg = v["message"].as_str().unwrap_or("the command failed");
                    break 'outer Ending::Failed(ConnectError::new(code, msg));
                }
                FrameType::Heartbeat => {}
            }
        }
    };
    drop(data);
    match ending {
        Ending::Exit(code) => {
            let mut end = json!({ "exited": true, "status": format!("exit status {code}") });
            if code != 0 {
                end["exitCode"] = json!(code);
                end["error"] = json!(format!("exit status {code}"));
            }
            let _ = tx
                .send(connect::message(&json!({ "event": { "end": end } })))
                .await;
            let _ = tx.send(connect::end(None)).await;
        }
        Ending::Failed(e) => {
            let _ = tx.send(connect::end(Some(&e))).await;
        }
    }
}

/// Every other `process.Process` RPC.
pub async fn unsupported(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(method): Path<String>,
) -> Response {
    if let Err(e) = ctx(&f, &headers, None) {
        return e.into_response();
    }
    let e = ConnectError::unimplemented(
        &format!("process.Process/{method}"),
        "background processes (pids that outlive their stream, input, reattach, list, \
         signals) need a /v1 processes resource that does not exist yet; run commands in \
         the foreground",
    );
    let streaming = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with(connect::STREAM_CONTENT_TYPE));
    if streaming {
        let mut r = failed_stream(&e);
        *r.status_mut() = StatusCode::OK;
        r
    } else {
        e.into_response()
    }
}
