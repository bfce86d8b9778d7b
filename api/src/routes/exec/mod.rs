//! Exec: `POST /v1/sandboxes/{id}/exec` (collected, size-capped) and
//! `POST /v1/sandboxes/{id}/exec/stream` (SSE, or binary frames on request). Both go straight
//! from this replica to the pool's adapter (no bus hop) and count as activity; an idle sandbox
//! is woken first.
//!
//! Streaming: the adapter writes `ExecEvent`s into a bounded channel (`STREAM_BUFFER`
//! chunks of at most 64 KiB); the body takes events as hyper can write them, so a slow reader
//! fills the channel and the command blocks on its pipe: memory stays bounded whatever the
//! output size. Each body chunk (one HTTP chunk on the wire) carries the event that woke the
//! body plus whatever further output is already queued, up to `COALESCE_LIMIT` bytes: a
//! command writing 4 KiB at a time reaches the client in pieces as large as the client's own
//! pace allows, and a single line is still sent the moment it arrives (the body never waits
//! for more). A client that disconnects drops the body, which closes
//! the channel, which cancels the command on the backend. The only time limit is the request's
//! own `timeoutSeconds` (exit code 124).
//!
//! Two response formats share that run ([`Running`]) and differ only in how an event becomes
//! body bytes. SSE (the default) carries each chunk as a JSON string (UTF-8 text or base64)
//! with `: ping` comments every `HEARTBEAT`. `Accept: application/vnd.differently.exec-stream`
//! selects length-prefixed binary frames ([`frames`]): raw bytes with no escaping on either
//! side, for clients that want throughput or exact bytes; heartbeat frames replace the pings.
//!
//! Collected exec uses the streaming path when the pool has `exec.stream`, so output is
//! binary-safe (`outputEncoding: "base64"`) and capped at `OUTPUT_CAP_BYTES` per stream with
//! `stdoutTruncated`/`stderrTruncated` set (the command still runs to completion). Without
//! `exec.stream` the adapter's own exec is used, and base64 output is refused (501) rather than
//! faked from lossy text.

pub mod frames;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;
use bytes::BytesMut;
use differently_adapters::exec_output::CollectedOutput;
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::pools::Pool;
use differently_adapters::{AdapterError, ExecEvent, ExecExit, InstanceRef};
use differently_core::exec::{ExecRequest, ExecResult, OutputEncoding};
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use differently_store::audit::StagedAudit;
use futures::Stream;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use frames::FrameType;

use crate::auth::Principal;
use crate::body::parse_json_allowing_nul;
use crate::data_events::{CallEvents, ExecEvents};
use crate::data_plane::{commit_detached, early_call, open_read_call, while_committing};
use crate::error::{ApiError, ApiResult};
use crate::sse::HEARTBEAT;
use crate::AppState;

/// Output kept per stream by collected exec.
pub use differently_core::exec::OUTPUT_CAP_BYTES;
/// Chunks buffered between the adapter and the response body.
pub const STREAM_BUFFER: usize = 8;
/// Output bytes past which a body chunk stops taking in further queued events (one more
/// event of at most 64 KiB may still join it).
pub const COALESCE_LIMIT: usize = 256 * 1024;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec_stream))
}

/// An exec body as both exec handlers read it (strict JSON, NUL allowed only in `stdin`,
/// the request's own checks, `stdinBase64` decodable); public for the fuzzers.
pub fn parse_exec(body: &Bytes) -> ApiResult<ExecRequest> {
    let req: ExecRequest = parse_json_allowing_nul(body, &["stdin"])?;
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
    principal.require(Scope::SandboxesExec)?;
    let req = parse_exec(&body)?;
    let detail = json!({ "program": req.program() });
    let enc = req.output_encoding.unwrap_or_default();
    if let Some(early) = early_call(
        &state,
        &principal,
        &id,
        "exec",
        "sandbox.exec",
        detail.clone(),
    )? {
        let stage = early.stage(&state);
        let (pool, at) = (&early.pool, &early.at);
        let req = with_base_env(&req, &early.env);
        if let Some(answer) = run_exec(&state, &principal, pool, at, &req, enc, stage).await? {
            return Ok(Json(answer));
        }
        // The row moved since: nothing was sent; read it like any other call.
    }
    let (pool, at, record, env) =
        open_read_call(&state, &principal, &id, "exec", "sandbox.exec", detail).await?;
    let staged = std::future::ready(Ok(Some(record)));
    let req = with_base_env(&req, &env);
    run_exec(&state, &principal, &pool, &at, &req, enc, staged)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::internal("exec: a committed record was refused"))
}

