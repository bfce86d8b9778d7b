//! [`DataCall`]: the one walk of a data-plane call from its audit record to its command (the
//! steps are in the module above).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use chrono::Utc;
use differently_adapters::go_ahead::{GoAhead, GoAheadGiver};
use differently_adapters::InstanceRef;
use differently_core::{SandboxId, SandboxStatus};
use differently_store::audit::{AuditEvent, NewAuditEvent, RowGuard, StagedAudit};
use serde_json::Value;

use super::overlap::{beside, commit_detached, while_committing};
use super::{ready_for_data, remembered, Target};
use crate::auth::access::load_sandbox;
use crate::auth::Principal;
use crate::control::mutation::{audit, audit_event};
use crate::control::sandbox_pool::{named_pool, require_capability};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// One data-plane call by `principal` on a sandbox: what it needs of the pool (`capability`)
/// and the audit record it writes (`action` with `detail`), appended before anything reaches
/// the sandbox (fail closed).
pub(crate) struct DataCall<'a> {
    state: &'a AppState,
    principal: &'a Principal,
    sandbox: &'a str,
    capability: &'static str,
    action: &'static str,
    detail: Value,
}

/// A call on a row this process remembers running: its target known at once, its record
/// still to be staged guarded on the row.
struct Remembered {
    target: Target,
    event: NewAuditEvent,
    guard: RowGuard,
}

impl<'a> DataCall<'a> {
    /// The call on sandbox `raw_id` (as the path gave it).
    pub(crate) fn new(
        state: &'a AppState,
        principal: &'a Principal,
        raw_id: &'a str,
        capability: &'static str,
        action: &'static str,
        detail: Value,
    ) -> DataCall<'a> {
        DataCall {
            state,
            principal,
            sandbox: raw_id,
            capability,
            action,
            detail,
        }
    }

    /// For a call that sends nothing before its record is durable (a terminal's open or
    /// reattach, file transfers): its target, with its record committed.
    pub(crate) async fn open(self) -> ApiResult<(Target, AuditEvent)> {
        if let Some(r) = self.remembered()? {
            let sandbox = r.target.at.sandbox_id.clone();
            if let Some(record) = stage_guarded(self.state, r.event, &r.guard, &sandbox).await? {
                return Ok((r.target, record.commit().await?));
            }
            // The row moved since: nothing was written; read it like any other call.
        }
        self.read().await
    }

    /// For a call that runs a command: `prepare` builds the call on its target, sending
    /// nothing of the command before its [`GoAhead`], and the call is polled while the record
    /// is staged. The result has the record staged and the command not yet let go
    /// ([`Staged::answer`], [`Staged::detach`]). A refused record drops the prepared call
    /// (nothing sent) and tries again from a read of the row, with a new one; an error of
    /// `prepare` is the call's, before anything is written for that attempt.
    pub(crate) async fn start<C: Future>(
        self,
        mut prepare: impl FnMut(&Target, GoAhead) -> ApiResult<C>,
    ) -> ApiResult<Staged<C>> {
        if let Some(r) = self.remembered()? {
            let sandbox = r.target.at.sandbox_id.clone();
            let stage = stage_guarded(self.state, r.event, &r.guard, &sandbox);
            if let Some(staged) = Staged::prepared_beside(r.target, stage, &mut prepare).await? {
                return Ok(staged);
            }
            // The row moved since: nothing was sent; read it like any other call.
        }
        let action = self.action;
        let (target, record) = self.read().await?;
        let committed = std::future::ready(Ok(Some(StagedAudit::committed(record))));
        Staged::prepared_beside(target, committed, &mut prepare)
            .await?
            .ok_or_else(|| ApiError::internal(format!("{action}: a committed record was refused")))
    }

    /// The call's target and record, if this process remembers the row running, the
    /// principal owns it and its env is known; `None` means the row must be read.
    fn remembered(&self) -> ApiResult<Option<Remembered>> {
        let id = SandboxId::parse(self.sandbox).map_err(|_| ApiError::not_found("sandbox"))?;
        let Some(r) = remembered(self.state, self.principal, &id) else {
            return Ok(None);
        };
        let pool = named_pool(self.state, &r.pool)?;
        require_capability(&pool, self.capability)?;
        // `RunningRows::get` hands out only rows whose env is known.
        let Some(env) = r.env else {
            return Ok(None);
        };
        let event = audit_event(
            self.principal,
            (&r.org_id, &r.project_id, &r.id),
            self.action,
            self.detail.clone(),
        );
        let guard = RowGuard {
            sandbox: r.id.clone(),
            status: SandboxStatus::Running,
            status_version: r.status_version,
        };
        let at = InstanceRef {
            sandbox_id: r.id,
            backend_ref: r.backend_ref,
        };
        Ok(Some(Remembered {
            target: Target { pool, at, env },
            event,
            guard,
        }))
    }

    /// The call's target from a read of the row (woken if idle, as [`ready_for_data`]
    /// does), its record committed, and the row remembered for the next call.
    async fn read(self) -> ApiResult<(Target, AuditEvent)> {
        let (state, principal) = (self.state, self.principal);
        let sandbox = load_sandbox(state, principal, self.sandbox).await?;
        let (pool, at, sandbox) =
            ready_for_data(state, principal, sandbox, self.capability).await?;
        let record = audit(state, principal, &sandbox, self.action, self.detail).await?;
        state.events.running.remember(&sandbox);
        let env = Arc::new(crate::data_plane::running_rows::call_env_of(&sandbox));
        Ok((Target { pool, at, env }, record))
    }
}

