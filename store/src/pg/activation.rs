//! Activation of queued sandboxes (groups of them: `activation_group`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{SandboxId, SandboxStatus};

use super::locks::lock_sandbox;
use super::writes::write_sandbox;
use super::PgStore;
use crate::prelude::*;
use crate::{Activation, PoolSlot, Quota, StoreError};

#[async_trait]
impl ActivationStore for PgStore {
    async fn activate_explained(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        explanation: Option<&serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        // One activation is a group of one: a single implementation of the rules and locks.
        let item = crate::ActivationItem {
            id: id.clone(),
            pool: pool.clone(),
            explanation: explanation.cloned(),
        };
        super::activation_group::activate_many(self, std::slice::from_ref(&item), quota, now)
            .await?
            .pop()
            .ok_or_else(|| StoreError::Internal("activation of one returned nothing".into()))
    }

    async fn activate_many(
        &self,
        items: &[crate::ActivationItem],
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Vec<Activation>, StoreError> {
        super::activation_group::activate_many(self, items, quota, now).await
    }

    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let now = Utc::now();
        let mut tx = self.begin().await?;
        let mut s = lock_sandbox(&mut tx, id).await?;
        if s.status == SandboxStatus::Queued {
            accounting::wait(&mut s, reason.to_owned(), now);
            write_sandbox(&mut tx, &s, Some(not_before)).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
