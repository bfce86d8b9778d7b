//! The scheduler: one leader (Postgres advisory lock) runs placement and the sweeps; the
//! other instances stand by and take over when the lock frees.
//!
//! Placement holds a fair queue in memory, fed by `dly.admit.*` messages and rebuilt from
//! queued rows (the repair pass), so a lost message or a leader change loses nothing.

use std::sync::Arc;
use std::time::Duration;

use differently_adapters::pools::PoolSet;
use differently_bus::Announcer;
use differently_store::{Quota, Store};
use tokio::sync::watch;

mod audit_checkpoints;
mod leader;
mod metrics;
mod placement;
mod sweeps;
mod usage_reconcile;
pub mod warm;

/// Tunables of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// How often placement retries waiting candidates and the sweeps run.
    pub tick: Duration,
    /// How often a standby tries to take the lead.
    pub standby_poll: Duration,
    /// Ack wait of the placement consumer.
    pub ack_wait: Duration,
    /// A provisioning row untouched this long is adopted or requeued.
    pub provisioning_timeout: Duration,
    /// A terminating row untouched this long gets its delete re-sent.
    pub terminating_retry: Duration,
    /// A queued row older than this and not in the in-memory queue is re-read (repair).
    pub repair_interval: Duration,
    /// Back-off of a waiting candidate before it is tried again (capacity release wakes it sooner).
    pub waiting_backoff: Duration,
    /// Tenant quota re-checked at activation.
    pub quota: Quota,
    /// Idle timeout of sandboxes that set none (`None`: such sandboxes never idle).
    pub default_idle_timeout: Option<Duration>,
    /// How often the reconciler compares each pool's backend listing with the rows.
    pub reconcile_interval: Duration,
    /// Most queued sandboxes the leader places in one transaction. Larger drains a backlog
    /// faster (fewer commits), but holds the audit heads of more chains at once, which
    /// admissions of the same orgs wait for (measured in `docs/performance.md`).
    pub placement_group: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            tick: Duration::from_millis(250),
            standby_poll: Duration::from_secs(1),
            ack_wait: Duration::from_secs(30),
            provisioning_timeout: Duration::from_secs(120),
            terminating_retry: Duration::from_secs(30),
            repair_interval: Duration::from_secs(2),
            waiting_backoff: Duration::from_secs(2),
            quota: Quota::default(),
            default_idle_timeout: None,
            reconcile_interval: Duration::from_secs(5),
            placement_group: 32,
        }
    }
}

/// What the scheduler works with.
#[derive(Clone)]
pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub announcer: Announcer,
    pub pools: PoolSet,
    pub config: SchedulerConfig,
}

impl Scheduler {
    /// Runs until `shutdown` turns true: stand by, lead while holding the lock, repeat.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        leader::run(self, shutdown).await
    }
}
