//! Activation of queued sandboxes under the store's one lock.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use super::{MemoryStore, State};
use crate::prelude::*;
use crate::shared::rules;
use crate::{Activation, PoolSlot, Quota, QuotaScope, StoreError};

#[async_trait]
impl ActivationStore for MemoryStore {
    async fn activate_explained(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        explanation: Option<&serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        let out = self.activate_locked(id, pool, quota, now)?;
        if let (Activation::Activated(_), Some(doc)) = (&out, explanation) {
            crate::placement::PlacementStore::save_placement(self, id, doc).await?;
        }
        Ok(out)
    }

    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let now = Utc::now();
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        if row.sandbox.status == SandboxStatus::Queued {
            accounting::wait(&mut row.sandbox, reason.to_owned(), now);
            row.next_attempt_at = not_before;
        }
        Ok(())
    }
}

impl MemoryStore {
    /// `activate` under the one state lock (the memory store's transaction).
    fn activate_locked(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        activate_in(&mut self.lock(), id, pool, quota, now, rules::activate)
    }
}

/// An activation on the locked state; `activate` writes the row's change and its record.
pub(super) fn activate_in(
    st: &mut State,
    id: &SandboxId,
    pool: &PoolSlot,
    quota: &Quota,
    now: DateTime<Utc>,
    activate: fn(&mut Sandbox, &PoolSlot, DateTime<Utc>) -> rules::AuditEntry,
) -> Result<Activation, StoreError> {
    let sbx = st.row_mut(id)?.sandbox.clone();
    if sbx.status != SandboxStatus::Queued {
        return Ok(Activation::NotQueued(sbx));
    }
    let org_scope = QuotaScope::Org(sbx.org_id.clone());
    let prj_scope = QuotaScope::Project(sbx.project_id.clone());
    let org_usage = st.usage(&org_scope);
    let org_quota = st.stored_quota(&org_scope).or(quota);
    let prj_usage = st.usage(&prj_scope);
    let prj_quota = st.stored_quota(&prj_scope);
    let pool_used = st
        .sandboxes
        .values()
        .filter(|r| {
            r.sandbox.pool.as_deref() == Some(pool.name.as_str())
                && r.sandbox.status.holds_pool_slot()
        })
        .count();
    let pool_used = u64::try_from(pool_used).unwrap_or(u64::MAX);
    let row = st.row_mut(id)?;
    let reason = accounting::waiting_reason(
        (&org_usage, &org_quota),
        (&prj_usage, &prj_quota),
        pool_used,
        &sbx,
        pool.cap(),
    );
    if let Some((wall, reason)) = reason {
        accounting::wait(&mut row.sandbox, reason, now);
        return Ok(Activation::Waiting(row.sandbox.clone(), wall));
    }
    let entry = activate(&mut row.sandbox, pool, now);
    let out = row.sandbox.clone();
    st.audit(&out.org_id, out.id.as_str(), entry, now);
    Ok(Activation::Activated(out))
}
