//! Reading sandbox rows: one, briefs of many, filtered lists, and the sweeps' selections.

use std::collections::HashMap;
use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use sqlx::Row;

use super::rows::{sandbox_of, sandboxes_of, sweep_rows_of};
use super::PgStore;
use crate::prelude::*;
use crate::{SandboxBrief, SandboxFilter, StoreError};

#[async_trait]
impl SandboxReadStore for PgStore {
    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        let row = sqlx::query("SELECT doc, env_sealed FROM sandboxes WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_of).transpose()
    }

    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, SandboxBrief>, StoreError> {
        let ids: Vec<&str> = ids.iter().map(SandboxId::as_str).collect();
        let rows =
            sqlx::query("SELECT id, org_id, project_id, status FROM sandboxes WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await?;
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Internal(format!("sandboxes.{what}: {e}"))
        };
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let id: String = r.try_get("id")?;
            let org: String = r.try_get("org_id")?;
            let prj: String = r.try_get("project_id")?;
            let status: String = r.try_get("status")?;
            out.insert(
                SandboxId::parse(&id).map_err(|e| bad("id", &e))?,
                SandboxBrief {
                    org_id: OrgId::parse(&org).map_err(|e| bad("org_id", &e))?,
                    project_id: ProjectId::parse(&prj).map_err(|e| bad("project_id", &e))?,
                    status: SandboxStatus::from_str(&status).map_err(|e| bad("status", &e))?,
                },
            );
        }
        Ok(out)
    }

    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError> {
        let limit = if filter.limit == 0 {
            None
        } else {
            Some(i64::from(filter.limit))
        };
        let label = (!filter.labels.is_empty()).then(|| serde_json::json!(filter.labels));
        let rows = sqlx::query(
            "SELECT doc, env_sealed FROM sandboxes
             WHERE ($1::text IS NULL OR org_id = $1)
               AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR status = $3)
               AND ($4::jsonb IS NULL OR doc -> 'spec' -> 'labels' @> $4)
               AND ($5::text IS NULL OR id > $5)
             ORDER BY id
             LIMIT $6",
        )
        .bind(filter.org_id.as_ref().map(OrgId::as_str))
        .bind(filter.project_id.as_ref().map(ProjectId::as_str))
        .bind(filter.status.map(SandboxStatus::as_str))
        .bind(label)
        .bind(filter.after.as_ref().map(SandboxId::as_str))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn runnable_queued(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc, env_sealed FROM sandboxes WHERE status = $1 AND next_attempt_at <= $2
             ORDER BY id LIMIT $3",
        )
        .bind(SandboxStatus::Queued.as_str())
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn stale(
        &self,
        status: SandboxStatus,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, doc, env_sealed FROM sandboxes WHERE status = $1 AND updated_at < $2
             ORDER BY updated_at, id LIMIT $3",
        )
        .bind(status.as_str())
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(sweep_rows_of(&rows))
    }

    async fn expired(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Sandbox>, StoreError> {
        let expirable: Vec<&str> = accounting::EXPIRABLE.iter().map(|s| s.as_str()).collect();
        let rows = sqlx::query(
            "SELECT id, doc, env_sealed FROM sandboxes WHERE status = ANY($1) AND expires_at < $2
             ORDER BY expires_at, id LIMIT $3",
        )
        .bind(expirable)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(sweep_rows_of(&rows))
    }
}