/// `req` with the sandbox's base env under its own (a warm sandbox's env; see
/// [`crate::running_rows::call_env_of`]); borrowed as is when there is none.
fn with_base_env<'r>(
    req: &'r ExecRequest,
    base: &BTreeMap<String, String>,
) -> std::borrow::Cow<'r, ExecRequest> {
    if base.is_empty() {
        return std::borrow::Cow::Borrowed(req);
    }
    let mut with = req.clone();
    with.env = crate::running_rows::merged_env(base, req.env.clone());
    std::borrow::Cow::Owned(with)
}

/// [`with_base_env`] for a request shared with the stream's task.
fn with_base_env_shared(
    req: &std::sync::Arc<ExecRequest>,
    base: &BTreeMap<String, String>,
) -> std::sync::Arc<ExecRequest> {
    match with_base_env(req, base) {
        std::borrow::Cow::Borrowed(_) => req.clone(),
        std::borrow::Cow::Owned(with) => std::sync::Arc::new(with),
    }
}

/// Awaits `wanted` (a record being staged, or the events that follow it) while polling
/// `call` beside it, so the call prepares its command meanwhile; returns `wanted`'s output
/// and the rest of the call. The call can only end first by failing (its command cannot go
/// before the go-ahead); that output is kept, and the rest of the call is then just it.
///
/// The call is polled first: its connection is opened before `wanted` sends its statement.
/// Polled second, it often started only once the statement was answered, since on a busy
/// machine the database's process, woken by the statement, can take this thread's core
/// until it has answered (measured: 57 of 300 execs, `docs/opensandbox.md`, sixth pass).
async fn beside<'c, W: std::future::Future, C: std::future::Future>(
    mut wanted: Pin<&mut W>,
    mut call: Pin<&'c mut C>,
) -> (W::Output, impl std::future::Future<Output = C::Output> + 'c) {
    let mut ended = None;
    let out = loop {
        tokio::select! {
            biased;
            end = &mut call, if ended.is_none() => ended = Some(end),
            out = &mut wanted => break out,
        }
    };
    let rest = async move {
        match ended {
            Some(end) => end,
            None => call.await,
        }
    };
    (out, rest)
}

