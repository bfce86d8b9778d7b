//! Exec: `POST /v1/sandboxes/{id}/exec` (collected, size-capped) and
//! `POST /v1/sandboxes/{id}/exec/stream` (SSE). Both go straight from this replica to the
//! pool's adapter (no bus hop) and count as activity; an idle sandbox is woken first.
//!
//! Streaming: the adapter writes `ExecEvent`s into a bounded channel (`STREAM_BUFFER`
//! chunks of at most 64 KiB); the SSE body takes one event at a time as hyper can write it,
//! so a slow reader fills the channel and the command blocks on its pipe: memory stays
//! bounded whatever the output size. A client that disconnects drops the body, which closes
//! the channel, which cancels the command on the backend. `: ping` comments every
//! `HEARTBEAT` keep proxies from closing a quiet stream. The only time limit is the request's
//! own `timeoutSeconds` (exit code 124).
//!
//! Collected exec uses the streaming path when the pool has `exec.stream`, so output is
//! binary-safe (`outputEncoding: "base64"`) and capped at `OUTPUT_CAP_BYTES` per stream with
//! `stdoutTruncated`/`stderrTruncated` set (the command still runs to completion). Without
//! `exec.stream` the adapter's own exec is used, and base64 output is refused (501) rather than
//! faked from lossy text.

use differently_adapters::metered::metered;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use differently_adapters::{AdapterError, ExecEvent};
use differently_core::exec::{ExecRequest, ExecResult, OutputEncoding};
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use futures::Stream;
use serde_json::json;
use tokio::sync::mpsc;

use crate::auth::Principal;
use crate::body::parse_json;
use crate::error::{ApiError, ApiResult};
use crate::lifecycle::{audit, load, ready_for_data};
use crate::AppState;

/// Output kept per stream by collected exec.
pub const OUTPUT_CAP_BYTES: usize = 1024 * 1024;
/// Chunks buffered between the adapter and the SSE body.
pub const STREAM_BUFFER: usize = 8;
/// Interval of `: ping` comments on a quiet stream.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec_stream))
}

fn parse_exec(body: &Bytes) -> ApiResult<ExecRequest> {
    let req: ExecRequest = parse_json(body)?;
    req.validate()
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    if let Some(b) = &req.stdin_base64 {
        if base64::engine::general_purpose::STANDARD.decode(b).is_err() {
            return Err(ApiError::field(
                ErrorCode::ValidationFailed,
                differently_core::FieldError::new("stdinBase64", "is not valid base64"),
            ));
        }
    }
    Ok(req)
}

/// Decodes UTF-8 across chunk boundaries: a character split between two chunks is held back
/// until its end arrives, so streamed text is never mangled at a boundary.
#[derive(Debug, Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let valid_up_to = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(valid_up_to);
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        out
    }

    fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

fn encode(enc: OutputEncoding, bytes: &[u8]) -> String {
    match enc {
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
    }
}

async fn exec(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<ExecResult>> {
    let req = parse_exec(&body)?;
    principal.require(Scope::SandboxesExec)?;
    let sandbox = load(&state, &principal, &id).await?;
    let (pool, at, sandbox) = ready_for_data(&state, &principal, sandbox, "exec").await?;
    tracing::info!(sandbox = %sandbox.id, program = req.program(), "exec");
    audit(
        &state,
        &principal,
        &sandbox,
        "sandbox.exec",
        json!({ "program": req.program() }),
    )
    .await?;
    let enc = req.output_encoding.unwrap_or_default();
    let streams = pool
        .adapter
        .capabilities()
        .iter()
        .any(|c| c == "exec.stream");
    if !streams {
        if enc == OutputEncoding::Base64 {
            return Err(ApiError::new(
                ErrorCode::UnsupportedOperation,
                "outputEncoding base64 needs a pool with exec.stream (binary-safe output)",
            ));
        }
        let call = pool.adapter.exec(&at, &req);
        return Ok(Json(metered(&pool.record.name, "exec", call).await?));
    }
    let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
    let adapter = pool.adapter.clone();
    let name = pool.record.name.clone();
    let run =
        async move { metered(&name, "exec_stream", adapter.exec_stream(&at, &req, tx)).await };
    let collect = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut out_cut, mut err_cut) = (false, false);
        while let Some(ev) = rx.recv().await {
            let (buf, cut, chunk) = match ev {
                ExecEvent::Stdout(c) => (&mut out, &mut out_cut, c),
                ExecEvent::Stderr(c) => (&mut err, &mut err_cut, c),
            };
            let room = OUTPUT_CAP_BYTES.saturating_sub(buf.len());
            buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if chunk.len() > room {
                *cut = true;
            }
        }
        (out, out_cut, err, err_cut)
    };
    let (exit, (out, out_cut, err, err_cut)) = tokio::join!(run, collect);
    let exit = exit?;
    Ok(Json(ExecResult {
        exit_code: exit.exit_code,
        stdout: encode(enc, &out),
        stderr: encode(enc, &err),
        stdout_truncated: out_cut,
        stderr_truncated: err_cut,
        duration_ms: exit.duration_ms,
    }))
}

