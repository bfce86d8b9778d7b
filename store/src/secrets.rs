//! Stored provider credentials, sealed (`sealed`) under the process's sealing key before they
//! reach the database. A pool refers to one by name (OpenSandbox: `apiKeySecret`); adapters
//! read it through `differently_adapters::credentials` when they make a call, so replacing
//! it takes effect without a restart. Changes are audited on the installation chain with the
//! name and fingerprint only.

use crate::sealed::{self, SealKey};
use crate::shared::rules;
use crate::{Actor, StoreError};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;

/// A stored secret as shown: never the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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

pub(crate) fn key() -> Result<&'static SealKey, StoreError> {
    sealed::process_key().ok_or_else(|| {
        StoreError::Internal("no secrets key configured (set DIFFERENTLY_SECRETS_KEY)".into())
    })
}

pub(crate) fn seal(name: &str, value: &[u8]) -> Result<Vec<u8>, StoreError> {
    sealed::seal(key()?, name, value).map_err(|e| StoreError::Internal(e.to_string()))
}

pub(crate) fn open(name: &str, blob: &[u8]) -> Result<Vec<u8>, StoreError> {
    sealed::open(key()?, name, blob).map_err(|e| StoreError::Internal(e.to_string()))
}

pub(crate) fn audit_entry(
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
