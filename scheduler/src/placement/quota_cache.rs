//! Quotas, policies and pool slot counts as placement reads them: re-read every couple of
//! seconds (slots every tick), shared by the placements of a group.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use differently_core::policy::EffectivePolicy;
use differently_core::tenancy::Quota;
use differently_core::Sandbox;
use differently_store::{QuotaScope, StoreError};
use tokio::time::Instant;

use crate::Scheduler;

/// Stored quotas are re-read at most this often.
pub(super) const QUOTA_CACHE: Duration = Duration::from_secs(2);

/// Stored quotas and policies, re-read every couple of seconds, and pool slot use, re-read
/// every tick (activations in between are counted locally). Shared by the placements of a
/// group; a miss is fetched outside the lock (two concurrent misses fetch twice, harmlessly).
#[derive(Default)]
pub(super) struct QuotaCache(Mutex<CacheState>);

#[derive(Default)]
pub(super) struct CacheState {
    pub(super) entries: HashMap<QuotaScope, (Instant, Option<Quota>)>,
    policies:
        HashMap<(differently_core::OrgId, differently_core::ProjectId), (Instant, EffectivePolicy)>,
    pub(super) slots: Option<(Instant, HashMap<String, u32>)>,
}

impl QuotaCache {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, CacheState> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Forgets slot counts (capacity was released: they are stale).
    pub(super) fn drop_slots(&self) {
        self.state().slots = None;
    }

    pub(super) async fn policy(
        &self,
        s: &Scheduler,
        row: &Sandbox,
    ) -> Result<EffectivePolicy, StoreError> {
        let key = (row.org_id.clone(), row.project_id.clone());
        if let Some((at, p)) = self.state().policies.get(&key) {
            if at.elapsed() < QUOTA_CACHE {
                return Ok(p.clone());
            }
        }
        let p = differently_store::placement::effective_policy(
            s.store.as_ref(),
            &row.org_id,
            &row.project_id,
        )
        .await?;
        self.state()
            .policies
            .insert(key, (Instant::now(), p.clone()));
        Ok(p)
    }

    pub(super) async fn slots(&self, s: &Scheduler) -> Result<HashMap<String, u32>, StoreError> {
        if let Some((at, used)) = &self.state().slots {
            if at.elapsed() < s.config.tick {
                return Ok(used.clone());
            }
        }
        let used = s.store.pool_slots_used().await?;
        self.state().slots = Some((Instant::now(), used.clone()));
        Ok(used)
    }

    pub(super) fn take_slot(&self, pool: &str) {
        if let Some((_, used)) = &mut self.state().slots {
            *used.entry(pool.to_owned()).or_insert(0) += 1;
        }
    }

    pub(super) async fn get(
        &self,
        s: &Scheduler,
        scope: QuotaScope,
    ) -> Result<Option<Quota>, StoreError> {
        if let Some((at, q)) = self.state().entries.get(&scope) {
            if at.elapsed() < QUOTA_CACHE {
                return Ok(*q);
            }
        }
        let q = s.store.get_quota(&scope).await?;
        self.state().entries.insert(scope, (Instant::now(), q));
        Ok(q)
    }

    /// The tighter of the org's (over the defaults) and the project's `maxQueueSeconds`.
    pub(super) async fn max_queue_seconds(
        &self,
        s: &Scheduler,
        row: &Sandbox,
    ) -> Result<Option<u64>, StoreError> {
        let org = self
            .get(s, QuotaScope::Org(row.org_id.clone()))
            .await?
            .unwrap_or_default();
        let project = self
            .get(s, QuotaScope::Project(row.project_id.clone()))
            .await?
            .unwrap_or_default();
        let org_limit = org.or(&s.config.quota).max_queue_seconds;
        Ok(match (org_limit, project.max_queue_seconds) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}
