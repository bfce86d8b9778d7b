//! Work claims: which worker is calling the backend for one status version of a sandbox row
//! (the create of a provisioning row's activation, the delete of a terminating row). Work
//! reaches a worker two ways, over the bus (the fast path) and by the worker's scan of the
//! store (the fallback while the work stream or its consumer has no leader, see
//! `differently_workers`); both take the claim before the call, so one call is never in
//! flight twice, whichever way each came. A claim runs out after `hold` unless renewed, so a
//! dead holder's work is taken up again.
//!
//! Workers take claims with [`WorkClaimStore::claim_current_work`] (or, for a create that came
//! by the bus, [`WorkClaimStore::claim_create_reading`]), which claim only while the row is still
//! at the claimed status version, in the same statement. So a claim whose row moved on can
//! never be taken again, and a worker does not delete its claim after a finished call (its
//! own status change settles it): the scan forgets settled claims in bulk
//! ([`WorkClaimStore::prune_settled_work_claims`]), one statement for many calls (issue #47).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use crate::StoreError;

/// What a claim is on: a sandbox and the status version of the change whose backend call it
/// is (every status change bumps it, so a requeued and re-placed row is a new activation with
/// a fresh claim, and its delete another).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimKey {
    pub sandbox: SandboxId,
    pub status_version: i64,
}

impl ClaimKey {
    /// The call a row's current status asks for (its create if provisioning, its delete if
    /// terminating).
    pub fn of(row: &Sandbox) -> ClaimKey {
        ClaimKey {
            sandbox: row.id.clone(),
            status_version: row.status_version,
        }
    }
}

/// What an attempt to claim a row's current call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Taken, this being the `n`-th claim of the call (the worker's attempt count).
    Taken(u32),
    /// Someone (maybe this worker by its other path) holds it.
    Held,
    /// The row is gone or no longer at the claimed change: the call is settled or stale.
    Moved,
}

/// Claims of backend calls, shared by every worker of every pool.
#[async_trait]
pub trait WorkClaimStore {
    /// Takes `activation`'s call for `owner` until `now + hold` if nobody holds it (no claim
    /// yet, or the last one ran out or was let go and its `free_at` passed). A live claim refuses
    /// everyone, its own holder included, so a process's bus path and scan cannot both go.
    /// `Some(tries)`: taken, this being the `tries`-th claim of the activation; `None`: held.
    async fn claim_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<u32>, StoreError>;

    /// [`Self::claim_work`], but only while `activation`'s row is still at its status version,
    /// checked in the same statement: a claim taken this way is on a live change, so the
    /// worker needs no separate re-read of the row before its call, and a settled change's
    /// claim is never taken again (its row moved on), which is what lets workers leave
    /// settled claims to [`Self::prune_settled_work_claims`] instead of deleting each.
    async fn claim_current_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Reads sandbox `id` and, if it is provisioning on `pool`, claims its create (the row's
    /// current status version) as [`Self::claim_current_work`] does, in the same round trip:
    /// the bus path's read of the row and its claim are one statement. `None`: no such row;
    /// [`ClaimOutcome::Moved`]: not a create on `pool` (stale work), nothing claimed.
    async fn claim_create_reading(
        &self,
        id: &SandboxId,
        pool: &str,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<(Sandbox, ClaimOutcome)>, StoreError>;

    /// Extends `owner`'s claim to `now + hold`; `false` if it is no longer `owner`'s (it ran
    /// out and someone else took it).
    async fn renew_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<bool, StoreError>;

    /// Lets go of `owner`'s claim after a failed attempt: free for anyone from `free_at` (the
    /// retry's back-off), keeping its tries. Not `owner`'s any more: nothing happens.
    async fn release_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        free_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Forgets the claim: its call is settled (the row moved on).
    async fn drop_work_claim(&self, activation: &ClaimKey) -> Result<(), StoreError>;

    /// Forgets claims that ran out before `before` (of rows that moved on while the holder
    /// was gone); how many.
    async fn prune_work_claims(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;

    /// Forgets claims whose row is gone or moved past their status version: their calls are
    /// settled, and [`Self::claim_current_work`] never takes them again. How many.
    async fn prune_settled_work_claims(&self) -> Result<u64, StoreError>;

    /// Rows on `pool` in one of `statuses` (provisioning: a create; terminating: a delete)
    /// that reached it before `changed_before` and whose call nobody holds at `now`, oldest
    /// change first: work the bus has not brought to any worker.
    async fn unclaimed_work(
        &self,
        pool: &str,
        statuses: &[SandboxStatus],
        changed_before: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;
}

/// `now + hold`, saturating instead of overflowing on absurd holds.
pub(crate) fn held_until(now: DateTime<Utc>, hold: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(hold)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
