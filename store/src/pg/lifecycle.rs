//! `LifecycleStore` on Postgres (tables from `migrations/0003_snapshots.sql`). Each record is
//! a JSONB document with the columns needed for locking and filtering promoted next to it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::Row;

use crate::lifecycle::{
    LifecycleStore, OpBegun, OpError, OpRecord, OpState, SnapshotRecord, ON_BACKEND,
};
use crate::pg::env_at_rest;
use crate::pg::rows::{sandbox_of, sweep_rows_of};
use crate::pg::PgStore;
use crate::shared::storable;
use crate::StoreError;

fn op_of(row: &sqlx::postgres::PgRow) -> Result<OpRecord, StoreError> {
    let Json(op): Json<OpRecord> = row.try_get("doc")?;
    Ok(op)
}

fn snapshot_of(row: &sqlx::postgres::PgRow) -> Result<SnapshotRecord, StoreError> {
    let Json(s): Json<SnapshotRecord> = row.try_get("doc")?;
    Ok(s)
}

#[async_trait]
impl LifecycleStore for PgStore {
    async fn begin_op(&self, op: &OpRecord) -> Result<OpBegun, StoreError> {
        // The partial unique index admits one pending exclusive op per sandbox. A lost insert
        // whose winner finishes before we read it is retried.
        for _ in 0..5 {
            let inserted = sqlx::query(
                "INSERT INTO sandbox_ops (id, sandbox_id, org_id, kind, exclusive, state,
                     created_at, updated_at, doc)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (sandbox_id) WHERE state = 'pending' AND exclusive DO NOTHING",
            )
            .bind(op.id.as_str())
            .bind(op.sandbox_id.as_str())
            .bind(op.org_id.as_str())
            .bind(&op.kind)
            .bind(op.exclusive)
            .bind(op.state.as_str())
            .bind(op.created_at)
            .bind(op.updated_at)
            .bind(Json(op))
            .execute(self.pool())
            .await?;
            if inserted.rows_affected() == 1 {
                return Ok(OpBegun::New(op.clone()));
            }
            let row = sqlx::query(
                "SELECT doc FROM sandbox_ops
                 WHERE sandbox_id = $1 AND state = 'pending' AND exclusive",
            )
            .bind(op.sandbox_id.as_str())
            .fetch_optional(self.pool())
            .await?;
            if let Some(row) = row {
                let pending = op_of(&row)?;
                return Ok(if pending.kind == op.kind && pending.args == op.args {
                    OpBegun::Joined(pending)
                } else {
                    OpBegun::Busy(pending)
                });
            }
        }
        Err(StoreError::Internal(
            "operation insert kept conflicting".into(),
        ))
    }

    async fn get_op(&self, id: &OpId) -> Result<Option<OpRecord>, StoreError> {
        let row = sqlx::query("SELECT doc FROM sandbox_ops WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(op_of).transpose()
    }

    async fn finish_op(
        &self,
        id: &OpId,
        state: OpState,
        result: Value,
        error: Option<OpError>,
        now: DateTime<Utc>,
    ) -> Result<OpRecord, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query("SELECT doc FROM sandbox_ops WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut op = op_of(&row)?;
        if op.state == OpState::Pending {
            op.state = state;
            op.result = result;
            op.error = error;
            op.updated_at = now;
            sqlx::query(
                "UPDATE sandbox_ops SET state = $2, updated_at = $3, doc = $4 WHERE id = $1",
            )
            .bind(id.as_str())
            .bind(op.state.as_str())
            .bind(now)
            .bind(Json(&op))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(op)
    }

    async fn pending_ops(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<OpRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc FROM sandbox_ops WHERE state = 'pending' AND updated_at < $1
             ORDER BY updated_at, id LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(op_of).collect()
    }

    async fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        storable::snapshot(s)?;
        let mut tx = self.begin().await?;
        // Serialized with `delete_project` (which takes the row FOR UPDATE): no snapshot is
        // inserted into a project being deleted, so none outlives its project.
        let project = sqlx::query("SELECT 1 FROM projects WHERE id = $1 AND org_id = $2 FOR SHARE")
            .bind(s.project_id.as_str())
            .bind(s.org_id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if project.is_none() {
            return Err(StoreError::NotFound);
        }
        let res = sqlx::query(
            "INSERT INTO snapshots (id, org_id, project_id, sandbox_id, pool, status,
                 created_at, doc)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING",
        )
        .bind(s.id.as_str())
        .bind(s.org_id.as_str())
        .bind(s.project_id.as_str())
        .bind(s.sandbox_id.as_str())
        .bind(&s.pool)
        .bind(s.status.as_str())
        .bind(s.created_at)
        .bind(Json(s))
        .execute(&mut *tx)
        .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!("snapshot {}", s.id)));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<SnapshotRecord>, StoreError> {
        let row = sqlx::query("SELECT doc FROM snapshots WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(snapshot_of).transpose()
    }

    async fn list_snapshots(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc FROM snapshots
             WHERE org_id = $1 AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR id > $3)
             ORDER BY id LIMIT $4",
        )
        .bind(org.as_str())
        .bind(project.map(|p| p.as_str()))
        .bind(after.map(|a| a.as_str()))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(snapshot_of).collect()
    }

    async fn list_sandbox_snapshots(
        &self,
        sandbox: &SandboxId,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc FROM snapshots
             WHERE sandbox_id = $1 AND ($2::text IS NULL OR id > $2)
             ORDER BY id LIMIT $3",
        )
        .bind(sandbox.as_str())
        .bind(after.map(|a| a.as_str()))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(snapshot_of).collect()
    }

    async fn update_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        storable::snapshot(s)?;
        let res = sqlx::query("UPDATE snapshots SET status = $2, doc = $3 WHERE id = $1")
            .bind(s.id.as_str())
            .bind(s.status.as_str())
            .bind(Json(s))
            .execute(self.pool())
            .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    async fn remove_snapshot(&self, id: &SnapshotId) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM snapshots WHERE id = $1")
            .bind(id.as_str())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn touch_activity(&self, id: &SandboxId, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.touch_activity_many(&[(id.clone(), at)]).await
    }

    async fn touch_activity_many(
        &self,
        touches: &[(SandboxId, DateTime<Utc>)],
    ) -> Result<(), StoreError> {
        if touches.is_empty() {
            return Ok(());
        }
        // One row per sandbox (ON CONFLICT cannot touch a row twice in one statement).
        let mut latest: std::collections::BTreeMap<&str, DateTime<Utc>> = Default::default();
        for (id, at) in touches {
            let e = latest.entry(id.as_str()).or_insert(*at);
            *e = (*e).max(*at);
        }
        sqlx::query(
            "INSERT INTO sandbox_activity (sandbox_id, last_activity_at)
             SELECT * FROM UNNEST($1::text[], $2::timestamptz[])
             ON CONFLICT (sandbox_id) DO UPDATE
             SET last_activity_at = GREATEST(sandbox_activity.last_activity_at, EXCLUDED.last_activity_at)",
        )
        .bind(latest.keys().copied().collect::<Vec<_>>())
        .bind(latest.values().copied().collect::<Vec<_>>())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn last_activity(&self, id: &SandboxId) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row =
            sqlx::query("SELECT last_activity_at FROM sandbox_activity WHERE sandbox_id = $1")
                .bind(id.as_str())
                .fetch_optional(self.pool())
                .await?;
        Ok(row
            .map(|r| r.try_get::<DateTime<Utc>, _>("last_activity_at"))
            .transpose()?)
    }

    async fn idle_candidates(
        &self,
        now: DateTime<Utc>,
        default_idle_seconds: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        // Rows with their own timeout (few; a partial index, migration 0020) are compared
        // as seconds elapsed (numeric) rather than timestamp + interval: a stored timeout of
        // any size (rows admitted before the API bounded it may hold up to u64::MAX) neither
        // overflows `bigint` nor the timestamp range; it just never fires. Rows under the
        // default are idle when neither their last write nor their last activity is newer
        // than `$3`, now minus the default: an index range over running rows by
        // `updated_at`, empty while all were written recently, instead of a pass over every
        // running row. No cutoff (no default, or one reaching before any row): none are.
        let cutoff = default_idle_seconds.and_then(|d| idle_cutoff(now, d));
        let rows = sqlx::query(
            "SELECT id, doc, env_sealed FROM (
                 SELECT s.id, s.doc, s.env_sealed, s.updated_at FROM sandboxes s
                 LEFT JOIN sandbox_activity a ON a.sandbox_id = s.id
                 WHERE s.status = 'running'
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds') IS NOT NULL
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds')::numeric
                       < EXTRACT(EPOCH FROM ($1 - GREATEST(s.updated_at,
                             COALESCE(a.last_activity_at, s.updated_at))))
                 UNION ALL
                 SELECT s.id, s.doc, s.env_sealed, s.updated_at FROM sandboxes s
                 LEFT JOIN sandbox_activity a ON a.sandbox_id = s.id
                 WHERE s.status = 'running' AND s.updated_at < $3
                   AND (s.doc -> 'spec' ->> 'idleTimeoutSeconds') IS NULL
                   AND (a.last_activity_at IS NULL OR a.last_activity_at < $3)
             ) idle
             ORDER BY updated_at LIMIT $2",
        )
        .bind(now)
        .bind(i64::from(limit))
        .bind(cutoff)
        .fetch_all(self.pool())
        .await?;
        Ok(sweep_rows_of(&rows))
    }

    async fn live_not_listed(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[SandboxId],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let live = ON_BACKEND.map(SandboxStatus::as_str);
        // `NOT IN` a subquery is a hashed subplan: each row is probed in a hash of the
        // listing as it is scanned. The `NOT EXISTS` anti-join it replaces let the planner
        // (which guesses 10 rows for an `unnest` parameter) merge-join, sorting every live
        // row of the pool, documents and all, on disk: 280 ms a pass at 10k live (issue
        // #47), and growing with the pool. Ids are never NULL, so `NOT IN` means the same.
        let rows = sqlx::query(
            "SELECT s.id, s.doc, s.env_sealed FROM sandboxes s
             WHERE s.pool = $1 AND s.status = ANY($2) AND s.updated_at < $3
               AND s.id NOT IN (SELECT l.id FROM unnest($4::text[]) AS l(id))
             ORDER BY s.id LIMIT $5",
        )
        .bind(pool)
        .bind(&live[..])
        .bind(before)
        .bind(listed.iter().map(SandboxId::as_str).collect::<Vec<_>>())
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        Ok(sweep_rows_of(&rows))
    }

    async fn drifted(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[(SandboxId, SandboxStatus)],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let live = ON_BACKEND.map(SandboxStatus::as_str);
        let (ids, statuses): (Vec<&str>, Vec<&str>) = listed
            .iter()
            .map(|(id, st)| (id.as_str(), st.as_str()))
            .unzip();
        let rows = sqlx::query(
            "SELECT s.id, s.doc, s.env_sealed FROM sandboxes s
             JOIN unnest($2::text[], $3::text[]) AS l(id, status) ON l.id = s.id
             WHERE s.pool = $1 AND s.status = ANY($4) AND s.status <> l.status
               AND s.updated_at < $5
               AND NOT EXISTS (SELECT 1 FROM sandbox_ops o
                               WHERE o.sandbox_id = s.id AND o.state = 'pending')
             ORDER BY s.id LIMIT $6",
        )
        .bind(pool)
        .bind(ids)
        .bind(statuses)
        .bind(&live[..])
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        Ok(sweep_rows_of(&rows))
    }

    async fn update_spec(
        &self,
        id: &SandboxId,
        labels: Option<std::collections::BTreeMap<String, String>>,
        idle_timeout_seconds: Option<Option<u64>>,
    ) -> Result<Sandbox, StoreError> {
        accounting::check_storable_labels(labels.as_ref())?;
        self.update_doc(id, |s| {
            accounting::apply_spec_update(s, labels, idle_timeout_seconds)
        })
        .await
    }

    async fn renew_ttl(
        &self,
        id: &SandboxId,
        ttl_seconds: u64,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        self.update_doc(id, |s| accounting::apply_ttl(s, ttl_seconds, now))
            .await
    }
}

