//! What the data plane and the lifecycle need beyond the core `Store`: operation records
//! (one per lifecycle call the pool's workers execute), snapshots, and sandbox activity for
//! the idle sweep. Postgres (`pg::lifecycle`) and memory (`memory::lifecycle`) implement it.
//!
//! An operation is the durable handle of a mutation in flight: the API inserts it (at most one
//! *exclusive* pending operation per sandbox, so conflicting concurrent changes are refused
//! with 409 instead of racing on the backend), publishes `dly.work.<pool>.<op>`, and waits for
//! the worker to record its outcome here. The caller may leave; the record stays the truth.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::StoreError;

/// `statusReason` (and operation `reason`) of a sandbox the idle sweep paused or stopped.
/// Only such a sandbox is woken by the next data-plane call; one paused by a caller stays
/// paused.
pub const IDLE_REASON: &str = "idle timeout";

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    Pending,
    Done,
    Failed,
}

impl OpState {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            OpState::Pending => "pending",
            OpState::Done => "done",
            OpState::Failed => "failed",
        }
    }
}

/// Why an operation failed, as the API will serve it (`code` is an `ErrorCode` wire name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpError {
    pub code: String,
    pub message: String,
}

/// One lifecycle operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpRecord {
    pub id: OpId,
    pub sandbox_id: SandboxId,
    pub org_id: OrgId,
    /// The work subject token (`pause`, `snapshot`, `exposeport` …).
    pub kind: String,
    /// At most one exclusive operation per sandbox is pending at a time.
    pub exclusive: bool,
    /// Kind-specific arguments (`reason`, `snapshotId`, `port` …).
    pub args: Value,
    pub state: OpState,
    /// Kind-specific outcome (`url`, `expiresAt` …).
    #[serde(default)]
    pub result: Value,
    #[serde(default)]
    pub error: Option<OpError>,
    /// Audit form of who asked (`key:…`, `system:idle`).
    pub actor: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl OpRecord {
    /// A new pending operation.
    pub fn new(
        sandbox: &Sandbox,
        kind: &str,
        exclusive: bool,
        args: Value,
        actor: String,
        now: DateTime<Utc>,
    ) -> OpRecord {
        OpRecord {
            id: OpId::new(),
            sandbox_id: sandbox.id.clone(),
            org_id: sandbox.org_id.clone(),
            kind: kind.to_owned(),
            exclusive,
            args,
            state: OpState::Pending,
            result: Value::Null,
            error: None,
            actor,
            created_at: now,
            updated_at: now,
        }
    }
}

/// Result of `begin_op`.
#[derive(Debug, Clone, PartialEq)]
pub enum OpBegun {
    /// Inserted: publish its work message.
    New(OpRecord),
    /// The same kind with the same arguments is already pending: wait for that one.
    Joined(OpRecord),
    /// Another exclusive operation is pending: a conflicting concurrent change (409).
    Busy(OpRecord),
}

/// Status of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotStatus {
    Creating,
    Ready,
    Failed,
    Deleting,
}

impl SnapshotStatus {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotStatus::Creating => "creating",
            SnapshotStatus::Ready => "ready",
            SnapshotStatus::Failed => "failed",
            SnapshotStatus::Deleting => "deleting",
        }
    }
}

/// A snapshot as stored and served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    pub id: SnapshotId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    /// The sandbox it was taken from.
    pub sandbox_id: SandboxId,
    /// The pool holding it; restore and fork are pinned here.
    pub pool: String,
    pub name: Option<String>,
    pub status: SnapshotStatus,
    pub status_reason: Option<String>,
    /// The backend's id for it, once taken (never served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The statuses in which a row must have a backend instance in a known state: what the
/// reconciler judges against a pool's listing.
pub const ON_BACKEND: [SandboxStatus; 3] = [
    SandboxStatus::Running,
    SandboxStatus::Paused,
    SandboxStatus::Stopped,
];

