//! What placement keeps in the store: policies per level, the pool registry, the fleet-wide
//! pool health view, and each sandbox's placement explanation.

use std::collections::HashMap;

use async_trait::async_trait;
use differently_core::policy::Policy;
use differently_core::pool::{PoolHealth, PoolRecord};
use differently_core::{OrgId, ProjectId, SandboxId};

use crate::{Actor, StoreError};

/// Which level a policy applies at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PolicyScope {
    Global,
    Org(OrgId),
    Project(ProjectId),
}

impl PolicyScope {
    /// The stored key, e.g. `org:org_01…`.
    pub fn key(&self) -> String {
        match self {
            PolicyScope::Global => "global".to_owned(),
            PolicyScope::Org(id) => format!("org:{id}"),
            PolicyScope::Project(id) => format!("project:{id}"),
        }
    }
}

/// Store operations of placement.
#[async_trait]
pub trait PlacementStore: Send + Sync {
    /// The stored policy of one level (`None`: nothing set there).
    async fn get_policy(&self, scope: &PolicyScope) -> Result<Option<Policy>, StoreError>;

    /// The stored policies of several levels, in the order asked (one read on Postgres:
    /// every create reads all three levels).
    async fn get_policies(
        &self,
        scopes: &[PolicyScope],
    ) -> Result<Vec<Option<Policy>>, StoreError> {
        let mut out = Vec::with_capacity(scopes.len());
        for scope in scopes {
            out.push(self.get_policy(scope).await?);
        }
        Ok(out)
    }
    /// Replaces one level's policy; audited in the org's chain (the installation chain for
    /// the global level).
    async fn put_policy(
        &self,
        scope: &PolicyScope,
        policy: &Policy,
        actor: &Actor,
    ) -> Result<(), StoreError>;

    /// Inserts or replaces a pool definition; audited in the installation chain.
    async fn upsert_pool(&self, pool: &PoolRecord, actor: &Actor) -> Result<(), StoreError>;
    /// Every registered pool, by name.
    async fn list_pools(&self) -> Result<Vec<PoolRecord>, StoreError>;
    /// Removes a pool; `HasDependents` while sandboxes hold slots on it or it has warm
    /// instances (their deletes need its adapter: empty its warm classes first). Its warm
    /// classes document goes with it. Audited.
    async fn delete_pool(&self, name: &str, actor: &Actor) -> Result<(), StoreError>;
    /// Records a worker's health probe of a pool (last one wins).
    async fn report_pool_health(&self, health: &PoolHealth) -> Result<(), StoreError>;
    /// The latest probe of every pool.
    async fn pool_health(&self) -> Result<Vec<PoolHealth>, StoreError>;
    /// Slots in use per pool (rows that hold a pool slot).
    async fn pool_slots_used(&self) -> Result<HashMap<String, u32>, StoreError>;

    /// Stores why a sandbox was placed where it was (or why it waits).
    async fn save_placement(
        &self,
        id: &SandboxId,
        explanation: &serde_json::Value,
    ) -> Result<(), StoreError>;
    /// The stored explanation.
    async fn get_placement(&self, id: &SandboxId) -> Result<Option<serde_json::Value>, StoreError>;

    /// Which organizations had sandboxes placed on `pools`: per org and pool, how many,
    /// first and last creation time, and the latest stored explanation.
    async fn placements_on(&self, pools: &[String]) -> Result<Vec<PlacementSummary>, StoreError>;
}

/// One organization's use of one pool, for the trust report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSummary {
    pub org_id: OrgId,
    pub pool: String,
    pub sandboxes: u64,
    pub first_at: chrono::DateTime<chrono::Utc>,
    pub last_at: chrono::DateTime<chrono::Utc>,
    /// The explanation (with the effective policy) of the latest of them, if stored.
    pub latest_explanation: Option<serde_json::Value>,
}

/// The effective policy for a sandbox of `project` in `org`: the intersection of the three
/// stored levels (an absent level restricts nothing, except external placement, which
/// fails closed).
pub async fn effective_policy(
    store: &dyn PlacementStore,
    org: &OrgId,
    project: &ProjectId,
) -> Result<differently_core::policy::EffectivePolicy, StoreError> {
    let mut levels = store
        .get_policies(&[
            PolicyScope::Global,
            PolicyScope::Org(org.clone()),
            PolicyScope::Project(project.clone()),
        ])
        .await?
        .into_iter()
        .map(Option::unwrap_or_default);
    let mut next = || levels.next().unwrap_or_default();
    let (global, org, project) = (next(), next(), next());
    Ok(differently_core::policy::EffectivePolicy::intersect(
        &global, &org, &project,
    ))
}