/// Applies a `update_spec` to `s` (shared by both stores).
impl PgStore {
    /// Changes a sandbox's document (and `expires_at`, the one promoted column such a change
    /// may move) under its row lock; nothing counted changes, so no status rules apply.
    async fn update_doc(
        &self,
        id: &SandboxId,
        change: impl FnOnce(&mut Sandbox),
    ) -> Result<Sandbox, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query("SELECT doc, env_sealed FROM sandboxes WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut s = sandbox_of(&row)?;
        change(&mut s);
        let (doc, env_sealed) = env_at_rest::stored(&s)?;
        sqlx::query(
            "UPDATE sandboxes SET expires_at = $2, doc = $3, env_sealed = $4 WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(s.expires_at)
        .bind(doc)
        .bind(env_sealed)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(s)
    }
}

/// `now` minus `seconds`, the newest last write or activity of a row idle under a default
/// timeout of `seconds`; `None` when that is before the Unix epoch (or not representable):
/// no row was written then, so none is idle.
fn idle_cutoff(now: DateTime<Utc>, seconds: u64) -> Option<DateTime<Utc>> {
    let span = chrono::TimeDelta::try_seconds(i64::try_from(seconds).ok()?)?;
    now.checked_sub_signed(span)
        .filter(|c| *c >= DateTime::<Utc>::UNIX_EPOCH)
}
