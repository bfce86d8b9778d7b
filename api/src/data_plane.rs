//! What the data-plane routes (exec, streamed exec, files, ports, keepalive) share: a running
//! sandbox's pool and backend instance, woken first if the idle sweep paused or stopped it,
//! and the call counted as the sandbox's activity.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use differently_adapters::pools::Pool;
use differently_adapters::InstanceRef;
use differently_bus_schema::WorkOp;
use differently_core::ids::OpId;
use differently_core::{ErrorCode, Sandbox, SandboxId, SandboxStatus};
use differently_store::audit::{RowGuard, StagedAudit};
use serde_json::{json, Value};

use crate::access::load_sandbox;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::mutation::{audit, audit_event, transition, wait_op};
use crate::sandbox_pool::{named_pool, pool_of, require_capability, status_conflict};
use crate::AppState;

/// How long a data-plane call waits for an idle sandbox to wake.
pub const WAKE_WAIT: Duration = Duration::from_secs(30);

pub use differently_store::lifecycle::IDLE_REASON;

/// A running sandbox's pool and instance for a data-plane call (exec, files, ports,
/// keepalive), waking it first if the idle sweep paused or stopped it. Records activity.
pub(crate) async fn ready_for_data(
    state: &AppState,
    principal: &Principal,
    mut sandbox: Sandbox,
    capability: &str,
) -> ApiResult<(Arc<Pool>, InstanceRef, Sandbox)> {
    let pool = pool_of(state, &sandbox)?;
    require_capability(&pool, capability)?;
    let idled = sandbox.status_reason.as_deref() == Some(IDLE_REASON);
    let wake = match sandbox.status {
        SandboxStatus::Paused if idled => Some(WorkOp::Resume),
        SandboxStatus::Stopped if idled => Some(WorkOp::Start),
        _ => None,
    };
    if let Some(op) = wake {
        tracing::info!(sandbox = %sandbox.id, op = op.as_str(), "waking an idle sandbox");
        let (code, view) = match transition(state, principal, sandbox.clone(), op, WAKE_WAIT).await
        {
            Err(e) if e.code == ErrorCode::Conflict => {
                // The change that idled it (the sweep's pause or stop) may still be
                // finishing its record: let it finish, then wake from what it left.
                let other = e
                    .details
                    .as_ref()
                    .and_then(|d| d["operation"].as_str())
                    .and_then(|id| OpId::parse(id).ok());
                let Some(other) = other else { return Err(e) };
                wait_op(state, &other, &sandbox.id, WAKE_WAIT).await?;
                let fresh = state
                    .store
                    .get_sandbox(&sandbox.id)
                    .await?
                    .ok_or_else(|| ApiError::not_found("sandbox"))?;
                transition(state, principal, fresh, op, WAKE_WAIT).await?
            }
            other => other?,
        };
        if code != StatusCode::OK {
            return Err(ApiError::new(
                ErrorCode::ProviderUnavailable,
                "the sandbox is still waking up; retry",
            )
            .with_details(json!({ "status": view.status })));
        }
        sandbox = state
            .store
            .get_sandbox(&sandbox.id)
            .await?
            .ok_or_else(|| ApiError::not_found("sandbox"))?;
    }
    let at = running_instance(state, &sandbox)?;
    Ok((pool, at, sandbox))
}

/// The backend instance of a running sandbox, counted as activity (409 if it is not
/// running).
fn running_instance(state: &AppState, sandbox: &Sandbox) -> ApiResult<InstanceRef> {
    if sandbox.status != SandboxStatus::Running {
        return Err(status_conflict(
            sandbox,
            "this call needs a running sandbox",
        ));
    }
    let Some(backend_ref) = sandbox.backend_ref.clone() else {
        return Err(ApiError::internal(format!(
            "running sandbox {} without a backend ref",
            sandbox.id
        )));
    };
    Ok(called(state, sandbox.id.clone(), backend_ref))
}

/// The instance a data-plane call is about to use, counted as the sandbox's activity (off
/// the call's path and batched: the idle sweep only needs it within seconds).
fn called(state: &AppState, sandbox_id: SandboxId, backend_ref: String) -> InstanceRef {
    state.activity.record(&state.store, &sandbox_id, Utc::now());
    InstanceRef {
        sandbox_id,
        backend_ref,
    }
}

/// The row this process remembers running for sandbox `id`, if the principal owns it.
pub(crate) fn remembered(
    state: &AppState,
    principal: &Principal,
    id: &SandboxId,
) -> Option<crate::running_rows::RunningRow> {
    let row = state.events.running.get(id)?;
    principal.owns(&row.org_id, &row.project_id).then_some(row)
}

/// Opens a data-plane call (exec, streamed exec, files) on sandbox `raw_id` for `capability`: the
/// pool and the instance, with the call's `action` record appended first (fail closed). See
/// [`open_staged_call`]; this one waits for the record's commit before the call starts.
pub(crate) async fn open_data_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef)> {
    let (pool, at, record) =
        open_staged_call(state, principal, raw_id, capability, action, detail).await?;
    record.commit().await?;
    Ok((pool, at))
}

/// [`open_data_call`] whose record may still be committing: the caller starts the call and
/// answers only once the record is durable ([`while_committing`]), so the commit's fsync
/// overlaps the backend's work instead of preceding it.
///
/// A row remembered from an earlier call or from the event that started it
/// (`EventHub::running`) is used without a read when the record can be written guarded on it
/// (the row still running at that version); otherwise the row is read (and woken if idle) as
/// [`ready_for_data`] does, its record committed before the call, and the row remembered for
/// the next call.
pub(crate) async fn open_staged_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef, StagedAudit)> {
    let id = SandboxId::parse(raw_id).map_err(|_| ApiError::not_found("sandbox"))?;
    if let Some(r) = remembered(state, principal, &id) {
        let pool = named_pool(state, &r.pool)?;
        require_capability(&pool, capability)?;
        let guard = RowGuard {
            sandbox: r.id.clone(),
            status: SandboxStatus::Running,
            status_version: r.status_version,
        };
        let event = audit_event(
            principal,
            (&r.org_id, &r.project_id, &r.id),
            action,
            detail.clone(),
        );
        if let Some(record) = state.store.stage_audit_if(event, &guard).await? {
            return Ok((pool, called(state, r.id, r.backend_ref), record));
        }
        // It moved since: read it like any other call.
        state.events.running.forget(&id);
    }
    let sandbox = load_sandbox(state, principal, raw_id).await?;
    let (pool, at, sandbox) = ready_for_data(state, principal, sandbox, capability).await?;
    let record = audit(state, principal, &sandbox, action, detail).await?;
    state.events.running.remember(&sandbox);
    Ok((pool, at, StagedAudit::committed(record)))
}

/// Runs `call` while `record` commits, and answers once both are done. A failed commit
/// cancels the call (dropped: an adapter interrupts a command it started) and fails it, so
/// no answer goes out without its durable record.
pub(crate) async fn while_committing<T>(
    record: StagedAudit,
    call: impl std::future::Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    let commit = commit_detached(record);
    tokio::pin!(commit);
    tokio::pin!(call);
    tokio::select! {
        committed = &mut commit => {
            committed?;
            call.await
        }
        answer = &mut call => {
            commit.await?;
            answer
        }
    }
}

/// Commits `record` in a task of its own, so a caller that hangs up (its handler dropped)
/// cannot cancel the commit of a call that may already have started.
pub(crate) async fn commit_detached(record: StagedAudit) -> ApiResult<()> {
    match tokio::spawn(record.commit()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(ApiError::internal(format!("audit commit task: {e}"))),
    }
}
