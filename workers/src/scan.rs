//! The bus's fallback for creates and deletes: a group looks in the store for rows placed on
//! its pool (provisioning) or being deleted from it (terminating) that no worker has claimed
//! `scan_after` after that change, and makes the call itself.
//!
//! The bus brings work within milliseconds, so normally the scan finds nothing. It matters when
//! the work stream or its consumer has lost its leader: NATS elects a new one only after its
//! raft election timeout (4–9 s, compiled into nats-server), and until then nothing placed is
//! delivered. The store does not depend on the bus, so with the scan a create or delete is under
//! way about `scan_after` after its change whatever the bus is doing (deletes matter as much:
//! an org at its `maxActive` gets room only when they finish). Both paths take the work claim
//! first, so they never make one call twice at once; the work message that arrives after the
//! election finds the row moved on (or the claim held) and is acknowledged.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_bus::{Acker, BusError};
use differently_core::{Sandbox, SandboxStatus};
use tokio::sync::{watch, Semaphore};

use crate::WorkerGroup;

/// What the scan looks for: creates and deletes (lifecycle operations have their own
/// records and repair).
const SCANNED: &[SandboxStatus] = &[SandboxStatus::Provisioning, SandboxStatus::Terminating];

/// Most rows one scan takes, whatever the free permits.
const SCAN_BATCH: usize = 64;

/// How often a group forgets claims of rows that moved on while their holder was gone.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How often a group forgets settled claims (their row moved on): workers leave them behind
/// rather than delete each after its call, so one statement here replaces a `DELETE` per
/// create and per delete (issue #47). Often enough that the table stays small under load.
const PRUNE_SETTLED_EVERY: Duration = Duration::from_secs(10);

/// Claims that ran out longer ago than this are forgotten by the prune.
const PRUNE_AFTER: chrono::Duration = chrono::Duration::minutes(10);

impl WorkerGroup {
    /// Scans every `scan_every` until `shutdown`, taking at most the permits free then.
    pub(crate) async fn scan(self, permits: Arc<Semaphore>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.scan_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pruned_at = tokio::time::Instant::now();
        let mut settled_at = tokio::time::Instant::now();
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let free = permits.available_permits().min(SCAN_BATCH);
            if free == 0 {
                continue;
            }
            let now = Utc::now();
            let after = chrono::Duration::from_std(self.config.scan_after)
                .unwrap_or(chrono::Duration::seconds(1));
            let rows = match self
                .store
                .unclaimed_work(&self.pool, SCANNED, now - after, now, free as u32)
                .await
            {
                Ok(rows) => {
                    failing = false;
                    rows
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(pool = %self.pool, error = %e, "worker: cannot scan for undelivered creates");
                    }
                    failing = true;
                    continue;
                }
            };
            for row in rows {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    break;
                };
                let group = self.clone();
                tokio::spawn(async move {
                    group.undelivered(row).await;
                    drop(permit);
                });
            }
            if pruned_at.elapsed() >= PRUNE_EVERY {
                pruned_at = tokio::time::Instant::now();
                if let Err(e) = self.store.prune_work_claims(now - PRUNE_AFTER).await {
                    tracing::debug!(error = %e, "worker: cannot prune create claims");
                }
            }
            if settled_at.elapsed() >= PRUNE_SETTLED_EVERY {
                settled_at = tokio::time::Instant::now();
                if let Err(e) = self.store.prune_settled_work_claims().await {
                    tracing::debug!(error = %e, "worker: cannot prune settled claims");
                }
            }
        }
    }

    /// Makes the call a row the bus did not deliver asks for, as a delivery would (claim
    /// first).
    async fn undelivered(&self, row: Sandbox) {
        let age = (Utc::now() - row.updated_at).num_milliseconds();
        let op = match row.status {
            SandboxStatus::Provisioning => "create",
            _ => "delete",
        };
        tracing::info!(sandbox = %row.id, pool = %self.pool, op, since_change_ms = age, "worker: work was not delivered by the bus; taking it from the store");
        metrics::counter!("differently_worker_undelivered_total", "pool" => self.pool.clone(), "op" => op)
            .increment(1);
        let trace = differently_bus::trace::new_root();
        let call = async {
            match row.status {
                SandboxStatus::Provisioning => self.create(&row, &NoBus).await,
                _ => self.delete(&row, &NoBus).await,
            }
        };
        differently_bus::trace::scope("work.scan", trace, call).await;
    }
}

/// The acknowledgements of work that did not come by the bus: there is nothing to tell it
/// (a retry is the claim's back-off, see `WorkerGroup::create`).
struct NoBus;

#[async_trait::async_trait]
impl Acker for NoBus {
    async fn ack(&self) -> Result<(), BusError> {
        Ok(())
    }
    async fn nak(&self, _delay: Duration) -> Result<(), BusError> {
        Ok(())
    }
    async fn in_progress(&self) -> Result<(), BusError> {
        Ok(())
    }
    async fn term(&self) -> Result<(), BusError> {
        Ok(())
    }
}
