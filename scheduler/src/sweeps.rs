//! Level-triggered sweeps run by the leader every tick: TTL expiry, provisioning that made
//! no progress (adopt the backend instance or requeue), deletes that did not finish, idle
//! sandboxes (paused, or stopped where the pool cannot pause), lifecycle operations whose work
//! message was lost (re-sent), and — every `reconcile_interval` — the reconciler: each pool's
//! backend listing against the rows. Backend instances tagged with this installation whose
//! row is missing or final are deleted (orphans); live rows whose instance vanished fail with
//! a reason; a pool whose listing fails is skipped for that pass. Every action is logged with
//! `action=` for counting.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use differently_bus_schema::WorkOp;
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{ErrorCode, SandboxId, SandboxStatus};
use differently_store::lifecycle::{OpBegun, OpError, OpRecord, OpState, IDLE_REASON};
use differently_store::{Actor, StoreError, Transition};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Scheduler;

const BATCH: u32 = 100;
/// How often the idle and operation-repair passes run.
const IDLE_PASS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    let mut resent: HashMap<SandboxId, Instant> = HashMap::new();
    let mut ops_resent: HashMap<OpId, Instant> = HashMap::new();
    let mut last_reconcile: Option<Instant> = None;
    let mut last_idle: Option<Instant> = None;
    loop {
        // Idle and lost-operation passes scan more rows than the others: once a second is
        // plenty for timeouts counted in seconds.
        if last_idle.is_none_or(|t| t.elapsed() >= IDLE_PASS_EVERY) {
            last_idle = Some(Instant::now());
            if let Err(e) = idle(&s).await {
                tracing::warn!(error = %e, "sweep: idle pass failed");
            }
            if let Err(e) = repair_ops(&s, &mut ops_resent).await {
                tracing::warn!(error = %e, "sweep: operation repair failed");
            }
        }
        if last_reconcile.is_none_or(|t| t.elapsed() >= s.config.reconcile_interval) {
            last_reconcile = Some(Instant::now());
            if let Err(e) = reconcile(&s).await {
                tracing::warn!(error = %e, "sweep: reconcile failed");
            }
        }
        if let Err(e) = expire(&s).await {
            tracing::warn!(error = %e, "sweep: ttl expiry failed");
        }
        if let Err(e) = stuck_provisioning(&s).await {
            tracing::warn!(error = %e, "sweep: provisioning repair failed");
        }
        if let Err(e) = stuck_terminating(&s, &mut resent).await {
            tracing::warn!(error = %e, "sweep: terminating repair failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(s.config.tick.max(std::time::Duration::from_millis(500))) => {}
            _ = stop.changed() => return,
        }
    }
}

fn chrono_dur(d: std::time::Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or_else(|_| chrono::Duration::seconds(60))
}

