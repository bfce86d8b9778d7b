//! The data plane: calls that go straight from this replica to a running sandbox's backend
//! (exec, streamed exec, terminals, files, ports, keepalive), with no bus hop.
//!
//! Every call that acts in a sandbox walks one path, [`DataCall`]:
//!
//! 1. **Stage the audit record.** A row this process remembers running
//!    ([`crate::data_plane::running_rows`]) is not read: the record is staged guarded on it (written only
//!    if the row is still running at that version). Otherwise the row is read, woken if the
//!    idle sweep paused or stopped it ([`ready_for_data`]), and the record committed.
//! 2. **Open the backend call beside it.** A command's call is prepared while the record is
//!    staged (the adapter opens its connection and sends the request head), holding back what
//!    names the command until its go-ahead ([`overlap::beside`]).
//! 3. **Let the command go** once the record is staged; a refused or failed record drops the
//!    call with nothing sent (fail closed), and a refused one is retried from a read.
//! 4. **Commit detached.** The command runs while the record commits; no answer goes out
//!    before the record is durable, and a failed commit cancels the call
//!    ([`overlap::while_committing`]).
//!
//! Calls that send nothing before their record is durable (a terminal's open, file
//! transfers) take steps 1 and 4 at once ([`DataCall::open`]). The facades reach the same
//! path: their commands are in-process `/v1` exec calls, and the OpenSandbox terminal opens
//! through [`crate::routes::pty`].
//!
//! Beside the walk: the activity the idle sweep reads ([`activity`]), the public events of
//! exec and file writes ([`call_events`]), the running rows a call may skip reading
//! ([`running_rows`]) and the terminal sessions this process runs ([`pty_sessions`]).

pub mod activity;
mod call;
pub(crate) mod call_events;
mod overlap;
pub mod pty_sessions;
pub mod running_rows;

pub(crate) use call::{DataCall, Detached};
pub(crate) use overlap::beside;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use differently_adapters::pools::Pool;
use differently_adapters::InstanceRef;
use differently_bus_schema::WorkOp;
use differently_core::ids::OpId;
use differently_core::{ErrorCode, Sandbox, SandboxId, SandboxStatus};
use serde_json::json;

use crate::auth::Principal;
use crate::control::mutation::{transition, wait_op};
use crate::control::sandbox_pool::{pool_of, require_capability, status_conflict};
use crate::error::{ApiError, ApiResult};
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
) -> Option<crate::data_plane::running_rows::RunningRow> {
    let row = state.events.running.get(id)?;
    principal.owns(&row.org_id, &row.project_id).then_some(row)
}

/// The env a call that starts a program must add under its own (see
/// [`crate::data_plane::running_rows::call_env_of`]): a warm sandbox's env, else nothing.
pub(crate) type BaseEnv = Arc<BTreeMap<String, String>>;

/// Where a data-plane call goes: the sandbox's pool and backend instance, and the env a
/// program it starts adds under its own.
pub(crate) struct Target {
    pub pool: Arc<Pool>,
    pub at: InstanceRef,
    pub env: BaseEnv,
}
