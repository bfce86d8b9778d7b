//! Quotas and usage, derived from rows on every read (nothing to drift).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::Utc;
use differently_core::OrgId;
use serde_json::json;

use super::MemoryStore;
use crate::prelude::*;
use crate::shared::rules;
use crate::{Actor, Quota, QuotaScope, StoreError, Usage, UsageDrift};

#[async_trait]
impl UsageStore for MemoryStore {
    async fn get_quota(&self, scope: &QuotaScope) -> Result<Option<Quota>, StoreError> {
        Ok(self.lock().quotas.get(&scope.key()).copied())
    }

    async fn put_quota(
        &self,
        scope: &QuotaScope,
        quota: &Quota,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let org = st.scope_org(scope)?;
        let key = scope.key();
        let old = st.quotas.insert(key.clone(), *quota);
        let e = rules::tenancy_entry(actor, "quota.put", json!({ "old": old, "new": quota }));
        st.audit(&org, &key, e, Utc::now());
        Ok(())
    }

    async fn usage(&self, scope: &QuotaScope) -> Result<Usage, StoreError> {
        let st = self.lock();
        st.scope_org(scope)?;
        Ok(st.usage(scope))
    }

    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError> {
        let st = self.lock();
        let mut out = HashMap::new();
        for r in st.sandboxes.values() {
            if r.sandbox.status.reserves_compute() {
                *out.entry(r.sandbox.org_id.clone()).or_insert(0) +=
                    u64::from(r.sandbox.spec.resources.cpu);
            }
        }
        Ok(out)
    }

    async fn reconcile_usage(&self) -> Result<Vec<UsageDrift>, StoreError> {
        // Usage is derived from rows on every read: there is nothing to drift.
        Ok(Vec::new())
    }
}
