//! Idempotency-Keys in memory.

use crate::idempotency::*;
use crate::memory::MemoryStore;
use crate::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

/// A claimed key as the memory store keeps it.
#[derive(Debug, Clone)]
pub(crate) struct IdemRow {
    request_hash: String,
    answer: Option<(u16, Value)>,
    claimed_at: DateTime<Utc>,
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim_idempotency(
        &self,
        k: &IdemKey,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Claim, StoreError> {
        let mut st = self.lock();
        if let Some(row) = st.idempotency.get(k) {
            let held = judge(
                request_hash,
                &row.request_hash,
                row.answer.clone(),
                row.claimed_at,
                now,
            );
            if let Some(claim) = held {
                return Ok(claim);
            }
        }
        st.idempotency.insert(
            k.clone(),
            IdemRow {
                request_hash: request_hash.to_owned(),
                answer: None,
                claimed_at: now,
            },
        );
        Ok(Claim::Fresh)
    }

    async fn finish_idempotency(
        &self,
        k: &IdemKey,
        status: u16,
        body: &Value,
    ) -> Result<(), StoreError> {
        if let Some(row) = self.lock().idempotency.get_mut(k) {
            row.answer = Some((status, body.clone()));
        }
        Ok(())
    }

    async fn release_idempotency(&self, k: &IdemKey) -> Result<(), StoreError> {
        let mut st = self.lock();
        if st.idempotency.get(k).is_some_and(|r| r.answer.is_none()) {
            st.idempotency.remove(k);
        }
        Ok(())
    }

    async fn prune_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let n = st.idempotency.len();
        st.idempotency.retain(|_, r| r.claimed_at >= before);
        Ok(u64::try_from(n - st.idempotency.len()).unwrap_or(u64::MAX))
    }
}
