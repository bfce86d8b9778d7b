//! Warm pools' refill, run by the leader: keeps each pool's warm classes at their `size`
//! and retires what should go. Level-triggered: every pass reads the classes and the warm
//! rows and decides from them alone, so a newly elected leader carries on from the table.
//! What it keeps in memory (token buckets, back-offs, when it last sent a message) only
//! paces it; losing it on a leader change costs at most one early retry.
//!
//! Per pool with classes, per class, each pass (`REFILL_EVERY`):
//! - **retire** (→ `retiring`, then `WarmDelete` to the pool's workers): rows of a class no
//!   longer declared; ready rows older than `maxAgeSeconds`; ready rows above `maxSize`
//!   (oldest first); creating rows older than [`CREATE_TIMEOUT`] (their create is stuck or
//!   its message lost; the worker's delete is idempotent).
//! - **refill** (`warm_begin` then `WarmCreate`): `size - (creating + ready)`, at most what
//!   the class's token bucket holds (`refillPerSecond`, a burst of one second's worth), at
//!   most the room the pool's `maxConcurrent` leaves (live sandboxes + every warm row, the
//!   retiring ones included, never above it), and nothing while the class backs off.
//! - **tenant work first**: while any queued sandbox waits for this pool's capacity (its
//!   stored reason names the pool, `differently_core::wait_reason`), the pool gets no
//!   refill: capacity that frees goes to the tenant. Placement counts live sandboxes only,
//!   so tenants may fill a capped pool that warm instances also hold; when live sandboxes
//!   and warm rows together are over the cap, ready instances (oldest first) are retired
//!   until they fit (`over_pool_cap`), giving the backend's capacity back to the tenants.
//! - **back-off**: a create that failed for good removes its row (`warm_failed`). The leader
//!   sees that as a row it last saw `creating` that is gone without having been seen `ready`,
//!   and backs the class off exponentially (1 s doubling to [`MAX_BACKOFF`]); a row seen
//!   ready resets it. A row made ready and claimed within one pass also looks like a failure:
//!   that costs one short back-off, and the next success clears it.
//! - **re-sends**: a retiring or creating row whose message may have been lost (a failed
//!   publish, a leader change) gets it again after [`RESEND_AFTER`]; the workers' handling is
//!   idempotent.
//!
//! Gauges `differently_warm_ready{pool,class}`, `differently_warm_creating{pool,class}` and
//! `differently_warm_size{pool,class}` (the declared size) are set every pass; the worker records `differently_warm_refill_seconds` (begin → ready).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use differently_bus_schema::WorkOp;
use differently_core::wait_reason;
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::SandboxId;
use differently_store::warm::{WarmInstance, WarmState};
use differently_store::StoreError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Scheduler;

/// How often a refill pass runs.
pub(crate) const REFILL_EVERY: Duration = Duration::from_millis(250);

/// A `creating` row older than this is retired: no backend create takes this long.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest back-off of a class whose creates fail.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A warm message is sent again for a row still `retiring` (or `creating`) this long after
/// the last send.
pub const RESEND_AFTER: Duration = Duration::from_secs(60);

/// Most queued rows read to find tenants waiting for a pool's capacity.
const WAITING_SCAN: u32 = 1000;

/// Runs refill passes until `stop`.
pub(crate) async fn run(s: Scheduler, mut stop: watch::Receiver<bool>) {
    let mut refill = Refill::default();
    loop {
        if let Err(e) = refill.pass(&s, Instant::now(), Utc::now()).await {
            tracing::warn!(error = %e, "warm: refill pass failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(REFILL_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Creates a class may start: `rate` per second, at most a second's worth (and at least
/// one) at once.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub(crate) fn new(rate: f64, now: Instant) -> Self {
        let mut b = TokenBucket {
            rate,
            tokens: 0.0,
            at: now,
        };
        b.tokens = b.burst();
        b
    }

    fn burst(&self) -> f64 {
        self.rate.max(1.0)
    }

    /// Follows a changed `refillPerSecond` without refilling.
    pub(crate) fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
        self.tokens = self.tokens.min(self.burst());
    }

    /// Takes up to `want` whole tokens at `now`; answers how many it took.
    pub(crate) fn take(&mut self, want: u32, now: Instant) -> u32 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst());
        let n = (self.tokens.floor() as u32).min(want);
        self.tokens -= f64::from(n);
        n
    }
}

