//! Work claims in Postgres: one row per claimed call in the unlogged `work_claims` table,
//! each method one statement (no WAL flush to wait for: see the migration).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use sqlx::Row;

use crate::audit::chain_suffix;
use crate::pg::rows::{sandbox_of, sweep_rows_of};
use crate::pg::transition_swap::remembered_of;
use crate::pg::PgStore;
use crate::work_claims::{held_until, ClaimKey, ClaimOutcome, WorkClaimStore};
use crate::StoreError;

/// The claim of the row in CTE `s` (columns `id`, `status_version`; no row: nothing claimed)
/// for owner `$2` until `$4`, taken over only from a claim that ran out by `$3`: the same
/// rule as `claim_work`.
macro_rules! claim_from_s {
    () => {
        "INSERT INTO work_claims AS w (sandbox_id, status_version, owner, held_until, tries)
     SELECT s.id, s.status_version, $2, $4, 1 FROM s
     ON CONFLICT (sandbox_id, status_version) DO UPDATE
         SET owner = EXCLUDED.owner, held_until = EXCLUDED.held_until, tries = w.tries + 1
         WHERE w.held_until <= $3"
    };
}

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

    async fn claim_current_work(
        &self,
        activation: &ClaimKey,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        // `s` is read in the statement's snapshot: a row at the version then can only move
        // on later, which the claim, held from now on, makes the holder's to do. The row, its
        // version (`xmin`) and its chain's head come along for the status change the holder
        // makes when the call is done (a delete's `terminated`), so that change needs no read
        // of its own (`transition_swap::RowMemo`).
        let row = sqlx::query(concat!(
            "WITH r AS (SELECT id, org_id, doc, env_sealed, status_version, xmin::text AS xmin
                        FROM sandboxes WHERE id = $1),
             s AS (SELECT id, status_version FROM r WHERE status_version = $5),
             c AS (",
            claim_from_s!(),
            " RETURNING tries)
             SELECT EXISTS (SELECT 1 FROM s) AS current, (SELECT tries FROM c) AS tries,
                    r.doc, r.env_sealed, r.xmin, h.chain_seq, h.hash
             FROM (SELECT 1) AS one
             LEFT JOIN r ON true
             LEFT JOIN audit_heads h ON h.chain = r.org_id || $6"
        ))
        .bind(activation.sandbox.as_str())
        .bind(owner)
        .bind(now)
        .bind(held_until(now, hold))
        .bind(activation.status_version)
        .bind(chain_suffix(activation.sandbox.as_str()))
        .fetch_one(self.pool())
        .await?;
        let outcome = outcome_of(&row)?;
        if let ClaimOutcome::Taken(_) = outcome {
            // Only a head start: a row that does not decode is read again by the change,
            // which reports it.
            if let Ok(seen) = remembered_of(&row) {
                self.row_memo().remember(seen);
            }
        }
        Ok(outcome)
    }

    async fn claim_create_reading(
        &self,
        id: &SandboxId,
        pool: &str,
        owner: &str,
        now: DateTime<Utc>,
        hold: Duration,
    ) -> Result<Option<(Sandbox, ClaimOutcome)>, StoreError> {
        // The row's version (`xmin`) and its chain's head come along for the change the
        // claim's holder makes next, `mark_running`, so it needs no read of its own
        // (`transition_swap::RowMemo`).
        let row = sqlx::query(concat!(
            "WITH r AS (SELECT id, org_id, doc, env_sealed, status, pool, status_version,
                               xmin::text AS xmin
                        FROM sandboxes WHERE id = $1),
             s AS (SELECT id, status_version FROM r WHERE status = $5 AND pool = $6),
             c AS (",
            claim_from_s!(),
            " RETURNING tries)
             SELECT r.id, r.doc, r.env_sealed, r.xmin, h.chain_seq, h.hash,
                    EXISTS (SELECT 1 FROM s) AS current, (SELECT tries FROM c) AS tries
             FROM r LEFT JOIN audit_heads h ON h.chain = r.org_id || $7"
        ))
        .bind(id.as_str())
        .bind(owner)
        .bind(now)
        .bind(held_until(now, hold))
        .bind(SandboxStatus::Provisioning.as_str())
        .bind(pool)
        .bind(chain_suffix(id.as_str()))
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let outcome = outcome_of(&row)?;
        if let ClaimOutcome::Taken(_) = outcome {
            let seen = remembered_of(&row)?;
            let sandbox = seen.row().clone();
            self.row_memo().remember(seen);
            return Ok(Some((sandbox, outcome)));
        }
        Ok(Some((sandbox_of(&row)?, outcome)))
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

    async fn prune_settled_work_claims(&self) -> Result<u64, StoreError> {
        let pruned = sqlx::query(
            "DELETE FROM work_claims c WHERE NOT EXISTS (
                 SELECT 1 FROM sandboxes s
                 WHERE s.id = c.sandbox_id AND s.status_version = c.status_version)",
        )
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

/// A claim statement's answer: whether the row was at the change (`current`) and the try
/// count if the claim was taken (`tries`).
fn outcome_of(row: &sqlx::postgres::PgRow) -> Result<ClaimOutcome, StoreError> {
    let current: bool = row.try_get("current")?;
    let tries: Option<i32> = row.try_get("tries")?;
    Ok(match (current, tries) {
        (false, _) => ClaimOutcome::Moved,
        (true, None) => ClaimOutcome::Held,
        (true, Some(t)) => ClaimOutcome::Taken(u32::try_from(t).unwrap_or(1)),
    })
}
