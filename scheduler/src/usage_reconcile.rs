//! Usage recount, run by the leader: the quota counters are kept by a database trigger in
//! the same transaction as every row change, so they should never drift; this recounts them
//! from rows anyway, corrects any drift, and makes it loud (a warning per scope and
//! `differently_usage_drift_total`), because drift means something wrote rows around the
//! trigger.

use std::time::Duration;

use tokio::sync::watch;

use crate::Scheduler;

/// How often the counters are recounted. Each recount holds the counters' table lock for
/// one aggregate over the sandbox rows (milliseconds at 10⁴ rows).
pub(crate) const RECOUNT_EVERY: Duration = Duration::from_secs(300);

/// Recounts when leadership starts (catching drift from whatever ran before), then every
/// `RECOUNT_EVERY`.
pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    loop {
        recount(&s).await;
        tokio::select! {
            _ = tokio::time::sleep(RECOUNT_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One recount; returns how many scopes were corrected.
async fn recount(s: &Scheduler) -> usize {
    match s.store.reconcile_usage().await {
        Ok(drift) => {
            for d in &drift {
                tracing::warn!(
                    scope = %d.scope,
                    stored = ?d.stored,
                    stored_slots = d.stored_slots,
                    counted = ?d.counted,
                    counted_slots = d.counted_slots,
                    "usage counter drifted from its rows; corrected"
                );
            }
            metrics::counter!("differently_usage_drift_total").increment(drift.len() as u64);
            drift.len()
        }
        Err(e) => {
            tracing::warn!(error = %e, "usage recount failed");
            0
        }
    }
}
