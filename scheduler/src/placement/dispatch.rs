//! The dispatch loop: picks groups in fair order, decides each candidate under policy,
//! and hands the decided ones to [`super::activate`].

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use differently_bus::trace;
use differently_bus_schema::{Cause, Origin, TraceContext};
use differently_core::fair::Candidate;
use differently_core::policy::{self, Decision};
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use differently_store::{Actor, StoreError, Transition, Wall};
use tokio::sync::watch;
use tokio::time::Instant;

use super::activate::activate_group;
use super::queue::{lock, Shared};
use super::quota_cache::QuotaCache;
use super::Outcome;
use crate::Scheduler;

/// Most candidates tried in one dispatch pass, so one pass stays short.
pub(super) const MAX_PER_PASS: usize = 100;

pub(super) async fn dispatch_loop(s: &Scheduler, q: &Shared, mut stop: watch::Receiver<bool>) {
    let quotas = QuotaCache::default();
    let mut cpu_read_at: Option<Instant> = None;
    let mut seen_generation = 0;
    let mut depth = crate::metrics::QueueDepth::default();
    loop {
        if *stop.borrow() {
            return;
        }
        publish_depth(q, &mut depth);
        let now = Instant::now();
        if cpu_read_at.is_none_or(|t| now.duration_since(t) >= s.config.tick) {
            match s.store.active_cpu_by_org().await {
                Ok(m) => lock(q).fair.reset_active_cpu(&m),
                Err(e) => tracing::warn!(error = %e, "placement: cannot read usage"),
            }
            cpu_read_at = Some(now);
        }
        lock(q).unpark_due(now);
        let generation = lock(q).generation;
        if generation != seen_generation {
            // Capacity was released: slot counts read before it are stale.
            quotas.drop_slots();
            seen_generation = generation;
        }
        let mut tried = 0;
        while tried < MAX_PER_PASS {
            let Some(group) = pick_group(q, seen_generation, s.config.placement_group.max(1))
            else {
                // Capacity was released mid-pass: start over with fresh counts and
                // everyone woken back in the queue, in fair order.
                break;
            };
            if group.is_empty() {
                break;
            }
            tried += group.len();
            let placed = place_group(s, &group, &quotas, q, seen_generation).await;
            let mut stale = false;
            for (p, placed) in group.into_iter().zip(placed) {
                let c = p.candidate;
                let mut queue = lock(q);
                if !matches!(placed, Ok(Outcome::Activated)) {
                    queue.fair.refund(&c.org, c.cpu);
                }
                match placed {
                    Ok(Outcome::Activated | Outcome::Gone) => queue.forget(&c.id),
                    Ok(Outcome::Stale) => {
                        queue.fair.push(c);
                        stale = true;
                    }
                    // Capacity was released while it was decided: it is not parked past
                    // the wake-up (everyone else is back in the queue), it is picked again
                    // in fair order with fresh counts.
                    Ok(Outcome::Wait) if queue.generation != seen_generation => {
                        queue.fair.push(c);
                        stale = true;
                    }
                    Ok(Outcome::Wait) => {
                        let until = Instant::now() + s.config.waiting_backoff;
                        queue.parked.insert(c.id.clone(), (until, c));
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %c.id, error = %e, "placement failed; will retry");
                        let until = Instant::now() + Duration::from_secs(1);
                        queue.parked.insert(c.id.clone(), (until, c));
                    }
                }
            }
            if stale {
                break;
            }
        }
        if tried > 0 {
            continue;
        }
        tokio::select! {
            _ = q.1.notified() => {}
            _ = tokio::time::sleep(s.config.tick) => {}
            _ = stop.changed() => {}
        }
    }
}

/// A candidate picked for placement, with what the queue knows about it.
pub(super) struct Pick {
    pub(super) candidate: Candidate,
    pub(super) trace: TraceContext,
    pub(super) row: Option<Sandbox>,
}

