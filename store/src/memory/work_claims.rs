//! Work claims in memory: the same rules as Postgres's `work_claims` table.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use crate::memory::{MemoryStore, State};
use crate::work_claims::{held_until, ClaimKey, ClaimOutcome, WorkClaimStore};
use crate::StoreError;

/// One claimed activation.
#[derive(Debug, Clone)]
pub(crate) struct ClaimRow {
    /// The holder; empty once it let go.
    owner: String,
    held_until: DateTime<Utc>,
    tries: u32,
}

/// `claim_work`'s rule on the locked state: `Some(tries)` taken, `None` held.
fn claim_in(
    st: &mut State,
    activation: &ClaimKey,
    owner: &str,
    now: DateTime<Utc>,
    hold: Duration,
) -> Option<u32> {
    let until = held_until(now, hold);
    match st.work_claims.get_mut(activation) {
        Some(c) if c.held_until > now => None,
        Some(c) => {
            c.owner = owner.to_owned();
            c.held_until = until;
            c.tries = c.tries.saturating_add(1);
            Some(c.tries)
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
            Some(1)
        }
    }
}

/// A claim's answer as `claim_current_work` gives it.
fn outcome(taken: Option<u32>) -> ClaimOutcome {
    taken.map_or(ClaimOutcome::Held, ClaimOutcome::Taken)
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
        Ok(claim_in(&mut self.lock(), activation, owner, now, hold))
    }

    async fn claim_current_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut st = self.lock();
        let current = st
            .sandboxes
            .get(&activation.sandbox)
            .is_some_and(|r| r.sandbox.status_version == activation.status_version);
        if !current {
            return Ok(ClaimOutcome::Moved);
        }
        Ok(outcome(claim_in(&mut st, activation, owner, now, hold)))
    }

    async fn claim_create_reading(
        &self,
        id: &SandboxId,
        pool: &str,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<(Sandbox, ClaimOutcome)>, StoreError> {
        let mut st = self.lock();
        let Some(row) = st.sandboxes.get(id).map(|r| r.sandbox.clone()) else {
            return Ok(None);
        };
        if row.status != SandboxStatus::Provisioning || row.pool.as_deref() != Some(pool) {
            return Ok(Some((row, ClaimOutcome::Moved)));
        }
        let taken = claim_in(&mut st, &ClaimKey::of(&row), owner, now, hold);
        Ok(Some((row, outcome(taken))))
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

    async fn prune_settled_work_claims(&self) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let State {
            work_claims,
            sandboxes,
            ..
        } = &mut *st;
        let was = work_claims.len();
        work_claims.retain(|k, _| {
            sandboxes
                .get(&k.sandbox)
                .is_some_and(|r| r.sandbox.status_version == k.status_version)
        });
        Ok((was - work_claims.len()) as u64)
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
