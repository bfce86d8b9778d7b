//! Placement: the leader's fair queue and its dispatch loop.
//!
//! Fed three ways: `dly.admit.*` messages (fast path), a periodic rebuild from queued rows
//! (repair: covers a publish lost between commit and bus, and a new leader's empty queue),
//! and capacity-release events (a terminated or failed sandbox wakes parked candidates).
//! Candidates blocked by quota or capacity are parked with a back-off; each activation
//! charges its org's CPU so the next pick already sees the new load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use differently_bus::trace;
use differently_bus_schema::{Admitted, Envelope, StatusChanged, TraceContext, WorkOp};
use differently_core::fair::{Candidate, FairQueue};
use differently_core::policy::{self, Decision, EffectivePolicy};
use differently_core::tenancy::Quota;
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use differently_store::{Activation, Actor, PoolSlot, QuotaScope, StoreError, Transition};
use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::Scheduler;

/// Most candidates tried in one dispatch pass, so one pass stays short.
const MAX_PER_PASS: usize = 100;
/// Stored quotas are re-read at most this often.
const QUOTA_CACHE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Queue {
    fair: FairQueue,
    parked: HashMap<SandboxId, (Instant, Candidate)>,
    /// Walls found since the last wake-up; kept across passes so nobody slips into a slot
    /// freed between a commit and its release event ahead of the fair order.
    blocked: Blocked,
    /// Bumped by every wake-up; an activation decided before a wake-up is re-decided after
    /// it, so a candidate popped just before capacity freed cannot take the slot out of turn.
    generation: u64,
    /// Trace context of the admission message, per candidate, so the work published at
    /// activation continues the caller's trace. Dropped when the candidate leaves the queue.
    traces: HashMap<SandboxId, TraceContext>,
}

impl Queue {
    fn offer(&mut self, s: &Sandbox) {
        if self.fair.contains(&s.id) || self.parked.contains_key(&s.id) {
            return;
        }
        self.fair.push(Candidate {
            id: s.id.clone(),
            org: s.org_id.clone(),
            priority: s.spec.priority,
            cpu: u64::from(s.spec.resources.cpu),
        });
    }

    /// Once any parked candidate is due, all come back together, so the fair order decides
    /// among everyone waiting rather than whoever's back-off ended first.
    fn unpark_due(&mut self, now: Instant) {
        if self.parked.values().any(|(t, _)| *t <= now) {
            self.wake_all();
        }
    }

