//! `WarmStore` on Postgres (tables `warm_classes` and `warm_instances`, migration 0015), and
//! the claim that admission makes inside its own transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::warm::WarmClasses;
use differently_core::SandboxId;
use sqlx::types::Json;
use sqlx::{Postgres, Row, Transaction};

use crate::pg::audit_records::insert_audit_installation;
use crate::pg::PgStore;
use crate::shared::rules::AuditEntry;
use crate::warm::{
    claim_minute, merge_counts, WarmClaims, WarmCount, WarmInstance, WarmState, WarmStore,
    CLAIM_COUNTS_KEPT,
};
use crate::{Actor, DirectPlacement, StoreError};

fn decode_classes(v: serde_json::Value) -> Result<WarmClasses, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::Internal(format!("stored warm classes: {e}")))
}

fn sandbox_id(s: &str) -> Result<SandboxId, StoreError> {
    SandboxId::parse(s).map_err(|e| StoreError::Internal(format!("stored warm id {s:?}: {e}")))
}

fn instance_of(row: &sqlx::postgres::PgRow) -> Result<WarmInstance, StoreError> {
    let state: String = row.try_get("state")?;
    let attempts: i32 = row.try_get("attempts")?;
    Ok(WarmInstance {
        id: sandbox_id(row.try_get("id")?)?,
        pool: row.try_get("pool")?,
        class: row.try_get("class")?,
        state: WarmState::parse(&state)
            .ok_or_else(|| StoreError::Internal(format!("stored warm state {state:?}")))?,
        backend_ref: row.try_get("backend_ref")?,
        created_at: row.try_get("created_at")?,
        ready_at: row.try_get("ready_at")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
    })
}

#[async_trait]
impl WarmStore for PgStore {
    async fn warm_classes(&self, pool: &str) -> Result<WarmClasses, StoreError> {
        let doc: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT classes FROM warm_classes WHERE pool = $1")
                .bind(pool)
                .fetch_optional(self.pool())
                .await?;
        doc.map(decode_classes)
            .transpose()
            .map(Option::unwrap_or_default)
    }