/// Pops up to `size` candidates (`SchedulerConfig::placement_group`) in fair order, charging
/// each to its org as it is picked. Their policy decisions run concurrently and their
/// first-choice activations share one transaction (`Store::activate_many`: one commit and one
/// round of locks and reads for the group instead of one per sandbox), decided in pick order;
/// since picks are charged as they are made, the order within a group is the one a sequential
/// placer would have used had every one of them activated. `None` if capacity was released
/// since `generation` (the caller starts over).
pub(super) fn pick_group(q: &Shared, generation: u64, size: usize) -> Option<Vec<Pick>> {
    let mut queue = lock(q);
    if queue.generation != generation {
        return None;
    }
    let mut group = Vec::with_capacity(size);
    while group.len() < size {
        let Some(c) = queue.fair.pop() else { break };
        queue.fair.charge(&c.org, c.cpu);
        group.push(Pick {
            // A candidate found by the rebuild (its admission message was lost, or a new
            // leader took over) has no caller's trace: its placement starts one, kept for
            // every pass until it leaves the queue.
            trace: queue
                .traces
                .entry(c.id.clone())
                .or_insert_with(trace::new_root)
                .clone(),
            row: queue.rows.get(&c.id).cloned(),
            candidate: c,
        });
    }
    Some(group)
}

/// Places a picked group: decides all at once, then activates the decided ones together
/// (`activate_group`). Outcomes in pick order.
pub(super) async fn place_group(
    s: &Scheduler,
    group: &[Pick],
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Vec<Result<Outcome, StoreError>> {
    let started = std::time::Instant::now();
    let decided = futures::future::join_all(group.iter().map(|p| {
        trace::scope(
            "place",
            p.trace.clone(),
            decide(s, &p.candidate.id, p.row.clone(), quotas, q, generation),
        )
    }))
    .await;
    let ready: Vec<Option<&Ready>> = decided
        .iter()
        .map(|d| match d {
            Ok(Decided::Ready(r)) => Some(r.as_ref()),
            _ => None,
        })
        .collect();
    let mut by_index: HashMap<usize, Result<Outcome, StoreError>> =
        activate_group(s, group, &ready, quotas, q, generation)
            .await
            .into_iter()
            .collect();
    // Every candidate of the group waited for the whole group.
    let per = started.elapsed().as_secs_f64();
    decided
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            metrics::histogram!("differently_placement_decision_seconds").record(per);
            match d {
                Ok(Decided::Done(o)) => Ok(o),
                Ok(Decided::Ready(_)) => by_index
                    .remove(&i)
                    .unwrap_or_else(|| Err(StoreError::Internal("placement lost".into()))),
                Err(e) => Err(e),
            }
        })
        .collect()
}

/// Sets the per-org queue-depth gauge from the fair queue and the parked candidates.
pub(super) fn publish_depth(q: &Shared, depth: &mut crate::metrics::QueueDepth) {
    let counts = {
        let queue = lock(q);
        let mut counts: HashMap<differently_core::OrgId, usize> = HashMap::new();
        for (org, n) in queue.fair.depth_by_org() {
            *counts.entry(org.clone()).or_default() += n;
        }
        for (_, c) in queue.parked.values() {
            *counts.entry(c.org.clone()).or_default() += 1;
        }
        counts
    };
    depth.publish(&counts);
}

pub(super) async fn fail_queued(
    s: &Scheduler,
    id: &SandboxId,
    reason: String,
) -> Result<Outcome, StoreError> {
    let t = Transition {
        id: id.clone(),
        from: vec![SandboxStatus::Queued],
        to: SandboxStatus::Failed,
        reason: Some(reason),
        actor: Actor::System("scheduler"),
    };
    match s.store.transition(t, Utc::now()).await {
        Ok(failed) => {
            let _ = s
                .announcer
                .status_by(&failed, Origin::system(Cause::Quota))
                .await;
            Ok(Outcome::Gone)
        }
        Err(StoreError::StatusConflict { .. }) => Ok(Outcome::Gone),
        Err(e) => Err(e),
    }
}

