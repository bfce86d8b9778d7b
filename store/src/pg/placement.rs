//! `PlacementStore` on Postgres.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::policy::Policy;
use differently_core::pool::{PoolHealth, PoolRecord};
use differently_core::{OrgId, SandboxId, SandboxStatus};
use sqlx::types::Json;

use crate::pg::audit_records::insert_audit_for;
use crate::pg::audit_records::insert_audit_installation;
use crate::pg::PgStore;
use crate::placement::{PlacementStore, PlacementSummary, PolicyScope};
use crate::shared::rules::AuditEntry;
use crate::shared::storable;
use crate::{Actor, StoreError};

fn slot_statuses() -> Vec<String> {
    SandboxStatus::ALL
        .into_iter()
        .filter(|s| s.holds_pool_slot())
        .map(|s| s.as_str().to_owned())
        .collect()
}

fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::Internal(format!("stored document: {e}")))
}

#[async_trait]
impl PlacementStore for PgStore {
    async fn get_policy(&self, scope: &PolicyScope) -> Result<Option<Policy>, StoreError> {
        let doc: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT doc FROM policies WHERE scope = $1")
                .bind(scope.key())
                .fetch_optional(self.pool())
                .await?;
        doc.map(decode).transpose()
    }

    async fn get_policies(
        &self,
        scopes: &[PolicyScope],
    ) -> Result<Vec<Option<Policy>>, StoreError> {
        let keys: Vec<String> = scopes.iter().map(PolicyScope::key).collect();
        let rows: Vec<(String, serde_json::Value)> =
            sqlx::query_as("SELECT scope, doc FROM policies WHERE scope = ANY($1)")
                .bind(&keys)
                .fetch_all(self.pool())
                .await?;
        let mut found: HashMap<String, serde_json::Value> = rows.into_iter().collect();
        keys.iter()
            .map(|k| found.remove(k).map(decode).transpose())
            .collect()
    }

    async fn put_policy(
        &self,
        scope: &PolicyScope,
        policy: &Policy,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        let old: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT doc FROM policies WHERE scope = $1 FOR UPDATE")
                .bind(scope.key())
                .fetch_optional(&mut *tx)
                .await?;
        let doc = serde_json::to_value(policy).map_err(|e| StoreError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO policies (scope, doc, updated_at) VALUES ($1, $2, $3)
             ON CONFLICT (scope) DO UPDATE SET doc = EXCLUDED.doc, updated_at = EXCLUDED.updated_at",
        )
        .bind(scope.key())
        .bind(Json(&doc))
        .bind(Utc::now())
        .execute(&mut *tx)
        .await?;
        let org: Option<String> = match scope {
            PolicyScope::Global => None,
            PolicyScope::Org(id) => Some(id.to_string()),
            PolicyScope::Project(id) => {
                sqlx::query_scalar("SELECT org_id FROM projects WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(&mut *tx)
                    .await?
            }
        };
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "policy.put".to_owned(),
            detail: serde_json::json!({ "old": old, "new": doc }),
        };
        match org.and_then(|o| OrgId::parse(&o).ok()) {
            Some(org) => insert_audit_for(&mut tx, &org, &scope.key(), entry, Utc::now()).await?,
            None => insert_audit_installation(&mut tx, &scope.key(), entry, Utc::now()).await?,
        }
        tx.commit().await?;
        Ok(())
    }