async fn expire(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    for row in s.store.expired(now, BATCH).await? {
        let t = Transition {
            id: row.id.clone(),
            from: vec![
                SandboxStatus::Running,
                SandboxStatus::Paused,
                SandboxStatus::Stopped,
            ],
            to: SandboxStatus::Terminating,
            reason: Some("ttl expired".into()),
            actor: Actor::System("ttl"),
        };
        match s.store.transition(t, now).await {
            Ok(updated) => {
                tracing::info!(sandbox = %updated.id, "ttl expired");
                let _ = s.announcer.work(&updated, WorkOp::Delete, "").await;
                let _ = s.announcer.status(&updated).await;
            }
            Err(StoreError::StatusConflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn stuck_provisioning(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(s.config.provisioning_timeout);
    for row in s
        .store
        .stale(SandboxStatus::Provisioning, before, BATCH)
        .await?
    {
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
                    continue;
                }
            },
            None => None,
        };
        let updated = match found {
            Some(instance) => {
                tracing::info!(sandbox = %row.id, "sweep: adopting backend instance");
                s.store
                    .mark_running(&row.id, &instance.backend_ref, now)
                    .await
            }
            None => {
                tracing::info!(sandbox = %row.id, "sweep: provisioning timed out; requeueing");
                s.store
                    .requeue(&row.id, "provisioning timed out; retrying", now)
                    .await
            }
        };
        match updated {
            Ok(u) => {
                if u.status == SandboxStatus::Queued {
                    let _ = s.announcer.admitted(&u, "-requeue").await;
                }
                let _ = s.announcer.status(&u).await;
            }
            Err(StoreError::StatusConflict { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn stuck_terminating(
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
                let _ = s.announcer.status(&u).await;
            }
            continue;
        }
        let attempt = format!("-retry{}", now.timestamp());
        if let Err(e) = s.announcer.work(&row, WorkOp::Delete, &attempt).await {
            tracing::warn!(sandbox = %row.id, error = %e, "sweep: delete re-send failed");
        } else {
            resent.insert(row.id.clone(), Instant::now());
        }
    }
    Ok(())
}

/// Pauses (or stops, where the pool cannot pause) running sandboxes idle past their timeout,
/// through the same operation records and work messages as the API.
async fn idle(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    let default = s.config.default_idle_timeout.map(|d| d.as_secs().max(1));
    for row in s.store.idle_candidates(now, default, BATCH).await? {
        let Some(pool) = row.pool.as_deref().and_then(|p| s.pools.get(p)) else {
            continue;
        };
        let caps = pool.adapter.capabilities();
        let op = if caps.iter().any(|c| c == "lifecycle.pause") {
            WorkOp::Pause
        } else if caps.iter().any(|c| c == "lifecycle.stop") {
            WorkOp::Stop
        } else {
            tracing::debug!(sandbox = %row.id, "sweep: idle, but the pool can neither pause nor stop");
            continue;
        };
        let record = OpRecord::new(
            &row,
            op.as_str(),
            true,
            serde_json::json!({ "reason": IDLE_REASON }),
            Actor::System("idle").as_audit(),
            now,
        );
        if let OpBegun::New(r) = s.store.begin_op(&record).await? {
            tracing::info!(sandbox = %row.id, op = op.as_str(), action = "idle", "sweep: idle sandbox");
            let pool_name = pool.view().name;
            crate::metrics::reconcile_action(&pool_name, "idle");
            if let Err(e) = s
                .announcer
                .op(&row, &pool_name, op, r.id.as_str(), "")
                .await
            {
                tracing::warn!(sandbox = %row.id, error = %e, "sweep: idle publish failed; repair re-sends it");
            }
        }
    }
    Ok(())
}

/// Pending operations older than this are re-sent (their work message may be lost).
const OP_RESEND_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Re-sends lost lifecycle work; fails operations whose sandbox has ended.
async fn repair_ops(s: &Scheduler, resent: &mut HashMap<OpId, Instant>) -> Result<(), StoreError> {
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
                tracing::info!(op = %op.id, kind = %op.kind, action = "op_resend", "sweep: re-sending operation");
                crate::metrics::reconcile_action(&pool, "op_resend");
                if s.announcer
                    .op(&row, &pool, kind, op.id.as_str(), &attempt)
                    .await
                    .is_ok()
                {
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
    }
    Ok(())
}

/// One reconciliation pass over every pool; see the module docs.
async fn reconcile(s: &Scheduler) -> Result<(), StoreError> {
    let installation = s.store.installation_id().await?;
    for name in s.pools.names() {
        let Some(pool) = s.pools.get(&name) else {
            continue;
        };
        let listed_at = Utc::now();
        let instances = match pool.adapter.list(&installation).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(pool = %name, error = %e, action = "reconcile_skipped", "reconcile: listing failed; pool skipped this pass");
                crate::metrics::reconcile_action(&name, "reconcile_skipped");
                continue;
            }
        };
        let mut seen = HashSet::new();
        for inst in &instances {
            seen.insert(inst.sandbox_id.clone());
            let row = s.store.get_sandbox(&inst.sandbox_id).await?;
            let orphan = match &row {
                None => true,
                Some(r) => r.status.is_final(),
            };
            if !orphan {
                continue;
            }
            match pool.adapter.delete(&inst.sandbox_id).await {
                Ok(()) => {
                    tracing::info!(pool = %name, sandbox = %inst.sandbox_id, action = "orphan_deleted", "reconcile: deleted an orphan backend instance");
                    crate::metrics::reconcile_action(&name, "orphan_deleted");
                    let ev = differently_store::audit::NewAuditEvent {
                        org_id: row.as_ref().map(|r| r.org_id.clone()),
                        project_id: row.as_ref().map(|r| r.project_id.clone()),
                        actor: Actor::System("reconciler").as_audit(),
                        action: "reconcile.orphan_deleted".to_owned(),
                        resource: inst.sandbox_id.to_string(),
                        outcome: "ok".to_owned(),
                        detail: serde_json::json!({ "pool": name, "backendRef": inst.backend_ref }),
                    };
                    if let Err(e) = s.store.append_audit(ev).await {
                        tracing::warn!(error = %e, "reconcile: audit of an orphan delete failed");
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %name, sandbox = %inst.sandbox_id, error = %e, "reconcile: orphan delete failed; next pass retries")
                }
            }
        }
        // Rows unchanged since before the listing must appear in it.
        for row in s.store.live_in_pool(&name, listed_at, BATCH).await? {
            if seen.contains(&row.id) {
                continue;
            }
            match pool.adapter.find(&row.id).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => {
                    tracing::warn!(sandbox = %row.id, error = %e, "reconcile: cannot confirm a missing instance");
                    continue;
                }
            }
            let t = Transition {
                id: row.id.clone(),
                from: vec![row.status],
                to: SandboxStatus::Failed,
                reason: Some("backend instance vanished".into()),
                actor: Actor::System("reconciler"),
            };
            match s.store.transition(t, Utc::now()).await {
                Ok(failed) => {
                    tracing::warn!(pool = %name, sandbox = %row.id, action = "vanished_failed", "reconcile: backend instance vanished; sandbox failed");
                    crate::metrics::reconcile_action(&name, "vanished_failed");
                    let _ = s.announcer.status(&failed).await;
                }
                Err(StoreError::StatusConflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