    fn wake_all(&mut self) {
        self.generation += 1;
        self.blocked = Blocked::default();
        for (_, (_, c)) in self.parked.drain() {
            self.fair.push(c);
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
            trace::record_consume_lag("admit", env.published_at);
            match s.store.get_sandbox(&env.sandbox_id).await {
                Ok(Some(row)) if row.status == SandboxStatus::Queued => {
                    let mut queue = lock(&q);
                    if env.trace.traceparent.is_some() {
                        queue.traces.insert(row.id.clone(), env.trace.clone());
                    }
                    queue.offer(&row);
                    drop(queue);
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
                let before = queue.fair.len();
                for row in &rows {
                    queue.offer(row);
                }
                let added = queue.fair.len() - before;
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

/// Stored quotas and policies, re-read every couple of seconds, and pool slot use, re-read
/// every tick (activations in between are counted locally).
#[derive(Default)]
struct QuotaCache {
    entries: HashMap<QuotaScope, (Instant, Option<Quota>)>,
    policies:
        HashMap<(differently_core::OrgId, differently_core::ProjectId), (Instant, EffectivePolicy)>,
    slots: Option<(Instant, HashMap<String, u32>)>,
}

impl QuotaCache {
    async fn policy(
        &mut self,
        s: &Scheduler,
        row: &Sandbox,
    ) -> Result<EffectivePolicy, StoreError> {
        let key = (row.org_id.clone(), row.project_id.clone());
        if let Some((at, p)) = self.policies.get(&key) {
            if at.elapsed() < QUOTA_CACHE {
                return Ok(p.clone());
            }
        }
        let p = differently_store::placement::effective_policy(
            s.store.as_ref(),
            &row.org_id,
            &row.project_id,
        )
        .await?;
        self.policies.insert(key, (Instant::now(), p.clone()));
        Ok(p)
    }

    async fn slots(&mut self, s: &Scheduler) -> Result<HashMap<String, u32>, StoreError> {
        if let Some((at, used)) = &self.slots {
            if at.elapsed() < s.config.tick {
                return Ok(used.clone());
            }
        }
        let used = s.store.pool_slots_used().await?;
        self.slots = Some((Instant::now(), used.clone()));
        Ok(used)
    }

    fn take_slot(&mut self, pool: &str) {
        if let Some((_, used)) = &mut self.slots {
            *used.entry(pool.to_owned()).or_insert(0) += 1;
        }
    }

    async fn get(&mut self, s: &Scheduler, scope: QuotaScope) -> Result<Option<Quota>, StoreError> {
        if let Some((at, q)) = self.entries.get(&scope) {
            if at.elapsed() < QUOTA_CACHE {
                return Ok(*q);
            }
        }
        let q = s.store.get_quota(&scope).await?;
        self.entries.insert(scope, (Instant::now(), q));
        Ok(q)
    }

    /// The tighter of the org's (over the defaults) and the project's `maxQueueSeconds`.
    async fn max_queue_seconds(
        &mut self,
        s: &Scheduler,
        row: &Sandbox,
    ) -> Result<Option<u64>, StoreError> {
        let org = self
            .get(s, QuotaScope::Org(row.org_id.clone()))
            .await?
            .unwrap_or_default();
        let project = self
            .get(s, QuotaScope::Project(row.project_id.clone()))
            .await?
            .unwrap_or_default();
        let org_limit = org.or(&s.config.quota).max_queue_seconds;
        Ok(match (org_limit, project.max_queue_seconds) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}

async fn dispatch_loop(s: &Scheduler, q: &Shared, mut stop: watch::Receiver<bool>) {
    let mut quotas = QuotaCache::default();
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
            quotas.slots = None;
            seen_generation = generation;
        }
        let mut tried = 0;
        while tried < MAX_PER_PASS {
            let (c, generation) = {
                let mut queue = lock(q);
                if queue.generation != seen_generation {
                    // Capacity was released mid-pass: start over with fresh counts and
                    // everyone woken back in the queue, in fair order.
                    break;
                }
                let Some(c) = queue.fair.pop() else { break };
                (c, queue.generation)
            };
            tried += 1;
            let ctx = lock(q).traces.get(&c.id).cloned().unwrap_or_default();
            let started = std::time::Instant::now();
            let placed = trace::scope(
                "place",
                ctx,
                place_one(s, &c.id, &mut quotas, q, generation),
            )
            .await;
            metrics::histogram!("differently_placement_decision_seconds")
                .record(started.elapsed().as_secs_f64());
            if matches!(placed, Ok(Outcome::Activated | Outcome::Gone)) {
                lock(q).traces.remove(&c.id);
            }
            match placed {
                Ok(Outcome::Stale) => {
                    lock(q).fair.push(c);
                    break;
                }
                Ok(Outcome::Activated) => lock(q).fair.charge(&c.org, c.cpu),
                Ok(Outcome::Gone) => {}
                Ok(Outcome::Wait) => {
                    let until = Instant::now() + s.config.waiting_backoff;
                    lock(q).parked.insert(c.id.clone(), (until, c));
                }
                Err(e) => {
                    tracing::warn!(sandbox = %c.id, error = %e, "placement failed; will retry");
                    let until = Instant::now() + Duration::from_secs(1);
                    lock(q).parked.insert(c.id.clone(), (until, c));
                }
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

/// Sets the per-org queue-depth gauge from the fair queue and the parked candidates.
fn publish_depth(q: &Shared, depth: &mut crate::metrics::QueueDepth) {
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

/// Walls already found (full pools, orgs or projects at quota): candidates behind the same
/// wall are parked without another transaction, and cannot jump the fair order when the
/// wall falls — everyone is woken together and picked fairly.
#[derive(Default)]
struct Blocked {
    pools: std::collections::HashSet<String>,
    orgs: std::collections::HashSet<differently_core::OrgId>,
    projects: std::collections::HashSet<differently_core::ProjectId>,
}

impl Blocked {
    fn note(&mut self, row: &Sandbox, pool: &str, reason: &str) {
        if reason.starts_with("waiting: org") {
            self.orgs.insert(row.org_id.clone());
        } else if reason.starts_with("waiting: project") {
            self.projects.insert(row.project_id.clone());
        } else if reason.starts_with("waiting: pool") {
            self.pools.insert(pool.to_owned());
        }
    }

    fn blocks(&self, row: &Sandbox, pool: &str) -> bool {
        self.orgs.contains(&row.org_id)
            || self.projects.contains(&row.project_id)
            || self.pools.contains(pool)
    }
}

enum Outcome {
    /// Now provisioning.
    Activated,
    /// Left the queue (failed, deleted, or no longer queued).
    Gone,
    /// Stays queued; retry after the back-off or when capacity is released.
    Wait,
    /// Capacity changed since it was popped: back into the queue, pick again.
    Stale,
}

async fn fail_queued(s: &Scheduler, id: &SandboxId, reason: String) -> Result<Outcome, StoreError> {
    let t = Transition {
        id: id.clone(),
        from: vec![SandboxStatus::Queued],
        to: SandboxStatus::Failed,
        reason: Some(reason),
        actor: Actor::System("scheduler"),
    };
    match s.store.transition(t, Utc::now()).await {
        Ok(failed) => {
            let _ = s.announcer.status(&failed).await;
            Ok(Outcome::Gone)
        }
        Err(StoreError::StatusConflict { .. }) => Ok(Outcome::Gone),
        Err(e) => Err(e),
    }
}

async fn place_one(
    s: &Scheduler,
    id: &SandboxId,
    quotas: &mut QuotaCache,
    q: &Shared,
    generation: u64,
) -> Result<Outcome, StoreError> {
    let Some(row) = s.store.get_sandbox(id).await? else {
        return Ok(Outcome::Gone);
    };
    if row.status != SandboxStatus::Queued {
        return Ok(Outcome::Gone);
    }
    let now = Utc::now();
    if let Some(max) = quotas.max_queue_seconds(s, &row).await? {
        let waited = (now - row.created_at).num_seconds().max(0) as u64;
        if waited >= max {
            let last = row
                .status_reason
                .clone()
                .unwrap_or_else(|| "waiting".into());
            return fail_queued(
                s,
                id,
                format!("queued longer than maxQueueSeconds ({max} s); last {last}"),
            )
            .await;
        }
    }
    let req = row.spec.placement_request();
    let effective = quotas.policy(s, &row).await?;
    let used = quotas.slots(s).await?;
    let explained = policy::decide(&req, &s.pools.profiles(&used), &effective);
    // The explanation keeps the effective policy it was decided under (the trust report
    // shows it for external placements).
    let mut doc = serde_json::to_value(&explained).unwrap_or_default();
    if let Some(obj) = doc.as_object_mut() {
        obj.insert(
            "policy".into(),
            serde_json::to_value(&effective).unwrap_or_default(),
        );
        obj.insert("decidedAt".into(), serde_json::json!(now));
    }
    match explained.decision.clone() {
        Decision::Placed { .. } => {
            // Try the ranked pools in turn: the first may have filled since the view.
            let ranking: Vec<(String, Option<u32>)> = explained
                .ranking()
                .iter()
                .map(|v| {
                    let cap = s.pools.get(&v.name).and_then(|p| p.record.max_concurrent);
                    (v.name.clone(), cap)
                })
                .collect();
            for (pool, cap) in ranking {
                {
                    let queue = lock(q);
                    if queue.generation != generation {
                        return Ok(Outcome::Stale);
                    }
                    if queue.blocked.blocks(&row, &pool) {
                        continue;
                    }
                }
                let slot = PoolSlot {
                    name: pool.clone(),
                    max_concurrent: cap,
                };
                match s.store.activate(id, &slot, &s.config.quota, now).await? {
                    Activation::Activated(active) => {
                        quotas.take_slot(&pool);
                        metrics::counter!("differently_activations_total", "pool" => pool.clone())
                            .increment(1);
                        tracing::info!(sandbox = %id, pool = %pool, "placement: activated");
                        if let Err(e) = s.store.save_placement(id, &doc).await {
                            tracing::warn!(sandbox = %id, error = %e, "cannot store the placement explanation");
                        }
                        if let Err(e) = s.announcer.work(&active, WorkOp::Create, "").await {
                            tracing::warn!(sandbox = %id, error = %e, "create publish failed; the provisioning sweep will retry");
                        }
                        let _ = s.announcer.status(&active).await;
                        return Ok(Outcome::Activated);
                    }
                    Activation::Waiting(waiting) => {
                        let reason = waiting.status_reason.as_deref().unwrap_or("");
                        let pool_wall = reason.starts_with("waiting: pool");
                        lock(q).blocked.note(&waiting, &pool, reason);
                        if !pool_wall {
                            // A tenant quota: no other pool helps.
                            break;
                        }
                    }
                    Activation::NotQueued(_) => return Ok(Outcome::Gone),
                }
            }
            if row.status_reason.is_none() {
                let _ = s.store.save_placement(id, &doc).await;
            }
            Ok(Outcome::Wait)
        }
        Decision::Waiting { reason } => {
            let next =
                now + chrono::Duration::from_std(s.config.waiting_backoff).unwrap_or_default();
            s.store.set_queued_reason(id, &reason, next).await?;
            Ok(Outcome::Wait)
        }
        Decision::Rejected { reason, .. } => {
            fail_queued(s, id, format!("placement rejected: {reason}")).await
        }
    }
}
