//! Reading sandbox rows: one, briefs of many, filtered lists, and what the sweeps select.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};

use crate::StoreError;

/// Whose a sandbox is and its status, without the rest of its row (`SandboxReadStore::sandbox_briefs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxBrief {
    /// The owning organization.
    pub org_id: OrgId,
    /// The owning project.
    pub project_id: ProjectId,
    /// The status as last committed.
    pub status: SandboxStatus,
}

/// Filter for listing sandboxes; results are in id (creation) order.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    pub org_id: Option<OrgId>,
    pub project_id: Option<ProjectId>,
    pub status: Option<SandboxStatus>,
    /// Only sandboxes carrying every one of these labels (key with that value); empty: any.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Only ids strictly greater than this (cursor pagination).
    pub after: Option<SandboxId>,
    pub limit: u32,
}

/// Reads of sandbox rows; none of them locks or writes, so any replica may call them freely.
#[async_trait]
pub trait SandboxReadStore: Send + Sync {
    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError>;

    /// The `SandboxBrief` of each of `ids` that has a row; an id without one is absent.
    /// One round trip for many ids, and no document to decode: for passes over every backend
    /// instance (the reconciler), which would otherwise read one full row per instance.
    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, SandboxBrief>, StoreError>;

    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError>;

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
}
