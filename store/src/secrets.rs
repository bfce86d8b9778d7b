//! Stored provider credentials, sealed (`sealed`) under the process's sealing key before they
//! reach the database. A pool refers to one by name (OpenSandbox: `apiKeySecret`); adapters
//! read it through `differently_adapters::credentials` when they make a call, so replacing
//! it takes effect without a restart. Changes are audited on the installation chain with the
//! name and fingerprint only.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::Row;

use crate::memory::MemoryStore;
use crate::shared::rules;
use crate::postgres::PgStore;
use crate::sealed::{self, SealKey};
use crate::{Actor, StoreError};

/// A stored secret as shown: never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    pub name: String,
    /// `sha256:<16 hex>` of the value.
    pub fingerprint: String,
    /// Who last set it (`key:<id>`).
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// A stored row of the memory store.
#[derive(Debug, Clone)]
pub(crate) struct SecretRow {
    info: SecretInfo,
    sealed: Vec<u8>,
}

/// Checks a secret name: 1–63 of `a-z 0-9 . _ -`, starting with a letter or digit.
pub fn validate_secret_name(name: &str) -> Result<(), String> {
    if differently_core::pool::valid_secret_name(name) {
        Ok(())
    } else {
        Err(
            "must be 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit"
                .into(),
        )
    }
}

fn key() -> Result<&'static SealKey, StoreError> {
    sealed::process_key().ok_or_else(|| {
        StoreError::Internal("no secrets key configured (set DIFFERENTLY_SECRETS_KEY)".into())
    })
}

fn seal(name: &str, value: &[u8]) -> Result<Vec<u8>, StoreError> {
    sealed::seal(key()?, name, value).map_err(|e| StoreError::Internal(e.to_string()))
}

fn open(name: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
    sealed::open(key()?, name, blob).map_err(|e| StoreError::Internal(e.to_string()))
}

fn audit_entry(
    actor: &Actor,
    name: &str,
    fingerprint: &str,
    old: Option<&str>,
) -> rules::AuditEntry {
    rules::tenancy_entry(
        actor,
        "secret.put",
        json!({ "name": name, "fingerprint": fingerprint, "oldFingerprint": old }),
    )
}

/// Sealed credentials.
#[async_trait]
pub trait SecretStore: Send + Sync {
    /// Seals `value` as `name` (creating or replacing it) and audits the change with the
    /// fingerprint, in one transaction. Fails if no sealing key is configured.
    async fn put_secret(
        &self,
        name: &str,
        value: &[u8],
        actor: &Actor,
    ) -> Result<SecretInfo, StoreError>;

    /// Every stored secret in name order, without values.
    async fn list_secrets(&self) -> Result<Vec<SecretInfo>, StoreError>;

    /// The value of `name` (`None` if absent). A blob that does not open under the key
    /// (wrong key, tampered, swapped) is an error.
    async fn open_secret(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

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
        crate::postgres::insert_audit_installation(&mut tx, name, e, now).await?;
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

#[async_trait]
impl SecretStore for MemoryStore {
    async fn put_secret(
        &self,
        name: &str,
        value: &[u8],
        actor: &Actor,
    ) -> Result<SecretInfo, StoreError> {
        let blob = seal(name, value)?;
        let fingerprint = sealed::fingerprint(value);
        let now = crate::audit::stored_time(Utc::now());
        let mut st = self.lock();
        let old = st.secrets.get(name).map(|r| r.info.clone());
        let info = SecretInfo {
            name: name.to_owned(),
            fingerprint: fingerprint.clone(),
            updated_by: actor.as_audit(),
            updated_at: now,
            created_at: old.as_ref().map_or(now, |o| o.created_at),
        };
        st.secrets.insert(
            name.to_owned(),
            SecretRow {
                info: info.clone(),
                sealed: blob,
            },
        );
        let e = audit_entry(
            actor,
            name,
            &fingerprint,
            old.as_ref().map(|o| o.fingerprint.as_str()),
        );
        st.audit_installation(name, e, now);
        Ok(info)
    }

    async fn list_secrets(&self) -> Result<Vec<SecretInfo>, StoreError> {
        Ok(self
            .lock()
            .secrets
            .values()
            .map(|r| r.info.clone())
            .collect())
    }

    async fn open_secret(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let blob = self.lock().secrets.get(name).map(|r| r.sealed.clone());
        blob.map(|b| open(name, &b)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_checked() {
        for ok in ["opensandbox", "a", "e2b.prod-key_1"] {
            assert!(validate_secret_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "Upper", "a b", &"x".repeat(64), "a/b"] {
            assert!(validate_secret_name(bad).is_err(), "{bad}");
        }
    }
}
