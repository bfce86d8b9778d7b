//! Level-triggered repair: creates whose work may never have gone out, provisioning that
//! made no progress (adopt the instance or requeue), deletes that did not finish, and
//! lifecycle operations whose work message was lost.

use std::collections::HashMap;

use chrono::Utc;
use differently_bus::Published;
use differently_bus_schema::{Cause, Origin, WorkOp};
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{ErrorCode, SandboxId, SandboxStatus};
use differently_store::lifecycle::{OpError, OpState};
use differently_store::{Actor, StoreError, Transition};
use tokio::time::Instant;

use super::{chrono_dur, pool_of, row_failed, traced, BATCH};
use crate::Scheduler;

pub(super) async fn stuck_provisioning(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(s.config.provisioning_timeout);
    for row in s
        .store
        .stale(SandboxStatus::Provisioning, before, BATCH)
        .await?
    {
        if let Err(e) = traced("sweep.provisioning", provisioning_one(s, row.clone(), now)).await {
            row_failed("provisioning", &row, &e);
        }
    }
    Ok(())
}

/// Adopts the backend instance of one stale provisioning row, or requeues the row.
pub(super) async fn provisioning_one(
    s: &Scheduler,
    row: differently_core::Sandbox,
    now: chrono::DateTime<Utc>,
) -> Result<(), StoreError> {
    let adapter = row
        .pool
        .as_deref()
        .and_then(|p| s.pools.get(p))
        .map(|p| p.adapter.clone());
    let found = match &adapter {
        Some(a) => match a.find(&row.id).await {
            Ok(found) => found,
            // The backend cannot say; leave the row for the next pass.
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "sweep: cannot look up instance");
                return Ok(());
            }
        },
        None => None,
    };
    let (action, updated) = match found {
        Some(instance) => (
            "provisioning_adopted",
            s.store
                .mark_running(&row.id, &instance.backend_ref, now)
                .await,
        ),
        None => (
            "provisioning_requeued",
            s.store
                .requeue(&row.id, "provisioning timed out; retrying", now)
                .await,
        ),
    };
    match updated {
        Ok(u) => {
            if u.status == SandboxStatus::Queued {
                tracing::info!(sandbox = %row.id, action, "sweep: provisioning timed out; requeued");
                let _ = s.announcer.admitted(&u, "-requeue").await;
            } else {
                tracing::info!(sandbox = %row.id, action, "sweep: adopted the backend instance");
            }
            crate::metrics::reconcile_action(pool_of(&row), action);
            let _ = s
                .announcer
                .status_by(&u, Origin::system(Cause::Reconciler))
                .await;
            Ok(())
        }
        Err(StoreError::StatusConflict { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long after its activation a provisioning row's create may be re-published: inside the
/// bus's de-duplication window (with a margin for clock skew), so a re-send of a create that
/// did go out is dropped by the bus and can never start a second backend create.
pub(super) const CREATE_RESEND_WITHIN: std::time::Duration =
    std::time::Duration::from_secs(differently_bus::jetstream::DUPLICATE_WINDOW.as_secs() * 3 / 4);

/// Provisioning rows whose create work may never have been published: whoever activated
/// them (the leader, or an API process placing directly in the admission) died or lost the
/// bus between its commit and its publish. Each is re-published once, `repair_interval` after
/// its activation, under the original message id: the bus drops it if the first one went
/// out, so only a lost create is delivered. Older rows are the provisioning timeout's
/// (adopt or requeue), which stays the repair of last resort.
pub(super) async fn unsent_creates(
    s: &Scheduler,
    resent: &mut HashMap<SandboxId, Instant>,
) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(s.config.repair_interval);
    let oldest = now - chrono_dur(CREATE_RESEND_WITHIN);
    let rows = s
        .store
        .stale(SandboxStatus::Provisioning, before, BATCH)
        .await?;
    resent.retain(|id, _| rows.iter().any(|r| &r.id == id));
    let due = rows
        .iter()
        .filter(|row| row.updated_at >= oldest && !resent.contains_key(&row.id));
    // All at once: each publish is bounded, but one after another a pass of many rows
    // would still take the bound times the rows while the stream has no leader.
    let sent = futures::future::join_all(due.map(|row| async move {
        let names = ("sweep.create", "create_resent");
        (row, resend_work(s, row, WorkOp::Create, "", names).await)
    }))
    .await;
    for (row, ok) in sent {
        if ok {
            resent.insert(row.id.clone(), Instant::now());
        }
    }
    Ok(())
}

/// Re-publishes `op` work for `row` under a root trace named `trace_name`, logging and
/// counting it as `action` when the bus stored it (a duplicate of a message that did go out
/// is dropped by the bus and counted nowhere); whether the bus answered.
pub(super) async fn resend_work(
    s: &Scheduler,
    row: &differently_core::Sandbox,
    op: WorkOp,
    attempt: &str,
    (trace_name, action): (&'static str, &'static str),
) -> bool {
    traced(trace_name, async {
        match s.announcer.work(row, op, attempt).await {
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, op = op.as_str(), "sweep: work re-send failed");
                false
            }
            Ok(Published::Duplicate) => {
                // The first one went out: nothing was lost, nothing to count.
                tracing::debug!(sandbox = %row.id, op = op.as_str(), "sweep: work re-send was a duplicate");
                true
            }
            Ok(Published::Stored) => {
                tracing::info!(sandbox = %row.id, action, "sweep: work re-sent");
                crate::metrics::reconcile_action(pool_of(row), action);
                true
            }
        }
    })
    .await
}

