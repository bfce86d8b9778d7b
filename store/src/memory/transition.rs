//! Status changes after activation under the store's one lock.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use super::{MemoryStore, State};
use crate::prelude::*;
use crate::shared::rules;
use crate::{Quota, QuotaScope, StoreError, Transition};

#[async_trait]
impl TransitionStore for MemoryStore {
    async fn mark_running(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        let mut sbx = row.sandbox.clone();
        let entry = rules::mark_running(&mut sbx, backend_ref, now)?;
        row.sandbox = sbx.clone();
        st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
        Ok(sbx)
    }

    async fn requeue(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let now = Utc::now();
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        let mut sbx = row.sandbox.clone();
        let entry = rules::requeue(&mut sbx, reason, not_before, now)?;
        row.sandbox = sbx.clone();
        row.next_attempt_at = not_before;
        st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
        Ok(sbx)
    }

    async fn transition_within_quota(
        &self,
        t: Transition,
        defaults: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        // Check and change under one hold of the state lock (the memory store's transaction).
        let mut st = self.lock();
        let current = st.row_mut(&t.id)?.sandbox.clone();
        if t.from.contains(&current.status) {
            let org_scope = QuotaScope::Org(current.org_id.clone());
            let prj_scope = QuotaScope::Project(current.project_id.clone());
            accounting::check_change_limits(
                &current,
                t.to,
                (
                    &st.usage(&org_scope),
                    &st.stored_quota(&org_scope).or(defaults),
                ),
                (&st.usage(&prj_scope), &st.stored_quota(&prj_scope)),
            )?;
        }
        transition_in(&mut st, &t, now)
    }

    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError> {
        transition_in(&mut self.lock(), &t, now)
    }
}

/// `transition` on the locked state.
pub(super) fn transition_in(
    st: &mut State,
    t: &Transition,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let row = st.row_mut(&t.id)?;
    let mut sbx = row.sandbox.clone();
    let entry = rules::transition(&mut sbx, t, now)?;
    row.sandbox = sbx.clone();
    if t.to == SandboxStatus::Queued {
        row.next_attempt_at = now;
    }
    st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
    Ok(sbx)
}
