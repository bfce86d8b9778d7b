//! Quotas and the usage they are checked against, derived from rows.

use std::collections::HashMap;

use async_trait::async_trait;
use differently_core::{OrgId, ProjectId};

use crate::{Actor, Quota, StoreError, Usage};

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

/// Quotas and the usage they are checked against, always derived from rows (Postgres keeps
/// trigger-maintained counters and can recount them).
#[async_trait]
pub trait UsageStore: Send + Sync {
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

    /// Active CPU per organization (rows that reserve compute), for fair order.
    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError>;

    /// Recounts usage from rows and corrects the stored counters that differ (Postgres keeps
    /// counters maintained by a trigger; memory derives usage from rows and never drifts).
    /// Returns what was corrected: anything here means something bypassed the trigger.
    async fn reconcile_usage(&self) -> Result<Vec<UsageDrift>, StoreError>;
}