    async fn upsert_pool(&self, pool: &PoolRecord, actor: &Actor) -> Result<(), StoreError> {
        storable::pool(pool)?;
        let doc = serde_json::to_value(pool).map_err(|e| StoreError::Internal(e.to_string()))?;
        let source = serde_json::to_value(pool.source)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned));
        let mut tx = self.pool().begin().await?;
        let old: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT doc FROM pools WHERE name = $1 FOR UPDATE")
                .bind(&pool.name)
                .fetch_optional(&mut *tx)
                .await?
                .flatten();
        if old
            .as_ref()
            .is_some_and(|o| crate::shared::documents::same_pool(o, &doc))
        {
            return Ok(()); // unchanged (every start re-registers config pools)
        }
        sqlx::query(
            "INSERT INTO pools (name, doc, source) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET doc = EXCLUDED.doc, source = EXCLUDED.source",
        )
        .bind(&pool.name)
        .bind(Json(&doc))
        .bind(source)
        .execute(&mut *tx)
        .await?;
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: if old.is_some() {
                "pool.update"
            } else {
                "pool.register"
            }
            .to_owned(),
            detail: serde_json::json!({ "old": old, "new": doc }),
        };
        insert_audit_installation(&mut tx, &format!("pool:{}", pool.name), entry, Utc::now())
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_pools(&self) -> Result<Vec<PoolRecord>, StoreError> {
        let docs: Vec<serde_json::Value> =
            sqlx::query_scalar("SELECT doc FROM pools WHERE doc IS NOT NULL ORDER BY name")
                .fetch_all(self.pool())
                .await?;
        docs.into_iter().map(decode).collect()
    }

    async fn delete_pool(&self, name: &str, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        let found: Option<String> = sqlx::query_scalar(
            "SELECT name FROM pools WHERE name = $1 AND doc IS NOT NULL FOR UPDATE",
        )
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
        if found.is_none() {
            return Err(StoreError::NotFound);
        }
        let used: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE pool = $1 AND status = ANY($2)",
        )
        .bind(name)
        .bind(slot_statuses())
        .fetch_one(&mut *tx)
        .await?;
        if used > 0 {
            return Err(StoreError::HasDependents(format!(
                "pool {name} has {used} live sandboxes"
            )));
        }
        crate::pg::warm::before_pool_delete(&mut tx, name).await?;
        // The row stays as a lock target; only the definition goes.
        sqlx::query("UPDATE pools SET doc = NULL, source = NULL WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM pool_health WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "pool.delete".to_owned(),
            detail: serde_json::json!({}),
        };
        insert_audit_installation(&mut tx, &format!("pool:{name}"), entry, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn report_pool_health(&self, health: &PoolHealth) -> Result<(), StoreError> {
        let doc = serde_json::to_value(health).map_err(|e| StoreError::Internal(e.to_string()))?;
        sqlx::query(
            "INSERT INTO pool_health (name, doc, checked_at) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET doc = EXCLUDED.doc, checked_at = EXCLUDED.checked_at",
        )
        .bind(&health.name)
        .bind(Json(doc))
        .bind(health.checked_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn pool_health(&self) -> Result<Vec<PoolHealth>, StoreError> {
        let docs: Vec<serde_json::Value> =
            sqlx::query_scalar("SELECT doc FROM pool_health ORDER BY name")
                .fetch_all(self.pool())
                .await?;
        docs.into_iter().map(decode).collect()
    }

    async fn pool_slots_used(&self) -> Result<HashMap<String, u32>, StoreError> {
        // The pool counters (migration 0006), kept by the sandboxes trigger.
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT substr(scope, 6), slots FROM usage_counters WHERE rank = 2 AND slots > 0",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(p, n)| (p, u32::try_from(n).unwrap_or(u32::MAX)))
            .collect())
    }

    async fn save_placement(
        &self,
        id: &SandboxId,
        explanation: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await?;
        write_placements(&mut tx, &[(id, explanation)], Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn placements_on(&self, pools: &[String]) -> Result<Vec<PlacementSummary>, StoreError> {
        type Row = (
            String,
            String,
            i64,
            DateTime<Utc>,
            DateTime<Utc>,
            Option<serde_json::Value>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT s.org_id, s.pool, count(*), min(s.created_at), max(s.created_at),
                    (SELECT p.doc FROM placements p JOIN sandboxes t ON t.id = p.sandbox_id
                      WHERE t.org_id = s.org_id AND t.pool = s.pool
                      ORDER BY t.id DESC LIMIT 1)
               FROM sandboxes s
              WHERE s.pool = ANY($1)
              GROUP BY s.org_id, s.pool
              ORDER BY s.org_id, s.pool",
        )
        .bind(pools)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(org, pool, n, first_at, last_at, latest_explanation)| {
                Ok(PlacementSummary {
                    org_id: OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))?,
                    pool,
                    sandboxes: u64::try_from(n).unwrap_or(0),
                    first_at,
                    last_at,
                    latest_explanation,
                })
            })
            .collect()
    }

    async fn get_placement(&self, id: &SandboxId) -> Result<Option<serde_json::Value>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT doc FROM placements WHERE sandbox_id = $1")
                .bind(id.as_str())
                .fetch_optional(self.pool())
                .await?,
        )
    }
}

/// Stores (replaces) the placement explanations of a group in `tx`, in one statement.
pub(crate) async fn write_placements(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    placements: &[(&SandboxId, &serde_json::Value)],
    at: chrono::DateTime<Utc>,
) -> Result<(), StoreError> {
    if placements.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO placements (sandbox_id, doc, decided_at)
         SELECT id, doc, $3 FROM UNNEST($1::text[], $2::jsonb[]) AS p(id, doc)
         ON CONFLICT (sandbox_id) DO UPDATE SET doc = EXCLUDED.doc, decided_at = EXCLUDED.decided_at",
    )
    .bind(
        placements
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        placements
            .iter()
            .map(|(_, doc)| (*doc).clone())
            .collect::<Vec<serde_json::Value>>(),
    )
    .bind(at)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
