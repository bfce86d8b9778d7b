//! Status changes after activation, compare-and-set on status and checked by the state machine.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};

use crate::{Actor, Quota, StoreError};

/// A status change, checked against the state machine and compare-and-set on `from`.
#[derive(Debug, Clone)]
pub struct Transition {
    pub id: SandboxId,
    /// The change applies only if the current status is one of these.
    pub from: Vec<SandboxStatus>,
    pub to: SandboxStatus,
    pub reason: Option<String>,
    pub actor: Actor,
}

/// A row as its caller last saw it (a running row it served a call on), at the one status of
/// a [`Transition`]'s `from`: enough for a store to change its status without reading it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRow {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status_version: i64,
}

/// Status changes of a sandbox after activation (workers, sweeps, lifecycle operations):
/// compare-and-set on status, checked by the state machine, audited in the same transaction.
#[async_trait]
pub trait TransitionStore: Send + Sync {
    /// `provisioning → running` with the backend's ref; sets `startedAt` and
    /// `expiresAt = now + ttl`. Conflict if the row moved meanwhile.
    async fn mark_running(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError>;

    /// `provisioning → queued` (another attempt, possibly on another pool) no earlier than
    /// `not_before`, clearing the pool.
    async fn requeue(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError>;

    /// Any other legal status change. Sets `endedAt` on final statuses.
    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError>;

    /// `transition` of a row the caller saw at `seen` (the one status in `t.from`, at
    /// `seen.status_version`). A store may use that to skip its read of the row; the outcome
    /// is `transition`'s whatever the row is now: a stale `seen` costs a read, never a
    /// different answer.
    async fn transition_seen(
        &self,
        t: Transition,
        seen: SeenRow,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let _ = seen;
        self.transition(t, now).await
    }

    /// `transition`, refused with `QuotaExceeded` if what the change adds (stopped → running
    /// reserves CPU and memory again) would exceed the org's quota (its stored quota over
    /// `defaults`) or the project's. Checked under the organization's row lock, like an
    /// activation, so concurrent starts and activations cannot overshoot together.
    async fn transition_within_quota(
        &self,
        t: Transition,
        defaults: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError>;
}
