//! The reconciler: each pool's backend listing against the live rows. Orphans tagged with
//! this installation are deleted, vanished instances fail their rows, and instances that
//! moved on their own are followed where that is safe ([`drift_reason`]).
//!
//! Warm instances (`differently_store::warm`) are tagged with their warm row's id: an
//! instance whose id is a warm row is not an orphan, whatever its state. A `ready` warm row
//! whose instance is missing from the listing (and from `find`) is removed (`warm_gone`), so
//! the refill replaces it; a `creating` row is left alone, its create may be in flight. The
//! warm rows are read after the listing and before the sandbox rows: a claim moves an id
//! from one to the other in one transaction, so an instance claimed at any moment is found
//! in one of the two reads.

use differently_bus_schema::{Cause, Origin};
use std::collections::{HashMap, HashSet};

use chrono::Utc;
use differently_adapters::InstanceState;
use differently_core::{SandboxId, SandboxStatus};
use differently_store::lifecycle::{IDLE_REASON, ON_BACKEND};
use differently_store::warm::{WarmInstance, WarmState};
use differently_store::{Actor, StoreError, Transition};

use super::{traced, BATCH};
use crate::Scheduler;

/// Backend instances whose rows are looked up with one query: a pass over 10,000 instances
/// is 10 round trips, not 10,000.
pub(super) const LOOKUP_CHUNK: usize = 1000;

/// Deletes a backend instance whose row is missing (`brief` is `None`) or final, and
/// records it.
pub(super) async fn delete_orphan(
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
pub(super) async fn reconcile(s: &Scheduler) -> Result<(), StoreError> {
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
        let warm = s.store.warm_instances(&name).await?;
        let warm_ids: HashSet<&SandboxId> = warm.iter().map(|w| &w.id).collect();
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
                if brief.is_none() && warm_ids.contains(&inst.sandbox_id) {
                    continue; // a warm instance, not an orphan
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
                        let _ = s.announcer.status_by(&failed, Origin::system(Cause::Reconciler)).await;
                    }
                    Err(StoreError::StatusConflict { .. }) => {}
                    Err(e) => super::row_failed("reconcile", &row, &e),
                }
            })
            .await;
        }
        let listed_set: HashSet<&SandboxId> = listed.iter().collect();
        for w in &warm {
            // Ready before the listing began, so its instance must be in it.
            let ready_before =
                w.state == WarmState::Ready && w.ready_at.is_some_and(|at| at < listed_at);
            if ready_before && !listed_set.contains(&w.id) {
                warm_vanished(s, &name, &pool.adapter, w).await;
            }
        }
        // The briefs were read after the listing, so a row may differ only because it is
        // mid-change: the store re-checks each (unchanged since the listing, no operation
        // pending) before it counts as drift.
        if !drift.is_empty() {
            let pairs: Vec<(SandboxId, SandboxStatus)> =
                drift.iter().map(|(id, st)| (id.clone(), *st)).collect();
            for row in s.store.drifted(&name, listed_at, &pairs, BATCH).await? {
                if let Some(listed) = drift.get(&row.id) {
                    if let Err(e) = follow_drift(s, &name, &row, *listed).await {
                        super::row_failed("reconcile", &row, &e);
                    }
                }
            }
        }
    }
    Ok(())
}

/// A ready warm row whose instance is not in the listing: confirmed with `find`, then the
/// row is removed so the refill makes a new one.
async fn warm_vanished(
    s: &Scheduler,
    name: &str,
    adapter: &differently_adapters::SharedAdapter,
    w: &WarmInstance,
) {
    match adapter.find(&w.id).await {
        Ok(None) => {}
        Ok(Some(_)) => return,
        Err(e) => {
            tracing::warn!(warm = %w.id, error = %e, "reconcile: cannot confirm a missing warm instance");
            return;
        }
    }
    match s.store.warm_gone(&w.id).await {
        Ok(true) => {
            tracing::warn!(pool = %name, warm = %w.id, class = %w.class, action = "warm_vanished", "reconcile: a ready warm instance vanished from the backend; removed, the refill replaces it");
            crate::metrics::reconcile_action(name, "warm_vanished");
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(warm = %w.id, error = %e, "reconcile: cannot remove a vanished warm instance; next pass retries")
        }
    }
}

/// The row status an instance's listed state means; `None` for a state in passing.
pub(super) fn listed_status(state: InstanceState) -> Option<SandboxStatus> {
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
pub(super) fn drift_reason(row: SandboxStatus, listed: SandboxStatus) -> Option<&'static str> {
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
pub(super) const RESUMED_BY_BACKEND: &str = "resumed by the backend";

/// The reason recorded when the reconciler follows a backend's start of a stopped sandbox.
pub(super) const STARTED_BY_BACKEND: &str = "started by the backend";

/// The reason recorded when the reconciler finds the backend instance failed.
pub(super) const INSTANCE_FAILED: &str = "backend instance failed";

/// Moves `row` to the status its instance was listed in, when [`drift_reason`] says so and the
/// quota has room for what the change adds (the store's own check, as for a caller's start:
/// of the followed changes only a start adds anything); otherwise logs and counts the
/// mismatch (every pass, until an operator, the quota or the backend settles it).
pub(super) async fn follow_drift(
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
                let _ = s.announcer.status_by(&moved, Origin::system(Cause::Reconciler)).await;
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
    pub(super) fn drift_is_followed_only_where_safe() {
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
