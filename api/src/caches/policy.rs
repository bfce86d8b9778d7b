//! The effective placement policy of each (org, project), kept for `auth::cache::TTL`, for the
//! fail-fast check every create makes before it is admitted (`placement::explain` without live
//! slot counts): one database read fewer on the create path.
//!
//! Only that check uses it. The placement leader decides with its own view and re-checks
//! everything when it activates, and the dry-run and placement routes read the store. A
//! policy written through this process clears the cache at once; written through another API
//! process, it reaches this one's fail-fast check within the TTL (like a revoked key).

use differently_core::policy::EffectivePolicy;
use differently_core::{OrgId, ProjectId};
use differently_store::placement::PlacementStore;
use differently_store::StoreError;

use crate::auth::cache::Map;

/// Effective policies by (org, project).
pub struct PolicyCache(Map<(OrgId, ProjectId), EffectivePolicy>);

impl Default for PolicyCache {
    fn default() -> Self {
        PolicyCache(Map::new())
    }
}

impl PolicyCache {
    /// The effective policy of `org`/`project`, from the cache when read less than the TTL
    /// ago, else from `store` (and kept).
    pub async fn effective(
        &self,
        store: &dyn PlacementStore,
        org: &OrgId,
        project: &ProjectId,
    ) -> Result<EffectivePolicy, StoreError> {
        let key = (org.clone(), project.clone());
        if let Some(p) = self.0.get(&key) {
            return Ok(p);
        }
        let p = differently_store::placement::effective_policy(store, org, project).await?;
        self.0.put(key, p.clone());
        Ok(p)
    }

    /// Forgets every policy (one was written here): the next check reads the store.
    pub fn clear(&self) {
        self.0.clear();
    }
}
