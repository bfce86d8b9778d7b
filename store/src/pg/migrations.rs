//! The embedded SQL migrations and applying them once across replicas.

use sqlx::{Connection, PgConnection};

use super::{usage_counters, PgStore};
use crate::StoreError;

/// Embedded migrations, applied in order; a version is never edited once released.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_init",
        include_str!("../../../migrations/0001_init.sql"),
    ),
    (
        "0002_tenancy",
        include_str!("../../../migrations/0002_tenancy.sql"),
    ),
    (
        "0003_snapshots",
        include_str!("../../../migrations/0003_snapshots.sql"),
    ),
    (
        "0004_audit_chain",
        include_str!("../../../migrations/0004_audit_chain.sql"),
    ),
    (
        "0005_placement",
        include_str!("../../../migrations/0005_placement.sql"),
    ),
    (
        "0006_usage_counters",
        include_str!("../../../migrations/0006_usage_counters.sql"),
    ),
    (
        "0007_audit_heads",
        include_str!("../../../migrations/0007_audit_heads.sql"),
    ),
    (
        "0008_idempotency",
        include_str!("../../../migrations/0008_idempotency.sql"),
    ),
    (
        "0009_snapshots_by_sandbox",
        include_str!("../../../migrations/0009_snapshots_by_sandbox.sql"),
    ),
    (
        "0010_audit_key_ids",
        include_str!("../../../migrations/0010_audit_key_ids.sql"),
    ),
    (
        "0011_webhooks",
        include_str!("../../../migrations/0011_webhooks.sql"),
    ),
    (
        "0012_work_claims",
        include_str!("../../../migrations/0012_work_claims.sql"),
    ),
    (
        "0013_webhook_fairness",
        include_str!("../../../migrations/0013_webhook_fairness.sql"),
    ),
    (
        "0014_env_at_rest_and_key_parents",
        include_str!("../../../migrations/0014_env_at_rest_and_key_parents.sql"),
    ),
    (
        "0015_warm_pools",
        include_str!("../../../migrations/0015_warm_pools.sql"),
    ),
    (
        "0016_warm_claim_counts",
        include_str!("../../../migrations/0016_warm_claim_counts.sql"),
    ),
    (
        "0017_usage_trigger_once",
        include_str!("../../../migrations/0017_usage_trigger_once.sql"),
    ),
    (
        "0018_status_change_in_one_statement",
        include_str!("../../../migrations/0018_status_change_in_one_statement.sql"),
    ),
    (
        "0019_admission_in_one_statement",
        include_str!("../../../migrations/0019_admission_in_one_statement.sql"),
    ),
    (
        "0020_idle_candidates_by_index",
        include_str!("../../../migrations/0020_idle_candidates_by_index.sql"),
    ),
    (
        "0021_webhook_fan_out_cursor",
        include_str!("../../../migrations/0021_webhook_fan_out_cursor.sql"),
    ),
    (
        "0022_status_patch_in_one_statement",
        include_str!("../../../migrations/0022_status_patch_in_one_statement.sql"),
    ),
];

/// Session advisory lock serializing migrations across replicas (`dly_mig`).
pub(crate) const MIGRATION_LOCK: i64 = 0x0064_6c79_5f6d_6967; // "dly_mig"

impl PgStore {
    /// Applies the embedded migrations not yet recorded in `schema_migrations`, each in its own
    /// transaction, under a session advisory lock on a dedicated connection, so replicas
    /// starting together migrate once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await?;
        let mut result = apply_migrations(&mut conn).await;
        if result.is_ok() {
            result = sync_usage_classes(&mut conn).await;
        }
        if result.is_ok() {
            result = seal_env_values(&mut conn).await;
        }
        // Closing the session releases the lock even if the unlock below fails.
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
        result?;
        unlocked?;
        Ok(())
    }

    /// The embedded migrations this database has not applied, in order (all of them on a
    /// database never migrated); changes nothing.
    pub async fn pending_migrations(&self) -> Result<Vec<&'static str>, StoreError> {
        let table: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('schema_migrations')::text")
                .fetch_one(&self.pool)
                .await?;
        let applied: Vec<String> = if table.is_some() {
            sqlx::query_scalar("SELECT version FROM schema_migrations")
                .fetch_all(&self.pool)
                .await?
        } else {
            Vec::new()
        };
        Ok(MIGRATIONS
            .iter()
            .map(|(v, _)| *v)
            .filter(|v| !applied.iter().any(|a| a == v))
            .collect())
    }
}

async fn apply_migrations(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version text PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *conn)
    .await?;
    for (version, sql) in MIGRATIONS {
        let applied: Option<String> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                .bind(*version)
                .fetch_optional(&mut *conn)
                .await?;
        if applied.is_some() {
            continue;
        }
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::Internal(format!("migration {version}: {e}")))?;
        sqlx::query("INSERT INTO schema_migrations (version) VALUES ($1)")
            .bind(*version)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(version, "applied migration");
    }
    Ok(())
}

/// Seals the env values rows still keep in plaintext, when a secrets key is configured (SQL
/// has no key, so this is the migration's Rust half; it finds nothing to do once done).
async fn seal_env_values(conn: &mut PgConnection) -> Result<(), StoreError> {
    let n = super::env_at_rest::seal_plaintext_rows(conn).await?;
    if n > 0 {
        tracing::info!(rows = n, "sandbox env values sealed under the secrets key");
    }
    Ok(())
}

/// Copies core's status classification into the database; a changed classification means
/// every counter was counted under the old one, so recount them.
async fn sync_usage_classes(conn: &mut PgConnection) -> Result<(), StoreError> {
    if usage_counters::sync_class_function(conn).await? {
        tracing::info!("usage classification function written from core");
    }
    if usage_counters::sync_status_classes(conn).await? {
        let fixed = usage_counters::reconcile(conn).await?;
        tracing::info!(
            corrected = fixed.len(),
            "status classification changed; usage recounted"
        );
    }
    Ok(())
}