/// Back-off of a class whose creates fail.
#[derive(Debug, Clone, Default)]
pub(crate) struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

impl Backoff {
    pub(crate) fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        let wait = Duration::from_secs(1)
            .saturating_mul(1u32 << self.failures.saturating_sub(1).min(16))
            .min(MAX_BACKOFF);
        self.until = Some(now + wait);
    }

    pub(crate) fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    pub(crate) fn waiting(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now < u)
    }
}

/// Why a row is retired (the `reason` of the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retire {
    ClassRemoved,
    MaxAge,
    OverMaxSize,
    CreateTimeout,
    OverPoolCap,
}

impl Retire {
    fn as_str(self) -> &'static str {
        match self {
            Retire::ClassRemoved => "class_removed",
            Retire::MaxAge => "max_age",
            Retire::OverMaxSize => "over_max_size",
            Retire::CreateTimeout => "create_timeout",
            Retire::OverPoolCap => "over_pool_cap",
        }
    }
}

/// What one pass decides for one pool from its classes and rows alone.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PoolPlan {
    /// Rows to retire, with their class and why.
    pub(crate) retire: Vec<(SandboxId, String, Retire)>,
    /// Per declared class in document order: instances missing to reach `size`.
    pub(crate) deficit: Vec<(String, u32)>,
}

/// Ready rows to retire so that `live` sandboxes and the warm rows still held (not retiring,
/// nor already being retired) fit under `cap`: the oldest ready ones first. Creating rows
/// are left to finish (retiring them would waste the create under way).
pub(crate) fn over_the_cap(
    rows: &[WarmInstance],
    retiring_now: &[(SandboxId, String, Retire)],
    live: u32,
    cap: u32,
) -> Vec<(SandboxId, String, Retire)> {
    let going = |r: &WarmInstance| {
        r.state == WarmState::Retiring || retiring_now.iter().any(|(id, _, _)| *id == r.id)
    };
    let held = rows.iter().filter(|r| !going(r)).count() as u32;
    let over = live.saturating_add(held).saturating_sub(cap) as usize;
    let mut ready: Vec<&WarmInstance> = rows
        .iter()
        .filter(|r| r.state == WarmState::Ready && !going(r))
        .collect();
    ready.sort_by_key(|r| (r.ready_at, r.id.clone()));
    ready
        .into_iter()
        .take(over)
        .map(|r| (r.id.clone(), r.class.clone(), Retire::OverPoolCap))
        .collect()
}

/// Decides retirements and deficits (see the module docs); pure, for tests.
pub(crate) fn plan(classes: &WarmClasses, rows: &[WarmInstance], now: DateTime<Utc>) -> PoolPlan {
    let declared: HashMap<&str, &WarmClass> = classes
        .classes
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    let timeout = chrono::Duration::from_std(CREATE_TIMEOUT).unwrap_or(chrono::Duration::zero());
    let mut out = PoolPlan::default();
    // Kept rows per class: (creating, ready rows).
    let mut kept: HashMap<&str, (u32, Vec<&WarmInstance>)> = HashMap::new();
    for row in rows.iter().filter(|r| r.state != WarmState::Retiring) {
        let Some(class) = declared.get(row.class.as_str()) else {
            out.retire
                .push((row.id.clone(), row.class.clone(), Retire::ClassRemoved));
            continue;
        };
        let entry = kept.entry(class.name.as_str()).or_default();
        match row.state {
            WarmState::Creating if row.created_at + timeout <= now => {
                out.retire
                    .push((row.id.clone(), row.class.clone(), Retire::CreateTimeout));
            }
            WarmState::Creating => entry.0 += 1,
            _ => {
                let max_age = chrono::Duration::seconds(
                    i64::try_from(class.max_age_seconds).unwrap_or(i64::MAX / 1000),
                );
                if row.created_at + max_age <= now {
                    out.retire
                        .push((row.id.clone(), row.class.clone(), Retire::MaxAge));
                } else {
                    entry.1.push(row);
                }
            }
        }
    }
    for class in &classes.classes {
        let (creating, mut ready) = kept.remove(class.name.as_str()).unwrap_or_default();
        let max = class.effective_max_size() as usize;
        if ready.len() > max {
            // Oldest first: they would age out soonest.
            ready.sort_by_key(|r| (r.created_at, r.id.to_string()));
            let extra = ready.len() - max;
            for r in ready.drain(..extra) {
                out.retire
                    .push((r.id.clone(), r.class.clone(), Retire::OverMaxSize));
            }
        }
        let have = creating + ready.len() as u32;
        out.deficit
            .push((class.name.clone(), class.size.saturating_sub(have)));
    }
    out
}