/// Operation records, snapshots and activity; see the module docs.
#[async_trait]
pub trait LifecycleStore: Send + Sync + 'static {
    /// Inserts `op` unless an exclusive operation is already pending on its sandbox.
    async fn begin_op(&self, op: &OpRecord) -> Result<OpBegun, StoreError>;
    async fn get_op(&self, id: &OpId) -> Result<Option<OpRecord>, StoreError>;
    /// Records the outcome of a pending operation; a finished one is returned unchanged
    /// (redelivered work must not overwrite the first outcome).
    async fn finish_op(
        &self,
        id: &OpId,
        state: OpState,
        result: Value,
        error: Option<OpError>,
        now: DateTime<Utc>,
    ) -> Result<OpRecord, StoreError>;
    /// Pending operations not updated since `before`, oldest first (lost work messages).
    async fn pending_ops(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<OpRecord>, StoreError>;

    async fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError>;
    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<SnapshotRecord>, StoreError>;
    /// Snapshots of `org` (and `project`, when given) in id order after `after`.
    async fn list_snapshots(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError>;
    /// One page of the snapshots taken from `sandbox`, in id order after `after` (the
    /// sandbox route's listing; the caller has already checked the sandbox is the tenant's).
    async fn list_sandbox_snapshots(
        &self,
        sandbox: &SandboxId,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError>;
    /// Replaces the stored record (`NotFound` if there is none).
    async fn update_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError>;
    /// Removes the record once the backend snapshot is gone (missing is fine).
    async fn remove_snapshot(&self, id: &SnapshotId) -> Result<(), StoreError>;

    /// Records a data-plane call (exec, file, port, keepalive) on the sandbox.
    async fn touch_activity(&self, id: &SandboxId, at: DateTime<Utc>) -> Result<(), StoreError>;
    /// `touch_activity` for many sandboxes at once (a process's buffered activity); an entry
    /// never moves a sandbox's recorded activity back. The default touches them one by one.
    async fn touch_activity_many(
        &self,
        touches: &[(SandboxId, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        for (id, at) in touches {
            self.touch_activity(id, *at).await?;
        }
        Ok(())
    }
    /// The last recorded activity, if any.
    async fn last_activity(&self, id: &SandboxId) -> Result<Option<DateTime<Utc>>, StoreError>;
    /// Running sandboxes idle for longer than their `idleTimeoutSeconds` (or
    /// `default_idle_seconds` when they have none): neither a data-plane call nor a status
    /// change since then.
    async fn idle_candidates(
        &self,
        now: DateTime<Utc>,
        default_idle_seconds: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;

    /// Running, paused or stopped rows on `pool` unchanged since `before` whose id is not in
    /// `listed` (the pool's backend listing): rows that must have a backend instance and
    /// were not listed (the reconciler fails those whose instance vanished). The difference
    /// is taken in the store, so a pool of any size is checked whole on every pass and only
    /// the missing rows come back.
    async fn live_not_listed(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[SandboxId],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;

    /// Running, paused or stopped rows on `pool` unchanged since `before` and with no pending
    /// operation, whose status differs from the one their backend instance was listed in
    /// (`listed`: sandbox id and the status the instance's state means): rows whose instance
    /// moved behind Differently's back, which the reconciler follows. An operation in flight
    /// (its backend call made, its record not yet) is not drift, hence the pending guard.
    async fn drifted(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[(SandboxId, SandboxStatus)],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError>;

    /// Replaces what a caller may change on a sandbox without its backend: the labels (the
    /// reserved `differently.dev/` ones are kept) and the idle timeout (`Some(None)` clears
    /// it, so the server's default applies). `None` leaves a field alone.
    async fn update_spec(
        &self,
        id: &SandboxId,
        labels: Option<std::collections::BTreeMap<String, String>>,
        idle_timeout_seconds: Option<Option<u64>>,
    ) -> Result<Sandbox, StoreError>;

    /// Sets a new TTL: `expiresAt = now + ttl` for a sandbox that has started, and the spec's
    /// `ttlSeconds`. `NotFound` if the row is missing.
    async fn renew_ttl(
        &self,
        id: &SandboxId,
        ttl_seconds: u64,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError>;
}

/// Whether `s` has been idle past its timeout at `now` (shared by both stores). Checked
/// arithmetic throughout: a timeout too large to add to a timestamp (rows admitted before
/// the API bounded it may hold any `u64`) means "never idle", not a panic.
pub(crate) fn is_idle(
    s: &Sandbox,
    last_activity: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    default_idle_seconds: Option<u64>,
) -> bool {
    let Some(idle) = s.spec.idle_timeout_seconds.or(default_idle_seconds) else {
        return false;
    };
    let since = last_activity.map_or(s.updated_at, |a| a.max(s.updated_at));
    i64::try_from(idle)
        .ok()
        .and_then(chrono::TimeDelta::try_seconds)
        .and_then(|idle| since.checked_add_signed(idle))
        .is_some_and(|deadline| deadline < now)
}