/// Stages `event` guarded on the remembered row, and counts the call as the sandbox's
/// activity. `None`: the row moved since (it is forgotten), nothing written.
async fn stage_guarded(
    state: &AppState,
    event: NewAuditEvent,
    guard: &RowGuard,
    sandbox: &SandboxId,
) -> ApiResult<Option<StagedAudit>> {
    match state.store.stage_audit_if(event, guard).await? {
        Some(record) => {
            state.activity.record(&state.store, sandbox, Utc::now());
            Ok(Some(record))
        }
        None => {
            state.events.running.forget(sandbox);
            Ok(None)
        }
    }
}

/// A call whose record is staged (perhaps not yet durable) and whose command is prepared
/// but not sent: [`Staged::answer`] or [`Staged::detach`] lets it go. Dropped, it withdraws
/// the command unsent.
pub(crate) struct Staged<C: Future> {
    target: Target,
    record: StagedAudit,
    giver: GoAheadGiver,
    call: Detached<C>,
}

impl<C: Future> Staged<C> {
    /// Prepares the call on `target` and polls it while `stage` stages its record; `None`:
    /// the record was refused and the call dropped with its command unsent (as on an error).
    async fn prepared_beside(
        target: Target,
        stage: impl Future<Output = ApiResult<Option<StagedAudit>>>,
        prepare: &mut impl FnMut(&Target, GoAhead) -> ApiResult<C>,
    ) -> ApiResult<Option<Staged<C>>> {
        let (giver, go) = GoAhead::pair();
        let mut call = Box::pin(prepare(&target, go)?);
        tokio::pin!(stage);
        let (staged, ended) = beside(stage.as_mut(), call.as_mut()).await;
        let Some(record) = staged? else {
            return Ok(None);
        };
        Ok(Some(Staged {
            target,
            record,
            giver,
            call: Detached { call, ended },
        }))
    }

    /// Where the call goes.
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// The call's record, as it is or will be committed.
    pub(crate) fn record(&self) -> &AuditEvent {
        self.record.record()
    }

    /// Lets the command go and answers once it has ended and its record is durable; a failed
    /// commit cancels the command and fails the call.
    pub(crate) async fn answer<T>(self) -> ApiResult<T>
    where
        C: Future<Output = ApiResult<T>>,
    {
        self.giver.give();
        while_committing(self.record, self.call).await
    }

    /// Lets the command go and waits only for its record to be durable: the call, handed
    /// back, goes on (a stream's output). A failed commit drops the call and fails.
    pub(crate) async fn detach(self) -> ApiResult<Detached<C>> {
        self.giver.give();
        commit_detached(self.record).await?;
        Ok(self.call)
    }
}

/// A call that has its go-ahead, with its output if it ended while its record was staged.
pub(crate) struct Detached<C: Future> {
    call: Pin<Box<C>>,
    ended: Option<C::Output>,
}

impl<C: Future> Detached<C> {
    /// A call let go without being prepared beside a record (a test's).
    #[cfg(test)]
    pub(crate) fn new(call: C) -> Detached<C> {
        Detached {
            call: Box::pin(call),
            ended: None,
        }
    }

    /// The call itself (the caller's own type, to set it up for what follows).
    pub(crate) fn call_mut(&mut self) -> Pin<&mut C> {
        self.call.as_mut()
    }
}

// The output is never pinned (only moved out once ready), and the call is boxed.
impl<C: Future> Unpin for Detached<C> {}

impl<C: Future> Future for Detached<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        if let Some(out) = self.ended.take() {
            return Poll::Ready(out);
        }
        self.call.as_mut().poll(cx)
    }
}
