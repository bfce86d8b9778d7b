//! `POST /v1/sandboxes/{id}/exec`: the command's output collected, size-capped, in one answer.

use std::future::Future;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use differently_adapters::exec_output::CollectedOutput;
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::AdapterError;
use differently_core::exec::{ExecRequest, ExecResult, OutputEncoding};
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use serde_json::json;
use tokio::sync::mpsc;

use super::text::encode;
use super::{parse_exec, with_base_env, STREAM_BUFFER};
use crate::auth::Principal;
use crate::data_plane::call_events::{CallEvents, ExecEvents};
use crate::data_plane::{DataCall, Target};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

pub(super) async fn exec(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<ExecResult>> {
    principal.require(Scope::SandboxesExec)?;
    let req = parse_exec(&body)?;
    let detail = json!({ "program": req.program() });
    let enc = req.output_encoding.unwrap_or_default();
    let call = DataCall::new(&state, &principal, &id, "exec", "sandbox.exec", detail);
    let staged = call
        .start(|target, go| prepare(target, &req, enc, go))
        .await?;
    let sandbox = &staged.target().at.sandbox_id;
    tracing::info!(sandbox = %sandbox, program = req.program(), "exec");
    let events = CallEvents::new(&state, &principal, staged.record(), sandbox);
    let exec_events = ExecEvents::start(events, &req.command, req.timeout());
    let answer = exec_events.around(staged.answer()).await;
    exec_events.finish(answer.as_ref().ok().map(|r| (r.exit_code, r.duration_ms)));
    answer.map(Json)
}

/// The collected exec of `req` on `target`, sent once `go` is given: through the adapter's
/// streamed exec when the pool has `exec.stream` (binary-safe, capped per stream), else its
/// plain exec, which has no base64 output to give (refused before anything is written).
fn prepare<'r>(
    target: &Target,
    req: &'r ExecRequest,
    enc: OutputEncoding,
    go: GoAhead,
) -> ApiResult<impl Future<Output = ApiResult<ExecResult>> + 'r> {
    let adapter = target.pool.adapter.clone();
    let streams = adapter.capabilities().iter().any(|c| c == "exec.stream");
    if !streams && enc == OutputEncoding::Base64 {
        return Err(ApiError::new(
            ErrorCode::UnsupportedOperation,
            "outputEncoding base64 needs a pool with exec.stream (binary-safe output)",
        ));
    }
    let at = target.at.clone();
    let req = with_base_env(req, &target.env);
    Ok(async move {
        if !streams {
            go.wait().await.map_err(AdapterError::from)?;
            return Ok(adapter.exec(&at, &req).await?);
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let run = adapter.exec_stream_after(&at, &req, tx, go);
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
    })
}
