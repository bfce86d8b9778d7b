//! Activation: a queued sandbox moved onto a pool when quotas and the pool cap allow.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId};

use crate::Wall;
use crate::{Quota, StoreError};

/// The pool chosen for an activation and its concurrency cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSlot {
    pub name: String,
    pub max_concurrent: Option<u32>,
}

impl PoolSlot {
    /// The pool as the core accounting rules see it.
    pub fn cap(&self) -> differently_core::accounting::PoolCap<'_> {
        differently_core::accounting::PoolCap {
            name: &self.name,
            max_concurrent: self.max_concurrent,
        }
    }
}

/// One activation of an `activate_many` group.
#[derive(Debug, Clone)]
pub struct ActivationItem {
    pub id: SandboxId,
    pub pool: PoolSlot,
    /// Stored with the activation when it activates (see `activate_explained`).
    pub explanation: Option<serde_json::Value>,
}

/// Result of `activate`.
#[derive(Debug, Clone, PartialEq)]
pub enum Activation {
    /// Now `provisioning` on the pool; `attempts` was incremented.
    Activated(Sandbox),
    /// Quota or pool cap is full; the row stays `queued` with this `statusReason`, and
    /// `Wall` says which limit, so placement can park everyone behind the same one.
    Waiting(Sandbox, Wall),
    /// The row is no longer `queued` (deleted, already activated): nothing done.
    NotQueued(Sandbox),
}

/// Moving queued sandboxes onto pools: the placement leader's transactions, each re-checking
/// quotas and the pool cap under the organization's (and pool's) lock.
#[async_trait]
pub trait ActivationStore: crate::sandboxes::SandboxReadStore + Send + Sync {
    /// Locks organization, then pool (when capped), then sandbox; re-checks the org's and the
    /// project's quotas (their stored quotas over `quota`, the defaults) against usage derived
    /// from rows, and the pool cap against the pool's rows; moves `queued → provisioning` on
    /// `pool`, or records why it waits (`waiting: org cpu quota 8/8`).
    async fn activate(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        self.activate_explained(id, pool, quota, None, now).await
    }

    /// `activate`, and when it activates, stores the placement `explanation` in the same
    /// transaction: one commit per activation, and no activated sandbox without its reasons.
    async fn activate_explained(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        explanation: Option<&serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError>;

    /// Several activations at once, in order, each decided exactly as `activate_explained`
    /// would decide it after the ones before it (their slots and quota already taken). One
    /// transaction on Postgres: one commit, one round of locks and reads for the whole
    /// group, instead of one of each per sandbox. A missing row fails the whole call
    /// (`NotFound`), as `activate` does for one.
    async fn activate_many(
        &self,
        items: &[ActivationItem],
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Vec<Activation>, StoreError> {
        for it in items {
            if self.get_sandbox(&it.id).await?.is_none() {
                return Err(StoreError::NotFound);
            }
        }
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            out.push(
                self.activate_explained(&it.id, &it.pool, quota, it.explanation.as_ref(), now)
                    .await?,
            );
        }
        Ok(out)
    }

    /// Updates only `statusReason` of a queued row (placement's "waiting: …").
    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError>;
}
