//! The in-memory store: the same contract as Postgres behind one mutex, for `--dev` and tests.
//! State is per process, so run exactly one replica with it.
//!
//! The rules both stores share live in `differently_core::accounting` (the domain) and
//! `crate::shared` (audit entries, refusals), so the two implementations cannot drift apart.
//! One file per intent, with the same names as the Postgres store's.

mod activation;
mod admission;
pub(crate) mod audit;
mod idempotency;
mod installation;
pub(crate) mod lifecycle;
pub(crate) mod placement;
mod sandboxes;
mod secrets;
mod tenancy;
mod transition;
mod usage;
mod warm;
mod webhooks;
mod work_claims;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use differently_core::ids::InstallationId;
use differently_core::{KeyId, OrgId, ProjectId, Sandbox, SandboxId};

use crate::shared::rules;
use crate::{ApiKeyRecord, Org, Project, Quota, QuotaScope, StoreError, Usage};

/// A stored sandbox with the fields that are not part of the `Sandbox` document.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) sandbox: Sandbox,
    request_hash: String,
    next_attempt_at: DateTime<Utc>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    installation_id: Option<InstallationId>,
    /// Keyed by id, so iteration is id order (for listing).
    orgs: BTreeMap<OrgId, Org>,
    projects: BTreeMap<ProjectId, Project>,
    keys: BTreeMap<KeyId, ApiKeyRecord>,
    /// The key that minted each key minted by one (`parent_key_id` in Postgres).
    key_parents: HashMap<KeyId, String>,
    /// Keyed by `QuotaScope::key()`.
    quotas: HashMap<String, Quota>,
    /// Keyed by id, so iteration is id (admission) order.
    pub(crate) sandboxes: BTreeMap<SandboxId, Row>,
    /// Audit chains (`memory::audit.rs`).
    pub(crate) audit: audit::MemoryAudit,
    /// Sealed secrets by name (`secrets.rs`).
    pub(crate) secrets: BTreeMap<String, secrets::SecretRow>,
    /// Claimed Idempotency-Keys (`idempotency.rs`).
    pub(crate) idempotency: HashMap<crate::idempotency::IdemKey, idempotency::IdemRow>,
    /// Webhooks and their deliveries (`webhooks.rs`).
    pub(crate) webhooks: webhooks::WebhookState,
    /// Claimed backend calls (`work_claims.rs`).
    pub(crate) work_claims: HashMap<crate::work_claims::ClaimKey, work_claims::ClaimRow>,
    /// Warm classes and instances (`warm.rs`): here, so an admission's claim is in its
    /// mutex section.
    pub(crate) warm: warm::Warm,
}

impl State {
    /// Drops the parents of keys no longer stored (their org or project was deleted).
    pub(crate) fn forget_removed_key_parents(&mut self) {
        let keys = &self.keys;
        self.key_parents.retain(|k, _| keys.contains_key(k));
    }

    /// Appends a record about `resource` to `org_id`'s audit chain (`memory::audit`).
    pub(crate) fn audit(
        &mut self,
        org_id: &OrgId,
        resource: &str,
        e: rules::AuditEntry,
        at: DateTime<Utc>,
    ) {
        // A sandbox's record carries its project, as in Postgres.
        let project = SandboxId::parse(resource)
            .ok()
            .and_then(|id| self.sandboxes.get(&id))
            .map(|r| r.sandbox.project_id.clone());
        let ev = e.into_event(Some(org_id), project.as_ref(), resource);
        self.audit.append(ev, at);
    }

    /// Appends a record about `resource` to the installation chain (no organization).
    pub(crate) fn audit_installation(
        &mut self,
        resource: &str,
        e: rules::AuditEntry,
        at: DateTime<Utc>,
    ) {
        let ev = e.into_event(None, None, resource);
        self.audit.append(ev, at);
    }

    fn row_mut(&mut self, id: &SandboxId) -> Result<&mut Row, StoreError> {
        self.sandboxes.get_mut(id).ok_or(StoreError::NotFound)
    }

    /// Usage of the rows in `scope`, per the core accounting table.
    fn usage(&self, scope: &QuotaScope) -> Usage {
        let mut u = Usage::default();
        for r in self.sandboxes.values() {
            let s = &r.sandbox;
            let inside = match scope {
                QuotaScope::Org(o) => &s.org_id == o,
                QuotaScope::Project(p) => &s.project_id == p,
            };
            if inside {
                u.add(s.status, &s.spec.resources);
            }
        }
        u
    }

    /// The stored quota of `scope`, or no limits.
    fn stored_quota(&self, scope: &QuotaScope) -> Quota {
        self.quotas.get(&scope.key()).copied().unwrap_or_default()
    }

    /// The organization owning `scope`; `NotFound` if the org or project does not exist.
    fn scope_org(&self, scope: &QuotaScope) -> Result<OrgId, StoreError> {
        match scope {
            QuotaScope::Org(o) => self.orgs.get(o).map(|o| o.id.clone()),
            QuotaScope::Project(p) => self.projects.get(p).map(|p| p.org_id.clone()),
        }
        .ok_or(StoreError::NotFound)
    }
}

impl crate::Store for MemoryStore {}

/// In-memory `Store`: one `std::sync::Mutex` over plain collections, never held across an
/// await. Leadership is exclusive within the process.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    leader: Arc<AtomicBool>,
    /// The webhook fan-out's (`Lead::WebhookFanOut`).
    fan_out_leader: Arc<AtomicBool>,
    /// Policies, pools, health and explanations (`memory::placement.rs`).
    pub(crate) placement: Arc<Mutex<placement::PlacementState>>,
    /// Operations, snapshots and activity (`memory::lifecycle.rs`).
    pub(crate) lifecycle: Arc<Mutex<lifecycle::LifecycleState>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave half a change behind (every method
        // validates before mutating), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slots in use per pool (for `PlacementStore`).
    pub(crate) fn slots_used(&self) -> HashMap<String, u32> {
        let mut out = HashMap::new();
        for row in self.lock().sandboxes.values() {
            if let (Some(pool), true) = (&row.sandbox.pool, row.sandbox.status.holds_pool_slot()) {
                *out.entry(pool.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// (sandbox, org, pool, created) of every sandbox ever placed on one of `pools`, in id order.
    pub(crate) fn sandboxes_on(
        &self,
        pools: &[String],
    ) -> Vec<(SandboxId, OrgId, String, DateTime<Utc>)> {
        self.lock()
            .sandboxes
            .values()
            .filter_map(|r| {
                let pool = r.sandbox.pool.as_ref().filter(|p| pools.contains(p))?;
                Some((
                    r.sandbox.id.clone(),
                    r.sandbox.org_id.clone(),
                    pool.clone(),
                    r.sandbox.created_at,
                ))
            })
            .collect()
    }

    /// The organization of a project, if it exists.
    pub(crate) fn project_org(&self, id: &ProjectId) -> Option<OrgId> {
        self.lock().projects.get(id).map(|p| p.org_id.clone())
    }

    /// Appends an audit record about `resource` of `org`.
    pub(crate) fn audit_for(&self, org: &OrgId, resource: &str, e: rules::AuditEntry) {
        self.lock().audit(org, resource, e, Utc::now());
    }

    /// Appends an audit record to the installation chain (no organization).
    pub(crate) fn audit_installation_for(&self, resource: &str, e: rules::AuditEntry) {
        self.lock().audit_installation(resource, e, Utc::now());
    }
}
