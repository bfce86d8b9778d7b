//! Sealed secrets in Postgres; changes audited on the installation chain.

use crate::pg::PgStore;
use crate::sealed::{self};
use crate::secrets::*;
use crate::{Actor, StoreError};
use async_trait::async_trait;
use chrono::Utc;
use sqlx::Row;

fn info_of(r: &sqlx::postgres::PgRow) -> Result<SecretInfo, StoreError> {
    Ok(SecretInfo {
        name: r.try_get("name")?,
        fingerprint: r.try_get("fingerprint")?,
        updated_by: r.try_get("updated_by")?,
        updated_at: r.try_get("updated_at")?,
        created_at: r.try_get("created_at")?,
    })
}

#[async_trait]
impl SecretStore for PgStore {
    async fn put_secret(
        &self,
        name: &str,
        value: &[u8],
        actor: &Actor,
    ) -> Result<SecretInfo, StoreError> {
        let blob = seal(name, value)?;
        let fingerprint = sealed::fingerprint(value);
        let now = crate::audit::stored_time(Utc::now());
        let mut tx = self.pool().begin().await?;
        let old: Option<String> =
            sqlx::query_scalar("SELECT fingerprint FROM secrets WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let row = sqlx::query(
            "INSERT INTO secrets (name, sealed, fingerprint, updated_by, updated_at, created_at)
             VALUES ($1, $2, $3, $4, $5, $5)
             ON CONFLICT (name) DO UPDATE SET sealed = EXCLUDED.sealed,
                 fingerprint = EXCLUDED.fingerprint, updated_by = EXCLUDED.updated_by,
                 updated_at = EXCLUDED.updated_at
             RETURNING name, fingerprint, updated_by, updated_at, created_at",
        )
        .bind(name)
        .bind(&blob)
        .bind(&fingerprint)
        .bind(actor.as_audit())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let info = info_of(&row)?;
        let e = audit_entry(actor, name, &fingerprint, old.as_deref());
        crate::pg::audit_records::insert_audit_installation(&mut tx, name, e, now).await?;
        tx.commit().await?;
        Ok(info)
    }

    async fn list_secrets(&self) -> Result<Vec<SecretInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT name, fingerprint, updated_by, updated_at, created_at FROM secrets
             ORDER BY name",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(info_of).collect()
    }

    async fn open_secret(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let blob: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT sealed FROM secrets WHERE name = $1")
                .bind(name)
                .fetch_optional(self.pool())
                .await?;
        blob.map(|b| open(name, &b)).transpose()
    }
}
