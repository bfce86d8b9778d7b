//! TTL expiry (to `terminating`) and idle timeouts (pause, or stop where the pool cannot
//! pause).

use chrono::Utc;
use differently_bus_schema::{Cause, EventType, Origin, WorkOp};
use differently_core::capability::Capability;
use differently_core::SandboxStatus;
use differently_store::lifecycle::{OpBegun, OpRecord, IDLE_REASON};
use differently_store::{Actor, StoreError, Transition};

use super::{pool_of, row_failed, traced, BATCH};
use crate::Scheduler;

pub(super) async fn expire(s: &Scheduler) -> Result<(), StoreError> {
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
                    let _ = s
                        .announcer
                        .status_by(&updated, Origin::system(Cause::Ttl))
                        .await;
                }
                Err(StoreError::StatusConflict { .. }) => {}
                Err(e) => row_failed("ttl", &row, &e),
            }
        })
        .await;
    }
    Ok(())
}

/// Pauses (or stops, where the pool cannot pause) running sandboxes idle past their timeout,
/// through the same operation records and work messages as the API.
pub(super) async fn idle(s: &Scheduler) -> Result<(), StoreError> {
    let now = Utc::now();
    let default = s.config.default_idle_timeout.map(|d| d.as_secs().max(1));
    for row in s.store.idle_candidates(now, default, BATCH).await? {
        let Some(pool) = row.pool.as_deref().and_then(|p| s.pools.get(p)) else {
            continue;
        };
        let op = if pool.adapter.offers(Capability::LifecyclePause) {
            WorkOp::Pause
        } else if pool.adapter.offers(Capability::LifecycleStop) {
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
        let begun = match s.store.begin_op(&record).await {
            Ok(b) => b,
            Err(e) => {
                row_failed("idle", &row, &e);
                continue;
            }
        };
        if let OpBegun::New(r) = begun {
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
                let _ = s
                    .announcer
                    .operation(
                        &row,
                        EventType::OperationRequested,
                        r.id.as_str(),
                        op.as_str(),
                        None,
                        Origin::system(Cause::Idle),
                    )
                    .await;
            })
            .await;
        }
    }
    Ok(())
}
