//! `PlacementStore` in memory (for `differently dev` and the conformance suite).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use differently_core::policy::Policy;
use differently_core::pool::{PoolHealth, PoolRecord};
use differently_core::{OrgId, SandboxId};

use crate::memory::MemoryStore;
use crate::placement::{PlacementStore, PlacementSummary, PolicyScope};
use crate::shared::rules::AuditEntry;
use crate::shared::storable;
use crate::{Actor, StoreError};

/// Placement data of a `MemoryStore`.
#[derive(Debug, Default)]
pub(crate) struct PlacementState {
    policies: HashMap<String, Policy>,
    pools: BTreeMap<String, PoolRecord>,
    health: BTreeMap<String, PoolHealth>,
    placements: HashMap<SandboxId, serde_json::Value>,
}

impl MemoryStore {
    fn placement(&self) -> std::sync::MutexGuard<'_, PlacementState> {
        self.placement.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl PlacementStore for MemoryStore {
    async fn get_policy(&self, scope: &PolicyScope) -> Result<Option<Policy>, StoreError> {
        Ok(self.placement().policies.get(&scope.key()).cloned())
    }

    async fn put_policy(
        &self,
        scope: &PolicyScope,
        policy: &Policy,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let org = match scope {
            PolicyScope::Global => None,
            PolicyScope::Org(id) => Some(id.clone()),
            PolicyScope::Project(id) => self.project_org(id),
        };
        let old = self
            .placement()
            .policies
            .insert(scope.key(), policy.clone());
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "policy.put".to_owned(),
            detail: serde_json::json!({ "old": old, "new": policy }),
        };
        match org {
            Some(org) => self.audit_for(&org, &scope.key(), entry),
            None => self.audit_installation_for(&scope.key(), entry),
        }
        Ok(())
    }

    async fn upsert_pool(&self, pool: &PoolRecord, actor: &Actor) -> Result<(), StoreError> {
        storable::pool(pool)?;
        let doc = serde_json::to_value(pool).map_err(|e| StoreError::Internal(e.to_string()))?;
        let old = self
            .placement()
            .pools
            .insert(pool.name.clone(), pool.clone());
        let old = old.and_then(|o| serde_json::to_value(o).ok());
        if old
            .as_ref()
            .is_some_and(|o| crate::shared::documents::same_pool(o, &doc))
        {
            return Ok(());
        }
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: if old.is_some() {
                "pool.update"
            } else {
                "pool.register"
            }
            .to_owned(),
            detail: serde_json::json!({ "old": old, "new": doc }),
        };
        self.audit_installation_for(&format!("pool:{}", pool.name), entry);
        Ok(())
    }

    async fn list_pools(&self) -> Result<Vec<PoolRecord>, StoreError> {
        Ok(self.placement().pools.values().cloned().collect())
    }

    async fn delete_pool(&self, name: &str, actor: &Actor) -> Result<(), StoreError> {
        if !self.placement().pools.contains_key(name) {
            return Err(StoreError::NotFound);
        }
        let used = self.slots_used().get(name).copied().unwrap_or(0);
        if used > 0 {
            return Err(StoreError::HasDependents(format!(
                "pool {name} has {used} live sandboxes"
            )));
        }
        self.before_pool_delete(name)?;
        {
            let mut st = self.placement();
            st.pools.remove(name);
            st.health.remove(name);
        }
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "pool.delete".to_owned(),
            detail: serde_json::json!({}),
        };
        self.audit_installation_for(&format!("pool:{name}"), entry);
        Ok(())
    }

    async fn report_pool_health(&self, health: &PoolHealth) -> Result<(), StoreError> {
        self.placement()
            .health
            .insert(health.name.clone(), health.clone());
        Ok(())
    }

    async fn pool_health(&self) -> Result<Vec<PoolHealth>, StoreError> {
        Ok(self.placement().health.values().cloned().collect())
    }

    async fn pool_slots_used(&self) -> Result<HashMap<String, u32>, StoreError> {
        Ok(self.slots_used())
    }

    async fn save_placement(
        &self,
        id: &SandboxId,
        explanation: &serde_json::Value,
    ) -> Result<(), StoreError> {
        self.placement()
            .placements
            .insert(id.clone(), explanation.clone());
        Ok(())
    }

    async fn placements_on(&self, pools: &[String]) -> Result<Vec<PlacementSummary>, StoreError> {
        let mut out: BTreeMap<(OrgId, String), PlacementSummary> = BTreeMap::new();
        for (id, org, pool, at) in self.sandboxes_on(pools) {
            let explanation = self.placement().placements.get(&id).cloned();
            let e = out
                .entry((org.clone(), pool.clone()))
                .or_insert(PlacementSummary {
                    org_id: org,
                    pool,
                    sandboxes: 0,
                    first_at: at,
                    last_at: at,
                    latest_explanation: None,
                });
            e.sandboxes += 1;
            e.first_at = e.first_at.min(at);
            if at >= e.last_at {
                e.last_at = at;
                e.latest_explanation = explanation;
            }
        }
        Ok(out.into_values().collect())
    }

    async fn get_placement(&self, id: &SandboxId) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(self.placement().placements.get(id).cloned())
    }
}
