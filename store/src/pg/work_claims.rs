//! Work claims in Postgres: one row per claimed call in the unlogged `work_claims` table,
//! each method one statement (no WAL flush to wait for: see the migration).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxStatus};
use sqlx::Row;

use crate::pg::rows::sweep_rows_of;
use crate::pg::PgStore;
use crate::work_claims::{held_until, ClaimKey, WorkClaimStore};
use crate::StoreError;

#[async_trait]
impl WorkClaimStore for PgStore {
    async fn claim_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<u32>, StoreError> {
        let row = sqlx::query(
            "INSERT INTO work_claims AS c (sandbox_id, status_version, owner, held_until, tries)
             VALUES ($1, $2, $3, $5, 1)
             ON CONFLICT (sandbox_id, status_version) DO UPDATE
                 SET owner = EXCLUDED.owner, held_until = EXCLUDED.held_until,
                     tries = c.tries + 1
                 WHERE c.held_until <= $4
             RETURNING tries",
        )
        .bind(activation.sandbox.as_str())
        .bind(activation.status_version)
        .bind(owner)
        .bind(now)
        .bind(held_until(now, hold))
        .fetch_optional(self.pool())
        .await?;
        match row {
            Some(r) => {
                let tries: i32 = r.try_get("tries")?;
                Ok(Some(u32::try_from(tries).unwrap_or(1)))
            }
            None => Ok(None),
        }
    }

    async fn renew_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let renewed = sqlx::query(
            "UPDATE work_claims SET held_until = $4
             WHERE sandbox_id = $1 AND status_version = $2 AND owner = $3",
        )
        .bind(activation.sandbox.as_str())
        .bind(activation.status_version)
        .bind(owner)
        .bind(held_until(now, hold))
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(renewed == 1)
    }

    async fn release_work_claim(
        &self,
        activation: &ClaimKey,
        owner: &str,
        free_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE work_claims SET owner = '', held_until = $4
             WHERE sandbox_id = $1 AND status_version = $2 AND owner = $3",
        )
        .bind(activation.sandbox.as_str())
        .bind(activation.status_version)
        .bind(owner)
        .bind(free_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn drop_work_claim(&self, activation: &ClaimKey) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM work_claims WHERE sandbox_id = $1 AND status_version = $2")
            .bind(activation.sandbox.as_str())
            .bind(activation.status_version)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn prune_work_claims(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let pruned = sqlx::query("DELETE FROM work_claims WHERE held_until < $1")
            .bind(before)
            .execute(self.pool())
            .await?
            .rows_affected();
        Ok(pruned)
    }

    async fn unclaimed_work(
        &self,
        pool: &str,
        statuses: &[SandboxStatus],
        changed_before: DateTime<Utc>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT s.id, s.doc, s.env_sealed FROM sandboxes s
             WHERE s.status = ANY($1) AND s.pool = $2 AND s.updated_at < $3
               AND NOT EXISTS (
                   SELECT 1 FROM work_claims c
                   WHERE c.sandbox_id = s.id AND c.status_version = s.status_version
                     AND c.held_until > $4)
             ORDER BY s.updated_at, s.id LIMIT $5",
        )
        .bind(statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        .bind(pool)
        .bind(changed_before)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        Ok(sweep_rows_of(&rows))
    }
}