/// What the SSE body is doing.
enum Phase {
    Streaming,
    Done,
}

struct StreamState {
    rx: mpsc::Receiver<ExecEvent>,
    task: Option<tokio::task::JoinHandle<Result<differently_adapters::ExecExit, AdapterError>>>,
    enc: OutputEncoding,
    out: Utf8Carry,
    err: Utf8Carry,
    phase: Phase,
    /// Tail events (flushed UTF-8 remainders, then exit or error) still to send.
    tail: Vec<Event>,
}

fn data_event(kind: &str, data: String) -> Event {
    Event::default()
        .event(kind)
        .data(json!({ "data": data }).to_string())
}

fn sse_events(st: StreamState) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.tail.pop() {
                return Some((Ok(ev), st));
            }
            if matches!(st.phase, Phase::Done) {
                return None;
            }
            match st.rx.recv().await {
                Some(ExecEvent::Stdout(b)) => {
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.out.push(&b),
                    };
                    if data.is_empty() {
                        continue;
                    }
                    return Some((Ok(data_event("stdout", data)), st));
                }
                Some(ExecEvent::Stderr(b)) => {
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.err.push(&b),
                    };
                    if data.is_empty() {
                        continue;
                    }
                    return Some((Ok(data_event("stderr", data)), st));
                }
                None => {
                    // The adapter dropped its sender: it has finished.
                    st.phase = Phase::Done;
                    let end = match st.task.take() {
                        Some(t) => t.await,
                        None => continue,
                    };
                    let last = match end {
                        Ok(Ok(exit)) => Event::default().event("exit").data(
                            json!({ "exitCode": exit.exit_code, "durationMs": exit.duration_ms })
                                .to_string(),
                        ),
                        Ok(Err(e)) => {
                            let api = ApiError::from(e);
                            Event::default().event("error").data(
                                json!({ "code": api.code, "message": api.message }).to_string(),
                            )
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "exec stream task failed");
                            Event::default().event("error").data(
                                json!({ "code": ErrorCode::Internal, "message": "internal error" })
                                    .to_string(),
                            )
                        }
                    };
                    // Popped from the back: the exit goes last.
                    st.tail.push(last);
                    let rest_err = st.err.finish();
                    if !rest_err.is_empty() {
                        st.tail.push(data_event("stderr", rest_err));
                    }
                    let rest_out = st.out.finish();
                    if !rest_out.is_empty() {
                        st.tail.push(data_event("stdout", rest_out));
                    }
                }
            }
        }
    })
}

async fn exec_stream(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req = parse_exec(&body)?;
    principal.require(Scope::SandboxesExec)?;
    let sandbox = load(&state, &principal, &id).await?;
    let (pool, at, sandbox) = ready_for_data(&state, &principal, sandbox, "exec.stream").await?;
    tracing::info!(sandbox = %sandbox.id, program = req.program(), "exec stream");
    audit(
        &state,
        &principal,
        &sandbox,
        "sandbox.exec_stream",
        json!({ "program": req.program() }),
    )
    .await?;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let adapter = pool.adapter.clone();
    let enc = req.output_encoding.unwrap_or_default();
    let name = pool.record.name.clone();
    let task = tokio::spawn(async move {
        metered(&name, "exec_stream", adapter.exec_stream(&at, &req, tx)).await
    });
    let st = StreamState {
        rx,
        task: Some(task),
        enc,
        out: Utf8Carry::default(),
        err: Utf8Carry::default(),
        phase: Phase::Streaming,
        tail: Vec::new(),
    };
    let sse =
        Sse::new(sse_events(st)).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("ping"));
    let mut resp = sse.into_response();
    // Ask buffering proxies (nginx) to pass events through as they come.
    resp.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_held_back() {
        let mut c = Utf8Carry::default();
        let snow = "☃".as_bytes(); // 3 bytes
        assert_eq!(c.push(&[b'a', snow[0]]), "a");
        assert_eq!(c.push(&snow[1..2]), "");
        assert_eq!(c.push(&[snow[2], b'b']), "☃b");
        // Invalid bytes are replaced, not held forever.
        assert_eq!(c.push(&[0xff, b'c']), "\u{fffd}c");
        assert_eq!(c.push(&[0xe2]), "");
        assert_eq!(c.finish(), "\u{fffd}");
    }
}
