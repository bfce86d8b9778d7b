//! Work claims in memory: the same rules as Postgres's `work_claims` table.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxStatus};

use crate::memory::MemoryStore;
use crate::work_claims::{held_until, ClaimKey, WorkClaimStore};
use crate::StoreError;

/// One claimed activation.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRow {
    /// The holder; empty once it let go.
    owner: String,
    held_until: DateTime<Utc>,
    tries: u32,
}

#[async_trait]
impl WorkClaimStore for MemoryStore {
    async fn claim_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let mut st = self.lock();
        let until = held_until(now, hold);
        match st.work_claims.get_mut(activation) {
            Some(c) if c.held_until > now => Ok(None),
            Some(c) => {
                c.owner = owner.to_owned();
                c.held_until = until;
                c.tries = c.tries.saturating_add(1);
                Ok(Some(c.tries))
            }
            None => {
                st.work_claims.insert(
                    activation.clone(),
                    ClaimRow {
                        owner: owner.to_owned(),
                        held_until: until,
                        tries: 1,
                    },
                );
                Ok(Some(1))
            }
        }
    }

    async fn renew_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock();
        match st.work_claims.get_mut(activation) {
            Some(c) if c.owner == owner => {
                c.held_until = held_until(now, hold);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        free_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        if let Some(c) = st.work_claims.get_mut(activation) {
            if c.owner == owner {
                c.owner.clear();
                c.held_until = free_at;
            }
        }
        Ok(())
    }

    async fn drop_work_claim(&self, activation: &ClaimKey) -> Result<(), StoreError> {
        self.lock().work_claims.remove(activation);
        Ok(())
    }

    async fn prune_work_claims(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let was = st.work_claims.len();
        st.work_claims.retain(|_, c| c.held_until >= before);
        Ok((was - st.work_claims.len()) as u64)
    }

    async fn unclaimed_work(
        &self,
        pool: &str,
        statuses: &[SandboxStatus],
        changed_before: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| {
                statuses.contains(&s.status)
                    && s.pool.as_deref() == Some(pool)
                    && s.updated_at < changed_before
                    && st
                        .work_claims
                        .get(&ClaimKey::of(s))
                        .is_none_or(|c| c.held_until <= now)
            })
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }
}
