//! `dly.evt.<org>.<project>.<sandbox>.<phase>`: a committed status change (internal: the public
//! event contract is separate and never carries `backendRef` or `auditHead`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use differently_core::sandbox::SandboxView;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde::{Deserialize, Serialize};

use super::WireResources;
use crate::Message;

/// Body on `dly.evt.…`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusChanged {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    pub pool: Option<String>,
    pub at: DateTime<Utc>,
    /// The backend's instance reference at this version, so an API replica can serve a
    /// data-plane call on a just-started sandbox without reading its row (the call's audit
    /// append re-checks the row's status and version). Internal: never sent to clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<String>,
    /// The row as a client sees it at this version (env keys only, never values), so a
    /// `wait` that this event satisfies answers without reading the row. Absent from older
    /// publishers; then the waiter reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<Box<SandboxState>>,
    /// The head of the audit chain the change's record went to, right after it: an API
    /// process that appends the next record of this sandbox on its own (an exec) hashes it
    /// onto this head instead of missing once on a head it last saw before the change.
    /// Internal, like `backend_ref`; absent from older publishers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_head: Option<AuditHead>,
    /// Why the status changed and which key changed it, when the publisher knows: the public
    /// `sandbox.status.changed` event carries it as `cause`/`actor`. Absent from older
    /// publishers (then `backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::public::Origin>,
    /// The sandbox runs on a claimed warm instance, which was created without its env: an
    /// API replica that serves a data-plane call from this event must read the row for the
    /// env instead. Internal; absent (false) from older publishers and for other sandboxes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
}

impl Message for StatusChanged {
    const KIND: &'static str = "status";
}

/// A status event read for its status alone: readers that act only on some statuses (the
/// placement leader wakes on final ones) skip the rest of the body, a whole client view,
/// instead of building it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusOnly {
    pub status: SandboxStatus,
}

impl Message for StatusOnly {
    const KIND: &'static str = "status";
}

/// An audit chain's head: its name, its last record's sequence and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditHead {
    pub chain: String,
    pub seq: i64,
    pub hash: String,
}

impl StatusChanged {
    /// The event of row `s` as committed: its status, and its client view and backend ref at
    /// that version.
    pub fn of(s: &Sandbox) -> StatusChanged {
        StatusChanged {
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            status: s.status,
            status_reason: s.status_reason.clone(),
            pool: s.pool.clone(),
            at: s.updated_at,
            backend_ref: s.backend_ref.clone(),
            view: Some(Box::new(SandboxState::of(s))),
            audit_head: None,
            origin: None,
            warm: s.warm_class.is_some(),
        }
    }
}

/// A sandbox as its clients see it, at one version: the fields of the API's `Sandbox`
/// object, written out here so the wire does not follow core's view type by accident.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxState {
    pub id: SandboxId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    pub pool: Option<String>,
    pub resources: WireResources,
    pub capabilities: Vec<String>,
    pub classification: String,
    pub region: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub template: Option<String>,
    pub env_keys: Vec<String>,
    pub ttl_seconds: u64,
    pub idle_timeout_seconds: Option<u64>,
    pub priority: i32,
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

impl SandboxState {
    /// The state of row `s` (its client view).
    pub fn of(s: &Sandbox) -> SandboxState {
        SandboxState::from(s.view())
    }
}

impl From<SandboxView> for SandboxState {
    fn from(v: SandboxView) -> Self {
        SandboxState {
            id: v.id,
            org_id: v.org_id,
            project_id: v.project_id,
            status: v.status,
            status_reason: v.status_reason,
            pool: v.pool,
            resources: v.resources.into(),
            capabilities: v.capabilities,
            classification: v.classification,
            region: v.region,
            labels: v.labels,
            template: v.template,
            env_keys: v.env_keys,
            ttl_seconds: v.ttl_seconds,
            idle_timeout_seconds: v.idle_timeout_seconds,
            priority: v.priority,
            attempts: v.attempts,
            created_at: v.created_at,
            started_at: v.started_at,
            expires_at: v.expires_at,
            ended_at: v.ended_at,
        }
    }
}

impl From<SandboxState> for SandboxView {
    fn from(v: SandboxState) -> Self {
        SandboxView {
            id: v.id,
            org_id: v.org_id,
            project_id: v.project_id,
            status: v.status,
            status_reason: v.status_reason,
            pool: v.pool,
            resources: v.resources.into(),
            capabilities: v.capabilities,
            classification: v.classification,
            region: v.region,
            labels: v.labels,
            template: v.template,
            env_keys: v.env_keys,
            ttl_seconds: v.ttl_seconds,
            idle_timeout_seconds: v.idle_timeout_seconds,
            priority: v.priority,
            attempts: v.attempts,
            created_at: v.created_at,
            started_at: v.started_at,
            expires_at: v.expires_at,
            ended_at: v.ended_at,
        }
    }
}
