//! The `Store`: Postgres is the truth. Every method is one transaction named by its intent;
//! every sandbox status change is compare-and-set on status and writes its audit record in
//! the same transaction. Postgres (`postgres`) and in-memory (`memory`) implementations
//! pass one conformance suite (`tests/conformance`).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::ids::InstallationId;
use differently_core::{KeyId, OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};

mod activation_pg;
mod admission_pg;
pub mod audit;
mod audit_memory;
mod audit_pg;
mod audit_standalone_pg;
pub mod error;
mod group_commit;
pub mod idempotency;
pub mod lifecycle;
mod lifecycle_memory;
mod lifecycle_pg;
pub mod memory;
pub mod placement;
mod placement_memory;
mod placement_pg;
pub mod postgres;
mod prior_write;
pub mod sealed;
pub mod secrets;
mod shared;
#[cfg(feature = "test-support")]
pub mod testing;
mod transition_lane_pg;
mod usage_pg;

pub use error::StoreError;

/// Whose a sandbox is and its status, without the rest of its row (`Store::sandbox_briefs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxBrief {
    /// The owning organization.
    pub org_id: OrgId,
    /// The owning project.
    pub project_id: ProjectId,
    /// The status as last committed.
    pub status: SandboxStatus,
}

pub use differently_core::tenancy::{ApiKeyRecord, Org, OrgStatus, Project, Quota, Usage};

/// Whose quota: an organization's or a project's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum QuotaScope {
    Org(OrgId),
    Project(ProjectId),
}

impl QuotaScope {
    /// The stored key, e.g. `org:org_01…`.
    pub fn key(&self) -> String {
        match self {
            QuotaScope::Org(id) => format!("org:{id}"),
            QuotaScope::Project(id) => format!("project:{id}"),
        }
    }
}

/// A usage counter that disagreed with its rows and was corrected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDrift {
    /// `org:<id>`, `project:<id>` or `pool:<name>`.
    pub scope: String,
    pub stored: Usage,
    pub stored_slots: i64,
    pub counted: Usage,
    pub counted_slots: i64,
}

/// Who did something, for the audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// An API key (its public id only).
    Key(String),
    /// The control plane itself (scheduler, worker, sweep).
    System(&'static str),
}

impl Actor {
    /// The audit form, e.g. `key:key_01…` or `system:scheduler`.
    pub fn as_audit(&self) -> String {
        match self {
            Actor::Key(k) => format!("key:{k}"),
            Actor::System(s) => format!("system:{s}"),
        }
    }
}

/// Admission of a new sandbox.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The row to insert; its status is `queued` (see `direct`).
    pub sandbox: Sandbox,
    /// Hash of the request body, so an `Idempotency-Key` reused with another body is a conflict.
    pub request_hash: String,
    /// Installation-wide default limits; the organization's and the project's own quotas
    /// (read inside the transaction) take precedence field by field.
    pub defaults: Quota,
    pub actor: Actor,
    /// The request that asked, for the audit record; `None`: the current task's
    /// (`audit::with_request_id`). Set when another task (a group of admissions) writes it.
    pub request_id: Option<String>,
    /// Where to place the sandbox in its admission transaction, if nothing makes it wait
    /// (`None`: it is queued for the placement leader).
    pub direct: Option<DirectPlacement>,
}

/// A placement decided by the admitting API process, applied in the admission transaction
/// when the organization has nothing queued and its quotas admit the sandbox's compute now:
/// the row is inserted `provisioning` (with both audit records, admission then activation)
/// instead of `queued`, saving the leader's round (a bus hop, a pull and a transaction).
/// Anything that would make it wait (a queued sandbox of the org, a quota) queues it as
/// usual, so fair order decides whenever anyone waits. Only for pools without a concurrency
/// cap: a cap is contended across organizations, which only the leader orders.
#[derive(Debug, Clone)]
pub struct DirectPlacement {
    /// The pool, uncapped (`max_concurrent: None`); a capped one is ignored (queued).
    pub pool: PoolSlot,
    /// The placement explanation stored with the activation.
    pub explanation: serde_json::Value,
}

impl DirectPlacement {
    /// Whether a store may apply it: its pool has no concurrency cap (a cap is contended
    /// across organizations, and only the leader orders those).
    pub fn applies(&self) -> bool {
        self.pool.max_concurrent.is_none()
    }
}

/// Result of `admit`.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Inserted now: `queued`, or `provisioning` when its `DirectPlacement` was applied.
    New(Sandbox),
    /// The `Idempotency-Key` was seen before with the same body: the original sandbox.
    Replayed(Sandbox),
}

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

pub use differently_core::accounting::Wall;

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

/// Filter for listing sandboxes; results are in id (creation) order.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    pub org_id: Option<OrgId>,
    pub project_id: Option<ProjectId>,
    pub status: Option<SandboxStatus>,
    /// Only sandboxes carrying this label key with this value.
    pub label: Option<(String, String)>,
    /// Only ids strictly greater than this (cursor pagination).
    pub after: Option<SandboxId>,
    pub limit: u32,
}

