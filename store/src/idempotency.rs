//! Idempotency-Key for creating requests whose rows do not carry one (organizations,
//! projects, keys, snapshots, pools): the first request claims the key, its answer is kept,
//! and a retry with the same key and body gets that answer instead of creating again.
//!
//! The claim and the answer are separate from the creation's own transaction, so a process
//! that dies between creating and recording leaves a pending claim; it is taken over after
//! [`PENDING_FOR`] (and the retry then creates again). Answers are kept for [`KEPT_FOR`].

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;

use crate::memory::MemoryStore;
use crate::postgres::PgStore;
use crate::StoreError;

/// How long a claim whose request never answered blocks retries (they get `InFlight`).
pub const PENDING_FOR: Duration = Duration::from_secs(60);
/// How long an answer is replayed; after that the key may be used afresh.
pub const KEPT_FOR: Duration = Duration::from_secs(24 * 3600);

/// Whose key, on which route.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdemKey {
    /// The API key that sent the request (`key_…`).
    pub owner: String,
    /// Method and route template, e.g. `POST /v1/keys`.
    pub route: String,
    /// The `Idempotency-Key` header.
    pub key: String,
}

/// What a request finds under its key.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Nobody has it (or its holder's time ran out): this request goes ahead.
    Fresh,
    /// A request with the same body finished: its answer.
    Replay { status: u16, body: Value },
    /// The key was used with another body.
    Mismatch,
    /// A request with this key is still running.
    InFlight,
}

/// A claimed key as the memory store keeps it.
#[derive(Debug, Clone)]
pub(crate) struct IdemRow {
    request_hash: String,
    answer: Option<(u16, Value)>,
    claimed_at: DateTime<Utc>,
}

/// Claims, answers and releases Idempotency-Keys.
#[async_trait]
pub trait IdempotencyStore {
    /// Claims `k` for a request whose body hashes to `request_hash`, at `now`.
    async fn claim_idempotency(
        &self,
        k: &IdemKey,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Claim, StoreError>;

    /// Records the answer of the request that claimed `k`.
    async fn finish_idempotency(
        &self,
        k: &IdemKey,
        status: u16,
        body: &Value,
    ) -> Result<(), StoreError>;

    /// Gives `k` up (the request failed): a retry may go ahead at once.
    async fn release_idempotency(&self, k: &IdemKey) -> Result<(), StoreError>;

    /// Forgets keys claimed before `before` (older than [`KEPT_FOR`] when the leader's sweep
    /// calls it); answers how many.
    async fn prune_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

fn span(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// What an existing claim means for a new request at `now`; `None`: it no longer counts.
fn judge(
    request_hash: &str,
    held_hash: &str,
    answer: Option<(u16, Value)>,
    claimed_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Option<Claim> {
    let age = now - claimed_at;
    match answer {
        Some(_) if age >= span(KEPT_FOR) => None,
        None if age >= span(PENDING_FOR) => None,
        _ if held_hash != request_hash => Some(Claim::Mismatch),
        Some((status, body)) => Some(Claim::Replay { status, body }),
        None => Some(Claim::InFlight),
    }
}

#[async_trait]
impl IdempotencyStore for PgStore {
    async fn claim_idempotency(
        &self,
        k: &IdemKey,
        request_hash: &str,
        now: DateTime<Utc>,
    ) -> Result<Claim, StoreError> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (owner, route, key, request_hash, state, claimed_at)
             VALUES ($1, $2, $3, $4, 'pending', $5)
             ON CONFLICT (owner, route, key) DO NOTHING",
        )
        .bind(&k.owner)
        .bind(&k.route)
        .bind(&k.key)
        .bind(request_hash)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 1 {
            tx.commit().await?;
            return Ok(Claim::Fresh);
        }
        let row = sqlx::query(
            "SELECT request_hash, status, body, claimed_at FROM idempotency_keys
             WHERE owner = $1 AND route = $2 AND key = $3 FOR UPDATE",
        )
        .bind(&k.owner)
        .bind(&k.route)
        .bind(&k.key)
        .fetch_one(&mut *tx)
        .await?;
        let status: Option<i16> = row.try_get("status")?;
        let body: Option<Value> = row.try_get("body")?;
        let answer = match (status, body) {
            (Some(s), Some(b)) => Some((u16::try_from(s).unwrap_or(200), b)),
            _ => None,
        };
        let held: String = row.try_get("request_hash")?;
        let claimed_at: DateTime<Utc> = row.try_get("claimed_at")?;
        let claim = match judge(request_hash, &held, answer, claimed_at, now) {
            Some(c) => c,
            None => {
                sqlx::query(
                    "UPDATE idempotency_keys SET request_hash = $4, state = 'pending',
                         status = NULL, body = NULL, claimed_at = $5
                     WHERE owner = $1 AND route = $2 AND key = $3",
                )
                .bind(&k.owner)
                .bind(&k.route)
                .bind(&k.key)
                .bind(request_hash)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                Claim::Fresh
            }
        };
        tx.commit().await?;
        Ok(claim)
    }

    async fn finish_idempotency(
        &self,
        k: &IdemKey,
        status: u16,
        body: &Value,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE idempotency_keys SET state = 'done', status = $4, body = $5
             WHERE owner = $1 AND route = $2 AND key = $3",
        )
        .bind(&k.owner)
        .bind(&k.route)
        .bind(&k.key)
        .bind(i16::try_from(status).unwrap_or(i16::MAX))
        .bind(body)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn release_idempotency(&self, k: &IdemKey) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM idempotency_keys
             WHERE owner = $1 AND route = $2 AND key = $3 AND state = 'pending'",
        )
        .bind(&k.owner)
        .bind(&k.route)
        .bind(&k.key)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn prune_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        Ok(
            sqlx::query("DELETE FROM idempotency_keys WHERE claimed_at < $1")
                .bind(before)
                .execute(self.pool())
                .await?
                .rows_affected(),
        )
    }
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
