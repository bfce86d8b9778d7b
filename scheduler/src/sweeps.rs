//! Level-triggered sweeps run by the leader every tick: TTL expiry, creates whose work
//! message may never have gone out (re-published under the same message id, which the bus
//! drops if it did), provisioning that made no progress (adopt the backend instance or
//! requeue), deletes that did not finish, idle
//! sandboxes (paused, or stopped where the pool cannot pause), lifecycle operations whose work
//! message was lost (re-sent), and — every `reconcile_interval` — the reconciler: each pool's
//! backend listing against the rows. Backend instances tagged with this installation whose
//! row is missing or final are deleted (orphans); live rows whose instance vanished fail with
//! a reason; live rows whose instance moved on its own follow it where that is safe
//! ([`drift_reason`]); a pool whose listing fails is skipped for that pass. Every action is
//! logged with `action=` and counted in `differently_reconcile_actions_total` under the same
//! name, and runs under a fresh root trace ([`traced`]), so the work it publishes carries a
//! trace id that the worker's log lines share.

use std::collections::HashMap;

use chrono::Utc;
use differently_adapters::InstanceState;
use differently_bus::{trace, Published};
use differently_bus_schema::WorkOp;
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{ErrorCode, SandboxId, SandboxStatus};
use differently_store::lifecycle::{OpBegun, OpError, OpRecord, OpState, IDLE_REASON, ON_BACKEND};
use differently_store::{Actor, StoreError, Transition};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Scheduler;