/// An audit record as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub seq: i64,
    pub org_id: Option<OrgId>,
    pub actor: String,
    pub action: String,
    pub resource: String,
    pub at: DateTime<Utc>,
    pub detail: serde_json::Value,
}

/// The store contract shared by Postgres and memory.
#[async_trait]
pub trait Store:
    placement::PlacementStore
    + lifecycle::LifecycleStore
    + audit::AuditStore
    + secrets::SecretStore
    + idempotency::IdempotencyStore
    + Send
    + Sync
    + 'static
{
    /// This installation's id, created once and kept (backend instances are tagged with it).
    async fn installation_id(&self) -> Result<InstallationId, StoreError>;

    /// Creates the organization and project if they do not exist (bootstrap tenant).
    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError>;
    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError>;

    // --- tenancy -------------------------------------------------------------------------

    /// Inserts an organization; `AlreadyExists` if the name is taken.
    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError>;
    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError>;
    /// Organizations in id order after `after`.
    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError>;
    /// Renames and/or suspends/reactivates; audited.
    async fn update_org(
        &self,
        id: &OrgId,
        name: Option<&str>,
        status: Option<OrgStatus>,
        actor: &Actor,
    ) -> Result<Org, StoreError>;
    /// Deletes an organization with no projects (`HasDependents` otherwise); its keys and
    /// quota go with it.
    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError>;

    /// Inserts a project (`NotFound` if the org is missing, `AlreadyExists` for a taken name
    /// within the org).
    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError>;
    /// Projects of `org` in id order after `after`.
    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError>;
    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError>;
    /// Locks the org row; refuses (`HasDependents`) while the project has sandboxes that are
    /// not final. Finished sandboxes, keys and quota of the project go with it.
    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError>;

    /// Stores a key record (hash only); audited without the hash.
    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError>;
    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// Keys of `org` in id order after `after`.
    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Sets `revokedAt` (idempotent: a revoked key keeps its first revocation time).
    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError>;
    /// Records `lastUsedAt` (not audited; callers throttle it).
    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// The stored quota of an org or project (`None` if none was set).
    async fn get_quota(&self, scope: &QuotaScope) -> Result<Option<Quota>, StoreError>;
    /// Replaces the stored quota; audited with old and new values.
    async fn put_quota(
        &self,
        scope: &QuotaScope,
        quota: &Quota,
        actor: &Actor,
    ) -> Result<(), StoreError>;
    /// Usage derived from sandbox rows now.
    async fn usage(&self, scope: &QuotaScope) -> Result<Usage, StoreError>;

    /// Locks the organization row, replays an `Idempotency-Key` of the same project, checks
    /// the admission limits (`maxQueued` of org and project, `maxSandbox` size), inserts the
    /// queued row and its audit record. A tenant at its concurrency limit still queues.
    /// With `direct` set and nothing making it wait, the row is activated in the same
    /// transaction instead (as `activate_explained` would, after the admission's record).
    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError>;

    /// `admit` for admissions that arrived together, one outcome per item in the order given.
    /// Postgres decides each organization's items in one transaction (one org lock and one
    /// commit for the lot), each as `admit` would in that order; a refused item refuses only
    /// itself. The default admits them one by one.
    async fn admit_many(&self, group: Vec<Admission>) -> Vec<Result<Admitted, StoreError>> {
        let mut out = Vec::with_capacity(group.len());
        for a in group {
            out.push(match a.request_id.clone() {
                Some(id) => audit::with_request_id(id, self.admit(a)).await,
                None => self.admit(a).await,
            });
        }
        out
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError>;
    /// The `SandboxBrief` of each of `ids` that has a row; an id without one is absent.
    /// One round trip for many ids, and no document to decode: for passes over every backend
    /// instance (the reconciler), which would otherwise read one full row per instance.
    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, SandboxBrief>, StoreError>;
    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError>;

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

    /// Updates only `statusReason` of a queued row (placement's "waiting: …").
    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Queued rows whose next attempt is due, oldest first.
    async fn runnable_queued(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;

    /// Rows in `status` not updated since `before`: work a lost message or a dead process left.
    async fn stale(
        &self,
        status: SandboxStatus,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;

    /// Running, paused or stopped rows whose `expiresAt` has passed.
    async fn expired(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Sandbox>, StoreError>;

    /// Active CPU per organization (rows that reserve compute), for fair order.
    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError>;

    /// Recounts usage from rows and corrects the stored counters that differ (Postgres keeps
    /// counters maintained by a trigger; memory derives usage from rows and never drifts).
    /// Returns what was corrected: anything here means something bypassed the trigger.
    async fn reconcile_usage(&self) -> Result<Vec<UsageDrift>, StoreError>;

    /// Audit records, newest last.
    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;

    /// Tries to become the scheduler leader. `Some` while held; dropping it releases it.
    async fn try_lead(&self) -> Result<Option<Box<dyn Leadership>>, StoreError>;
}

/// A held leadership. Postgres: a session advisory lock on a dedicated connection.
#[async_trait]
pub trait Leadership: Send {
    /// Checks (pings) that the lock is still held; `false` means step down now.
    async fn still_held(&mut self) -> bool;
}
