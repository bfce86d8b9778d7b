//! Changes of a sandbox through the pool's workers (design doc §5).
//!
//! A mutation is an operation record (`LifecycleStore::begin_op`, at most one exclusive one
//! pending per sandbox, so a conflicting concurrent change is a 409) plus a work message
//! `dly.work.<pool>.<op>`. The handler waits for the worker to record the outcome up to
//! `LIFECYCLE_WAIT`, then answers 202: the change completes even if the caller leaves.
//! Repeating a transition into the current status is a 200 with no backend call. Every
//! action's audit record is appended before it runs (fail closed).

use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use differently_bus_schema::WorkOp;
use differently_core::ids::OpId;
use differently_core::lifecycle::LifecycleStep;
use differently_core::sandbox::SandboxView;
use differently_core::{ErrorCode, OrgId, ProjectId, Sandbox, SandboxId};
use differently_store::audit::NewAuditEvent;
use differently_store::lifecycle::{OpBegun, OpRecord, OpState};
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::control::sandbox_pool::{pool_name, pool_of, require_capability, status_conflict};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// How long a lifecycle call waits for its outcome before answering 202.
pub const LIFECYCLE_WAIT: Duration = Duration::from_secs(10);

/// Appends an audit record of `action` on `sandbox` by the caller, before the action runs:
/// if it cannot be written the action does not happen (fail closed). Never argument values.
/// Answers the record written.
pub(crate) async fn audit(
    state: &AppState,
    principal: &Principal,
    sandbox: &Sandbox,
    action: &str,
    detail: Value,
) -> ApiResult<differently_store::audit::AuditEvent> {
    Ok(state
        .store
        .append_audit(audit_event(
            principal,
            (&sandbox.org_id, &sandbox.project_id, &sandbox.id),
            action,
            detail,
        ))
        .await?)
}

/// The record of `action` on sandbox `(org, project, id)` by the caller, before the action
/// runs.
pub(crate) fn audit_event(
    principal: &Principal,
    (org, project, id): (&OrgId, &ProjectId, &SandboxId),
    action: &str,
    detail: Value,
) -> NewAuditEvent {
    NewAuditEvent {
        org_id: Some(org.clone()),
        project_id: Some(project.clone()),
        actor: principal.actor().as_audit(),
        action: action.to_owned(),
        resource: id.to_string(),
        outcome: "requested".to_owned(),
        detail,
    }
}

/// Waits up to `bound` for operation `id` to finish; `None` if it is still pending.
pub(crate) async fn wait_op(
    state: &AppState,
    id: &OpId,
    sandbox: &SandboxId,
    bound: Duration,
) -> ApiResult<Option<OpRecord>> {
    let mut events = state.events.watch(sandbox);
    let deadline = tokio::time::Instant::now() + bound;
    let mut poll = Duration::from_millis(25);
    loop {
        match state.store.get_op(id).await? {
            Some(op) if op.state != OpState::Pending => return Ok(Some(op)),
            Some(_) => {}
            None => return Err(ApiError::internal(format!("operation {id} vanished"))),
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        // The worker records the outcome right after the status event: an event of this
        // sandbox or a short poll, whichever comes first.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = tokio::time::sleep(poll) => {}
            _ = events.changed() => {}
        }
        poll = (poll * 2).min(Duration::from_millis(250));
    }
}

/// The error a failed operation carries, as served.
pub(crate) fn op_failure(op: &OpRecord) -> ApiError {
    let (code, message) = match &op.error {
        Some(e) => (
            serde_json::from_value::<ErrorCode>(Value::String(e.code.clone()))
                .unwrap_or(ErrorCode::Internal),
            e.message.clone(),
        ),
        None => (ErrorCode::Internal, "the operation failed".to_owned()),
    };
    ApiError::new(code, message).with_details(json!({ "operation": op.id, "kind": op.kind }))
}

/// Inserts (or joins) an operation and publishes its work message.
pub(crate) async fn begin(
    state: &AppState,
    sandbox: &Sandbox,
    pool: &str,
    op: WorkOp,
    exclusive: bool,
    args: Value,
    actor: String,
) -> ApiResult<OpRecord> {
    let record = OpRecord::new(sandbox, op.as_str(), exclusive, args, actor, Utc::now());
    let record = match state.store.begin_op(&record).await? {
        OpBegun::New(r) => {
            // The operation record is durable: the scheduler's repair re-sends it.
            let (a, s, p, id) = (
                state.announcer.clone(),
                sandbox.clone(),
                pool.to_owned(),
                r.id.as_str().to_owned(),
            );
            let (b, s2, id2, origin) = (
                state.announcer.clone(),
                sandbox.clone(),
                id.clone(),
                differently_bus_schema::Origin::from_audit_actor(&r.actor),
            );
            crate::control::after_commit::publish_bounded(
                sandbox.id.as_str(),
                vec![
                    (
                        "operation",
                        crate::control::after_commit::boxed(async move {
                            a.op(&s, &p, op, &id, "").await
                        }),
                    ),
                    (
                        "operation event",
                        crate::control::after_commit::boxed(async move {
                            b.operation(
                                &s2,
                                differently_bus_schema::EventType::OperationRequested,
                                &id2,
                                op.as_str(),
                                None,
                                origin,
                            )
                            .await
                        }),
                    ),
                ],
            )
            .await;
            r
        }
        OpBegun::Joined(r) => r,
        OpBegun::Busy(other) => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "another change ({}) of this sandbox is in progress; retry when it is done",
                    other.kind
                ),
            )
            .with_details(json!({ "operation": other.id, "kind": other.kind })))
        }
    };
    Ok(record)
}

/// A status transition through the workers; see the module docs.
pub(crate) async fn transition(
    state: &AppState,
    principal: &Principal,
    sandbox: Sandbox,
    op: WorkOp,
    bound: Duration,
) -> ApiResult<(StatusCode, SandboxView)> {
    let Some(lifecycle) = op.lifecycle() else {
        return Err(ApiError::internal(format!("{op:?} is not a transition")));
    };
    let pool = pool_of(state, &sandbox)?;
    let capability = match op {
        WorkOp::Pause | WorkOp::Resume => "lifecycle.pause",
        _ => "lifecycle.stop",
    };
    require_capability(&pool, capability)?;
    match lifecycle.step(sandbox.status) {
        LifecycleStep::AlreadyDone => return Ok((StatusCode::OK, sandbox.view())),
        LifecycleStep::Refused => {
            return Err(status_conflict(
                &sandbox,
                &format!("cannot {} the sandbox", op.as_str()),
            ))
        }
        LifecycleStep::Proceed => {}
    }
    audit(
        state,
        principal,
        &sandbox,
        &format!("sandbox.{}", op.as_str()),
        json!({}),
    )
    .await?;
    let record = begin(
        state,
        &sandbox,
        &pool_name(&pool),
        op,
        true,
        json!({ "reason": null }),
        principal.actor().as_audit(),
    )
    .await?;
    match wait_op(state, &record.id, &sandbox.id, bound).await? {
        Some(done) if done.state == OpState::Done => {
            let now = state
                .store
                .get_sandbox(&sandbox.id)
                .await?
                .ok_or_else(|| ApiError::not_found("sandbox"))?;
            Ok((StatusCode::OK, now.view()))
        }
        Some(failed) => Err(op_failure(&failed)),
        None => {
            let now = state
                .store
                .get_sandbox(&sandbox.id)
                .await?
                .unwrap_or(sandbox);
            Ok((StatusCode::ACCEPTED, now.view()))
        }
    }
}
