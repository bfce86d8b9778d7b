//! Create claims in memory: the same rules as Postgres's `create_claims` table.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxStatus};

use crate::create_claims::{held_until, ClaimKey, CreateClaimStore};
use crate::memory::MemoryStore;
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
impl CreateClaimStore for MemoryStore {
    async fn claim_create(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let mut st = self.lock();
        let until = held_until(now, hold);
        match st.create_claims.get_mut(activation) {
            Some(c) if c.held_until > now => Ok(None),
            Some(c) => {
                c.owner = owner.to_owned();
                c.held_until = until;
                c.tries = c.tries.saturating_add(1);
                Ok(Some(c.tries))
            }
            None => {
                st.create_claims.insert(
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

    async fn renew_create_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock();
        match st.create_claims.get_mut(activation) {
            Some(c) if c.owner == owner => {
                c.held_until = held_until(now, hold);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn release_create_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        free_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        if let Some(c) = st.create_claims.get_mut(activation) {
            if c.owner == owner {
                c.owner.clear();
                c.held_until = free_at;
            }
        }
        Ok(())
    }

    async fn drop_create_claim(&self, activation: &ClaimKey) -> Result<(), StoreError> {
        self.lock().create_claims.remove(activation);
        Ok(())
    }

    async fn prune_create_claims(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let was = st.create_claims.len();
        st.create_claims.retain(|_, c| c.held_until >= before);
        Ok((was - st.create_claims.len()) as u64)
    }

    async fn unclaimed_creates(
        &self,
        pool: &str,
        activated_before: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| {
                s.status == SandboxStatus::Provisioning
                    && s.pool.as_deref() == Some(pool)
                    && s.updated_at < activated_before
                    && st
                        .create_claims
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
