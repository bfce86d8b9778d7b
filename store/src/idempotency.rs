//! Idempotency-Key for creating requests whose rows do not carry one (organizations,
//! projects, keys, snapshots, pools): the first request claims the key, its answer is kept,
//! and a retry with the same key and body gets that answer instead of creating again.
//!
//! The claim and the answer are separate from the creation's own transaction, so a process
//! that dies between creating and recording leaves a pending claim; it is taken over after
//! [`PENDING_FOR`] (and the retry then creates again). Answers are kept for [`KEPT_FOR`].

use crate::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::time::Duration;

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

pub(crate) fn span(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// What an existing claim means for a new request at `now`; `None`: it no longer counts.
pub(crate) fn judge(
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
