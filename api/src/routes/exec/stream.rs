//! `POST /v1/sandboxes/{id}/exec/stream`: output as it comes, as SSE or binary frames.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::pools::Pool;
use differently_adapters::InstanceRef;
use differently_core::exec::{ExecRequest, OutputEncoding};
use differently_core::tenancy::Scope;
use differently_store::audit::StagedAudit;
use serde_json::json;
use tokio::sync::mpsc;

use super::frame_body::{frame_chunks, wants_frames, FrameState};
use super::frames;
use super::running::Running;
use super::sse_body::sse_response;
use super::{beside, parse_exec, with_base_env_shared, STREAM_BUFFER};
use crate::auth::Principal;
use crate::data_events::{CallEvents, ExecEvents};
use crate::data_plane::{commit_detached, early_call, open_read_call};
use crate::error::{ApiError, ApiResult};
use crate::sse::HEARTBEAT;
use crate::AppState;

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

pub(super) async fn exec_stream(
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
