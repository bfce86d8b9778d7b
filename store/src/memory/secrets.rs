//! Sealed secrets in memory.

use crate::memory::MemoryStore;
use crate::sealed::{self};
use crate::secrets::*;
use crate::{Actor, StoreError};
use async_trait::async_trait;
use chrono::Utc;

/// A stored row of the memory store.
#[derive(Debug, Clone)]
pub(crate) struct SecretRow {
    info: SecretInfo,
    sealed: Vec<u8>,
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
