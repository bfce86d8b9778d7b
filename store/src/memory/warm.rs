//! `WarmStore` in memory. Instances live in the store's one `State`, so the claim made by an
//! admission is inside the same mutex section (the memory store's transaction) as the
//! sandbox row it inserts.

use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::wait_reason;
use differently_core::warm::WarmClasses;
use differently_core::{Sandbox, SandboxId, SandboxStatus};

use super::{MemoryStore, Row, State};
use crate::placement::PlacementStore;
use crate::shared::rules::{self, AuditEntry};
use crate::warm::{
    claim_minute, merge_counts, WarmClaims, WarmCount, WarmInstance, WarmState, WarmStore,
    CLAIM_COUNTS_KEPT,
};
use crate::{Actor, DirectPlacement, Quota, QuotaScope, StoreError};

/// Warm classes per pool and warm instances by id.
#[derive(Debug, Default)]
pub(crate) struct Warm {
    classes: BTreeMap<String, WarmClasses>,
    instances: BTreeMap<SandboxId, WarmInstance>,
    /// (hits, misses) by (pool, class, minute).
    claims: BTreeMap<(String, String, DateTime<Utc>), (u64, u64)>,
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

    async fn warm_count_claims(
        &self,
        counts: &[WarmClaims],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let minute = claim_minute(at);
        let mut st = self.lock();
        for c in counts {
            let n = st
                .warm
                .claims
                .entry((c.pool.clone(), c.class.clone(), minute))
                .or_default();
            n.0 = n.0.saturating_add(c.hits);
            n.1 = n.1.saturating_add(c.misses);
        }
        let oldest = minute - CLAIM_COUNTS_KEPT;
        st.warm.claims.retain(|(_, _, m), _| *m >= oldest);
        Ok(())
    }

    async fn warm_claims_since(
        &self,
        pool: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<WarmClaims>, StoreError> {
        let since = claim_minute(since);
        let st = self.lock();
        let mut by_class: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for ((p, class, minute), (hits, misses)) in &st.warm.claims {
            if p == pool && *minute >= since {
                let n = by_class.entry(class.as_str()).or_default();
                n.0 = n.0.saturating_add(*hits);
                n.1 = n.1.saturating_add(*misses);
            }
        }
        Ok(by_class
            .into_iter()
            .map(|(class, (hits, misses))| WarmClaims {
                pool: pool.to_owned(),
                class: class.to_owned(),
                hits,
                misses,
            })
            .collect())
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

/// What [`admit_claimed`] did.
#[derive(Debug)]
pub(super) enum Claim {
    /// Inserted under a warm instance's id.
    Claimed(Box<Sandbox>),
    /// A limit stops the placement now (this `waiting: …` reason); nothing written.
    Waits(String),
    /// No class, no instance ready, or (claim only) a queued sandbox may be waiting for the
    /// capped pool; nothing written.
    None,
}

/// Admits `sandbox` onto a ready warm instance of `direct.warm_class`, on the locked state,
/// if the direct placement may apply now (the caller checked nothing of the org waits; here:
/// the org's and project's quotas admit it, and on a capped pool a live slot is left and no
/// queued sandbox of any org may be waiting for the pool) and an instance is ready (oldest
/// ready first). Inserts the row under the instance's id with both records, as the Postgres
/// admission does.
pub(super) fn admit_claimed(
    st: &mut State,
    sandbox: &Sandbox,
    request_hash: &str,
    actor: &Actor,
    direct: &DirectPlacement,
    defaults: &Quota,
) -> Result<Claim, StoreError> {
    let pool = direct.pool.name.as_str();
    // Live sandboxes on a capped pool, as the leader's activation counts them.
    let used = if direct.claim_only() {
        st.sandboxes
            .values()
            .filter(|r| {
                r.sandbox.pool.as_deref() == Some(pool) && r.sandbox.status.holds_pool_slot()
            })
            .count() as u64
    } else {
        0
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
        used,
        sandbox,
        direct.pool.cap(),
    );
    if let Some((_, reason)) = walls {
        return Ok(Claim::Waits(reason));
    }
    let Some(class) = direct.warm_class.as_deref() else {
        return Ok(Claim::None);
    };
    if direct.claim_only() {
        let waited = st.sandboxes.values().any(|r| {
            r.sandbox.status == SandboxStatus::Queued
                && wait_reason::may_want(r.sandbox.status_reason.as_deref(), pool)
        });
        if waited {
            return Ok(Claim::None);
        }
    }
    let ready = st
        .warm
        .instances
        .values()
        .filter(|w| w.pool == pool && w.class == class)
        .filter(|w| w.state == WarmState::Ready && w.backend_ref.is_some())
        .min_by_key(|w| (w.ready_at, w.id.clone()))
        .map(|w| w.id.clone());
    let Some(id) = ready else {
        return Ok(Claim::None);
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
        return Ok(Claim::None);
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
    Ok(Claim::Claimed(Box::new(row)))
}

impl MemoryStore {
    /// `delete_pool`'s warm part, as on Postgres (`pg::warm::before_pool_delete`): refuses
    /// while the pool has warm instances, then forgets its classes document.
    pub(super) fn before_pool_delete(&self, pool: &str) -> Result<(), StoreError> {
        let mut st = self.lock();
        let rows = st
            .warm
            .instances
            .values()
            .filter(|w| w.pool == pool)
            .count();
        if rows > 0 {
            return Err(StoreError::HasDependents(format!(
                "pool {pool} has {rows} warm instances; empty its warm classes and wait for them to be deleted"
            )));
        }
        st.warm.classes.remove(pool);
        Ok(())
    }
}