/// Runs a collected exec whose record `stage` is staging. The command is prepared beside it
/// (the adapter opens its connection and sends the request head, [`GoAhead`]) and goes once
/// the record is staged; the answer waits for the record's commit ([`while_committing`]).
/// `None`: the record was refused (the row moved), so the command was never sent.
async fn run_exec(
    state: &AppState,
    principal: &Principal,
    pool: &Pool,
    at: &InstanceRef,
    req: &ExecRequest,
    enc: OutputEncoding,
    stage: impl std::future::Future<Output = ApiResult<Option<StagedAudit>>>,
) -> ApiResult<Option<ExecResult>> {
    let streams = pool
        .adapter
        .capabilities()
        .iter()
        .any(|c| c == "exec.stream");
    if !streams && enc == OutputEncoding::Base64 {
        return Err(ApiError::new(
            ErrorCode::UnsupportedOperation,
            "outputEncoding base64 needs a pool with exec.stream (binary-safe output)",
        ));
    }
    let (giver, go) = GoAhead::pair();
    let run = async {
        if !streams {
            go.wait().await.map_err(AdapterError::from)?;
            return Ok(pool.adapter.exec(at, req).await?);
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let run = pool.adapter.exec_stream_after(at, req, tx, go);
        let collect = CollectedOutput::collect(rx);
        let (exit, out) = tokio::join!(run, collect);
        let exit = exit?;
        Ok(ExecResult {
            exit_code: exit.exit_code,
            stdout: encode(enc, out.stdout.bytes()),
            stderr: encode(enc, out.stderr.bytes()),
            stdout_truncated: out.stdout.truncated(),
            stderr_truncated: out.stderr.truncated(),
            duration_ms: exit.duration_ms,
        })
    };
    tokio::pin!(run, stage);
    let (staged, rest) = beside(stage.as_mut(), run.as_mut()).await;
    // Refused or failed: `run` is dropped here with its command unsent.
    let Some(record) = staged? else {
        return Ok(None);
    };
    giver.give();
    tracing::info!(sandbox = %at.sandbox_id, program = req.program(), "exec");
    let events = CallEvents::new(state, principal, record.record(), &at.sandbox_id);
    let exec_events = ExecEvents::start(events, &req.command, req.timeout());
    let answer = exec_events.around(while_committing(record, rest)).await;
    exec_events.finish(answer.as_ref().ok().map(|r| (r.exit_code, r.duration_ms)));
    answer.map(Some)
}

/// A streamed exec in progress: the adapter runs in its own task and writes output into
/// `rx`. Both response formats read it through [`Running::next`], so the run itself (audit,
/// metering, backpressure, cancellation on hang-up, the timeout's exit 124) is one code path
/// and the formats differ only in how a [`Next`] becomes body bytes. Dropping it (the client
/// hung up, so hyper dropped the body) closes the channel, which cancels the command.
struct Running {
    rx: mpsc::Receiver<ExecEvent>,
    task: Option<tokio::task::JoinHandle<Result<ExecExit, AdapterError>>>,
    /// An event taken out of `rx` by [`Running::ready`] but not used yet; `next` returns it
    /// first, so output order is kept.
    held: Option<ExecEvent>,
}

/// What a streamed exec produces next.
enum Next {
    /// A chunk of output (≤ 64 KiB, as the adapter wrote it).
    Output(ExecEvent),
    /// The end; nothing follows.
    End(Ending),
}

/// How a streamed exec ended, with the JSON both formats carry: SSE as the `exit`/`error`
/// event's data, frames as the exit/error frame's payload.
enum Ending {
    /// The command ran to an exit code (124 on timeout): `{exitCode, durationMs}`.
    Exit(String),
    /// The backend (or the task running it) failed: `{code, message}`.
    Error(String),
}

impl Ending {
    fn of(end: Result<Result<ExecExit, AdapterError>, tokio::task::JoinError>) -> Ending {
        match end {
            Ok(Ok(exit)) => Ending::Exit(
                json!({ "exitCode": exit.exit_code, "durationMs": exit.duration_ms }).to_string(),
            ),
            Ok(Err(e)) => {
                let api = ApiError::from(e);
                Ending::Error(json!({ "code": api.code, "message": api.message }).to_string())
            }
            Err(e) => {
                tracing::error!(error = %e, "exec stream task failed");
                Ending::Error(
                    json!({ "code": ErrorCode::Internal, "message": "internal error" }).to_string(),
                )
            }
        }
    }
}

impl Running {
    fn new(
        rx: mpsc::Receiver<ExecEvent>,
        task: tokio::task::JoinHandle<Result<ExecExit, AdapterError>>,
    ) -> Running {
        Running {
            rx,
            task: Some(task),
            held: None,
        }
    }

    /// The next output chunk, then the ending once, then `None`. Cancel-safe (the binary
    /// body races it against the heartbeat timer): the task handle is kept until it resolves.
    async fn next(&mut self) -> Option<Next> {
        if let Some(ev) = self.held.take() {
            return Some(Next::Output(ev));
        }
        if let Some(ev) = self.rx.recv().await {
            return Some(Next::Output(ev));
        }
        // The adapter dropped its sender: it has finished.
        let end = (self.task.as_mut()?).await;
        self.task = None;
        Some(Next::End(Ending::of(end)))
    }

    /// An output event that is already queued, never waiting for one: what a body chunk
    /// merges into itself after the event that woke it.
    fn ready(&mut self) -> Option<ExecEvent> {
        self.held.take().or_else(|| self.rx.try_recv().ok())
    }

    /// Gives back an event [`Running::ready`] returned, to come out of the next `next`.
    fn hold(&mut self, ev: ExecEvent) {
        self.held = Some(ev);
    }

    /// `first` followed by the queued output of the same stream, as one buffer of about
    /// `COALESCE_LIMIT` bytes at most; the first event of the other stream is held back.
    fn merge_same_stream(&mut self, first: Bytes, stdout: bool) -> Bytes {
        let mut merged: Option<BytesMut> = None;
        while merged.as_ref().map_or(first.len(), BytesMut::len) < COALESCE_LIMIT {
            let more = match self.ready() {
                Some(ExecEvent::Stdout(b)) if stdout => b,
                Some(ExecEvent::Stderr(b)) if !stdout => b,
                Some(other) => {
                    self.hold(other);
                    break;
                }
                None => break,
            };
            merged
                .get_or_insert_with(|| BytesMut::from(&first[..]))
                .extend_from_slice(&more);
        }
        merged.map_or(first, BytesMut::freeze)
    }
}

/// What the SSE body keeps between events.
struct SseState {
    run: Running,
    enc: OutputEncoding,
    out: Utf8Carry,
    err: Utf8Carry,
    done: bool,
    /// Tail events (flushed UTF-8 remainders, then exit or error) still to send.
    tail: Vec<Event>,
}

fn data_event(kind: &str, data: String) -> Event {
    Event::default()
        .event(kind)
        .data(json!({ "data": data }).to_string())
}

fn sse_events(st: SseState) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.tail.pop() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            match st.run.next().await {
                Some(Next::Output(ExecEvent::Stdout(b))) => {
                    let b = st.run.merge_same_stream(b, true);
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.out.push(&b),
                    };
                    if data.is_empty() {
                        continue;
                    }
                    return Some((Ok(data_event("stdout", data)), st));
                }
                Some(Next::Output(ExecEvent::Stderr(b))) => {
                    let b = st.run.merge_same_stream(b, false);
                    let data = match st.enc {
                        OutputEncoding::Base64 => encode(st.enc, &b),
                        OutputEncoding::Utf8 => st.err.push(&b),
                    };
                    if data.is_empty() {
                        continue;
                    }
                    return Some((Ok(data_event("stderr", data)), st));
                }
                Some(Next::End(end)) => {
                    st.done = true;
                    let (name, json) = match end {
                        Ending::Exit(j) => ("exit", j),
                        Ending::Error(j) => ("error", j),
                    };
                    // Popped from the back: the exit goes last.
                    st.tail.push(Event::default().event(name).data(json));
                    let rest_err = st.err.finish();
                    if !rest_err.is_empty() {
                        st.tail.push(data_event("stderr", rest_err));
                    }
                    let rest_out = st.out.finish();
                    if !rest_out.is_empty() {
                        st.tail.push(data_event("stdout", rest_out));
                    }
                }
                None => st.done = true,
            }
        }
    })
}

