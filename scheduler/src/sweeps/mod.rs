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
//!
//! - [`ttl_idle`]: TTL expiry and idle timeouts;
//! - [`repair`]: creates, provisioning, deletes and lifecycle operations that made no progress;
//! - [`reconcile`]: each pool's backend listing against the rows.

use std::collections::HashMap;

use chrono::Utc;
use differently_bus::trace;
use differently_core::ids::OpId;
use differently_core::SandboxId;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Scheduler;

mod reconcile;
mod repair;
mod ttl_idle;

use repair::{repair_ops, stuck_provisioning, stuck_terminating, unsent_creates};
use ttl_idle::{expire, idle};

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
            if let Err(e) = reconcile::reconcile(&s).await {
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

/// One row's failure in a pass: logged with `action=row_skipped` and counted under the same
/// name, and the pass goes on with the next row, so one bad row (one tenant's) never stops a
/// sweep for everyone else. The row is tried again next pass.
fn row_failed(
    pass: &'static str,
    row: &differently_core::Sandbox,
    error: &differently_store::StoreError,
) {
    tracing::warn!(pass, sandbox = %row.id, pool = pool_of(row), error = %error, action = "row_skipped", "sweep: one row failed; skipped it this pass");
    crate::metrics::reconcile_action(pool_of(row), "row_skipped");
}

/// The `pool` label of a sandbox's action (`none` before placement).
fn pool_of(s: &differently_core::Sandbox) -> &str {
    s.pool.as_deref().unwrap_or("none")
}
