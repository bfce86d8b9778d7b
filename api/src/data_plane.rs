//! What the data-plane routes (exec, streamed exec, files, ports, keepalive) share: a running
//! sandbox's pool and backend instance, woken first if the idle sweep paused or stopped it,
//! and the call counted as the sandbox's activity.

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
use differently_store::audit::{NewAuditEvent, RowGuard, StagedAudit};
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

/// The env a call that starts a program must add under its own (see
/// [`crate::running_rows::call_env_of`]): a warm sandbox's env, else nothing.
pub(crate) type BaseEnv = Arc<BTreeMap<String, String>>;

/// [`open_data_call`] for a call that starts a program (a terminal), with the sandbox's
/// [`BaseEnv`]. The row is read: the env is on it, not on the event that started it.
pub(crate) async fn open_program_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef, BaseEnv)> {
    let (pool, at, record, env) =
        open_read_call(state, principal, raw_id, capability, action, detail).await?;
    record.commit().await?;
    Ok((pool, at, env))
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
/// (the row still running at that version; [`early_call`]); otherwise the row is read
/// ([`open_read_call`]).
pub(crate) async fn open_staged_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef, StagedAudit)> {
    if let Some(early) = early_call(state, principal, raw_id, capability, action, detail.clone())? {
        if let Some(record) = early.stage(state).await? {
            return Ok((early.pool, early.at, record));
        }
    }
    let (pool, at, record, _) =
        open_read_call(state, principal, raw_id, capability, action, detail).await?;
    Ok((pool, at, record))
}

/// A data-plane call on a row this process remembers running: its pool and instance, known
/// at once, and its record still to be staged guarded on the row ([`EarlyCall::stage`]). The
/// caller may prepare the call meanwhile (exec opens its connection to the sandbox), as long
/// as nothing reaches the sandbox before the record is staged.
pub(crate) struct EarlyCall {
    pub pool: Arc<Pool>,
    pub at: InstanceRef,
    /// What a program started by the call adds under its own env.
    pub env: BaseEnv,
    event: NewAuditEvent,
    guard: RowGuard,
}

/// The [`EarlyCall`] for sandbox `raw_id` if this process remembers it running and the
/// principal owns it; `None` means the row must be read ([`open_read_call`]).
pub(crate) fn early_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<Option<EarlyCall>> {
    let id = SandboxId::parse(raw_id).map_err(|_| ApiError::not_found("sandbox"))?;
    let Some(r) = remembered(state, principal, &id) else {
        return Ok(None);
    };
    let pool = named_pool(state, &r.pool)?;
    require_capability(&pool, capability)?;
    let event = audit_event(principal, (&r.org_id, &r.project_id, &r.id), action, detail);
    let guard = RowGuard {
        sandbox: r.id.clone(),
        status: SandboxStatus::Running,
        status_version: r.status_version,
    };
    let at = InstanceRef {
        sandbox_id: r.id,
        backend_ref: r.backend_ref,
    };
    // `RunningRows::get` hands out only rows whose env is known.
    let Some(env) = r.env else {
        return Ok(None);
    };
    Ok(Some(EarlyCall {
        pool,
        at,
        env,
        event,
        guard,
    }))
}

impl EarlyCall {
    /// Stages the call's record guarded on the remembered row, and counts the call as the
    /// sandbox's activity. `None`: the row moved since (it is forgotten; read it as any
    /// other call), nothing written.
    pub(crate) async fn stage(&self, state: &AppState) -> ApiResult<Option<StagedAudit>> {
        match state
            .store
            .stage_audit_if(self.event.clone(), &self.guard)
            .await?
        {
            Some(record) => {
                state
                    .activity
                    .record(&state.store, &self.at.sandbox_id, Utc::now());
                Ok(Some(record))
            }
            None => {
                state.events.running.forget(&self.at.sandbox_id);
                Ok(None)
            }
        }
    }
}