/// A candidate whose policy decision placed it: the pools to try, in rank order.
pub(super) struct Ready {
    pub(super) row: Sandbox,
    pub(super) doc: serde_json::Value,
    pub(super) ranking: Vec<(String, Option<u32>)>,
    pub(super) now: chrono::DateTime<Utc>,
}

/// What deciding a candidate led to: an outcome already, or pools to try.
pub(super) enum Decided {
    Done(Outcome),
    Ready(Box<Ready>),
}

/// Phase one of a placement, run concurrently for a group: everything up to the activation
/// (queue time limit, policy decision). Writes only for candidates that end here.
pub(super) async fn decide(
    s: &Scheduler,
    id: &SandboxId,
    cached: Option<Sandbox>,
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Result<Decided, StoreError> {
    let row = match cached {
        Some(row) => row,
        None => match s.store.get_sandbox(id).await? {
            Some(row) => row,
            None => return Ok(Decided::Done(Outcome::Gone)),
        },
    };
    if row.status != SandboxStatus::Queued {
        return Ok(Decided::Done(Outcome::Gone));
    }
    let now = Utc::now();
    if let Some(max) = quotas.max_queue_seconds(s, &row).await? {
        let waited = (now - row.created_at).num_seconds().max(0) as u64;
        if waited >= max {
            let last = row
                .status_reason
                .clone()
                .unwrap_or_else(|| "waiting".into());
            let out = fail_queued(
                s,
                id,
                format!("queued longer than maxQueueSeconds ({max} s); last {last}"),
            )
            .await?;
            return Ok(Decided::Done(out));
        }
    }
    let req = row.spec.placement_request();
    let effective = quotas.policy(s, &row).await?;
    let used = quotas.slots(s).await?;
    let explained = policy::decide(&req, &s.pools.profiles(&used), &effective);
    let doc = explained.record(&effective, now);
    match explained.decision.clone() {
        Decision::Placed { .. } => {
            let ranking = explained
                .ranking()
                .iter()
                .map(|v| {
                    let cap = s.pools.get(&v.name).and_then(|p| p.record.max_concurrent);
                    (v.name.clone(), cap)
                })
                .collect();
            Ok(Decided::Ready(Box::new(Ready {
                row,
                doc,
                ranking,
                now,
            })))
        }
        Decision::Waiting { reason } => {
            let next =
                now + chrono::Duration::from_std(s.config.waiting_backoff).unwrap_or_default();
            note_capacity_walls(q, generation, &row, &explained.pools);
            if lock(q).needs_explaining(id, &reason) {
                // The explanation follows the reason (it says waiting, and why), never an
                // older `placed` from before a requeue.
                match s.store.save_placement(id, &doc).await {
                    Ok(()) => {
                        lock(q).explained.insert(id.clone(), reason.clone());
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "placement: cannot record why it waits");
                    }
                }
            }
            s.store.set_queued_reason(id, &reason, next).await?;
            if let Some(cached) = lock(q).rows.get_mut(id) {
                cached.status_reason = Some(reason);
            }
            Ok(Decided::Done(Outcome::Wait))
        }
        Decision::Rejected { reason, .. } => Ok(Decided::Done(
            fail_queued(s, id, format!("placement rejected: {reason}")).await?,
        )),
    }
}

/// A candidate the policy left waiting for capacity (full or unhealthy pools) walls those
/// pools for everyone until the next wake-up, as a refused activation does: the slot view is
/// re-read every tick, so a candidate decided later in the pass (or in the next one, while
/// this one is parked) could otherwise see a slot freed since and take it ahead of the fair
/// order, before the release event wakes everyone.
fn note_capacity_walls(q: &Shared, generation: u64, row: &Sandbox, pools: &[policy::PoolVerdict]) {
    let mut queue = lock(q);
    if queue.generation != generation {
        // Decided on counts from before a wake-up: the wall may have fallen since.
        return;
    }
    for v in pools
        .iter()
        .filter(|v| v.stage == Some(policy::Stage::Capacity))
    {
        queue.blocked.note(row, &v.name, Wall::Pool);
    }
}