/// The pools that queued sandboxes wait for the capacity of, by their stored reasons
/// (`differently_core::wait_reason`, which the writers use too).
pub(crate) fn pools_waited_for<'a>(reasons: impl IntoIterator<Item = &'a str>) -> HashSet<String> {
    reasons
        .into_iter()
        .flat_map(wait_reason::pools_waited_for)
        .map(str::to_owned)
        .collect()
}

/// Pacing state of one class of one pool.
#[derive(Debug)]
struct ClassState {
    bucket: TokenBucket,
    backoff: Backoff,
    /// Rows last seen `creating`, to tell a failed create (gone) from one that succeeded.
    creating: HashSet<SandboxId>,
}

/// The refill loop's memory (see the module docs: pacing only).
#[derive(Default)]
struct Refill {
    classes: HashMap<(String, String), ClassState>,
    /// When a warm message was last sent for a row, for re-sends.
    sent: HashMap<SandboxId, Instant>,
    /// Gauges set by the last pass, so those of removed classes drop to zero.
    shown: HashSet<(String, String)>,
    /// Pools already logged as not offering warm instances.
    warned: HashSet<String>,
}

impl Refill {
    async fn pass(
        &mut self,
        s: &Scheduler,
        mono: Instant,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let all = s.store.all_warm_classes().await?;
        let mut waited: Option<HashSet<String>> = None;
        let mut slots: Option<HashMap<String, u32>> = None;
        let mut shown = HashSet::new();
        let mut seen_rows = HashSet::new();
        for (pool, classes) in all {
            let Some(p) = s.pools.get(&pool) else {
                continue; // no adapter here, no workers to send to
            };
            let rows = s.store.warm_instances(&pool).await?;
            seen_rows.extend(rows.iter().map(|r| r.id.clone()));
            self.follow_outcomes(&pool, &rows, mono);
            let mut decided = plan(&classes, &rows, now);
            // A capped pool's cap and its live sandboxes (slots read once per pass).
            let capped = match p.record.max_concurrent {
                None => None,
                Some(cap) => {
                    if slots.is_none() {
                        slots = Some(s.store.pool_slots_used().await?);
                    }
                    let live = slots
                        .as_ref()
                        .and_then(|m| m.get(&pool))
                        .copied()
                        .unwrap_or(0);
                    Some((cap, live))
                }
            };
            if let Some((cap, live)) = capped {
                decided
                    .retire
                    .extend(over_the_cap(&rows, &decided.retire, live, cap));
            }
            self.retire(s, &pool, &decided.retire, mono).await?;
            self.resend(s, &pool, &rows, &decided.retire, mono, now)
                .await;
            for c in s.store.warm_counts(&pool).await? {
                let labels = [("pool", pool.clone()), ("class", c.class.clone())];
                metrics::gauge!("differently_warm_ready", &labels).set(f64::from(c.ready));
                metrics::gauge!("differently_warm_creating", &labels).set(f64::from(c.creating));
                // The declared size (0 for a class being retired), so an alert can compare.
                let size = classes.get(&c.class).map_or(0, |k| k.size);
                metrics::gauge!("differently_warm_size", &labels).set(f64::from(size));
                shown.insert((pool.clone(), c.class));
            }
            if decided.deficit.iter().all(|(_, n)| *n == 0) {
                continue;
            }
            if !differently_adapters::offers_warm(p.adapter.as_ref()) {
                if self.warned.insert(pool.clone()) {
                    tracing::warn!(pool = %pool, "warm: the pool's backend does not offer warm instances; its classes are not refilled");
                }
                continue;
            }
            if !p.healthy() || p.capacity_refused_until(now).is_some() {
                continue;
            }
            if waited.is_none() {
                let queued = s
                    .store
                    .runnable_queued(now + chrono::Duration::days(1), WAITING_SCAN)
                    .await?;
                waited = Some(pools_waited_for(
                    queued.iter().filter_map(|r| r.status_reason.as_deref()),
                ));
            }
            if waited.as_ref().is_some_and(|w| w.contains(&pool)) {
                continue; // tenant work first
            }
            // Room under the pool's cap: live sandboxes and every warm row hold a slot.
            let mut room = match capped {
                None => u32::MAX,
                Some((cap, live)) => cap.saturating_sub(live.saturating_add(rows.len() as u32)),
            };
            for (class, deficit) in &decided.deficit {
                let Some(spec) = classes.classes.iter().find(|c| &c.name == class) else {
                    continue;
                };
                let key = (pool.clone(), class.clone());
                let st = self.classes.entry(key).or_insert_with(|| ClassState {
                    bucket: TokenBucket::new(spec.refill_per_second, mono),
                    backoff: Backoff::default(),
                    creating: HashSet::new(),
                });
                st.bucket.set_rate(spec.refill_per_second);
                if *deficit == 0 || room == 0 || st.backoff.waiting(mono) {
                    continue;
                }
                let n = st.bucket.take((*deficit).min(room), mono);
                room -= n;
                for _ in 0..n {
                    let id = SandboxId::new();
                    s.store.warm_begin(&pool, class, &id, now).await?;
                    st.creating.insert(id.clone());
                    let sent = s
                        .announcer
                        .warm_work(&pool, &id, WorkOp::WarmCreate, class, "")
                        .await;
                    match sent {
                        Ok(_) => {
                            self.sent.insert(id.clone(), mono);
                        }
                        Err(e) => {
                            // Re-sent after `RESEND_AFTER`; retired after the create timeout.
                            tracing::warn!(pool = %pool, class = %class, warm = %id, error = %e, "warm: create not published");
                        }
                    }
                    tracing::debug!(pool = %pool, class = %class, warm = %id, "warm: refill began");
                }
            }
        }
        for gone in self.shown.difference(&shown) {
            let labels = [("pool", gone.0.clone()), ("class", gone.1.clone())];
            metrics::gauge!("differently_warm_ready", &labels).set(0.0);
            metrics::gauge!("differently_warm_creating", &labels).set(0.0);
            metrics::gauge!("differently_warm_size", &labels).set(0.0);
        }
        self.shown = shown;
        self.sent.retain(|id, _| seen_rows.contains(id));
        Ok(())
    }

