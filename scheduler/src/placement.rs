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
use differently_bus_schema::{Admitted, Envelope, StatusChanged, TraceContext};
use differently_core::fair::{Candidate, FairQueue};
use differently_core::policy::{self, Decision, EffectivePolicy};
use differently_core::tenancy::Quota;
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use differently_store::{
    Activation, ActivationItem, Actor, PoolSlot, QuotaScope, StoreError, Transition, Wall,
};
use futures::StreamExt;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use crate::Scheduler;

/// Most candidates tried in one dispatch pass, so one pass stays short.
const MAX_PER_PASS: usize = 100;
/// Groups whose work and status publishes may be in flight while the leader places the next
/// groups. The publishes do not gate the next group (the activation is committed; a lost
/// work message is re-sent by the provisioning sweep), but they are bounded, so a slow bus
/// slows placement down instead of piling up tasks.
const ANNOUNCING_GROUPS: usize = 4;
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
    /// The queued row of each candidate as last seen, so placing it needs no read: its spec
    /// cannot change while it is queued, and the activation re-checks everything under locks.
    rows: HashMap<SandboxId, Sandbox>,
}

impl Queue {
    fn offer(&mut self, s: &Sandbox) {
        if self.fair.contains(&s.id) || self.parked.contains_key(&s.id) {
            return;
        }
        self.rows.insert(s.id.clone(), s.clone());
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

    /// The candidate left the queue for good.
    fn forget(&mut self, id: &SandboxId) {
        self.traces.remove(id);
        self.rows.remove(id);
    }

    fn wake_all(&mut self) {
        self.generation += 1;
        self.blocked = Blocked::default();
        for (_, (_, c)) in self.parked.drain() {
            self.fair.push(c);
        }
    }
}

/// The queue, its wake-up, and the permits of activation announcements in flight.
type Shared = Arc<(Mutex<Queue>, Notify, Arc<Semaphore>)>;

fn lock(q: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    match q.0.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

pub(crate) async fn run(s: Scheduler, stop: watch::Receiver<bool>) {
    let shared: Shared = Arc::new((
        Mutex::new(Queue::default()),
        Notify::new(),
        Arc::new(Semaphore::new(ANNOUNCING_GROUPS)),
    ));
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
            let row = match env.body.sandbox {
                Some(row) if row.id == env.sandbox_id => Ok(Some(*row)),
                _ => s.store.get_sandbox(&env.sandbox_id).await,
            };
            match row {
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
/// every tick (activations in between are counted locally). Shared by the placements of a
/// group; a miss is fetched outside the lock (two concurrent misses fetch twice, harmlessly).
#[derive(Default)]
struct QuotaCache(Mutex<CacheState>);

#[derive(Default)]
struct CacheState {
    entries: HashMap<QuotaScope, (Instant, Option<Quota>)>,
    policies:
        HashMap<(differently_core::OrgId, differently_core::ProjectId), (Instant, EffectivePolicy)>,
    slots: Option<(Instant, HashMap<String, u32>)>,
}

impl QuotaCache {
    fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Forgets slot counts (capacity was released: they are stale).
    fn drop_slots(&self) {
        self.state().slots = None;
    }

    async fn policy(&self, s: &Scheduler, row: &Sandbox) -> Result<EffectivePolicy, StoreError> {
        let key = (row.org_id.clone(), row.project_id.clone());
        if let Some((at, p)) = self.state().policies.get(&key) {
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
        self.state()
            .policies
            .insert(key, (Instant::now(), p.clone()));
        Ok(p)
    }

    async fn slots(&self, s: &Scheduler) -> Result<HashMap<String, u32>, StoreError> {
        if let Some((at, used)) = &self.state().slots {
            if at.elapsed() < s.config.tick {
                return Ok(used.clone());
            }
        }
        let used = s.store.pool_slots_used().await?;
        self.state().slots = Some((Instant::now(), used.clone()));
        Ok(used)
    }

    fn take_slot(&self, pool: &str) {
        if let Some((_, used)) = &mut self.state().slots {
            *used.entry(pool.to_owned()).or_insert(0) += 1;
        }
    }

    async fn get(&self, s: &Scheduler, scope: QuotaScope) -> Result<Option<Quota>, StoreError> {
        if let Some((at, q)) = self.state().entries.get(&scope) {
            if at.elapsed() < QUOTA_CACHE {
                return Ok(*q);
            }
        }
        let q = s.store.get_quota(&scope).await?;
        self.state().entries.insert(scope, (Instant::now(), q));
        Ok(q)
    }

    /// The tighter of the org's (over the defaults) and the project's `maxQueueSeconds`.
    async fn max_queue_seconds(
        &self,
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
struct Pick {
    candidate: Candidate,
    trace: TraceContext,
    row: Option<Sandbox>,
}

/// Pops up to `size` candidates (`SchedulerConfig::placement_group`) in fair order, charging
/// each to its org as it is picked. Their policy decisions run concurrently and their
/// first-choice activations share one transaction (`Store::activate_many`: one commit and one
/// round of locks and reads for the group instead of one per sandbox), decided in pick order;
/// since picks are charged as they are made, the order within a group is the one a sequential
/// placer would have used had every one of them activated. `None` if capacity was released
/// since `generation` (the caller starts over).
fn pick_group(q: &Shared, generation: u64, size: usize) -> Option<Vec<Pick>> {
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
async fn place_group(
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
            decide(s, &p.candidate.id, p.row.clone(), quotas, q),
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
    fn note(&mut self, row: &Sandbox, pool: &str, wall: Wall) {
        match wall {
            Wall::Org => {
                self.orgs.insert(row.org_id.clone());
            }
            Wall::Project => {
                self.projects.insert(row.project_id.clone());
            }
            Wall::Pool => {
                self.pools.insert(pool.to_owned());
            }
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

/// A candidate whose policy decision placed it: the pools to try, in rank order.
struct Ready {
    row: Sandbox,
    doc: serde_json::Value,
    ranking: Vec<(String, Option<u32>)>,
    now: chrono::DateTime<Utc>,
}

/// What deciding a candidate led to: an outcome already, or pools to try.
enum Decided {
    Done(Outcome),
    Ready(Box<Ready>),
}

/// Phase one of a placement, run concurrently for a group: everything up to the activation
/// (queue time limit, policy decision). Writes only for candidates that end here.
async fn decide(
    s: &Scheduler,
    id: &SandboxId,
    cached: Option<Sandbox>,
    quotas: &QuotaCache,
    q: &Shared,
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

/// Phase two for a group: the first choices of every decided candidate in one
/// `activate_many`, in pick order — each sees the activations before it, so whoever the fair
/// order picked first gets a contested slot or quota, exactly as one by one. A candidate
/// whose first pool was full then tries its other ranked pools on its own.
async fn activate_group(
    s: &Scheduler,
    group: &[Pick],
    ready: &[Option<&Ready>],
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Vec<(usize, Result<Outcome, StoreError>)> {
    let mut out = Vec::with_capacity(ready.len());
    let mut items: Vec<(usize, ActivationItem)> = Vec::new();
    let mut walled: Vec<usize> = Vec::new();
    {
        let queue = lock(q);
        let decided = ready
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)));
        if queue.generation != generation {
            // Capacity was released while deciding: pick again, in fair order.
            return decided.map(|(i, _)| (i, Ok(Outcome::Stale))).collect();
        }
        for (i, r) in decided {
            match r
                .ranking
                .iter()
                .find(|(pool, _)| !queue.blocked.blocks(&r.row, pool))
            {
                Some((pool, cap)) => items.push((
                    i,
                    ActivationItem {
                        id: r.row.id.clone(),
                        pool: PoolSlot {
                            name: pool.clone(),
                            max_concurrent: *cap,
                        },
                        explanation: Some(r.doc.clone()),
                    },
                )),
                None => walled.push(i),
            }
        }
    }
    for i in walled {
        if let Some(r) = ready[i] {
            out.push((i, Ok(wait_behind_walls(s, r).await)));
        }
    }
    if items.is_empty() {
        return out;
    }
    let batch: Vec<ActivationItem> = items.iter().map(|(_, it)| it.clone()).collect();
    let results = match s
        .store
        .activate_many(&batch, &s.config.quota, Utc::now())
        .await
    {
        Ok(results) => results,
        Err(e) => {
            let msg = e.to_string();
            out.extend(
                items
                    .into_iter()
                    .map(|(i, _)| (i, Err(StoreError::Internal(msg.clone())))),
            );
            return out;
        }
    };
    let mut activated: Vec<(usize, Sandbox)> = Vec::new();
    let mut try_others: Vec<usize> = Vec::new();
    for ((i, it), res) in items.into_iter().zip(results) {
        match res {
            Activation::Activated(active) => {
                count_activation(quotas, &it.pool.name);
                activated.push((i, active));
                out.push((i, Ok(Outcome::Activated)));
            }
            Activation::Waiting(waiting, wall) => {
                note_wall(q, waiting, &it.pool.name, wall);
                if wall == Wall::Pool {
                    try_others.push(i);
                } else if let Some(r) = ready[i] {
                    // A tenant quota: no other pool helps.
                    out.push((i, Ok(wait_behind_walls(s, r).await)));
                }
            }
            Activation::NotQueued(_) => out.push((i, Ok(Outcome::Gone))),
        }
    }
    // The work and status of every activation at once, each under its caller's trace, while
    // the leader goes on with the next group.
    let announcements: Vec<(TraceContext, Sandbox)> = activated
        .into_iter()
        .map(|(i, active)| {
            let ctx = group.get(i).map(|p| p.trace.clone()).unwrap_or_default();
            (ctx, active)
        })
        .collect();
    announce_in_background(s, q, announcements).await;
    for i in try_others {
        let (Some(r), Some(p)) = (ready[i], group.get(i)) else {
            continue;
        };
        let res = trace::scope(
            "activate",
            p.trace.clone(),
            activate_ranked(s, r, quotas, q, generation),
        )
        .await;
        out.push((i, res));
    }
    out
}

/// Counts an activation on `pool` (metric, and the slot view until the next read).
fn count_activation(quotas: &QuotaCache, pool: &str) {
    quotas.take_slot(pool);
    metrics::counter!("differently_activations_total", "pool" => pool.to_owned()).increment(1);
}

/// Publishes the group's activations from a task of its own, once one of the
/// `ANNOUNCING_GROUPS` permits is free.
async fn announce_in_background(
    s: &Scheduler,
    q: &Shared,
    activated: Vec<(TraceContext, Sandbox)>,
) {
    if activated.is_empty() {
        return;
    }
    // The semaphore is never closed; if it were, announcing unbounded beats not announcing.
    let permit = q.2.clone().acquire_owned().await.ok();
    let s = s.clone();
    tokio::spawn(async move {
        futures::future::join_all(activated.iter().map(|(ctx, active)| {
            trace::scope("activate", ctx.clone(), announce_activation(&s, active))
        }))
        .await;
        drop(permit);
    });
}

/// Publishes an activated sandbox's create work and its status, both at once: the work
/// matters only to the worker, the status only to watchers.
async fn announce_activation(s: &Scheduler, active: &Sandbox) {
    tracing::info!(sandbox = %active.id, pool = active.pool.as_deref().unwrap_or(""), "placement: activated");
    if let Err(e) = s.announcer.activated(active).await {
        tracing::warn!(sandbox = %active.id, error = %e, "create publish failed; the provisioning sweep will retry");
    }
}

/// Records the wall an activation found (others behind it are parked without a
/// transaction) and the row as it now reads (its waiting reason).
fn note_wall(q: &Shared, waiting: Sandbox, pool: &str, wall: Wall) {
    let mut queue = lock(q);
    queue.blocked.note(&waiting, pool, wall);
    queue.rows.insert(waiting.id.clone(), waiting);
}

/// Every pool this candidate could use is behind a wall: it waits; its explanation is stored
/// the first time, so `GET …/placement` says why.
async fn wait_behind_walls(s: &Scheduler, r: &Ready) -> Outcome {
    if r.row.status_reason.is_none() {
        let _ = s.store.save_placement(&r.row.id, &r.doc).await;
    }
    Outcome::Wait
}

/// A candidate whose first pool was full tries its other ranked pools, one at a time (any
/// may have filled since the view).
async fn activate_ranked(
    s: &Scheduler,
    ready: &Ready,
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Result<Outcome, StoreError> {
    let Ready {
        row,
        doc,
        ranking,
        now,
    } = ready;
    for (pool, cap) in ranking {
        {
            let queue = lock(q);
            if queue.generation != generation {
                return Ok(Outcome::Stale);
            }
            if queue.blocked.blocks(row, pool) {
                continue;
            }
        }
        let slot = PoolSlot {
            name: pool.clone(),
            max_concurrent: *cap,
        };
        let activation = s
            .store
            .activate_explained(&row.id, &slot, &s.config.quota, Some(doc), *now)
            .await?;
        match activation {
            Activation::Activated(active) => {
                count_activation(quotas, pool);
                announce_activation(s, &active).await;
                return Ok(Outcome::Activated);
            }
            Activation::Waiting(waiting, wall) => {
                note_wall(q, waiting, pool, wall);
                if wall != Wall::Pool {
                    // A tenant quota: no other pool helps.
                    break;
                }
            }
            Activation::NotQueued(_) => return Ok(Outcome::Gone),
        }
    }
    Ok(wait_behind_walls(s, ready).await)
}
