//! `POST /v1/sandboxes/{id}/exec/stream`: output as it comes, as SSE or binary frames.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::ExecEvent;
use differently_core::exec::{ExecRequest, OutputEncoding};
use differently_core::tenancy::Scope;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::frame_body::{frame_chunks, wants_frames, FrameState};
use super::frames;
use super::running::{Running, StreamTask};
use super::sse_body::sse_response;
use super::{parse_exec, with_base_env_shared, START_WINDOW, STREAM_BUFFER};
use crate::auth::Principal;
use crate::data_plane::call_events::{CallEvents, ExecEvents};
use crate::data_plane::{beside, DataCall, Target};
use crate::error::{ApiError, ApiResult};
use crate::requests::sse::HEARTBEAT;
use crate::AppState;

/// The checks, audit record and adapter call every streamed exec shares, whatever its
/// response format; returns the run and the output encoding the request asked for.
///
/// The adapter's task prepares the command at once ([`GoAhead`]: for OpenSandbox, the
/// connection and the request head) and sends it once the record is staged; the call's
/// events, which name the record, reach the task before its go-ahead, so its grace timer
/// starts with the command. The response (and with it any output) waits for the record's
/// commit, and a failed commit stops the command and answers the error.
async fn start_stream(
    state: &AppState,
    principal: &Principal,
    id: &str,
    body: &Bytes,
) -> ApiResult<(Running, OutputEncoding)> {
    principal.require(Scope::SandboxesExec)?;
    let req = Arc::new(parse_exec(body)?);
    let detail = json!({ "program": req.program() });
    let enc = req.output_encoding.unwrap_or_default();
    let call = DataCall::new(
        state,
        principal,
        id,
        "exec.stream",
        "sandbox.exec_stream",
        detail,
    );
    // The output and the events of the attempt that was let go (a refused one is dropped).
    let mut wiring = None;
    let staged = call
        .start(|target, go| {
            let (task, output, events) = spawn_stream(target, &req, go);
            wiring = Some((output, events));
            Ok(task)
        })
        .await?;
    let (output, events_tx) =
        wiring.ok_or_else(|| ApiError::internal("exec stream: started without its task"))?;
    let sandbox = &staged.target().at.sandbox_id;
    tracing::info!(sandbox = %sandbox, program = req.program(), "exec stream");
    let _ = events_tx.send(CallEvents::new(state, principal, staged.record(), sandbox));
    let task = staged.detach().await?;
    let mut run = Running::new(output, task);
    // A command refused before it starts is the usual JSON error, as for buffered exec.
    run.started(START_WINDOW).await?;
    Ok((run, enc))
}

/// The adapter's task for `req` on `target`: it sends the command once `go` is given and
/// publishes the exec's events once it has them. Returns the task, its output channel, and
/// the sender of its events (`None` when the record names no tenant).
fn spawn_stream(
    target: &Target,
    req: &Arc<ExecRequest>,
    go: GoAhead,
) -> (
    StreamTask,
    mpsc::Receiver<ExecEvent>,
    oneshot::Sender<Option<CallEvents>>,
) {
    let (events_tx, events_rx) = oneshot::channel::<Option<CallEvents>>();
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let adapter = target.pool.adapter.clone();
    let (at, req) = (target.at.clone(), with_base_env_shared(req, &target.env));
    let task = tokio::spawn(async move {
        let call = adapter.exec_stream_after(&at, &req, tx, go);
        tokio::pin!(call, events_rx);
        let (events, ended) = beside(events_rx.as_mut(), call.as_mut()).await;
        let rest = async {
            match ended {
                Some(end) => end,
                None => call.await,
            }
        };
        // No events: the go-ahead was withdrawn and this task is being aborted.
        let Ok(events) = events else {
            return rest.await;
        };
        // Dropped with the task when the stream's caller goes away: `finished` without a code.
        let exec_events = ExecEvents::start(events, &req.command, req.timeout());
        let exit = exec_events.around(rest).await;
        exec_events.finish(exit.as_ref().ok().map(|x| (x.exit_code, x.duration_ms)));
        exit
    });
    (StreamTask::new(task), rx, events_tx)
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
    Ok(respond(run, binary, enc, None))
}

/// The response of a run: binary frames when `binary`, else SSE in `enc`, its output events
/// carrying `id:` byte offsets from `sse_offset` when given (a process's output, which a
/// client re-attaches to from an offset).
pub(crate) fn respond(
    run: Running,
    binary: bool,
    enc: OutputEncoding,
    sse_offset: Option<u64>,
) -> Response {
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
        sse_response(run, enc, sse_offset)
    };
    // Ask buffering proxies (nginx) to pass output through as it comes.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
