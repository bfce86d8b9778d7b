//! Leadership: try the lock, lead while it is held, step down at once when a ping fails.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{audit_checkpoints, placement, sweeps, usage_reconcile, Scheduler};

/// Longest one publish may hold up a leader task. The leader's loops publish what Postgres
/// already holds (re-sends, status, activations) and repeat every pass, so a publish to a
/// hung node or a stream without a leader is better given up and retried than waited on for
/// the client's full timeout (5 s), row after row (issue #27: a pass stalled for a minute).
pub(crate) const LEADER_PUBLISH_BOUND: Duration = Duration::from_secs(1);

pub(crate) async fn run(s: Scheduler, mut shutdown: watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow() {
            return;
        }
        match s.store.try_lead().await {
            Ok(Some(mut lease)) => {
                tracing::info!("scheduler: leading");
                let s = Scheduler {
                    announcer: s.announcer.clone().bounded(LEADER_PUBLISH_BOUND),
                    ..s.clone()
                };
                let (stop_tx, stop_rx) = watch::channel(false);
                let mut tasks = JoinSet::new();
                tasks.spawn(placement::run(s.clone(), stop_rx.clone()));
                tasks.spawn(sweeps::run(s.clone(), stop_rx.clone()));
                tasks.spawn(audit_checkpoints::run(s.clone(), stop_rx.clone()));
                tasks.spawn(usage_reconcile::run(s.clone(), stop_rx.clone()));
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {
                            if !lease.still_held().await {
                                tracing::warn!("scheduler: lost leadership");
                                break;
                            }
                        }
                        Some(res) = tasks.join_next() => {
                            tracing::error!(?res, "scheduler: a leader task ended; stepping down");
                            break;
                        }
                    }
                }
                let _ = stop_tx.send(true);
                tasks.shutdown().await;
                drop(lease);
                tracing::info!("scheduler: stepped down");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "scheduler: cannot try leadership"),
        }
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = tokio::time::sleep(s.config.standby_poll) => {}
        }
    }
}