    async fn set_warm_classes(
        &self,
        pool: &str,
        classes: &WarmClasses,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        classes.validate().map_err(StoreError::InvalidValue)?;
        let doc = serde_json::to_value(classes).map_err(|e| StoreError::Internal(e.to_string()))?;
        let mut tx = self.pool().begin().await?;
        // Shared: the pool cannot be deleted meanwhile, and registrations are not excluded.
        let registered: Option<String> = sqlx::query_scalar(
            "SELECT name FROM pools WHERE name = $1 AND doc IS NOT NULL FOR SHARE",
        )
        .bind(pool)
        .fetch_optional(&mut *tx)
        .await?;
        if registered.is_none() {
            return Err(StoreError::NotFound);
        }
        let old: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT classes FROM warm_classes WHERE pool = $1 FOR UPDATE")
                .bind(pool)
                .fetch_optional(&mut *tx)
                .await?;
        // Compared decoded: jsonb keeps its own key order and number forms.
        if let Some(old) = &old {
            if decode_classes(old.clone()).ok().as_ref() == Some(classes) {
                return Ok(());
            }
        }
        let now = Utc::now();
        sqlx::query(
            "INSERT INTO warm_classes (pool, classes, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (pool) DO UPDATE
                 SET classes = EXCLUDED.classes, updated_at = EXCLUDED.updated_at",
        )
        .bind(pool)
        .bind(Json(&doc))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "pool.warm.set".to_owned(),
            detail: serde_json::json!({ "old": old, "new": doc }),
        };
        insert_audit_installation(&mut tx, &format!("pool:{pool}"), entry, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn all_warm_classes(&self) -> Result<Vec<(String, WarmClasses)>, StoreError> {
        let rows = sqlx::query("SELECT pool, classes FROM warm_classes ORDER BY pool")
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("pool")?, decode_classes(r.try_get("classes")?)?)))
            .collect()
    }

    async fn warm_counts(&self, pool: &str) -> Result<Vec<WarmCount>, StoreError> {
        let classes = self.warm_classes(pool).await?;
        let rows = sqlx::query(
            "SELECT class, state, count(*) AS n FROM warm_instances WHERE pool = $1
             GROUP BY class, state",
        )
        .bind(pool)
        .fetch_all(self.pool())
        .await?;
        let mut counts = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.try_get("state")?;
            let n: i64 = r.try_get("n")?;
            let Some(state) = WarmState::parse(&state) else {
                return Err(StoreError::Internal(format!("stored warm state {state:?}")));
            };
            counts.push((
                r.try_get::<String, _>("class")?,
                state,
                u32::try_from(n).unwrap_or(u32::MAX),
            ));
        }
        Ok(merge_counts(&classes, counts))
    }

    async fn warm_begin(
        &self,
        pool: &str,
        class: &str,
        id: &SandboxId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let begun = sqlx::query(
            "INSERT INTO warm_instances AS w (id, pool, class, state, created_at, attempts)
             VALUES ($1, $2, $3, 'creating', $4, 1)
             ON CONFLICT (id) DO UPDATE SET attempts = w.attempts + 1
                 WHERE w.state = 'creating' AND w.pool = EXCLUDED.pool
                   AND w.class = EXCLUDED.class
             RETURNING id",
        )
        .bind(id.as_str())
        .bind(pool)
        .bind(class)
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        match begun {
            Some(_) => Ok(()),
            None => Err(StoreError::AlreadyExists(format!("warm instance {id}"))),
        }
    }

    async fn warm_ready(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // The CTE and the second test read the same snapshot: a creating row is made ready,
        // an already ready one (a redelivered create) answers true as well.
        let ready: bool = sqlx::query_scalar(
            "WITH made AS (
                 UPDATE warm_instances SET state = 'ready', backend_ref = $2, ready_at = $3
                 WHERE id = $1 AND state = 'creating'
                 RETURNING id)
             SELECT EXISTS (SELECT 1 FROM made)
                 OR EXISTS (SELECT 1 FROM warm_instances WHERE id = $1 AND state = 'ready')",
        )
        .bind(id.as_str())
        .bind(backend_ref)
        .bind(now)
        .fetch_one(self.pool())
        .await?;
        Ok(ready)
    }

    async fn warm_retire(&self, ids: &[SandboxId]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<&str> = ids.iter().map(SandboxId::as_str).collect();
        let done = sqlx::query("UPDATE warm_instances SET state = 'retiring' WHERE id = ANY($1)")
            .bind(&ids)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }

    async fn warm_gone(&self, id: &SandboxId) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM warm_instances WHERE id = $1")
            .bind(id.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn warm_failed(&self, id: &SandboxId) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM warm_instances WHERE id = $1 AND state = 'creating'")
            .bind(id.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn warm_count_claims(
        &self,
        counts: &[WarmClaims],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let minute = claim_minute(at);
        let mut tx = self.pool().begin().await?;
        if !counts.is_empty() {
            let to_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            sqlx::query(
                "INSERT INTO warm_claim_counts AS w (pool, class, minute, hits, misses)
                 SELECT p, c, $3, h, m FROM UNNEST($1::text[], $2::text[], $4::bigint[],
                     $5::bigint[]) AS k(p, c, h, m)
                 ON CONFLICT (pool, class, minute) DO UPDATE
                     SET hits = w.hits + EXCLUDED.hits, misses = w.misses + EXCLUDED.misses",
            )
            .bind(counts.iter().map(|c| c.pool.as_str()).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| c.class.as_str()).collect::<Vec<_>>())
            .bind(minute)
            .bind(counts.iter().map(|c| to_i64(c.hits)).collect::<Vec<_>>())
            .bind(counts.iter().map(|c| to_i64(c.misses)).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM warm_claim_counts WHERE minute < $1")
            .bind(minute - CLAIM_COUNTS_KEPT)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn warm_claims_since(
        &self,
        pool: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<WarmClaims>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT class, sum(hits)::bigint, sum(misses)::bigint FROM warm_claim_counts
             WHERE pool = $1 AND minute >= $2 GROUP BY class ORDER BY class",
        )
        .bind(pool)
        .bind(claim_minute(since))
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(class, hits, misses)| WarmClaims {
                pool: pool.to_owned(),
                class,
                hits: u64::try_from(hits).unwrap_or(0),
                misses: u64::try_from(misses).unwrap_or(0),
            })
            .collect())
    }

    async fn warm_instances(&self, pool: &str) -> Result<Vec<WarmInstance>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, pool, class, state, backend_ref, created_at, ready_at, attempts
             FROM warm_instances WHERE pool = $1 ORDER BY id",
        )
        .bind(pool)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(instance_of).collect()
    }
}