fn sse_response(run: Running, enc: OutputEncoding) -> Response {
    let st = SseState {
        run,
        enc,
        out: Utf8Carry::default(),
        err: Utf8Carry::default(),
        done: false,
        tail: Vec::new(),
    };
    Sse::new(sse_events(st))
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("ping"))
        .into_response()
}

/// What the frame body keeps between body chunks.
struct FrameState {
    run: Running,
    /// Body chunks (frame headers and payloads) still to send, in order.
    pending: VecDeque<Bytes>,
    done: bool,
    /// Quiet time after which a heartbeat is sent (`HEARTBEAT`; shorter in tests).
    every: Duration,
    /// When the last frame was produced; a heartbeat follows `every` after it.
    last_frame: Instant,
    /// Armed for `last_frame + every` lazily: it is moved only when it fires, so busy
    /// streams do not touch the timer once per chunk.
    heartbeat: Pin<Box<tokio::time::Sleep>>,
}

impl FrameState {
    fn new(run: Running, every: Duration) -> FrameState {
        FrameState {
            run,
            pending: VecDeque::new(),
            done: false,
            every,
            last_frame: Instant::now(),
            heartbeat: Box::pin(tokio::time::sleep(every)),
        }
    }
}

/// The binary body: the output event that woke it and every one already queued after it
/// (up to `COALESCE_LIMIT`), as frames in one body chunk.
fn frame_chunks(st: FrameState) -> impl Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(chunk) = st.pending.pop_front() {
                return Some((Ok(chunk), st));
            }
            if st.done {
                return None;
            }
            let next = tokio::select! {
                biased;
                next = st.run.next() => next,
                () = &mut st.heartbeat => {
                    if Instant::now() >= st.last_frame + st.every {
                        st.pending.push_back(frames::heartbeat());
                        st.last_frame = Instant::now();
                    }
                    let at = st.last_frame + st.every;
                    st.heartbeat.as_mut().reset(at);
                    continue;
                }
            };
            match next {
                Some(Next::Output(first)) => {
                    let mut body = BytesMut::new();
                    let mut ev = Some(first);
                    while let Some(e) = ev.take() {
                        match e {
                            ExecEvent::Stdout(b) => {
                                frames::output(FrameType::Stdout, &b, &mut body)
                            }
                            ExecEvent::Stderr(b) => {
                                frames::output(FrameType::Stderr, &b, &mut body)
                            }
                        }
                        if body.len() < COALESCE_LIMIT {
                            ev = st.run.ready();
                        }
                    }
                    if !body.is_empty() {
                        st.pending.push_back(body.freeze());
                    }
                }
                Some(Next::End(end)) => {
                    let (kind, json) = match end {
                        Ending::Exit(j) => (FrameType::Exit, j),
                        Ending::Error(j) => (FrameType::Error, j),
                    };
                    st.pending.push_back(frames::control(kind, json.as_bytes()));
                    st.done = true;
                }
                None => st.done = true,
            }
            if !st.pending.is_empty() {
                st.last_frame = Instant::now();
            }
        }
    })
}

