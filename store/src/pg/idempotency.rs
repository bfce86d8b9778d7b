//! Idempotency-Keys in Postgres: one row per claimed key.

use crate::idempotency::*;
use crate::pg::PgStore;
use crate::StoreError;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;

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
