//! The leader's in-memory queue: candidates in fair order, the parked ones, and the walls
//! they wait behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use differently_bus_schema::TraceContext;
use differently_core::fair::{Candidate, FairQueue};
use differently_core::{Sandbox, SandboxId};
use differently_store::Wall;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

#[derive(Default)]
pub(super) struct Queue {
    pub(super) fair: FairQueue,
    pub(super) parked: HashMap<SandboxId, (Instant, Candidate)>,
    /// Walls found since the last wake-up; kept across passes so nobody slips into a slot
    /// freed between a commit and its release event ahead of the fair order.
    pub(super) blocked: Blocked,
    /// Bumped by every wake-up; an activation decided before a wake-up is re-decided after
    /// it, so a candidate popped just before capacity freed cannot take the slot out of turn.
    pub(super) generation: u64,
    /// Trace context of the admission message, per candidate, so the work published at
    /// activation continues the caller's trace. Dropped when the candidate leaves the queue.
    pub(super) traces: HashMap<SandboxId, TraceContext>,
    /// The queued row of each candidate as last seen, so placing it needs no read: its spec
    /// cannot change while it is queued, and the activation re-checks everything under locks.
    pub(super) rows: HashMap<SandboxId, Sandbox>,
    /// The waiting reason this leader last stored an explanation for, per candidate. The
    /// row's own `statusReason` cannot tell: an admission that tried direct placement sets
    /// the reason without an explanation, and `GET …/placement` then found none.
    pub(super) explained: HashMap<SandboxId, String>,
}

impl Queue {
    pub(super) fn offer(&mut self, s: &Sandbox) {
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
    pub(super) fn unpark_due(&mut self, now: Instant) {
        if self.parked.values().any(|(t, _)| *t <= now) {
            self.wake_all();
        }
    }

    /// The candidate left the queue for good.
    pub(super) fn forget(&mut self, id: &SandboxId) {
        self.traces.remove(id);
        self.rows.remove(id);
        self.explained.remove(id);
    }

    /// Whether the waiting explanation of `id` for `reason` is still to be stored.
    pub(super) fn needs_explaining(&self, id: &SandboxId, reason: &str) -> bool {
        self.explained.get(id).map(String::as_str) != Some(reason)
    }

    pub(super) fn wake_all(&mut self) {
        self.generation += 1;
        self.blocked = Blocked::default();
        for (_, (_, c)) in self.parked.drain() {
            self.fair.push(c);
        }
    }
}

/// The queue, its wake-up, and the permits of activation announcements in flight.
pub(super) type Shared = Arc<(Mutex<Queue>, Notify, Arc<Semaphore>)>;

pub(super) fn lock(q: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    match q.0.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Walls already found (full pools, orgs or projects at quota): candidates behind the same
/// wall are parked without another transaction, and cannot jump the fair order when the
/// wall falls — everyone is woken together and picked fairly.
#[derive(Default)]
pub(super) struct Blocked {
    pub(super) pools: std::collections::HashSet<String>,
    pub(super) orgs: std::collections::HashSet<differently_core::OrgId>,
    pub(super) projects: std::collections::HashSet<differently_core::ProjectId>,
}

impl Blocked {
    pub(super) fn note(&mut self, row: &Sandbox, pool: &str, wall: Wall) {
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

    pub(super) fn blocks(&self, row: &Sandbox, pool: &str) -> bool {
        self.orgs.contains(&row.org_id)
            || self.projects.contains(&row.project_id)
            || self.pools.contains(pool)
    }
}