/// Claims a ready instance for a direct placement that names a warm class, in the admission's
/// transaction `tx`: the oldest ready instance of (pool, class) that no concurrent claim is
/// taking (they skip each other's row instead of waiting for it, so N claims of M < N
/// instances take M distinct ones and the rest find none). Its row is deleted; answers its
/// id and backend ref. `None`: no class, or no instance ready.
pub(crate) async fn claim(
    tx: &mut Transaction<'static, Postgres>,
    direct: &DirectPlacement,
) -> Result<Option<(SandboxId, String)>, StoreError> {
    let Some(class) = direct.warm_class.as_deref() else {
        return Ok(None);
    };
    let row = sqlx::query(
        "DELETE FROM warm_instances WHERE id = (
             SELECT id FROM warm_instances
             WHERE pool = $1 AND class = $2 AND state = 'ready' AND backend_ref IS NOT NULL
             ORDER BY ready_at, id
             LIMIT 1
             FOR UPDATE SKIP LOCKED)
         RETURNING id, backend_ref",
    )
    .bind(&direct.pool.name)
    .bind(class)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let backend_ref: Option<String> = row.try_get("backend_ref")?;
    let backend_ref = backend_ref
        .ok_or_else(|| StoreError::Internal("claimed a warm instance without ref".into()))?;
    Ok(Some((sandbox_id(row.try_get("id")?)?, backend_ref)))
}

/// Most queued rows read to tell whether anyone may be waiting for a capped pool; when there
/// are more, the pool counts as waited for (the claim queues, as the leader would order it).
const WAITERS_SCAN: i64 = 1000;

/// A capped pool as a claim-only direct placement sees it in the admission transaction.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CappedPool {
    /// Slots held by live sandboxes (the pool counter the leader's activation reads).
    pub(crate) used: u64,
    /// A queued sandbox of some organization may be waiting for its capacity
    /// (`differently_core::wait_reason::may_want`).
    pub(crate) waited: bool,
}

/// Locks `pools` (capped, named by the transaction's claim-only placements) in name order,
/// after the organization as every writer does, and reads their live slots and whether any
/// queued sandbox may be waiting for them. Under the pool's lock no activation nor other
/// claim can take a slot until this transaction ends.
pub(crate) async fn capped_pools(
    tx: &mut Transaction<'static, Postgres>,
    pools: &[&str],
) -> Result<std::collections::HashMap<String, CappedPool>, StoreError> {
    let mut out = std::collections::HashMap::new();
    if pools.is_empty() {
        return Ok(out);
    }
    let mut names: Vec<&str> = pools.to_vec();
    names.sort_unstable();
    names.dedup();
    for name in &names {
        crate::pg::locks::lock_pool(tx, name).await?;
    }
    let keys: Vec<String> = names
        .iter()
        .map(|p| crate::pg::usage_counters::pool_key(p))
        .collect();
    let slots: Vec<(String, i64)> =
        sqlx::query_as("SELECT scope, slots FROM usage_counters WHERE scope = ANY($1::text[])")
            .bind(&keys)
            .fetch_all(&mut **tx)
            .await?;
    // Unlocked read: a row queued meanwhile was admitted after this claim decided.
    let reasons: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT doc->>'statusReason' FROM sandboxes WHERE status = 'queued' LIMIT $1",
    )
    .bind(WAITERS_SCAN)
    .fetch_all(&mut **tx)
    .await?;
    let too_many = reasons.len() as i64 >= WAITERS_SCAN;
    for (name, key) in names.iter().zip(&keys) {
        let used = slots
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0, |(_, n)| u64::try_from(*n).unwrap_or(0));
        let waited = too_many
            || reasons
                .iter()
                .any(|r| differently_core::wait_reason::may_want(r.as_deref(), name));
        out.insert((*name).to_owned(), CappedPool { used, waited });
    }
    Ok(out)
}

/// In `delete_pool`'s transaction (the pool row locked): refuses while the pool has warm
/// instances (their backend deletes need the pool's adapter, which goes with the pool:
/// empty its classes first, and the refill leader retires them), and removes its classes
/// document, so the name registered again starts with none.
pub(crate) async fn before_pool_delete(
    tx: &mut Transaction<'static, Postgres>,
    pool: &str,
) -> Result<(), StoreError> {
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM warm_instances WHERE pool = $1")
        .bind(pool)
        .fetch_one(&mut **tx)
        .await?;
    if rows > 0 {
        return Err(StoreError::HasDependents(format!(
            "pool {pool} has {rows} warm instances; empty its warm classes and wait for them to be deleted"
        )));
    }
    sqlx::query("DELETE FROM warm_classes WHERE pool = $1")
        .bind(pool)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
