//! The in-memory store: the same contract as Postgres behind one mutex, for `--dev` and tests.
//! State is per process, so run exactly one replica with it.
//!
//! The rules both stores share live in `differently_core::accounting` (the domain) and
//! `crate::shared` (audit entries, refusals), so the two implementations cannot drift apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::ids::InstallationId;
use differently_core::{KeyId, OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use differently_core::accounting;
use serde_json::json;

use crate::shared::rules;
use crate::{
    Activation, Actor, Admission, Admitted, ApiKeyRecord, AuditRecord, Leadership, Org, OrgStatus,
    PoolSlot, Project, Quota, QuotaScope, SandboxFilter, Store, StoreError, Transition, Usage,
};

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
    /// Keyed by `QuotaScope::key()`.
    quotas: HashMap<String, Quota>,
    /// Keyed by id, so iteration is id (admission) order.
    pub(crate) sandboxes: BTreeMap<SandboxId, Row>,
    /// Audit chains (`audit_memory.rs`).
    pub(crate) audit: crate::audit_memory::MemoryAudit,
    /// Sealed secrets by name (`secrets.rs`).
    pub(crate) secrets: BTreeMap<String, crate::secrets::SecretRow>,
    /// Claimed Idempotency-Keys (`idempotency.rs`).
    pub(crate) idempotency: HashMap<crate::idempotency::IdemKey, crate::idempotency::IdemRow>,
}

impl State {
    /// Appends a record about `resource` to `org_id`'s audit chain (`audit_memory`).
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

    /// `AlreadyExists` if another organization than `except` has `name`.
    fn check_org_name(&self, name: &str, except: &OrgId) -> Result<(), StoreError> {
        if self
            .orgs
            .values()
            .any(|o| o.name == name && &o.id != except)
        {
            return Err(rules::name_taken("organization", name));
        }
        Ok(())
    }

    /// `AlreadyExists` if another project of `org` than `except` has `name`.
    fn check_project_name(
        &self,
        org: &OrgId,
        name: &str,
        except: &ProjectId,
    ) -> Result<(), StoreError> {
        let taken = self
            .projects
            .values()
            .any(|p| &p.org_id == org && p.name == name && &p.id != except);
        if taken {
            return Err(rules::name_taken("project", name));
        }
        Ok(())
    }
}

/// In-memory `Store`: one `std::sync::Mutex` over plain collections, never held across an
/// await. Leadership is exclusive within the process.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    leader: Arc<AtomicBool>,
    /// Policies, pools, health and explanations (`placement_memory.rs`).
    pub(crate) placement: Arc<Mutex<crate::placement_memory::PlacementState>>,
    /// Operations, snapshots and activity (`lifecycle_memory.rs`).
    pub(crate) lifecycle: Arc<Mutex<crate::lifecycle_memory::LifecycleState>>,
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

/// Leadership of a `MemoryStore`: a process-wide flag cleared on drop.
struct MemoryLeadership {
    flag: Arc<AtomicBool>,
}

#[async_trait]
impl Leadership for MemoryLeadership {
    async fn still_held(&mut self) -> bool {
        true
    }
}

