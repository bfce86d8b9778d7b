//! Placement: the leader's fair queue and its dispatch loop.
//!
//! Fed three ways: `dly.admit.*` messages (fast path), a periodic rebuild from queued rows
//! (repair: covers a publish lost between commit and bus, and a new leader's empty queue),
//! and capacity-release events (a terminated or failed sandbox wakes waiting candidates).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use differently_bus_schema::{Admitted, Envelope, StatusChanged, WorkOp};
use differently_core::fair::{fair_order, Candidate};
use differently_core::placement::{decide, Decision};
use differently_core::{OrgId, Sandbox, SandboxId, SandboxStatus};
use differently_store::{Activation, Actor, PoolSlot, StoreError, Transition};
use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::Scheduler;

/// Most candidates tried in one dispatch pass, so one pass stays short.
const MAX_PER_PASS: usize = 100;

struct Entry {
    org: OrgId,
    priority: i32,
    not_before: Instant,
}

#[derive(Default)]
struct Queue {
    entries: HashMap<SandboxId, Entry>,
}

impl Queue {
    fn insert(&mut self, s: &Sandbox) {
        self.entries.entry(s.id.clone()).or_insert(Entry {
            org: s.org_id.clone(),
            priority: s.spec.priority,
            not_before: Instant::now(),
        });
    }

    fn due(&self, now: Instant) -> Vec<Candidate> {
        self.entries
            .iter()
            .filter(|(_, e)| e.not_before <= now)
            .map(|(id, e)| Candidate {
                id: id.clone(),
                org: e.org.clone(),
                priority: e.priority,
            })
            .collect()
    }

    fn wake_all(&mut self) {
        let now = Instant::now();
        for e in self.entries.values_mut() {
            e.not_before = now;
        }
    }
}

type Shared = Arc<(Mutex<Queue>, Notify)>;

fn lock(q: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    match q.0.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

pub(crate) async fn run(s: Scheduler, stop: watch::Receiver<bool>) {
    let shared: Shared = Arc::new((Mutex::new(Queue::default()), Notify::new()));
    let consume = tokio::spawn(consume_admissions(s.clone(), shared.clone()));
    let rebuild = tokio::spawn(rebuild_from_store(s.clone(), shared.clone()));
    let release = tokio::spawn(follow_releases(s.clone(), shared.clone()));
    dispatch_loop(&s, &shared, stop).await;
    consume.abort();
    rebuild.abort();
    release.abort();
}

async fn consume_admissions(s: Scheduler, q: Shared) {
    let def = s.announcer.naming().placement_consumer(s.config.ack_wait);
    loop {
        let mut pull = match s.announcer.bus().pull(&def).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "placement: cannot bind consumer; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            let delivery = match pull.next(Duration::from_secs(5)).await {
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "placement: pull failed");
                    break;
                }
            };
            let Ok(env) = serde_json::from_slice::<Envelope<Admitted>>(&delivery.payload) else {
                tracing::warn!(subject = %delivery.subject, "placement: undecodable message dropped");
                let _ = delivery.acker.term().await;
                continue;
            };
            match s.store.get_sandbox(&env.sandbox_id).await {
                Ok(Some(row)) if row.status == SandboxStatus::Queued => {
                    lock(&q).insert(&row);
                    q.1.notify_one();
                }
                Ok(_) => {}
                Err(e) => {
                    // Not acked: redelivered later; the rebuild pass also covers it.
                    tracing::warn!(error = %e, "placement: cannot read admitted row");
                    let _ = delivery.acker.nak(Duration::from_secs(1)).await;
                    continue;
                }
            }
            // The row in Postgres is the truth from here on; a new leader rebuilds from it.
            if let Err(e) = delivery.acker.ack().await {
                tracing::warn!(error = %e, "placement: ack failed");
            }
        }
    }
}

