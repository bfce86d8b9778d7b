//! `/v1/sandboxes/{id}/processes`: background processes (docs/processes.md). The handlers
//! check access and shape the answers; the supervisor ([`crate::processes`]) holds the
//! processes and routes a pid to the API process that supervises it. A start's answer
//! carries the new process as a response extension ([`crate::processes::follow::Attached`])
//! for in-process callers (the E2B facade) to follow without a second request.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use differently_adapters::ExecEvent;
use differently_core::exec::OutputEncoding;
use differently_core::process::{
    Process, ProcessStatus, SignalProcess, StartProcess, TerminalSize,
};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError, Sandbox};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::exec::{respond, wants_frames, Ending, Running, STREAM_BUFFER};
use crate::auth::access::load_sandbox;
use crate::auth::Principal;
use crate::control::mutation::audit;
use crate::error::{ApiError, ApiResult};
use crate::processes::ask::{Answer, Ask, READ_PAGE_BYTES};
use crate::processes::entry::{Ending as ProcessEnding, Stream};
use crate::processes::{self, ask_pid, parse_pid, refusal};
use crate::requests::body::parse_json;
use crate::requests::page::{bad_query, Page};
use crate::requests::query::StrictQuery;
use crate::AppState;

/// Largest stdin write accepted in one call.
pub const MAX_STDIN_BYTES: usize = 1 << 20;
/// How long one read of a followed stream waits for output before asking again.
const FOLLOW_WAIT_MS: u64 = 20_000;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/processes", post(start).get(list))
        .route(
            "/v1/sandboxes/{id}/processes/{pid}",
            get(get_one).delete(kill),
        )
        .route("/v1/sandboxes/{id}/processes/{pid}/output", get(output))
        .route(
            "/v1/sandboxes/{id}/processes/{pid}/stdin",
            post(stdin).delete(close_stdin),
        )
        .route("/v1/sandboxes/{id}/processes/{pid}/signal", post(signal))
        .route("/v1/sandboxes/{id}/processes/{pid}/resize", post(resize))
}

/// 403 unless the key may read processes (`sandboxes:read` or `sandboxes:exec`).
fn require_read(p: &Principal) -> ApiResult<()> {
    if p.has(Scope::SandboxesExec) {
        return Ok(());
    }
    p.require(Scope::SandboxesRead)
}

/// The caller's sandbox (404 for another tenant's) and the pid of the path.
async fn target(
    state: &AppState,
    p: &Principal,
    id: &str,
    raw_pid: &str,
) -> ApiResult<(Sandbox, u32)> {
    let sandbox = load_sandbox(state, p, id).await?;
    Ok((sandbox, parse_pid(raw_pid)?))
}

/// The process of `pid` in `sandbox`, or 404.
async fn one(state: &AppState, sandbox: &Sandbox, pid: u32) -> ApiResult<Process> {
    let ask = Ask::Get {
        sandbox: sandbox.id.to_string(),
        pid,
    };
    match ask_pid(state, pid, ask).await? {
        Answer::Process { process } => Ok(*process),
        other => Err(refusal(other, pid)),
    }
}