impl Drop for MemoryLeadership {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::SeqCst);
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn installation_id(&self) -> Result<InstallationId, StoreError> {
        let mut st = self.lock();
        Ok(st
            .installation_id
            .get_or_insert_with(InstallationId::new)
            .clone())
    }

    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError> {
        let mut st = self.lock();
        st.orgs.entry(org.id.clone()).or_insert_with(|| org.clone());
        st.projects
            .entry(project.id.clone())
            .or_insert_with(|| project.clone());
        Ok(())
    }

    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError> {
        Ok(self.lock().projects.get(id).cloned())
    }

    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        if st.orgs.contains_key(&org.id) {
            return Err(StoreError::AlreadyExists(format!(
                "organization {}",
                org.id
            )));
        }
        st.check_org_name(&org.name, &org.id)?;
        st.orgs.insert(org.id.clone(), org.clone());
        let e = rules::tenancy_entry(
            actor,
            "org.create",
            json!({ "name": org.name, "status": org.status }),
        );
        st.audit(&org.id, org.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError> {
        Ok(self.lock().orgs.get(id).cloned())
    }

    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError> {
        let st = self.lock();
        Ok(st
            .orgs
            .values()
            .filter(|o| after.is_none_or(|a| &o.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn update_org(
        &self,
        id: &OrgId,
        name: Option<&str>,
        status: Option<OrgStatus>,
        actor: &Actor,
    ) -> Result<Org, StoreError> {
        let mut st = self.lock();
        let mut org = st.orgs.get(id).cloned().ok_or(StoreError::NotFound)?;
        if let Some(n) = name {
            st.check_org_name(n, id)?;
        }
        let detail = rules::update_org(&mut org, name, status);
        st.orgs.insert(id.clone(), org.clone());
        let e = rules::tenancy_entry(actor, "org.update", detail);
        st.audit(id, id.as_str(), e, Utc::now());
        Ok(org)
    }

    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        let org = st.orgs.get(id).cloned().ok_or(StoreError::NotFound)?;
        let projects = st.projects.values().filter(|p| &p.org_id == id).count();
        if projects > 0 {
            return Err(rules::org_has_projects(projects as u64));
        }
        st.orgs.remove(id);
        st.keys.retain(|_, k| &k.org_id != id);
        st.quotas.remove(&QuotaScope::Org(id.clone()).key());
        let e = rules::tenancy_entry(actor, "org.delete", json!({ "name": org.name }));
        st.audit(id, id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        if !st.orgs.contains_key(&project.org_id) {
            return Err(StoreError::NotFound);
        }
        if st.projects.contains_key(&project.id) {
            return Err(StoreError::AlreadyExists(format!("project {}", project.id)));
        }
        st.check_project_name(&project.org_id, &project.name, &project.id)?;
        st.projects.insert(project.id.clone(), project.clone());
        let e = rules::tenancy_entry(actor, "project.create", json!({ "name": project.name }));
        st.audit(&project.org_id, project.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError> {
        let st = self.lock();
        Ok(st
            .projects
            .values()
            .filter(|p| &p.org_id == org && after.is_none_or(|a| &p.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError> {
        let mut st = self.lock();
        let mut p = st.projects.get(id).cloned().ok_or(StoreError::NotFound)?;
        st.check_project_name(&p.org_id, name, id)?;
        let old = std::mem::replace(&mut p.name, name.to_owned());
        st.projects.insert(id.clone(), p.clone());
        let e = rules::tenancy_entry(
            actor,
            "project.rename",
            json!({ "old": old, "new": p.name }),
        );
        st.audit(&p.org_id, id.as_str(), e, Utc::now());
        Ok(p)
    }

    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        let p = st.projects.get(id).cloned().ok_or(StoreError::NotFound)?;
        let live = st
            .sandboxes
            .values()
            .filter(|r| &r.sandbox.project_id == id && !r.sandbox.status.is_final())
            .count();
        if live > 0 {
            return Err(rules::project_has_live_sandboxes(live as u64));
        }
        let before = st.sandboxes.len();
        st.sandboxes.retain(|_, r| &r.sandbox.project_id != id);
        let removed = before - st.sandboxes.len();
        st.projects.remove(id);
        st.keys.retain(|_, k| k.project_id.as_ref() != Some(id));
        st.quotas.remove(&QuotaScope::Project(id.clone()).key());
        let e = rules::tenancy_entry(
            actor,
            "project.delete",
            json!({ "name": p.name, "deletedSandboxes": removed }),
        );
        st.audit(&p.org_id, id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        if !st.orgs.contains_key(&key.org_id) {
            return Err(StoreError::NotFound);
        }
        if let Some(p) = &key.project_id {
            if st.projects.get(p).is_none_or(|p| p.org_id != key.org_id) {
                return Err(StoreError::NotFound);
            }
        }
        if st.keys.contains_key(&key.id) {
            return Err(StoreError::AlreadyExists(format!("key {}", key.id)));
        }
        st.keys.insert(key.id.clone(), key.clone());
        let e = rules::tenancy_entry(actor, "key.create", rules::key_detail(key));
        st.audit(&key.org_id, key.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        Ok(self.lock().keys.get(id).cloned())
    }

    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let st = self.lock();
        Ok(st
            .keys
            .values()
            .filter(|k| &k.org_id == org && after.is_none_or(|a| &k.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError> {
        let mut st = self.lock();
        let key = st.keys.get_mut(id).ok_or(StoreError::NotFound)?;
        if key.revoked_at.is_some() {
            return Ok(key.clone());
        }
        key.revoked_at = Some(at);
        let key = key.clone();
        let e = rules::tenancy_entry(actor, "key.revoke", json!({ "revokedAt": at }));
        st.audit(&key.org_id, id.as_str(), e, at);
        Ok(key)
    }

    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError> {
        let mut st = self.lock();
        let key = st.keys.get_mut(id).ok_or(StoreError::NotFound)?;
        key.last_used_at = Some(at);
        Ok(())
    }

    async fn get_quota(&self, scope: &QuotaScope) -> Result<Option<Quota>, StoreError> {
        Ok(self.lock().quotas.get(&scope.key()).copied())
    }

    async fn put_quota(
        &self,
        scope: &QuotaScope,
        quota: &Quota,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut st = self.lock();
        let org = st.scope_org(scope)?;
        let key = scope.key();
        let old = st.quotas.insert(key.clone(), *quota);
        let e = rules::tenancy_entry(actor, "quota.put", json!({ "old": old, "new": quota }));
        st.audit(&org, &key, e, Utc::now());
        Ok(())
    }

    async fn usage(&self, scope: &QuotaScope) -> Result<Usage, StoreError> {
        let st = self.lock();
        st.scope_org(scope)?;
        Ok(st.usage(scope))
    }

    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError> {
        let Admission {
            sandbox,
            request_hash,
            defaults,
            actor,
            request_id: _,
            direct,
        } = admission;
        accounting::check_admissible(&sandbox)?;
        let (activated, direct) = {
            let mut st = self.lock();
            if !st.orgs.contains_key(&sandbox.org_id) {
                return Err(StoreError::NotFound);
            }
            match st.projects.get(&sandbox.project_id) {
                Some(p) if p.org_id == sandbox.org_id => {}
                _ => return Err(StoreError::NotFound),
            }
            if let Some(key) = &sandbox.idempotency_key {
                let existing = st.sandboxes.values().find(|r| {
                    r.sandbox.project_id == sandbox.project_id
                        && r.sandbox.idempotency_key.as_ref() == Some(key)
                });
                if let Some(r) = existing {
                    return if r.request_hash == request_hash {
                        Ok(Admitted::Replayed(r.sandbox.clone()))
                    } else {
                        Err(StoreError::IdempotencyMismatch)
                    };
                }
            }
            let org_scope = QuotaScope::Org(sandbox.org_id.clone());
            let prj_scope = QuotaScope::Project(sandbox.project_id.clone());
            accounting::check_admission_limits(
                &sandbox,
                (
                    &st.usage(&org_scope),
                    &st.stored_quota(&org_scope).or(&defaults),
                ),
                (&st.usage(&prj_scope), &st.stored_quota(&prj_scope)),
            )?;
            if st.sandboxes.contains_key(&sandbox.id) {
                return Err(StoreError::Internal(format!(
                    "sandbox {} already exists",
                    sandbox.id
                )));
            }
            // Read before the insert: whether anything of the org already waits.
            let org_queued = st.usage(&org_scope).queued;
            let entry = rules::admit_entry(&sandbox, &actor);
            st.audit(
                &sandbox.org_id,
                sandbox.id.as_str(),
                entry,
                sandbox.created_at,
            );
            st.sandboxes.insert(
                sandbox.id.clone(),
                Row {
                    sandbox: sandbox.clone(),
                    request_hash,
                    next_attempt_at: sandbox.created_at,
                },
            );
            let direct = direct.filter(|d| d.applies() && org_queued == 0);
            let Some(direct) = direct else {
                return Ok(Admitted::New(sandbox));
            };
            let now = sandbox.created_at;
            let activated = activate_in(
                &mut st,
                &sandbox.id,
                &direct.pool,
                &defaults,
                now,
                rules::activate_direct,
            )?;
            (activated, direct)
        };
        match activated {
            Activation::Activated(active) => {
                crate::placement::PlacementStore::save_placement(
                    self,
                    &active.id,
                    &direct.explanation,
                )
                .await?;
                Ok(Admitted::New(active))
            }
            Activation::Waiting(waiting, _) | Activation::NotQueued(waiting) => {
                Ok(Admitted::New(waiting))
            }
        }
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.lock().sandboxes.get(id).map(|r| r.sandbox.clone()))
    }

    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, crate::SandboxBrief>, StoreError> {
        let st = self.lock();
        Ok(ids
            .iter()
            .filter_map(|id| {
                let s = &st.sandboxes.get(id)?.sandbox;
                let brief = crate::SandboxBrief {
                    org_id: s.org_id.clone(),
                    project_id: s.project_id.clone(),
                    status: s.status,
                };
                Some((id.clone(), brief))
            })
            .collect())
    }

    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let out = st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| filter.after.as_ref().is_none_or(|a| &s.id > a))
            .filter(|s| filter.org_id.as_ref().is_none_or(|o| &s.org_id == o))
            .filter(|s| {
                filter
                    .project_id
                    .as_ref()
                    .is_none_or(|p| &s.project_id == p)
            })
            .filter(|s| filter.status.is_none_or(|st| s.status == st))
            .filter(|s| {
                filter
                    .label
                    .as_ref()
                    .is_none_or(|(k, v)| s.spec.labels.get(k) == Some(v))
            })
            .take(accounting::effective_limit(filter.limit))
            .cloned()
            .collect();
        Ok(out)
    }

    async fn activate_explained(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        explanation: Option<&serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        let out = self.activate_locked(id, pool, quota, now)?;
        if let (Activation::Activated(_), Some(doc)) = (&out, explanation) {
            crate::placement::PlacementStore::save_placement(self, id, doc).await?;
        }
        Ok(out)
    }

    async fn mark_running(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        let mut sbx = row.sandbox.clone();
        let entry = rules::mark_running(&mut sbx, backend_ref, now)?;
        row.sandbox = sbx.clone();
        st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
        Ok(sbx)
    }

    async fn requeue(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let now = Utc::now();
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        let mut sbx = row.sandbox.clone();
        let entry = rules::requeue(&mut sbx, reason, not_before, now)?;
        row.sandbox = sbx.clone();
        row.next_attempt_at = not_before;
        st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
        Ok(sbx)
    }

    async fn transition_within_quota(
        &self,
        t: Transition,
        defaults: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        // Check and change under one hold of the state lock (the memory store's transaction).
        let mut st = self.lock();
        let current = st.row_mut(&t.id)?.sandbox.clone();
        if t.from.contains(&current.status) {
            let org_scope = QuotaScope::Org(current.org_id.clone());
            let prj_scope = QuotaScope::Project(current.project_id.clone());
            accounting::check_change_limits(
                &current,
                t.to,
                (
                    &st.usage(&org_scope),
                    &st.stored_quota(&org_scope).or(defaults),
                ),
                (&st.usage(&prj_scope), &st.stored_quota(&prj_scope)),
            )?;
        }
        transition_in(&mut st, &t, now)
    }

    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError> {
        transition_in(&mut self.lock(), &t, now)
    }

    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let now = Utc::now();
        let mut st = self.lock();
        let row = st.row_mut(id)?;
        if row.sandbox.status == SandboxStatus::Queued {
            accounting::wait(&mut row.sandbox, reason.to_owned(), now);
            row.next_attempt_at = not_before;
        }
        Ok(())
    }

    async fn runnable_queued(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        Ok(st
            .sandboxes
            .values()
            .filter(|r| r.sandbox.status == SandboxStatus::Queued && r.next_attempt_at <= now)
            .take(limit as usize)
            .map(|r| r.sandbox.clone())
            .collect())
    }

    async fn stale(
        &self,
        status: SandboxStatus,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .filter(|r| r.sandbox.status == status && r.sandbox.updated_at < before)
            .map(|r| r.sandbox.clone())
            .collect();
        out.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn expired(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Sandbox>, StoreError> {
        let st = self.lock();
        let mut out: Vec<Sandbox> = st
            .sandboxes
            .values()
            .filter(|r| {
                accounting::EXPIRABLE.contains(&r.sandbox.status)
                    && r.sandbox.expires_at.is_some_and(|e| e < now)
            })
            .map(|r| r.sandbox.clone())
            .collect();
        out.sort_by(|a, b| (a.expires_at, &a.id).cmp(&(b.expires_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError> {
        let st = self.lock();
        let mut out = HashMap::new();
        for r in st.sandboxes.values() {
            if r.sandbox.status.reserves_compute() {
                *out.entry(r.sandbox.org_id.clone()).or_insert(0) +=
                    u64::from(r.sandbox.spec.resources.cpu);
            }
        }
        Ok(out)
    }

    async fn reconcile_usage(&self) -> Result<Vec<crate::UsageDrift>, StoreError> {
        // Usage is derived from rows on every read: there is nothing to drift.
        Ok(Vec::new())
    }

    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        Ok(self.lock().audit.tail(limit as usize))
    }

    async fn try_lead(&self) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        if self
            .leader
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            Ok(Some(Box::new(MemoryLeadership {
                flag: self.leader.clone(),
            })))
        } else {
            Ok(None)
        }
    }
}

impl MemoryStore {
    /// `activate` under the one state lock (the memory store's transaction).
    fn activate_locked(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        activate_in(&mut self.lock(), id, pool, quota, now, rules::activate)
    }
}

/// An activation on the locked state; `activate` writes the row's change and its record.
fn activate_in(
    st: &mut State,
    id: &SandboxId,
    pool: &PoolSlot,
    quota: &Quota,
    now: DateTime<Utc>,
    activate: fn(&mut Sandbox, &PoolSlot, DateTime<Utc>) -> rules::AuditEntry,
) -> Result<Activation, StoreError> {
    let sbx = st.row_mut(id)?.sandbox.clone();
    if sbx.status != SandboxStatus::Queued {
        return Ok(Activation::NotQueued(sbx));
    }
    let org_scope = QuotaScope::Org(sbx.org_id.clone());
    let prj_scope = QuotaScope::Project(sbx.project_id.clone());
    let org_usage = st.usage(&org_scope);
    let org_quota = st.stored_quota(&org_scope).or(quota);
    let prj_usage = st.usage(&prj_scope);
    let prj_quota = st.stored_quota(&prj_scope);
    let pool_used = st
        .sandboxes
        .values()
        .filter(|r| {
            r.sandbox.pool.as_deref() == Some(pool.name.as_str())
                && r.sandbox.status.holds_pool_slot()
        })
        .count();
    let pool_used = u64::try_from(pool_used).unwrap_or(u64::MAX);
    let row = st.row_mut(id)?;
    let reason = accounting::waiting_reason(
        (&org_usage, &org_quota),
        (&prj_usage, &prj_quota),
        pool_used,
        &sbx,
        pool.cap(),
    );
    if let Some((wall, reason)) = reason {
        accounting::wait(&mut row.sandbox, reason, now);
        return Ok(Activation::Waiting(row.sandbox.clone(), wall));
    }
    let entry = activate(&mut row.sandbox, pool, now);
    let out = row.sandbox.clone();
    st.audit(&out.org_id, out.id.as_str(), entry, now);
    Ok(Activation::Activated(out))
}

/// `transition` on the locked state.
fn transition_in(
    st: &mut State,
    t: &Transition,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let row = st.row_mut(&t.id)?;
    let mut sbx = row.sandbox.clone();
    let entry = rules::transition(&mut sbx, t, now)?;
    row.sandbox = sbx.clone();
    if t.to == SandboxStatus::Queued {
        row.next_attempt_at = now;
    }
    st.audit(&sbx.org_id, sbx.id.as_str(), entry, now);
    Ok(sbx)
}