/// Whether the client asked for frames: `Accept` names [`frames::MEDIA_TYPE`] with a
/// non-zero `q` no lower than that of any range SSE satisfies (`text/event-stream`,
/// `text/*`, `*/*`). Everything else, including no `Accept` at all, gets SSE, so existing
/// clients see no change; `application/*` alone does not opt in.
fn wants_frames(headers: &HeaderMap) -> bool {
    let (mut frames_q, mut sse_q) = (None::<f32>, None::<f32>);
    let ranges = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for range in ranges {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim();
        let mut q = Some(1.0f32);
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                if k.trim().eq_ignore_ascii_case("q") {
                    q = v
                        .trim()
                        .parse::<f32>()
                        .ok()
                        .filter(|q| (0.0..=1.0).contains(q));
                }
            }
        }
        // A malformed q makes the range unusable rather than guessing.
        let Some(q) = q else { continue };
        let slot = if media.eq_ignore_ascii_case(frames::MEDIA_TYPE) {
            &mut frames_q
        } else if ["text/event-stream", "text/*", "*/*"]
            .iter()
            .any(|m| media.eq_ignore_ascii_case(m))
        {
            &mut sse_q
        } else {
            continue;
        };
        *slot = Some(slot.map_or(q, |old| old.max(q)));
    }
    match frames_q {
        Some(f) => f > 0.0 && sse_q.is_none_or(|s| f >= s),
        None => false,
    }
}

/// The checks, audit record and adapter call every streamed exec shares, whatever its
/// response format; returns the run and the output encoding the request asked for. As with
/// collected exec, a remembered row's record is staged while the command is prepared
/// ([`start_staged_stream`]); a refused one falls back to a fresh read of the row.
async fn start_stream(
    state: &AppState,
    principal: &Principal,
    id: &str,
    body: &Bytes,
) -> ApiResult<(Running, OutputEncoding)> {
    principal.require(Scope::SandboxesExec)?;
    let req = std::sync::Arc::new(parse_exec(body)?);
    let detail = json!({ "program": req.program() });
    let enc = req.output_encoding.unwrap_or_default();
    let (capability, action) = ("exec.stream", "sandbox.exec_stream");
    if let Some(early) = early_call(state, principal, id, capability, action, detail.clone())? {
        let stage = early.stage(state);
        let (pool, at) = (&early.pool, &early.at);
        let req = with_base_env_shared(&req, &early.env);
        if let Some(run) = start_staged_stream(state, principal, pool, at, &req, stage).await? {
            return Ok((run, enc));
        }
        // The row moved since: nothing was sent; read it like any other call.
    }
    let (pool, at, record, env) =
        open_read_call(state, principal, id, capability, action, detail).await?;
    let staged = std::future::ready(Ok(Some(record)));
    let req = with_base_env_shared(&req, &env);
    start_staged_stream(state, principal, &pool, &at, &req, staged)
        .await?
        .map(|run| (run, enc))
        .ok_or_else(|| ApiError::internal("exec stream: a committed record was refused"))
}