    /// Settles the back-off of each class from what became of the rows it last saw
    /// `creating` (see the module docs).
    fn follow_outcomes(&mut self, pool: &str, rows: &[WarmInstance], mono: Instant) {
        let by_id: HashMap<&SandboxId, &WarmInstance> = rows.iter().map(|r| (&r.id, r)).collect();
        for ((p, class), st) in self.classes.iter_mut() {
            if p != pool {
                continue;
            }
            let mut failed = false;
            let mut succeeded = false;
            st.creating
                .retain(|id| match by_id.get(id).map(|r| r.state) {
                    Some(WarmState::Creating) => true,
                    Some(WarmState::Ready) => {
                        succeeded = true;
                        false
                    }
                    Some(WarmState::Retiring) => false,
                    None => {
                        failed = true;
                        false
                    }
                });
            if succeeded {
                st.backoff.succeeded();
            } else if failed {
                st.backoff.failed(mono);
                tracing::info!(pool, class = %class, "warm: a create failed; the class backs off");
            }
        }
        // Rows still creating that this leader did not begin (it is new): followed from now.
        for r in rows.iter().filter(|r| r.state == WarmState::Creating) {
            if let Some(st) = self.classes.get_mut(&(pool.to_owned(), r.class.clone())) {
                st.creating.insert(r.id.clone());
            }
        }
    }

