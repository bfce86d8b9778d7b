//! `WarmStore` in memory. Instances live in the store's one `State`, so the claim made by an
//! admission is inside the same mutex section (the memory store's transaction) as the
//! sandbox row it inserts.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::warm::WarmClasses;
use differently_core::{Sandbox, SandboxId};

use super::{MemoryStore, Row, State};
use crate::placement::PlacementStore;
use crate::shared::rules::{self, AuditEntry};
use crate::warm::{merge_counts, WarmCount, WarmInstance, WarmState, WarmStore};
use crate::{Actor, DirectPlacement, Quota, QuotaScope, StoreError};

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

/// Admits `sandbox` onto a ready warm instance of `direct.warm_class`, on the locked state,
/// if the direct placement may apply now (the caller checked nothing of the org waits; here:
/// the org's and project's quotas admit it) and an instance is ready (oldest ready first).
/// Inserts the row under the instance's id with both records, as the Postgres admission
/// does; `None` (nothing written): placed as without a class.
pub(super) fn admit_claimed(
    st: &mut State,
    sandbox: &Sandbox,
    request_hash: &str,
    actor: &Actor,
    direct: &DirectPlacement,
    defaults: &Quota,
) -> Result<Option<Sandbox>, StoreError> {
    let Some(class) = direct.warm_class.as_deref() else {
        return Ok(None);
    };
    // Usage without this row: a queued row reserves nothing these limits count.
    let org_scope = QuotaScope::Org(sandbox.org_id.clone());
    let prj_scope = QuotaScope::Project(sandbox.project_id.clone());
    let walls = accounting::waiting_reason(
        (
            &st.usage(&org_scope),
            &st.stored_quota(&org_scope).or(defaults),
        ),
        (&st.usage(&prj_scope), &st.stored_quota(&prj_scope)),
        0,
        sandbox,
        direct.pool.cap(),
    );
    if walls.is_some() {
        return Ok(None);
    }
    let ready = st
        .warm
        .instances
        .values()
        .filter(|w| w.pool == direct.pool.name && w.class == class)
        .filter(|w| w.state == WarmState::Ready && w.backend_ref.is_some())
        .min_by_key(|w| (w.ready_at, w.id.clone()))
        .map(|w| w.id.clone());
    let Some(id) = ready else {
        return Ok(None);
    };
    if st.sandboxes.contains_key(&id) {
        return Err(StoreError::Internal(format!(
            "warm instance {id} is already a sandbox"
        )));
    }
    let Some(backend_ref) = st
        .warm
        .instances
        .get(&id)
        .and_then(|w| w.backend_ref.clone())
    else {
        return Ok(None);
    };
    let now = sandbox.created_at;
    let mut row = sandbox.clone();
    let entry = rules::claim_warm(&mut row, direct, id.clone(), &backend_ref, now)?;
    st.warm.instances.remove(&id);
    st.sandboxes.insert(
        id.clone(),
        Row {
            sandbox: row.clone(),
            request_hash: request_hash.to_owned(),
            next_attempt_at: now,
        },
    );
    st.audit(
        &row.org_id,
        id.as_str(),
        rules::admit_entry(&row, actor),
        now,
    );
    st.audit(&row.org_id, id.as_str(), entry, now);
    Ok(Some(row))
}