/// Starts a streamed exec whose record `stage` is staging. The adapter's task prepares the
/// command at once ([`GoAhead`]: for OpenSandbox, the connection and the request head) and
/// sends it once the record is staged; the call's events, which name the record, are handed
/// to the task with the go-ahead. The response (and with it any output) waits for the
/// record's commit, and a failed commit stops the command and answers the error. `None`: the
/// record was refused (the row moved), so the command was never sent.
async fn start_staged_stream(
    state: &AppState,
    principal: &Principal,
    pool: &Pool,
    at: &InstanceRef,
    req: &std::sync::Arc<ExecRequest>,
    stage: impl std::future::Future<Output = ApiResult<Option<StagedAudit>>>,
) -> ApiResult<Option<Running>> {
    let (giver, go) = GoAhead::pair();
    let (events_tx, events_rx) = tokio::sync::oneshot::channel::<Option<CallEvents>>();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let adapter = pool.adapter.clone();
    let (task_at, task_req) = (at.clone(), req.clone());
    let task = tokio::spawn(async move {
        let call = adapter.exec_stream_after(&task_at, &task_req, tx, go);
        tokio::pin!(call, events_rx);
        let (events, rest) = beside(events_rx.as_mut(), call.as_mut()).await;
        // No events: the record was refused and this task is being aborted.
        let Ok(events) = events else {
            return rest.await;
        };
        // Dropped with the task when the stream's caller goes away: `finished` without a code.
        let exec_events = ExecEvents::start(events, &task_req.command, task_req.timeout());
        let exit = exec_events.around(rest).await;
        exec_events.finish(exit.as_ref().ok().map(|x| (x.exit_code, x.duration_ms)));
        exit
    });
    // Refused or failed: the task is stopped with its command unsent.
    let record = match stage.await {
        Ok(Some(record)) => record,
        Ok(None) => {
            task.abort();
            return Ok(None);
        }
        Err(e) => {
            task.abort();
            return Err(e);
        }
    };
    tracing::info!(sandbox = %at.sandbox_id, program = req.program(), "exec stream");
    let events = CallEvents::new(state, principal, record.record(), &at.sandbox_id);
    // Events first, so the task has them when the go-ahead wakes it and its grace timer
    // starts with the command.
    let _ = events_tx.send(events);
    giver.give();
    // The command starts while its record commits.
    if let Err(e) = commit_detached(record).await {
        task.abort();
        return Err(e);
    }
    Ok(Some(Running::new(rx, task)))
}