    async fn retire(
        &mut self,
        s: &Scheduler,
        pool: &str,
        retire: &[(SandboxId, String, Retire)],
        mono: Instant,
    ) -> Result<(), StoreError> {
        if retire.is_empty() {
            return Ok(());
        }
        let ids: Vec<SandboxId> = retire.iter().map(|(id, _, _)| id.clone()).collect();
        s.store.warm_retire(&ids).await?;
        for (id, class, why) in retire {
            tracing::info!(pool, class = %class, warm = %id, reason = why.as_str(), "warm: retiring an instance");
            match s
                .announcer
                .warm_work(pool, id, WorkOp::WarmDelete, class, "")
                .await
            {
                Ok(_) => {
                    self.sent.insert(id.clone(), mono);
                }
                Err(e) => {
                    tracing::warn!(pool, warm = %id, error = %e, "warm: delete not published; re-sent later");
                }
            }
        }
        Ok(())
    }

    /// Sends again the message of rows still retiring or creating long after the last send
    /// (or never sent by this leader and older than [`RESEND_AFTER`]).
    async fn resend(
        &mut self,
        s: &Scheduler,
        pool: &str,
        rows: &[WarmInstance],
        retired: &[(SandboxId, String, Retire)],
        mono: Instant,
        now: DateTime<Utc>,
    ) {
        let after = chrono::Duration::from_std(RESEND_AFTER).unwrap_or(chrono::Duration::zero());
        for r in rows {
            if retired.iter().any(|(id, _, _)| id == &r.id) {
                continue;
            }
            let due = match self.sent.get(&r.id) {
                Some(at) => mono.saturating_duration_since(*at) >= RESEND_AFTER,
                // This leader never sent it: a retiring row may be one whose delete a former
                // leader never published; a creating row is given its create's time first.
                None => r.state == WarmState::Retiring || r.created_at + after <= now,
            };
            if !due {
                continue;
            }
            let op = match r.state {
                WarmState::Retiring => WorkOp::WarmDelete,
                WarmState::Creating => WorkOp::WarmCreate,
                WarmState::Ready => continue,
            };
            let attempt = format!("-{}", now.timestamp_millis());
            if s.announcer
                .warm_work(pool, &r.id, op, &r.class, &attempt)
                .await
                .is_ok()
            {
                self.sent.insert(r.id.clone(), mono);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, size: u32, max: Option<u32>) -> WarmClass {
        WarmClass {
            name: name.into(),
            size,
            max_size: max,
            refill_per_second: 5.0,
            max_age_seconds: 600,
            template: None,
            resources: None,
        }
    }

    fn row(class: &str, state: WarmState, age_s: i64, now: DateTime<Utc>) -> WarmInstance {
        let created_at = now - chrono::Duration::seconds(age_s);
        WarmInstance {
            id: SandboxId::new(),
            pool: "p".into(),
            class: class.into(),
            state,
            backend_ref: (state != WarmState::Creating).then(|| "ref".to_owned()),
            created_at,
            ready_at: (state != WarmState::Creating).then_some(created_at),
            attempts: 1,
        }
    }

    #[test]
    fn tenants_over_a_capped_pool_retire_the_oldest_ready_instances() {
        let now = Utc::now();
        let old = row("small", WarmState::Ready, 300, now);
        let young = row("small", WarmState::Ready, 10, now);
        let creating = row("small", WarmState::Creating, 1, now);
        let going = row("small", WarmState::Retiring, 400, now);
        let rows = vec![young.clone(), creating.clone(), old.clone(), going];
        // 3 held (the retiring one is not) + 6 live = 9 under a cap of 10: nothing.
        assert!(over_the_cap(&rows, &[], 6, 10).is_empty());
        // + 8 live = 11: one over, the oldest ready goes.
        let out = over_the_cap(&rows, &[], 8, 10);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, old.id);
        assert_eq!(out[0].2, Retire::OverPoolCap);
        // Already being retired for another reason counts as gone.
        let max_age = vec![(old.id.clone(), "small".to_owned(), Retire::MaxAge)];
        let out = over_the_cap(&rows, &max_age, 8, 10);
        assert!(out.is_empty(), "{out:?}");
        // Far over: every ready one, never the one being created.
        let out = over_the_cap(&rows, &[], 20, 10);
        let ids: Vec<_> = out.iter().map(|(id, _, _)| id.clone()).collect();
        assert_eq!(ids, vec![old.id.clone(), young.id.clone()]);
    }

    #[test]
    fn the_bucket_gives_its_rate_and_a_second_of_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2.0, t0);
        assert_eq!(b.take(10, t0), 2, "a full bucket holds one second's worth");
        assert_eq!(b.take(10, t0), 0);
        assert_eq!(b.take(10, t0 + Duration::from_millis(499)), 0);
        assert_eq!(b.take(10, t0 + Duration::from_millis(500)), 1);
        assert_eq!(b.take(10, t0 + Duration::from_millis(900)), 0);
        // Idle for a minute: still only a second's worth.
        assert_eq!(b.take(100, t0 + Duration::from_secs(61)), 2);
        // Over ten seconds at 2/s: 20 tokens, whatever the polling.
        let mut b = TokenBucket::new(2.0, t0);
        let _ = b.take(10, t0);
        let mut total = 0;
        for ms in (250..=10_000).step_by(250) {
            total += b.take(10, t0 + Duration::from_millis(ms));
        }
        assert_eq!(total, 20);
        // A slow class gets one now and then: 0.5/s is one every two seconds.
        let mut slow = TokenBucket::new(0.5, t0);
        assert_eq!(slow.take(5, t0), 1);
        assert_eq!(slow.take(5, t0 + Duration::from_millis(1900)), 0);
        assert_eq!(slow.take(5, t0 + Duration::from_millis(2000)), 1);
    }

    #[test]
    fn back_off_doubles_to_its_cap_and_resets_on_success() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(!b.waiting(t0));
        b.failed(t0);
        assert!(b.waiting(t0 + Duration::from_millis(900)));
        assert!(!b.waiting(t0 + Duration::from_millis(1000)));
        for _ in 0..10 {
            b.failed(t0);
        }
        assert!(b.waiting(t0 + Duration::from_secs(29)));
        assert!(!b.waiting(t0 + MAX_BACKOFF));
        b.succeeded();
        assert!(!b.waiting(t0));
    }

    #[test]
    fn the_plan_retires_what_should_go_and_counts_what_is_missing() {
        let now = Utc::now();
        let classes = WarmClasses {
            classes: vec![class("a", 3, Some(4)), class("b", 2, None)],
        };
        let rows = vec![
            row("a", WarmState::Ready, 10, now),
            row("a", WarmState::Ready, 700, now), // older than maxAgeSeconds (600)
            row("a", WarmState::Creating, 5, now),
            row("a", WarmState::Creating, 601 + 600, now), // create timed out
            row("gone", WarmState::Ready, 1, now),         // class removed
            row("gone", WarmState::Retiring, 1, now),      // already retiring: left alone
            row("b", WarmState::Ready, 30, now),
            row("b", WarmState::Ready, 20, now),
            row("b", WarmState::Ready, 10, now), // above maxSize (= size 2)
        ];
        let p = plan(&classes, &rows, now);
        let why = |r: Retire| -> Vec<SandboxId> {
            p.retire
                .iter()
                .filter(|x| x.2 == r)
                .map(|x| x.0.clone())
                .collect()
        };
        assert_eq!(why(Retire::MaxAge), vec![rows[1].id.clone()]);
        assert_eq!(why(Retire::CreateTimeout), vec![rows[3].id.clone()]);
        assert_eq!(why(Retire::ClassRemoved), vec![rows[4].id.clone()]);
        assert_eq!(
            why(Retire::OverMaxSize),
            vec![rows[6].id.clone()],
            "the oldest goes"
        );
        assert_eq!(p.retire.len(), 4);
        // a: one ready and one creating kept, size 3; b: two kept, size 2.
        assert_eq!(p.deficit, vec![("a".into(), 1), ("b".into(), 0)]);
        // No classes: everything live retires, nothing is missing.
        let empty = plan(&WarmClasses::default(), &rows, now);
        assert_eq!(empty.retire.len(), 8);
        assert!(empty.deficit.is_empty());
    }

    #[test]
    fn waiting_reasons_name_the_pools() {
        // Written as the policy and the activation write them.
        let reasons = [
            wait_reason::capacity([("fake", "at capacity 2/2"), ("other", "unhealthy")]),
            "waiting: org active quota 1/1".to_owned(),
            wait_reason::capacity([("third", "at capacity 1/1")]),
            wait_reason::pool_full("fourth", 3, 3),
        ];
        let w = pools_waited_for(reasons.iter().map(String::as_str));
        let mut got: Vec<_> = w.into_iter().collect();
        got.sort();
        assert_eq!(got, ["fake", "fourth", "other", "third"]);
    }
}