const BATCH: u32 = 100;
/// How often the idle and operation-repair passes run.
const IDLE_PASS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How often Idempotency-Keys past their keeping time are deleted.
const IDEMPOTENCY_PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    let mut resent: HashMap<SandboxId, Instant> = HashMap::new();
    let mut creates_resent: HashMap<SandboxId, Instant> = HashMap::new();
    let mut ops_resent: HashMap<OpId, Instant> = HashMap::new();
    let mut last_reconcile: Option<Instant> = None;
    let mut last_idle: Option<Instant> = None;
    let mut last_prune: Option<Instant> = None;
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
        if last_prune.is_none_or(|t| t.elapsed() >= IDEMPOTENCY_PRUNE_EVERY) {
            last_prune = Some(Instant::now());
            let kept = chrono_dur(differently_store::idempotency::KEPT_FOR);
            match s.store.prune_idempotency(Utc::now() - kept).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(keys = n, "sweep: forgot expired Idempotency-Keys"),
                Err(e) => tracing::warn!(error = %e, "sweep: Idempotency-Key pruning failed"),
            }
        }
        if let Err(e) = expire(&s).await {
            tracing::warn!(error = %e, "sweep: ttl expiry failed");
        }
        if let Err(e) = unsent_creates(&s, &mut creates_resent).await {
            tracing::warn!(error = %e, "sweep: create re-send failed");
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

/// Runs one sweep action under a new root trace context named `name`: its log lines carry
/// the trace id, and every envelope it publishes carries the `traceparent` on to the worker.
async fn traced<F: std::future::Future>(name: &'static str, action: F) -> F::Output {
    trace::scope(name, trace::new_root(), action).await
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
        traced("sweep.ttl", async {
            match s.store.transition(t, now).await {
                Ok(updated) => {
                    tracing::info!(sandbox = %updated.id, action = "ttl_expired", "ttl expired");
                    crate::metrics::reconcile_action(pool_of(&updated), "ttl_expired");
                    let _ = s.announcer.work(&updated, WorkOp::Delete, "").await;
                    let _ = s.announcer.status(&updated).await;
                    Ok(())
                }
                Err(StoreError::StatusConflict { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await?;
    }
    Ok(())
}

/// The `pool` label of a sandbox's action (`none` before placement).
fn pool_of(s: &differently_core::Sandbox) -> &str {
    s.pool.as_deref().unwrap_or("none")
}

async fn stuck_provisioning(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    let before = now - chrono_dur(s.config.provisioning_timeout);
    for row in s
        .store
        .stale(SandboxStatus::Provisioning, before, BATCH)
        .await?
    {
        traced("sweep.provisioning", provisioning_one(s, row, now)).await?;
    }
    Ok(())
}

/// Adopts the backend instance of one stale provisioning row, or requeues the row.
async fn provisioning_one(
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
            let _ = s.announcer.status(&u).await;
            Ok(())
        }
        Err(StoreError::StatusConflict { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long after its activation a provisioning row's create may be re-published: inside the
/// bus's de-duplication window (with a margin for clock skew), so a re-send of a create that
/// did go out is dropped by the bus and can never start a second backend create.
const CREATE_RESEND_WITHIN: std::time::Duration =
    std::time::Duration::from_secs(differently_bus::jetstream::DUPLICATE_WINDOW.as_secs() * 3 / 4);

/// Provisioning rows whose create work may never have been published: whoever activated
/// them (the leader, or an API process placing directly in the admission) died or lost the
/// bus between its commit and its publish. Each is re-published once, `repair_interval` after
/// its activation, under the original message id: the bus drops it if the first one went
/// out, so only a lost create is delivered. Older rows are the provisioning timeout's
/// (adopt or requeue), which stays the repair of last resort.
async fn unsent_creates(
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
    for row in rows {
        if row.updated_at < oldest || resent.contains_key(&row.id) {
            continue;
        }
        if resend_work(
            s,
            &row,
            WorkOp::Create,
            "",
            ("sweep.create", "create_resent"),
        )
        .await
        {
            resent.insert(row.id.clone(), Instant::now());
        }
    }
    Ok(())
}

/// Re-publishes `op` work for `row` under a root trace named `trace_name`, logging and
/// counting it as `action` when the bus stored it (a duplicate of a message that did go out
/// is dropped by the bus and counted nowhere); whether the bus answered.
async fn resend_work(
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
        let names = ("sweep.terminating", "delete_resent");
        if resend_work(s, &row, WorkOp::Delete, &attempt, names).await {
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
            let pool_name = pool.view().name;
            traced("sweep.idle", async {
                tracing::info!(sandbox = %row.id, op = op.as_str(), action = "idle", "sweep: idle sandbox");
                crate::metrics::reconcile_action(&pool_name, "idle");
                if let Err(e) = s
                    .announcer
                    .op(&row, &pool_name, op, r.id.as_str(), "")
                    .await
                {
                    tracing::warn!(sandbox = %row.id, error = %e, "sweep: idle publish failed; repair re-sends it");
                }
            })
            .await;
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
    }
    Ok(())
}

/// Backend instances whose rows are looked up with one query: a pass over 10,000 instances
/// is 10 round trips, not 10,000.
const LOOKUP_CHUNK: usize = 1000;

/// Deletes a backend instance whose row is missing (`brief` is `None`) or final, and
/// records it.
async fn delete_orphan(
    s: &Scheduler,
    name: &str,
    adapter: &differently_adapters::SharedAdapter,
    inst: &differently_adapters::Instance,
    brief: Option<&differently_store::SandboxBrief>,
) {
    match traced("reconcile.orphan", adapter.delete(&inst.sandbox_id)).await {
        Ok(()) => {
            tracing::info!(pool = %name, sandbox = %inst.sandbox_id, action = "orphan_deleted", "reconcile: deleted an orphan backend instance");
            crate::metrics::reconcile_action(name, "orphan_deleted");
            let ev = differently_store::audit::NewAuditEvent {
                org_id: brief.map(|b| b.org_id.clone()),
                project_id: brief.map(|b| b.project_id.clone()),
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
        let listed: Vec<SandboxId> = instances.iter().map(|i| i.sandbox_id.clone()).collect();
        // Live rows whose instance is listed in another state than theirs, settled below.
        let mut drift: HashMap<SandboxId, SandboxStatus> = HashMap::new();
        for (chunk, ids) in instances
            .chunks(LOOKUP_CHUNK)
            .zip(listed.chunks(LOOKUP_CHUNK))
        {
            let briefs = s.store.sandbox_briefs(ids).await?;
            for inst in chunk {
                let brief = briefs.get(&inst.sandbox_id);
                if let Some(b) = brief.filter(|b| !b.status.is_final()) {
                    // Only rows that must have an instance in a known state: a
                    // provisioning or terminating row is mid-change, not drifted.
                    let drifted = listed_status(inst.state)
                        .filter(|st| *st != b.status && ON_BACKEND.contains(&b.status));
                    if let Some(st) = drifted {
                        drift.insert(inst.sandbox_id.clone(), st);
                    }
                    continue;
                }
                delete_orphan(s, &name, &pool.adapter, inst, brief).await;
            }
        }
        // Rows unchanged since before the listing must appear in it.
        for row in s
            .store
            .live_not_listed(&name, listed_at, &listed, BATCH)
            .await?
        {
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
            traced("reconcile.vanished", async {
                match s.store.transition(t, Utc::now()).await {
                    Ok(failed) => {
                        tracing::warn!(pool = %name, sandbox = %row.id, action = "vanished_failed", "reconcile: backend instance vanished; sandbox failed");
                        crate::metrics::reconcile_action(&name, "vanished_failed");
                        let _ = s.announcer.status(&failed).await;
                        Ok(())
                    }
                    Err(StoreError::StatusConflict { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await?;
        }
        // The briefs were read after the listing, so a row may differ only because it is
        // mid-change: the store re-checks each (unchanged since the listing, no operation
        // pending) before it counts as drift.
        if !drift.is_empty() {
            let pairs: Vec<(SandboxId, SandboxStatus)> =
                drift.iter().map(|(id, st)| (id.clone(), *st)).collect();
            for row in s.store.drifted(&name, listed_at, &pairs, BATCH).await? {
                if let Some(listed) = drift.get(&row.id) {
                    follow_drift(s, &name, &row, *listed).await?;
                }
            }
        }
    }
    Ok(())
}

/// The row status an instance's listed state means; `None` for a state in passing.
fn listed_status(state: InstanceState) -> Option<SandboxStatus> {
    match state {
        InstanceState::Running => Some(SandboxStatus::Running),
        InstanceState::Paused => Some(SandboxStatus::Paused),
        InstanceState::Stopped => Some(SandboxStatus::Stopped),
        InstanceState::Failed => Some(SandboxStatus::Failed),
        InstanceState::Pending => None,
    }
}

/// How the reconciler follows a row whose instance moved on its own: the reason it records,
/// or `None` where it does not follow.
/// - The backend paused or stopped a running sandbox (its own idle policy, an operator):
///   recorded as idled, so the next data-plane call wakes it as it wakes one the idle sweep
///   paused.
/// - The backend resumed a paused one (a wake on access through its gateway).
/// - The backend started a stopped one: followed only within the quota, because running
///   reserves the CPU and memory that stopping gave back (see [`follow_drift`]).
/// - The instance failed.
///
/// Moves between paused and stopped are not transitions a row can make.
fn drift_reason(row: SandboxStatus, listed: SandboxStatus) -> Option<&'static str> {
    use SandboxStatus::*;
    match (row, listed) {
        (Running, Paused | Stopped) => Some(IDLE_REASON),
        (Paused, Running) => Some(RESUMED_BY_BACKEND),
        (Stopped, Running) => Some(STARTED_BY_BACKEND),
        (_, Failed) => Some(INSTANCE_FAILED),
        _ => None,
    }
}

/// The reason recorded when the reconciler follows a backend's resume.
const RESUMED_BY_BACKEND: &str = "resumed by the backend";
/// The reason recorded when the reconciler follows a backend's start of a stopped sandbox.
const STARTED_BY_BACKEND: &str = "started by the backend";
/// The reason recorded when the reconciler finds the backend instance failed.
const INSTANCE_FAILED: &str = "backend instance failed";

/// Moves `row` to the status its instance was listed in, when [`drift_reason`] says so and the
/// quota has room for what the change adds (the store's own check, as for a caller's start:
/// of the followed changes only a start adds anything); otherwise logs and counts the
/// mismatch (every pass, until an operator, the quota or the backend settles it).
async fn follow_drift(
    s: &Scheduler,
    pool: &str,
    row: &differently_core::Sandbox,
    listed: SandboxStatus,
) -> Result<(), StoreError> {
    let Some(reason) = drift_reason(row.status, listed) else {
        tracing::warn!(pool, sandbox = %row.id, status = %row.status, backend = %listed, action = "drift_unfollowed", "reconcile: the backend instance is in another state than the sandbox; not followed");
        crate::metrics::reconcile_action(pool, "drift_unfollowed");
        return Ok(());
    };
    let t = Transition {
        id: row.id.clone(),
        from: vec![row.status],
        to: listed,
        reason: Some(reason.into()),
        actor: Actor::System("reconciler"),
    };
    traced("reconcile.drift", async {
        let moved = s
            .store
            .transition_within_quota(t, &s.config.quota, Utc::now())
            .await;
        match moved {
            Err(StoreError::QuotaExceeded(why)) => {
                tracing::warn!(pool, sandbox = %row.id, status = %row.status, backend = %listed, action = "drift_unfollowed", "reconcile: the backend started a stopped sandbox and the quota has no room for it ({why}); not followed");
                crate::metrics::reconcile_action(pool, "drift_unfollowed");
                Ok(())
            }
            Ok(moved) => {
                tracing::warn!(pool, sandbox = %row.id, from = %row.status, to = %listed, reason, action = "drift_followed", "reconcile: the backend instance moved on its own; the sandbox follows");
                crate::metrics::reconcile_action(pool, "drift_followed");
                let _ = s.announcer.status(&moved).await;
                Ok(())
            }
            Err(StoreError::StatusConflict { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxStatus::*;

    #[test]
    fn drift_is_followed_only_where_safe() {
        let followed = |row, listed| drift_reason(row, listed);
        assert_eq!(followed(Running, Paused), Some(IDLE_REASON));
        assert_eq!(followed(Running, Stopped), Some(IDLE_REASON));
        assert_eq!(followed(Paused, Running), Some(RESUMED_BY_BACKEND));
        for row in [Running, Paused, Stopped] {
            assert_eq!(followed(row, Failed), Some(INSTANCE_FAILED));
        }
        // Within the quota only (`follow_drift`).
        assert_eq!(followed(Stopped, Running), Some(STARTED_BY_BACKEND));
        // No transition a row can make.
        assert_eq!(followed(Paused, Stopped), None);
        assert_eq!(followed(Stopped, Paused), None);
        // Every followed change is one the status machine allows.
        for row in [Running, Paused, Stopped] {
            for listed in [Running, Paused, Stopped, Failed] {
                if followed(row, listed).is_some() {
                    assert!(
                        differently_core::status::can_transition(row, listed),
                        "{row} -> {listed}"
                    );
                }
            }
        }
        assert_eq!(listed_status(InstanceState::Pending), None);
        assert_eq!(listed_status(InstanceState::Failed), Some(Failed));
    }
}
