//! Audit checkpoints, written by the leader: a signed snapshot of every audit chain's head,
//! so deleting the newest records of a chain (which leaves the rest intact) is detectable.
//! Nothing is written while no chain moved.

use std::time::Duration;

use tokio::sync::watch;

use crate::Scheduler;

/// How often the heads are signed: a truncated tail older than this is always caught.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(60);

pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CHECKPOINT_EVERY) => {}
            _ = stop.changed() => return,
        }
        match s.store.write_audit_checkpoint().await {
            Ok(Some(cp)) => {
                tracing::debug!(seq = cp.seq, chains = cp.heads.len(), "audit checkpoint")
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "audit checkpoint failed"),
        }
    }
}
