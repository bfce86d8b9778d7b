//! Warm pools: per pool and warm class, instances created ahead of time and never used, so a
//! create matching the class is answered from one inside its admission transaction.
//!
//! A warm instance is a row keyed by a `SandboxId` chosen when the refill leader reserves it
//! (`warm_begin`): the backend instance is tagged with that id, and the sandbox that claims it
//! takes the same id, so every adapter call by sandbox id finds it. A claim deletes the warm
//! row in the transaction that inserts the sandbox row (`DirectPlacement::warm_class`), so an
//! instance is claimed at most once by construction: the row is gone and the id is the
//! sandbox's primary key. The claim is therefore not a call of this trait.
//!
//! States: `creating` (reserved, the backend create in flight) → `ready` (claimable) →
//! `retiring` (too old, class removed or shrunk: its backend delete in flight) → gone. A
//! creating row may also be retired, or removed when its create failed for good.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::warm::WarmClasses;
use differently_core::SandboxId;

use crate::{Actor, StoreError};

/// Where a warm instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WarmState {
    /// Reserved by the refill leader; the backend create is in flight.
    Creating,
    /// Created and claimable.
    Ready,
    /// To be deleted from the backend; never claimed again.
    Retiring,
}

impl WarmState {
    /// Every state, in life order.
    pub const ALL: [WarmState; 3] = [WarmState::Creating, WarmState::Ready, WarmState::Retiring];

    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmState::Creating => "creating",
            WarmState::Ready => "ready",
            WarmState::Retiring => "retiring",
        }
    }

    /// The state of a stored form.
    pub fn parse(s: &str) -> Option<WarmState> {
        WarmState::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

/// One warm instance as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmInstance {
    /// The sandbox id the instance is tagged with, and that its claimer takes.
    pub id: SandboxId,
    pub pool: String,
    pub class: String,
    pub state: WarmState,
    /// The backend's own id, once created.
    pub backend_ref: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When it became ready (the claim takes the oldest ready first).
    pub ready_at: Option<DateTime<Utc>>,
    /// How many times the create was begun (a repeated `warm_begin` of a creating row).
    pub attempts: u32,
}

/// Instances of one class of a pool per state.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmCount {
    pub class: String,
    pub creating: u32,
    pub ready: u32,
    pub retiring: u32,
}

/// Creates that matched a warm class of a pool: `hits` claimed a ready instance, `misses`
/// went cold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmClaims {
    pub pool: String,
    pub class: String,
    pub hits: u64,
    pub misses: u64,
}

/// How long claim counts are kept (`warm_count_claims` prunes older minutes).
pub const CLAIM_COUNTS_KEPT: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// The minute `at` falls in: claim counts are kept per minute.
pub fn claim_minute(at: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::DurationRound;
    at.duration_trunc(chrono::TimeDelta::minutes(1))
        .unwrap_or(at)
}

/// The warm classes of pools and their instances. The refill leader, the workers, the
/// reconciler and the admin API use these calls; the claim happens inside admission.
#[async_trait]
pub trait WarmStore: Send + Sync {
    /// The pool's warm classes (none if never set).
    async fn warm_classes(&self, pool: &str) -> Result<WarmClasses, StoreError>;

    /// Replaces the pool's warm classes, audited in the installation chain
    /// (`pool.warm.set` on `pool:<name>`, with the old and new documents); nothing is written
    /// when the document is unchanged. `NotFound` if the pool is not registered,
    /// `InvalidValue` (naming `classes[i].field`) if the document does not validate.
    /// Instances of removed or shrunk classes are left to the refill leader to retire.
    async fn set_warm_classes(
        &self,
        pool: &str,
        classes: &WarmClasses,
        actor: &Actor,
    ) -> Result<(), StoreError>;

    /// Every pool that has warm classes set (an empty document included), by pool name.
    async fn all_warm_classes(&self) -> Result<Vec<(String, WarmClasses)>, StoreError>;

    /// Instances per class and state: every declared class in document order (zeros
    /// included), then classes that still have rows but are no longer declared, by name.
    async fn warm_counts(&self, pool: &str) -> Result<Vec<WarmCount>, StoreError>;

    /// Reserves an instance of (`pool`, `class`) under `id`, `creating`: the refill leader
    /// calls it before publishing the create. Begun again for a row still `creating` of the
    /// same pool and class, it counts one more attempt; any other existing row with that id
    /// is `AlreadyExists`.
    async fn warm_begin(
        &self,
        pool: &str,
        class: &str,
        id: &SandboxId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// `creating → ready` with the backend's ref. `true` also for a row already ready (a
    /// redelivered create); `false` if the row is retiring or gone (class removed, retired
    /// meanwhile), in which case the caller deletes the instance it created.
    async fn warm_ready(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError>;

    /// Moves the rows of `ids` to `retiring` (they will not be claimed); answers how many
    /// rows it found. Their backend deletes follow, then `warm_gone`.
    async fn warm_retire(&self, ids: &[SandboxId]) -> Result<u64, StoreError>;

    /// Removes the row once its backend instance is deleted (any state); `false` if there was
    /// none.
    async fn warm_gone(&self, id: &SandboxId) -> Result<bool, StoreError>;

    /// Removes a `creating` row whose create failed for good; `false` (and nothing changed)
    /// if the row is not creating.
    async fn warm_failed(&self, id: &SandboxId) -> Result<bool, StoreError>;

    /// The pool's instances, by id (for the reconciler: a backend instance whose sandbox id
    /// is neither a sandbox row nor a warm row is an orphan).
    async fn warm_instances(&self, pool: &str) -> Result<Vec<WarmInstance>, StoreError>;

    /// Adds `counts` to the minute `at` falls in ([`claim_minute`]), and forgets minutes
    /// older than [`CLAIM_COUNTS_KEPT`]. API processes call it with what they counted since
    /// their last call, so every replica's creates add up in one place.
    async fn warm_count_claims(
        &self,
        counts: &[WarmClaims],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Hits and misses per class of `pool` over the minutes from `since`'s on, by class.
    async fn warm_claims_since(
        &self,
        pool: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<WarmClaims>, StoreError>;
}

/// `counts` (class, state, n) merged with the declared classes: every declared class in
/// document order, then the others by name.
pub(crate) fn merge_counts(
    classes: &WarmClasses,
    counts: impl IntoIterator<Item = (String, WarmState, u32)>,
) -> Vec<WarmCount> {
    let mut out: Vec<WarmCount> = classes
        .classes
        .iter()
        .map(|c| WarmCount {
            class: c.name.clone(),
            ..WarmCount::default()
        })
        .collect();
    let mut extra: std::collections::BTreeMap<String, WarmCount> = Default::default();
    for (class, state, n) in counts {
        let entry = match out.iter_mut().position(|c| c.class == class) {
            Some(i) => &mut out[i],
            None => extra.entry(class.clone()).or_insert_with(|| WarmCount {
                class,
                ..WarmCount::default()
            }),
        };
        match state {
            WarmState::Creating => entry.creating += n,
            WarmState::Ready => entry.ready += n,
            WarmState::Retiring => entry.retiring += n,
        }
    }
    out.extend(extra.into_values());
    out
}