/// A data-plane call whose row is read first (and woken if idle, as [`ready_for_data`]
/// does): its record is committed before the call, and the row remembered for the next call.
/// With the [`BaseEnv`] a program it starts adds under its own.
pub(crate) async fn open_read_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef, StagedAudit, BaseEnv)> {
    let sandbox = load_sandbox(state, principal, raw_id).await?;
    let (pool, at, sandbox) = ready_for_data(state, principal, sandbox, capability).await?;
    let record = audit(state, principal, &sandbox, action, detail).await?;
    state.events.running.remember(&sandbox);
    let env = Arc::new(crate::running_rows::call_env_of(&sandbox));
    Ok((pool, at, StagedAudit::committed(record), env))
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

/// Commits `record`, polled by the caller; if the caller is dropped first (a hang-up drops its
/// handler), the commit goes on in a task of its own, so the commit of a call that may already
/// have started is never cancelled. Spawning the commit up front did the same at the cost of
/// a task and a thread wake-up per call.
///
/// `COMMIT` is sent only after the tasks this one has just woken have had their turn: an exec
/// gives its command the go-ahead right before, and the task holding the command's request
/// then writes it first. Sent at once, the command waited behind it (0.15 ms at the median
/// between the record staged and the command written, 0.4 ms or more in one exec of four,
/// measured on a real OpenSandbox: `docs/opensandbox.md`); the commit still overlaps the
/// command.
pub(crate) async fn commit_detached(record: StagedAudit) -> ApiResult<()> {
    let mut commit = FinishOnDrop(Some(Box::pin(record.commit())));
    // Dropped while yielding, `commit` goes on in a task of its own as above.
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| commit.poll(cx)).await?;
    Ok(())
}

/// A future finished in a task of its own should it be dropped before it ends.
struct FinishOnDrop<F: std::future::Future + Send + 'static>(Option<std::pin::Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: std::future::Future + Send + 'static> FinishOnDrop<F>
where
    F::Output: Send,
{
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let Some(f) = self.0.as_mut() else {
            // Polled again after it ended: never, as `commit_detached` awaits it once.
            return std::task::Poll::Pending;
        };
        let out = std::task::ready!(f.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(out)
    }
}

impl<F: std::future::Future + Send + 'static> Drop for FinishOnDrop<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        if let (Some(f), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use differently_store::audit::{AuditEvent, AuditKey, NewAuditEvent};
    use std::sync::{Arc, Mutex};

    fn record() -> AuditEvent {
        let key = AuditKey::random().expect("audit key");
        let event = NewAuditEvent {
            org_id: None,
            project_id: None,
            actor: "system:test".to_owned(),
            action: "sandbox.exec".to_owned(),
            resource: "sbx_test".to_owned(),
            outcome: "ok".to_owned(),
            detail: serde_json::json!({}),
        };
        AuditEvent::chained(&key, "test".to_owned(), None, event, Utc::now(), None)
    }

    /// What an exec does: the go-ahead wakes the task holding the command, then the record
    /// commits. That task writes the command before `COMMIT` is sent.
    #[tokio::test(flavor = "current_thread")]
    async fn a_task_just_woken_runs_before_the_commit_is_sent() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let command = {
            let order = order.clone();
            tokio::spawn(async move {
                let _ = ready.await;
                order.lock().unwrap().push("command written");
            })
        };
        tokio::task::yield_now().await; // the command's task now waits for its go-ahead
        let staged = {
            let order = order.clone();
            StagedAudit::pending(record(), async move {
                order.lock().unwrap().push("commit sent");
                Ok(())
            })
        };
        go.send(()).expect("the command's task waits");
        commit_detached(staged).await.expect("commit");
        command.await.expect("command task");
        assert_eq!(
            *order.lock().unwrap(),
            ["command written", "commit sent"],
            "the woken task goes first"
        );
    }

    /// A caller dropped before the commit was sent (a hang-up during the yield) still
    /// commits: the command may already have been given its go-ahead.
    #[tokio::test(flavor = "current_thread")]
    async fn a_commit_dropped_before_it_was_sent_still_goes_through() {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let staged = StagedAudit::pending(record(), async move {
            let _ = done_tx.send(());
            Ok(())
        });
        let mut commit = Box::pin(commit_detached(staged));
        // One poll: the commit future is set up and this task yields before sending it.
        let polled = futures::poll!(commit.as_mut());
        assert!(polled.is_pending(), "it yields before the commit");
        drop(commit);
        tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("the commit ran in a task of its own")
            .expect("the commit completed");
    }
}
