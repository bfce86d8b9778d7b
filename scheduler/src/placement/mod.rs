//! Placement: the leader's fair queue and its dispatch loop.
//!
//! Fed three ways: `dly.admit.*` messages (fast path), a periodic rebuild from queued rows
//! (repair: covers a publish lost between commit and bus, and a new leader's empty queue),
//! and capacity-release events (a terminated or failed sandbox wakes parked candidates).
//! Candidates blocked by quota or capacity are parked with a back-off; each activation
//! charges its org's CPU so the next pick already sees the new load.
//!
//! - [`queue`]: the fair queue, its parked candidates and the walls they wait behind;
//! - [`feed`]: the three feeds of the queue;
//! - [`dispatch`]: the loop that picks groups in fair order and decides each under policy;
//! - [`activate`]: a group's activations in one transaction, and their announcements;
//! - [`quota_cache`]: quotas, policies and slot counts as placement reads them.

use std::sync::{Arc, Mutex};

use tokio::sync::{watch, Notify, Semaphore};

use crate::Scheduler;

mod activate;
mod dispatch;
mod feed;
mod queue;
mod quota_cache;

use dispatch::dispatch_loop;
use feed::{consume_admissions, follow_releases, rebuild_from_store};
use queue::{Queue, Shared};

/// Groups whose work and status publishes may be in flight while the leader places the next
/// groups. The publishes do not gate the next group (the activation is committed; a lost
/// work message is re-sent by the provisioning sweep, and the workers' scan creates it
/// anyway), but they are bounded, so a bus that stays slow slows placement down instead of
/// piling up tasks. The bound is on memory (a few KB a group), not throughput: while a
/// stream elects a leader every publish waits out its 1 s bound, and 4 groups in flight
/// held placement to 4 groups a second (activations spread over 6 s for 20 creates in 2 s
/// in the cluster e2e test), so it is 64.
const ANNOUNCING_GROUPS: usize = 64;

/// Runs placement while this instance leads: the three feeds in the background, the
/// dispatch loop in front, until `stop` turns true.
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