async fn exec_stream(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let binary = wants_frames(&headers);
    let (run, enc) = start_stream(&state, &principal, &id, &body).await?;
    let mut resp = if binary {
        // `outputEncoding` does not apply: frames carry the raw bytes.
        let mut resp =
            Body::from_stream(frame_chunks(FrameState::new(run, HEARTBEAT))).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(frames::MEDIA_TYPE),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        sse_response(run, enc)
    };
    // Ask buffering proxies (nginx) to pass output through as it comes.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use frames::{Frame, FrameDecoder};
    use futures::StreamExt;

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// The call opens its connection before the record's statement is sent, and a call that
    /// fails first is kept and handed back as the rest.
    #[tokio::test]
    async fn beside_starts_the_call_first_and_keeps_an_early_end() {
        let order = std::sync::Mutex::new(Vec::new());
        let wanted = async {
            order.lock().unwrap().push("statement sent");
            tokio::task::yield_now().await;
            "staged"
        };
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let call = async {
            order.lock().unwrap().push("connection opened");
            let _ = ready.await;
            "ran"
        };
        tokio::pin!(wanted, call);
        let (staged, rest) = beside(wanted.as_mut(), call.as_mut()).await;
        assert_eq!(staged, "staged");
        assert_eq!(
            *order.lock().unwrap(),
            ["connection opened", "statement sent"]
        );
        go.send(()).expect("the call waits");
        assert_eq!(rest.await, "ran");

        let failed = async { "failed at once" };
        let slow = async {
            tokio::task::yield_now().await;
            "staged"
        };
        tokio::pin!(failed, slow);
        let (staged, rest) = beside(slow.as_mut(), failed.as_mut()).await;
        assert_eq!((staged, rest.await), ("staged", "failed at once"));
    }

    #[test]
    fn only_an_explicit_accept_selects_frames() {
        let t = frames::MEDIA_TYPE;
        for (values, want) in [
            (vec![], false),
            (vec!["*/*"], false),
            (vec!["text/event-stream"], false),
            (vec!["application/*"], false),
            (vec!["application/json"], false),
            (vec![t], true),
            (vec!["Application/Vnd.Differently.Exec-Stream"], true),
            (vec![&format!("{t}, text/event-stream")], true),
            (vec![&format!("text/event-stream, {t}")], true),
            (vec![&format!("{t};q=0.5, text/event-stream")], false),
            (vec![&format!("{t};q=0.5, application/json")], true),
            (vec![&format!("{t} ; q=0.9, */*;q=0.1")], true),
            (vec![&format!("{t};q=0")], false),
            (vec![&format!("{t};q=banana")], false),
            (vec!["text/event-stream;q=0.2", t], true),
        ] {
            assert_eq!(wants_frames(&accept(&values)), want, "{values:?}");
        }
    }

    /// A run whose adapter writes `events` and then ends with `end`, after `pause` if given.
    fn run_of(
        events: Vec<ExecEvent>,
        pause: Option<Duration>,
        end: Result<ExecExit, AdapterError>,
    ) -> Running {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let task = tokio::spawn(async move {
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
            for ev in events {
                let _ = tx.send(ev).await;
            }
            end
        });
        Running::new(rx, task)
    }

    async fn frame_body(run: Running, every: Duration) -> (Vec<Bytes>, Vec<Frame>) {
        let chunks: Vec<Bytes> = frame_chunks(FrameState::new(run, every))
            .map(|c| match c {
                Ok(c) => c,
                Err(e) => match e {},
            })
            .collect()
            .await;
        let mut d = FrameDecoder::default();
        let mut frames = Vec::new();
        for c in &chunks {
            frames.extend(d.push(c).unwrap());
        }
        d.finish().unwrap();
        (chunks, frames)
    }

    #[tokio::test]
    async fn frame_body_carries_raw_bytes_then_the_exit() {
        let binary = Bytes::from_static(b"\xff\xfe\x00y\n");
        let run = run_of(
            vec![
                ExecEvent::Stdout(binary.clone()),
                ExecEvent::Stdout(Bytes::new()),
                ExecEvent::Stderr(Bytes::from_static(b"err")),
            ],
            None,
            Ok(ExecExit {
                exit_code: 3,
                duration_ms: 12,
            }),
        );
        let (_, frames) = frame_body(run, HEARTBEAT).await;
        let kinds: Vec<FrameType> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [FrameType::Stdout, FrameType::Stderr, FrameType::Exit]
        );
        assert_eq!(frames[0].payload, binary);
        assert_eq!(&frames[1].payload[..], b"err");
        let exit: serde_json::Value = serde_json::from_slice(&frames[2].payload).unwrap();
        assert_eq!(exit, json!({"exitCode": 3, "durationMs": 12}));
    }

    #[tokio::test]
    async fn frame_body_ends_with_an_error_frame_on_failure() {
        let run = run_of(
            vec![ExecEvent::Stdout(Bytes::from_static(b"a"))],
            None,
            Err(AdapterError::unavailable("backend down")),
        );
        let (_, frames) = frame_body(run, HEARTBEAT).await;
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].kind, FrameType::Error);
        let err: serde_json::Value = serde_json::from_slice(&frames[1].payload).unwrap();
        assert_eq!(
            err["code"],
            json!(ApiError::from(AdapterError::unavailable(String::new())).code)
        );
        assert!(err["message"].is_string());
    }

    #[tokio::test]
    async fn a_quiet_frame_stream_sends_heartbeats() {
        let run = run_of(
            vec![ExecEvent::Stdout(Bytes::from_static(b"late"))],
            Some(Duration::from_millis(250)),
            Ok(ExecExit {
                exit_code: 0,
                duration_ms: 250,
            }),
        );
        let (_, frames) = frame_body(run, Duration::from_millis(40)).await;
        let beats = frames
            .iter()
            .take_while(|f| f.kind == FrameType::Heartbeat)
            .count();
        assert!(beats >= 2, "{frames:?}");
        assert!(frames
            .iter()
            .all(|f| f.kind != FrameType::Heartbeat || f.payload.is_empty()));
        assert_eq!(frames[beats].kind, FrameType::Stdout);
        assert_eq!(frames[beats + 1].kind, FrameType::Exit);
    }

    #[tokio::test]
    async fn sse_body_is_unchanged() {
        let run = run_of(
            vec![
                ExecEvent::Stdout(Bytes::from_static(b"a\n\xe2\x98")),
                ExecEvent::Stderr(Bytes::from_static(b"b\n")),
                ExecEvent::Stdout(Bytes::from_static(b"\x83")),
            ],
            None,
            Ok(ExecExit {
                exit_code: 7,
                duration_ms: 5,
            }),
        );
        let resp = sse_response(run, OutputEncoding::Utf8);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        // The bytes the SSE path produced before the frame format existed.
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            "event: stdout\ndata: {\"data\":\"a\\n\"}\n\n\
             event: stderr\ndata: {\"data\":\"b\\n\"}\n\n\
             event: stdout\ndata: {\"data\":\"☃\"}\n\n\
             event: exit\ndata: {\"durationMs\":5,\"exitCode\":7}\n\n"
        );
    }

    /// A run whose `events` are all queued before the body reads any, ending after `end_after`.
    fn queued_run(events: Vec<ExecEvent>, end_after: Duration) -> Running {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        for ev in events {
            tx.try_send(ev).unwrap();
        }
        let task = tokio::spawn(async move {
            tokio::time::sleep(end_after).await;
            drop(tx);
            Ok(ExecExit {
                exit_code: 0,
                duration_ms: 1,
            })
        });
        Running::new(rx, task)
    }

    fn out(b: &'static [u8]) -> ExecEvent {
        ExecEvent::Stdout(Bytes::from_static(b))
    }

    fn err(b: &'static [u8]) -> ExecEvent {
        ExecEvent::Stderr(Bytes::from_static(b))
    }

    #[tokio::test]
    async fn queued_output_goes_out_as_one_frame_body_chunk() {
        let events = vec![out(b"a"), out(b""), out(b"b"), err(b"c"), out(b"d")];
        let run = queued_run(events, Duration::ZERO);
        let (chunks, frames) = frame_body(run, HEARTBEAT).await;
        // Every queued frame in the first chunk, in order; the exit frame follows alone.
        assert_eq!(chunks.len(), 2, "{chunks:?}");
        let mut d = FrameDecoder::default();
        let first: Vec<(FrameType, Vec<u8>)> = d
            .push(&chunks[0])
            .unwrap()
            .into_iter()
            .map(|f| (f.kind, f.payload.to_vec()))
            .collect();
        assert_eq!(
            first,
            [
                (FrameType::Stdout, b"a".to_vec()),
                (FrameType::Stdout, b"b".to_vec()),
                (FrameType::Stderr, b"c".to_vec()),
                (FrameType::Stdout, b"d".to_vec()),
            ]
        );
        assert_eq!(frames.last().map(|f| f.kind), Some(FrameType::Exit));
    }

    #[tokio::test]
    async fn a_frame_body_chunk_stops_merging_at_the_limit() {
        let big = || ExecEvent::Stdout(Bytes::from(vec![b'x'; 64 * 1024]));
        let events = (0..STREAM_BUFFER).map(|_| big()).collect();
        let (chunks, frames) = frame_body(queued_run(events, Duration::ZERO), HEARTBEAT).await;
        let per_chunk = COALESCE_LIMIT / (64 * 1024);
        assert_eq!(
            chunks[0].len(),
            per_chunk * (frames::HEADER_LEN + 64 * 1024)
        );
        let total: usize = frames
            .iter()
            .filter(|f| f.kind == FrameType::Stdout)
            .count();
        assert_eq!(total, STREAM_BUFFER);
    }

    #[tokio::test]
    async fn queued_sse_output_merges_per_stream_in_order() {
        let events = vec![out(b"a"), out(b"b\n"), err(b"c"), err(b"d"), out(b"e")];
        let resp = sse_response(queued_run(events, Duration::ZERO), OutputEncoding::Utf8);
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8(body.to_vec()).unwrap(),
            "event: stdout\ndata: {\"data\":\"ab\\n\"}\n\n\
             event: stderr\ndata: {\"data\":\"cd\"}\n\n\
             event: stdout\ndata: {\"data\":\"e\"}\n\n\
             event: exit\ndata: {\"durationMs\":1,\"exitCode\":0}\n\n"
        );
    }

    /// Latency: one short line while the command keeps running goes out at once, in both
    /// formats (the body merges only what is already queued, it never waits for more).
    #[tokio::test]
    async fn a_single_line_is_sent_at_once() {
        let wait = Duration::from_secs(2);
        let run = queued_run(vec![out(b"hi\n")], Duration::from_secs(60));
        let mut body = std::pin::pin!(frame_chunks(FrameState::new(run, HEARTBEAT)));
        let first = tokio::time::timeout(wait, body.next())
            .await
            .expect("the line was not sent within 2 s")
            .unwrap()
            .unwrap_or_else(|e| match e {});
        let got = FrameDecoder::default().push(&first).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].kind, &got[0].payload[..]),
            (FrameType::Stdout, &b"hi\n"[..])
        );

        let run = queued_run(vec![out(b"hi\n")], Duration::from_secs(60));
        let mut body = sse_response(run, OutputEncoding::Utf8)
            .into_body()
            .into_data_stream();
        let first = tokio::time::timeout(wait, body.next())
            .await
            .expect("the SSE line was not sent within 2 s")
            .unwrap()
            .unwrap();
        assert_eq!(&first[..], b"event: stdout\ndata: {\"data\":\"hi\\n\"}\n\n");
    }

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
