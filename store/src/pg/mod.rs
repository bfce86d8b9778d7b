//! The Postgres store: the truth. Every trait method is one transaction; sandbox rows keep the
//! full serialized `Sandbox` in `doc` with the columns needed for locking, filtering and
//! ordering promoted next to it (written together, so they never disagree).
//!
//! Lock order is fixed: organization row, then pool row, then sandbox row (`locks`). Status
//! changes load the row `FOR UPDATE`, apply the shared rules in Rust, and write doc, columns
//! and the audit record in the same transaction. One file per intent (`tenancy`, `admission`,
//! `activation`, `transition`, …), the same names as the memory store's; the helpers they
//! share are their own modules (`locks`, `rows`, `writes`, `limits`, `audit_records`).

mod activation;
pub(crate) mod activation_group;
mod admission;
pub(crate) mod admission_lanes;
mod admission_swap;
pub(crate) mod audit;
pub(crate) mod audit_records;
pub(crate) mod audit_standalone;
pub(crate) mod env_at_rest;
pub(crate) mod group_commit;
mod idempotency;
mod installation;
mod lifecycle;
pub(crate) mod limits;
pub(crate) mod locks;
mod migrations;
mod placement;
pub(crate) mod prior_write;
pub(crate) mod rows;
mod sandboxes;
mod secrets;
mod tenancy;
mod transition;
pub(crate) mod transition_lane;
pub(crate) mod transition_patch;
pub(crate) mod transition_swap;
mod usage;
pub(crate) mod usage_counters;
pub(crate) mod warm;
mod webhooks;
mod work_claims;
pub(crate) mod writes;

pub use installation::LEADER_IDLE_TIMEOUT_SECONDS;
pub use migrations::MIGRATIONS;

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::StoreError;

/// `idle_in_transaction_session_timeout` of every store connection, in milliseconds.
const IDLE_IN_TRANSACTION_TIMEOUT_MS: &str = "5000";

impl crate::Store for PgStore {}

/// Counts of a process's lone status changes since start ([`PgStore::status_swaps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusSwaps {
    /// Decided and written in one statement (refusals included).
    pub done: u64,
    /// Calls that found the row or its chain's head moved and wrote nothing.
    pub misses: u64,
    /// Handed back to the group-commit lane.
    pub laned: u64,
    /// Rows read for a change because none was remembered from a claim.
    pub reads: u64,
    /// Changed from the row as the caller saw it, with no read
    /// (`TransitionStore::transition_seen`).
    pub patched: u64,
}

/// Counts of a process's lone admissions since start ([`PgStore::admission_swaps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdmissionSwaps {
    /// Answered without the lane: written in one statement, or refused or replayed on the
    /// unlocked read.
    pub done: u64,
    /// Calls that found a guard broken and wrote nothing; each then took the lane.
    pub misses: u64,
    /// Handed to the lane without a call (a warm or capped placement, a chain without a
    /// head row, a fractional number in a record).
    pub declined: u64,
}

/// `Store` on PostgreSQL. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    options: PgConnectOptions,
    /// A dedicated connection per lock kept between failed `try_lead_as` attempts, so a
    /// standby replica trying every tick does not open a new session each time. It becomes
    /// the leader's connection when an attempt succeeds.
    standby: Arc<tokio::sync::Mutex<std::collections::HashMap<crate::Lead, PgConnection>>>,
    /// Audit heads this process last wrote, for standalone appends (`audit_standalone`).
    audit_heads: Arc<audit_standalone::HeadCache>,
    /// One-row status changes waiting to be committed together (`transition_lane`).
    transitions: Arc<transition_lane::TransitionLane>,
    /// What lone status changes did (`transition_swap`).
    swap_stats: Arc<transition_swap::SwapStats>,
    /// Rows read right before this process changes them (`transition_swap`).
    row_memo: Arc<transition_swap::RowMemo>,
    /// Admissions waiting to be committed together, per organization (`admission_lanes`).
    admissions: Arc<admission_lanes::AdmissionLanes>,
    /// What lone admissions did (`admission_swap`).
    admit_swap_stats: Arc<admission_swap::AdmitSwapStats>,
}

impl PgStore {
    /// Connects a pool of at most `max_connections` to `url`. Does not migrate.
    pub async fn connect(url: &str, max_connections: u32) -> Result<PgStore, StoreError> {
        // A process that stalls inside a transaction (a VM pause, SIGSTOP, a hung task) would
        // hold its locks, an organization's row among them, for as long as it stalls, and
        // every admission of that organization would wait with it. Postgres ends such a
        // session after this long idle in a transaction; its work rolls back and is retried.
        // No store transaction waits on anything but Postgres between statements.
        let options = PgConnectOptions::from_str(url)?.options([(
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT_MS,
        )]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            // No ping before handing out a connection: it was one extra round trip in front
            // of every query and transaction (the hot paths make several). A connection
            // that died while idle (a database restart) fails its next query instead, which
            // callers report or retry like any other database error.
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        Ok(PgStore {
            pool,
            options,
            standby: Arc::default(),
            audit_heads: Arc::default(),
            transitions: Arc::default(),
            swap_stats: Arc::default(),
            row_memo: Arc::default(),
            admissions: Arc::default(),
            admit_swap_stats: Arc::default(),
        })
    }

    pub(crate) fn transitions(&self) -> &Arc<transition_lane::TransitionLane> {
        &self.transitions
    }

    pub(crate) fn swap_stats(&self) -> &transition_swap::SwapStats {
        &self.swap_stats
    }

    pub(crate) fn row_memo(&self) -> &transition_swap::RowMemo {
        &self.row_memo
    }

    /// What this process's lone status changes did since start (`transition_swap`): the
    /// harness and tests read it to tell the one-statement path from the lane.
    pub fn status_swaps(&self) -> StatusSwaps {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.swap_stats;
        StatusSwaps {
            done: s.done.load(Relaxed),
            misses: s.misses.load(Relaxed),
            laned: s.laned.load(Relaxed),
            reads: s.reads.load(Relaxed),
            patched: s.patched.load(Relaxed),
        }
    }

    pub(crate) fn admit_swap_stats(&self) -> &admission_swap::AdmitSwapStats {
        &self.admit_swap_stats
    }

    /// What this process's lone admissions did since start (`admission_swap`).
    pub fn admission_swaps(&self) -> AdmissionSwaps {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.admit_swap_stats;
        AdmissionSwaps {
            done: s.done.load(Relaxed),
            misses: s.misses.load(Relaxed),
            declined: s.declined.load(Relaxed),
        }
    }

    pub(crate) fn admissions(&self) -> &Arc<admission_lanes::AdmissionLanes> {
        &self.admissions
    }

    pub(crate) fn audit_heads(&self) -> &audit_standalone::HeadCache {
        &self.audit_heads
    }

    /// Standalone audit appends (exec, files) whose compare-and-swap found the chain's head
    /// moved since this process last saw it, since start: each cost one more statement.
    pub fn audit_append_misses(&self) -> u64 {
        self.audit_heads.misses()
    }

    /// The connection pool, for callers that need plain queries (health checks).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every pooled connection; in-flight work finishes first.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }
}
