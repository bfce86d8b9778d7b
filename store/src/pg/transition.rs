//! Status changes after activation: running, requeued, any other legal change.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{OrgId, Sandbox, SandboxId, SandboxStatus};
use sqlx::{Postgres, Transaction};

use super::audit_records::insert_audit;
use super::limits::read_limits;
use super::locks::{lock_org_capacity, lock_sandbox};
use super::writes::write_sandbox;
use super::PgStore;
use crate::prelude::*;
use crate::shared::rules;
use crate::{Quota, QuotaScope, SeenRow, StoreError, Transition};

#[async_trait]
impl TransitionStore for PgStore {
    async fn mark_running(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let change = super::transition_lane::Change::Running {
            backend_ref: backend_ref.to_owned(),
        };
        super::transition_lane::submit(self, id, change, None, now).await
    }

    async fn requeue(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let now = Utc::now();
        let mut tx = self.begin().await?;
        let mut s = lock_sandbox(&mut tx, id).await?;
        let entry = rules::requeue(&mut s, reason, not_before, now)?;
        write_sandbox(&mut tx, &s, Some(not_before)).await?;
        insert_audit(&mut tx, &s, entry, now).await?;
        tx.commit().await?;
        Ok(s)
    }

    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError> {
        if t.to == SandboxStatus::Queued {
            let mut tx = self.begin().await?;
            let s = lock_sandbox(&mut tx, &t.id).await?;
            return apply_transition(tx, s, &t, now).await;
        }
        let id = t.id.clone();
        super::transition_lane::submit(self, &id, super::transition_lane::Change::To(t), None, now)
            .await
    }

    async fn transition_seen(
        &self,
        t: Transition,
        seen: SeenRow,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        if t.to == SandboxStatus::Queued {
            return self.transition(t, now).await;
        }
        let id = t.id.clone();
        let change = super::transition_lane::Change::To(t);
        super::transition_lane::submit(self, &id, change, Some(seen), now).await
    }

    async fn transition_within_quota(
        &self,
        t: Transition,
        defaults: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let mut tx = self.begin().await?;
        // As in `activate`: the org never changes, so read it unlocked and lock in order.
        let org: String = sqlx::query_scalar("SELECT org_id FROM sandboxes WHERE id = $1")
            .bind(t.id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let org = OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))?;
        lock_org_capacity(&mut tx, &org).await?;
        let s = lock_sandbox(&mut tx, &t.id).await?;
        if t.from.contains(&s.status) {
            let org_scope = QuotaScope::Org(org.clone());
            let prj_scope = QuotaScope::Project(s.project_id.clone());
            let limits = read_limits(&mut tx, &s.project_id, &org_scope, &prj_scope).await?;
            accounting::check_change_limits(
                &s,
                t.to,
                (
                    &limits.org_usage,
                    &limits.org_quota.unwrap_or_default().or(defaults),
                ),
                (&limits.prj_usage, &limits.prj_quota.unwrap_or_default()),
            )?;
        }
        apply_transition(tx, s, &t, now).await
    }
}

/// Applies `t` to the locked row `s`, writes it and its audit record, and commits.
async fn apply_transition(
    mut tx: Transaction<'static, Postgres>,
    mut s: Sandbox,
    t: &Transition,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let entry = rules::transition(&mut s, t, now)?;
    let next = (t.to == SandboxStatus::Queued).then_some(now);
    write_sandbox(&mut tx, &s, next).await?;
    insert_audit(&mut tx, &s, entry, now).await?;
    tx.commit().await?;
    Ok(s)
}
