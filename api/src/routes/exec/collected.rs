//! `POST /v1/sandboxes/{id}/exec`: the command's output collected, size-capped, in one answer.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use differently_adapters::exec_output::CollectedOutput;
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::pools::Pool;
use differently_adapters::{AdapterError, InstanceRef};
use differently_core::exec::{ExecRequest, ExecResult, OutputEncoding};
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use differently_store::audit::StagedAudit;
use serde_json::json;
use tokio::sync::mpsc;

use super::text::encode;
use super::{beside, parse_exec, with_base_env, STREAM_BUFFER};
use crate::auth::Principal;
use crate::data_events::{CallEvents, ExecEvents};
use crate::data_plane::{early_call, open_read_call, while_committing};
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