async fn rebuild_from_store(s: Scheduler, q: Shared) {
    loop {
        match s.store.runnable_queued(Utc::now(), 10_000).await {
            Ok(rows) => {
                let mut queue = lock(&q);
                let before = queue.entries.len();
                for row in &rows {
                    queue.insert(row);
                }
                let added = queue.entries.len() - before;
                drop(queue);
                if added > 0 {
                    tracing::debug!(added, "placement: queue rebuilt from store");
                    q.1.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "placement: cannot read queued rows"),
        }
        tokio::time::sleep(s.config.repair_interval).await;
    }
}

async fn follow_releases(s: Scheduler, q: Shared) {
    let naming = s.announcer.naming().clone();
    let stream = naming.events_stream().name;
    let filter = format!("{}.evt.>", naming.prefix());
    loop {
        match s.announcer.bus().events(&stream, &filter, None).await {
            Ok(mut events) => {
                while let Some(Ok(ev)) = events.next().await {
                    let Ok(env) = serde_json::from_slice::<Envelope<StatusChanged>>(&ev.payload)
                    else {
                        continue;
                    };
                    if env.body.status.is_final() {
                        lock(&q).wake_all();
                        q.1.notify_one();
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "placement: cannot follow events"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn dispatch_loop(s: &Scheduler, q: &Shared, mut stop: watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        let due = lock(q).due(Instant::now());
        if !due.is_empty() {
            let active_cpu = match s.store.active_cpu_by_org().await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "placement: cannot read usage");
                    HashMap::new()
                }
            };
            for c in fair_order(due, &active_cpu).into_iter().take(MAX_PER_PASS) {
                match place_one(s, &c.id).await {
                    Ok(Outcome::Done) => {
                        lock(q).entries.remove(&c.id);
                    }
                    Ok(Outcome::Wait) => {
                        if let Some(e) = lock(q).entries.get_mut(&c.id) {
                            e.not_before = Instant::now() + s.config.waiting_backoff;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %c.id, error = %e, "placement failed; will retry");
                        if let Some(e) = lock(q).entries.get_mut(&c.id) {
                            e.not_before = Instant::now() + Duration::from_secs(1);
                        }
                    }
                }
            }
            continue;
        }
        tokio::select! {
            _ = q.1.notified() => {}
            _ = tokio::time::sleep(s.config.tick) => {}
            _ = stop.changed() => {}
        }
    }
}

enum Outcome {
    /// Left the queue (activated, failed, or no longer queued).
    Done,
    /// Stays queued; retry after the back-off.
    Wait,
}

async fn place_one(s: &Scheduler, id: &SandboxId) -> Result<Outcome, StoreError> {
    let Some(row) = s.store.get_sandbox(id).await? else {
        return Ok(Outcome::Done);
    };
    if row.status != SandboxStatus::Queued {
        return Ok(Outcome::Done);
    }
    let pools = s.pools.views();
    let now = Utc::now();
    match decide(&row.spec, &pools).decision {
        Decision::Placed { pool } => {
            let cap = pools
                .iter()
                .find(|p| p.name == pool)
                .and_then(|p| p.max_concurrent);
            let slot = PoolSlot {
                name: pool,
                max_concurrent: cap,
            };
            match s.store.activate(id, &slot, &s.config.quota, now).await? {
                Activation::Activated(active) => {
                    if let Err(e) = s.announcer.work(&active, WorkOp::Create, "").await {
                        tracing::warn!(sandbox = %id, error = %e, "create publish failed; the provisioning sweep will retry");
                    }
                    let _ = s.announcer.status(&active).await;
                    Ok(Outcome::Done)
                }
                Activation::Waiting(_) => Ok(Outcome::Wait),
                Activation::NotQueued(_) => Ok(Outcome::Done),
            }
        }
        Decision::Waiting { reason } => {
            let next =
                now + chrono::Duration::from_std(s.config.waiting_backoff).unwrap_or_default();
            s.store.set_queued_reason(id, &reason, next).await?;
            Ok(Outcome::Wait)
        }
        Decision::Rejected { reason, .. } => {
            let t = Transition {
                id: id.clone(),
                from: vec![SandboxStatus::Queued],
                to: SandboxStatus::Failed,
                reason: Some(format!("placement rejected: {reason}")),
                actor: Actor::System("scheduler"),
            };
            match s.store.transition(t, now).await {
                Ok(failed) => {
                    let _ = s.announcer.status(&failed).await;
                    Ok(Outcome::Done)
                }
                Err(StoreError::StatusConflict { .. }) => Ok(Outcome::Done),
                Err(e) => Err(e),
            }
        }
    }
}
