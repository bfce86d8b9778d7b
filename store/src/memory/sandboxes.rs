//! Reading sandbox rows and the sweeps' selections.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use super::MemoryStore;
use crate::prelude::*;
use crate::{SandboxBrief, SandboxFilter, StoreError};

#[async_trait]
impl SandboxReadStore for MemoryStore {
    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.lock().sandboxes.get(id).map(|r| r.sandbox.clone()))
    }

    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, SandboxBrief>, StoreError> {
        let st = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| {
                let s = &st.sandboxes.get(id)?.sandbox;
                let brief = SandboxBrief {
                    org_id: s.org_id.clone(),
                    project_id: s.project_id.clone(),
                    status: s.status,
                };
                Some((id.clone(), brief))
            })
            .collect())
    }

    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let out = st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| filter.after.as_ref().is_none_or(|a| &s.id > a))
            .filter(|s| filter.org_id.as_ref().is_none_or(|o| &s.org_id == o))
            .filter(|s| {
                filter
                    .project_id
                    .as_ref()
                    .is_none_or(|p| &s.project_id == p)
            })
            .filter(|s| filter.status.is_none_or(|st| s.status == st))
            .filter(|s| {
                filter
                    .labels
                    .iter()
                    .all(|(k, v)| s.spec.labels.get(k) == Some(v))
            })
            .take(accounting::effective_limit(filter.limit))
            .cloned()
            .collect();
        Ok(out)
    }

    async fn runnable_queued(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        Ok(st
            .sandboxes
            .values()
            .filter(|r| r.sandbox.status == SandboxStatus::Queued && r.next_attempt_at <= now)
            .take(limit as usize)
            .map(|r| r.sandbox.clone())
            .collect())
    }

    async fn stale(
        &self,
        status: SandboxStatus,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .filter(|r| r.sandbox.status == status && r.sandbox.updated_at < before)
            .map(|r| r.sandbox.clone())
            .collect();
        out.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn expired(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .filter(|r| {
                accounting::EXPIRABLE.contains(&r.sandbox.status)
                    && r.sandbox.expires_at.is_some_and(|e| e < now)
            })
            .map(|r| r.sandbox.clone())
            .collect();
        out.sort_by(|a, b| (a.expires_at, &a.id).cmp(&(b.expires_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }
}
