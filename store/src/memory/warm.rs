//! `WarmStore` in memory. Instances live in the store's one `State`, so the claim made by an
//! admission is inside the same mutex section (the memory store's transaction) as the
//! sandbox row it inserts.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::warm::WarmClasses;
use differently_core::SandboxId;

use super::MemoryStore;
use crate::placement::PlacementStore;
use crate::shared::rules::AuditEntry;
use crate::warm::{merge_counts, WarmCount, WarmInstance, WarmState, WarmStore};
use crate::{Actor, StoreError};

/// Warm classes per pool and warm instances by id.
#[derive(Debug, Default)]
pub(crate) struct Warm {
    classes: BTreeMap<String, WarmClasses>,
    instances: BTreeMap<SandboxId, WarmInstance>,
}

#[async_trait]
impl WarmStore for MemoryStore {
    async fn warm_classes(&self, pool: &str) -> Result<WarmClasses, StoreError> {
        Ok(self
            .lock()
            .warm
            .classes
            .get(pool)
            .cloned()
            .unwrap_or_default())
    }

    async fn set_warm_classes(
        &self,
        pool: &str,
        classes: &WarmClasses,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        classes.validate().map_err(StoreError::InvalidValue)?;
        if !self.list_pools().await?.iter().any(|p| p.name == pool) {
            return Err(StoreError::NotFound);
        }
        let doc = serde_json::to_value(classes).map_err(|e| StoreError::Internal(e.to_string()))?;
        let mut st = self.lock();
        let old = st.warm.classes.insert(pool.to_owned(), classes.clone());
        if old.as_ref() == Some(classes) {
            return Ok(());
        }
        let entry = AuditEntry {
            actor: actor.as_audit(),
            action: "pool.warm.set".to_owned(),
            detail: serde_json::json!({ "old": old, "new": doc }),
        };
        st.audit_installation(&format!("pool:{pool}"), entry, Utc::now());
        Ok(())
    }

    async fn all_warm_classes(&self) -> Result<Vec<(String, WarmClasses)>, StoreError> {
        Ok(self
            .lock()
            .warm
            .classes
            .iter()
            .map(|(p, c)| (p.clone(), c.clone()))
            .collect())
    }

    async fn warm_counts(&self, pool: &str) -> Result<Vec<WarmCount>, StoreError> {
        let st = self.lock();
        let classes = st.warm.classes.get(pool).cloned().unwrap_or_default();
        let counts = st
            .warm
            .instances
            .values()
            .filter(|w| w.pool == pool)
            .map(|w| (w.class.clone(), w.state, 1));
        Ok(merge_counts(&classes, counts))
    }

    async fn warm_begin(
        &self,
        pool: &str,
        class: &str,
        id: &SandboxId,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        match st.warm.instances.get_mut(id) {
            Some(w) if w.state == WarmState::Creating && w.pool == pool && w.class == class => {
                w.attempts = w.attempts.saturating_add(1);
                Ok(())
            }
            Some(_) => Err(StoreError::AlreadyExists(format!("warm instance {id}"))),
            None => {
                st.warm.instances.insert(
                    id.clone(),
                    WarmInstance {
                        id: id.clone(),
                        pool: pool.to_owned(),
                        class: class.to_owned(),
                        state: WarmState::Creating,
                        backend_ref: None,
                        created_at: now,
                        ready_at: None,
                        attempts: 1,
                    },
                );
                Ok(())
            }
        }
    }

    async fn warm_ready(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let mut st = self.lock();
        Ok(match st.warm.instances.get_mut(id) {
            Some(w) if w.state == WarmState::Creating => {
                w.state = WarmState::Ready;
                w.backend_ref = Some(backend_ref.to_owned());
                w.ready_at = Some(now);
                true
            }
            Some(w) => w.state == WarmState::Ready,
            None => false,
        })
    }

    async fn warm_retire(&self, ids: &[SandboxId]) -> Result<u64, StoreError> {
        let mut st = self.lock();
        let mut found = 0;
        for id in ids {
            if let Some(w) = st.warm.instances.get_mut(id) {
                w.state = WarmState::Retiring;
                found += 1;
            }
        }
        Ok(found)
    }

    async fn warm_gone(&self, id: &SandboxId) -> Result<bool, StoreError> {
        Ok(self.lock().warm.instances.remove(id).is_some())
    }

    async fn warm_failed(&self, id: &SandboxId) -> Result<bool, StoreError> {
        let mut st = self.lock();
        let creating = st
            .warm
            .instances
            .get(id)
            .is_some_and(|w| w.state == WarmState::Creating);
        if creating {
            st.warm.instances.remove(id);
        }
        Ok(creating)
    }

    async fn warm_instances(&self, pool: &str) -> Result<Vec<WarmInstance>, StoreError> {
        Ok(self
            .lock()
            .warm
            .instances
            .values()
            .filter(|w| w.pool == pool)
            .cloned()
            .collect())
    }
}