async fn start(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    p.require(Scope::SandboxesExec)?;
    let req: StartProcess = parse_json(&body)?;
    let (process, attached) = processes::start(&state, &p, &id, req).await?;
    let mut resp = (StatusCode::CREATED, Json(process)).into_response();
    // For an in-process caller that follows the output at once; never sent to a client.
    resp.extensions_mut().insert(attached);
    Ok(resp)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<ListQuery>,
) -> ApiResult<Json<Page<Process>>> {
    require_read(&p)?;
    let status = match q.status.as_deref() {
        None => None,
        Some(raw) => Some(
            serde_json::from_value::<ProcessStatus>(json!(raw)).map_err(|_| {
                ApiError::field(
                    ErrorCode::ValidationFailed,
                    FieldError::new("status", "must be running, exited or failed"),
                )
            })?,
        ),
    };
    let sandbox = load_sandbox(&state, &p, &id).await?;
    let mut items = processes::list(&state, sandbox.id.as_str()).await?;
    if let Some(s) = status {
        items.retain(|x| x.status == s);
    }
    // Every process is on one page: a sandbox has few (64 running per API process).
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

async fn get_one(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
) -> ApiResult<Json<Process>> {
    require_read(&p)?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    Ok(Json(one(&state, &sandbox, pid).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    from: Option<String>,
    follow: Option<String>,
}

async fn output(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
    StrictQuery(q): StrictQuery<OutputQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let from = match q.from.as_deref() {
        None => 0,
        Some(f) => f.parse::<u64>().map_err(|_| {
            bad_query(
                "from",
                format!("must be a byte offset between 0 and {}", u64::MAX),
            )
        })?,
    };
    let follow = match q.follow.as_deref() {
        None | Some("true") => true,
        Some("false") => false,
        Some(_) => return Err(bad_query("follow", "must be true or false")),
    };
    p.require(Scope::SandboxesExec)?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    // A pid that is not there is a 404 now, not an error event later.
    let now = one(&state, &sandbox, pid).await?;
    // Where the stream really starts: an offset before what is kept starts at the oldest kept
    // byte, one past the end at the end. SSE ids count from it; frames clients read it here.
    let from = from.clamp(now.output_dropped, now.output_bytes);
    let run = relay(state, sandbox.id.to_string(), pid, from, follow);
    let binary = wants_frames(&headers);
    let mut resp = respond(run, binary, OutputEncoding::Utf8, Some(from));
    resp.headers_mut()
        .insert(OUTPUT_FROM, HeaderValue::from(from));
    Ok(resp)
}

/// The response header that says at which byte offset of the whole output a stream starts.
pub const OUTPUT_FROM: HeaderName = HeaderName::from_static("differently-output-from");

/// A run whose output is read from the process's supervisor (here or over the bus), page by
/// page, from `from`; it ends with the process's end, or (not following) once what is kept
/// now has been sent. The reader's pace never reaches the process: a slow one falls behind.
fn relay(state: AppState, sandbox: String, pid: u32, from: u64, follow: bool) -> Running {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let (end_tx, end_rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut at = from;
        let ending = loop {
            let ask = Ask::Read {
                sandbox: sandbox.clone(),
                pid,
                from: at,
                max: READ_PAGE_BYTES,
                wait_ms: if follow { FOLLOW_WAIT_MS } else { 0 },
            };
            match ask_pid(&state, pid, ask).await {
                Ok(Answer::Output {
                    chunks,
                    next,
                    ending,
                }) => {
                    let empty = chunks.is_empty();
                    if let Some(first) = chunks.first().filter(|c| c.at > at) {
                        // The reader fell behind by more than what is kept: say so rather
                        // than skip, so every offset the client holds stays true.
                        let message = format!(
                            "output from byte {at} to {} was dropped before it was read (the \
                             reader fell behind by more than the output kept); attach again \
                             from {}",
                            first.at, first.at
                        );
                        break Some(Ending::error(ErrorCode::Conflict.as_str(), &message));
                    }
                    for c in chunks {
                        let bytes = Bytes::from(c.bytes);
                        let event = match c.stream {
                            Stream::Stdout => ExecEvent::Stdout(bytes),
                            Stream::Stderr => ExecEvent::Stderr(bytes),
                        };
                        if tx.send(event).await.is_err() {
                            return; // the client went away: detached
                        }
                    }
                    at = next;
                    match ending {
                        Some(ProcessEnding::Exit {
                            exit_code,
                            duration_ms,
                        }) => break Some(Ending::exit(exit_code, duration_ms)),
                        Some(ProcessEnding::Error { code, message }) => {
                            break Some(Ending::error(&code, &message))
                        }
                        None if empty && !follow => break None,
                        None => {}
                    }
                }
                Ok(Answer::NotFound) => break Some(Ending::error(
                    ErrorCode::NotFound.as_str(),
                    "the process is gone (its supervising API process ended, or it was forgotten)",
                )),
                Ok(other) => {
                    let e = refusal(other, pid);
                    break Some(Ending::error(e.code.as_str(), &e.message));
                }
                Err(e) => break Some(Ending::error(e.code.as_str(), &e.message)),
            }
        };
        drop(tx);
        let _ = end_tx.send(ending);
    });
    Running::relay(rx, end_rx)
}

/// Answers `ask` about `pid` with 204, or the refusal.
async fn act(state: &AppState, pid: u32, ask: Ask) -> ApiResult<StatusCode> {
    match ask_pid(state, pid, ask).await? {
        Answer::Done => Ok(StatusCode::NO_CONTENT),
        other => Err(refusal(other, pid)),
    }
}

async fn stdin(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesExec)?;
    if body.len() > MAX_STDIN_BYTES {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("at most {MAX_STDIN_BYTES} bytes of stdin per call"),
        ));
    }
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    state
        .activity
        .record(&state.store, &sandbox.id, chrono::Utc::now());
    let ask = Ask::Stdin {
        sandbox: sandbox.id.to_string(),
        pid,
        bytes: body.to_vec(),
    };
    act(&state, pid, ask).await
}

async fn close_stdin(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesExec)?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    let ask = Ask::CloseStdin {
        sandbox: sandbox.id.to_string(),
        pid,
    };
    act(&state, pid, ask).await
}

/// Sends `signal` to `pid`, recorded in the audit log first (fail closed).
async fn send_signal(
    state: &AppState,
    p: &Principal,
    sandbox: &Sandbox,
    pid: u32,
    signal: differently_core::process::ProcessSignal,
) -> ApiResult<StatusCode> {
    // A pid that is not there is a 404, with nothing recorded.
    one(state, sandbox, pid).await?;
    audit(
        state,
        p,
        sandbox,
        "sandbox.process.signal",
        json!({ "pid": pid, "signal": signal.name() }),
    )
    .await?;
    let ask = Ask::Signal {
        sandbox: sandbox.id.to_string(),
        pid,
        signal,
    };
    act(state, pid, ask).await
}

async fn signal(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesExec)?;
    let req: SignalProcess = parse_json(&body)?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    send_signal(&state, &p, &sandbox, pid, req.signal).await
}

async fn kill(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesExec)?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    let kill = differently_core::process::ProcessSignal::Kill;
    send_signal(&state, &p, &sandbox, pid, kill).await
}

async fn resize(
    State(state): State<AppState>,
    p: Principal,
    Path((id, raw_pid)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesExec)?;
    let size: TerminalSize = parse_json(&body)?;
    size.validate("").map_err(|mut e| {
        e.field = e.field.trim_start_matches('.').to_owned();
        ApiError::field(ErrorCode::ValidationFailed, e)
    })?;
    let (sandbox, pid) = target(&state, &p, &id, &raw_pid).await?;
    let ask = Ask::Resize {
        sandbox: sandbox.id.to_string(),
        pid,
        size,
    };
    act(&state, pid, ask).await
}