pub(super) async fn stuck_terminating(
    s: &Scheduler,
    resent: &mut HashMap<SandboxId, Instant>,
) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(s.config.terminating_retry);
    let rows = s
        .store
        .stale(SandboxStatus::Terminating, before, BATCH)
        .await?;
    resent.retain(|id, _| rows.iter().any(|r| &r.id == id));
    for row in rows {
        let due = resent
            .get(&row.id)
            .is_none_or(|t| t.elapsed() >= s.config.terminating_retry);
        if !due {
            continue;
        }
        if row.pool.is_none() {
            // Never reached a backend: nothing to delete.
            let t = Transition {
                id: row.id.clone(),
                from: vec![SandboxStatus::Terminating],
                to: SandboxStatus::Terminated,
                reason: row.status_reason.clone(),
                actor: Actor::System("sweep"),
            };
            if let Ok(u) = s.store.transition(t, now).await {
                let _ = s
                    .announcer
                    .status_by(&u, Origin::system(Cause::Reconciler))
                    .await;
            }
            continue;
        }
        let attempt = format!("-retry{}", now.timestamp());
        let names = ("sweep.terminating", "delete_resent");
        if resend_work(s, &row, WorkOp::Delete, &attempt, names).await {
            resent.insert(row.id.clone(), Instant::now());
        }
    }
    Ok(())
}

/// Pending operations older than this are re-sent (their work message may be lost).
pub(super) const OP_RESEND_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Re-sends lost lifecycle work; fails operations whose sandbox has ended.
pub(super) async fn repair_ops(
    s: &Scheduler,
    resent: &mut HashMap<OpId, Instant>,
) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(OP_RESEND_AFTER);
    let ops = s.store.pending_ops(before, BATCH).await?;
    resent.retain(|id, _| ops.iter().any(|o| &o.id == id));
    for op in ops {
        if resent
            .get(&op.id)
            .is_some_and(|t| t.elapsed() < OP_RESEND_AFTER)
        {
            continue;
        }
        let Some(kind) = WorkOp::parse(&op.kind) else {
            continue;
        };
        if let Err(e) = repair_op(s, &op, kind, now, resent).await {
            tracing::warn!(pass = "operations", op = %op.id, sandbox = %op.sandbox_id, error = %e, action = "row_skipped", "sweep: one operation failed; skipped it this pass");
            crate::metrics::reconcile_action("none", "row_skipped");
        }
    }
    Ok(())
}

/// Re-sends one pending operation's work, or fails it when its sandbox has ended.
async fn repair_op(
    s: &Scheduler,
    op: &differently_store::lifecycle::OpRecord,
    kind: WorkOp,
    now: chrono::DateTime<Utc>,
    resent: &mut HashMap<OpId, Instant>,
) -> Result<(), StoreError> {
    let row = s.store.get_sandbox(&op.sandbox_id).await?;
    let ended = row.as_ref().is_none_or(|r| r.status.is_final());
    let snapshot_pool = match op.args["snapshotId"].as_str().map(SnapshotId::parse) {
        Some(Ok(id)) => s.store.get_snapshot(&id).await?.map(|snap| snap.pool),
        _ => None,
    };
    let pool = snapshot_pool.or_else(|| row.as_ref().and_then(|r| r.pool.clone()));
    match (row, pool) {
        (Some(row), Some(pool)) if !ended || kind == WorkOp::DeleteSnapshot => {
            let attempt = format!("-retry{}", now.timestamp());
            let sent = traced("sweep.op_resend", async {
                tracing::info!(sandbox = %row.id, op = %op.id, kind = %op.kind, action = "op_resend", "sweep: re-sending operation");
                crate::metrics::reconcile_action(&pool, "op_resend");
                s.announcer
                    .op(&row, &pool, kind, op.id.as_str(), &attempt)
                    .await
                    .is_ok()
            })
            .await;
            if sent {
                resent.insert(op.id.clone(), Instant::now());
            }
        }
        _ => {
            let err = OpError {
                code: ErrorCode::Conflict.as_str().to_owned(),
                message: "the sandbox ended before the operation ran".to_owned(),
            };
            s.store
                .finish_op(
                    &op.id,
                    OpState::Failed,
                    serde_json::Value::Null,
                    Some(err),
                    now,
                )
                .await?;
        }
    }
    Ok(())
}
