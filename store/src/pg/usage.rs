//! Quotas and usage: stored quotas, counters derived from rows, fair-order CPU, drift repair.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::Utc;
use differently_core::OrgId;
use serde_json::json;

use super::audit_records::insert_audit_for;
use super::limits::stored_quota;
use super::locks::lock_org;
use super::rows::json_of;
use super::tenancy::project_org;
use super::{usage_counters, PgStore};
use crate::prelude::*;
use crate::shared::rules;
use crate::{Actor, Quota, QuotaScope, StoreError, Usage, UsageDrift};

#[async_trait]
impl UsageStore for PgStore {
    async fn get_quota(&self, scope: &QuotaScope) -> Result<Option<Quota>, StoreError> {
        stored_quota(&self.pool, scope).await
    }

    async fn put_quota(
        &self,
        scope: &QuotaScope,
        quota: &Quota,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let org = match scope {
            QuotaScope::Org(o) => o.clone(),
            QuotaScope::Project(p) => project_org(&mut *tx, p).await?,
        };
        lock_org(&mut tx, &org).await?;
        let key = scope.key();
        let old = stored_quota(&mut *tx, scope).await?;
        sqlx::query(
            "INSERT INTO quotas (scope, doc) VALUES ($1, $2)
             ON CONFLICT (scope) DO UPDATE SET doc = EXCLUDED.doc",
        )
        .bind(&key)
        .bind(json_of(quota)?)
        .execute(&mut *tx)
        .await?;
        let e = rules::tenancy_entry(actor, "quota.put", json!({ "old": old, "new": quota }));
        insert_audit_for(&mut tx, &org, &key, e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn usage(&self, scope: &QuotaScope) -> Result<Usage, StoreError> {
        let mut conn = self.pool.acquire().await?;
        match scope {
            QuotaScope::Org(o) => {
                sqlx::query_scalar::<_, String>("SELECT id FROM organizations WHERE id = $1")
                    .bind(o.as_str())
                    .fetch_optional(&mut *conn)
                    .await?
                    .ok_or(StoreError::NotFound)?;
            }
            QuotaScope::Project(p) => {
                project_org(&mut *conn, p).await?;
            }
        }
        usage_counters::scope_usage(&mut *conn, scope).await
    }

    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT substr(scope, 5), cpu FROM usage_counters WHERE rank = 0 AND cpu > 0",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for (org, cpu) in rows {
            let org = OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))?;
            out.insert(org, u64::try_from(cpu).unwrap_or(0));
        }
        Ok(out)
    }

    async fn reconcile_usage(&self) -> Result<Vec<UsageDrift>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        usage_counters::reconcile(&mut conn).await
    }
}
