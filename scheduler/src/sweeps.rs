//! Level-triggered sweeps run by the leader every tick: TTL expiry, provisioning that made
//! no progress (adopt the backend instance or requeue), and deletes that did not finish.

use std::collections::HashMap;

use chrono::Utc;
use differently_bus_schema::WorkOp;
use differently_core::{SandboxId, SandboxStatus};
use differently_store::{Actor, StoreError, Transition};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Scheduler;

const BATCH: u32 = 100;

pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    let mut resent: HashMap<SandboxId, Instant> = HashMap::new();
    loop {
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
