//! The in-memory store: the same contract as Postgres behind one mutex, for `--dev` and tests.
//! State is per process, so run exactly one replica with it.
//!
//! The rules both stores share (how a status change mutates a `Sandbox`, when an activation
//! waits) live in [`rules`], so the two implementations cannot drift apart.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::ids::InstallationId;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};

use crate::{
    Activation, Admission, Admitted, AuditRecord, Leadership, Org, PoolSlot, Project, Quota,
    SandboxFilter, Store, StoreError, Transition,
};

/// Status-change rules shared by the memory and Postgres stores.
pub(crate) mod rules {
    use chrono::{DateTime, TimeDelta, Utc};
    use differently_core::status::can_transition;
    use differently_core::{Sandbox, SandboxStatus};
    use serde_json::json;

    use crate::{PoolSlot, Quota, StoreError, Transition};

    /// Statuses for which `pred` holds, in wire form: the single source for SQL `= ANY($n)`.
    pub(crate) fn statuses_where(pred: fn(SandboxStatus) -> bool) -> Vec<String> {
        SandboxStatus::ALL
            .into_iter()
            .filter(|s| pred(*s))
            .map(|s| s.as_str().to_owned())
            .collect()
    }

    /// Statuses the TTL sweep expires.
    pub(crate) const EXPIRABLE: [SandboxStatus; 3] = [
        SandboxStatus::Running,
        SandboxStatus::Paused,
        SandboxStatus::Stopped,
    ];

    /// An organization's usage derived from its rows.
    #[derive(Debug, Clone, Copy, Default)]
    pub(crate) struct Usage {
        pub active: u64,
        pub cpu: u64,
        pub memory_mib: u64,
        pub disk_gib: u64,
    }

    impl Usage {
        /// Adds one sandbox in its current status to the tally.
        pub(crate) fn add(&mut self, s: &Sandbox) {
            let r = s.spec.resources;
            if s.status.counts_active() {
                self.active += 1;
            }
            if s.status.reserves_compute() {
                self.cpu += u64::from(r.cpu);
                self.memory_mib += r.memory_mib;
            }
            if s.status.counts_disk() {
                self.disk_gib += r.disk_gib;
            }
        }
    }

    /// Why `sbx` cannot be activated now, or `None` if quota and pool cap leave room.
    /// `pool_used` is the number of rows holding a slot on the pool (only when capped).
    pub(crate) fn waiting_reason(
        usage: &Usage,
        pool_used: u64,
        sbx: &Sandbox,
        pool: &PoolSlot,
        quota: &Quota,
    ) -> Option<String> {
        let r = sbx.spec.resources;
        if let Some(max) = quota.max_active {
            if usage.active + 1 > u64::from(max) {
                return Some(format!("waiting: org active quota {}/{max}", usage.active));
            }
        }
        if let Some(max) = quota.max_cpu {
            if usage.cpu + u64::from(r.cpu) > max {
                return Some(format!("waiting: org cpu quota {}/{max}", usage.cpu));
            }
        }
        if let Some(max) = quota.max_memory_mib {
            if usage.memory_mib + r.memory_mib > max {
                return Some(format!(
                    "waiting: org memory quota {}/{max} MiB",
                    usage.memory_mib
                ));
            }
        }
        if let Some(max) = quota.max_disk_gib {
            if usage.disk_gib + r.disk_gib > max {
                return Some(format!(
                    "waiting: org disk quota {}/{max} GiB",
                    usage.disk_gib
                ));
            }
        }
        if let Some(max) = pool.max_concurrent {
            if pool_used + 1 > u64::from(max) {
                return Some(format!(
                    "waiting: pool {} full {pool_used}/{max}",
                    pool.name
                ));
            }
        }
        None
    }

    /// What a successful change writes to the audit log besides the row.
    pub(crate) struct AuditEntry {
        pub actor: String,
        pub action: String,
        pub detail: serde_json::Value,
    }

    /// `queued → provisioning` on `pool`.
    pub(crate) fn activate(sbx: &mut Sandbox, pool: &PoolSlot, now: DateTime<Utc>) -> AuditEntry {
        sbx.status = SandboxStatus::Provisioning;
        sbx.status_reason = None;
        sbx.status_version += 1;
        sbx.pool = Some(pool.name.clone());
        sbx.attempts = sbx.attempts.saturating_add(1);
        sbx.updated_at = now;
        AuditEntry {
            actor: crate::Actor::System("scheduler").as_audit(),
            action: "sandbox.activate".to_owned(),
            detail: json!({ "pool": pool.name, "attempts": sbx.attempts }),
        }
    }

    /// Records why a queued sandbox waits (not a status change: the version stays).
    pub(crate) fn wait(sbx: &mut Sandbox, reason: String, now: DateTime<Utc>) {
        sbx.status_reason = Some(reason);
        sbx.updated_at = now;
    }

    /// `provisioning → running`; conflict if the row is elsewhere.
    pub(crate) fn mark_running(
        sbx: &mut Sandbox,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<AuditEntry, StoreError> {
        if sbx.status != SandboxStatus::Provisioning {
            return Err(StoreError::StatusConflict {
                current: sbx.status,
            });
        }
        let ttl = i64::try_from(sbx.spec.ttl_seconds)
            .ok()
            .and_then(TimeDelta::try_seconds)
            .ok_or_else(|| {
                StoreError::Database(format!("ttl {} out of range", sbx.spec.ttl_seconds))
            })?;
        sbx.status = SandboxStatus::Running;
        sbx.status_reason = None;
        sbx.status_version += 1;
        sbx.backend_ref = Some(backend_ref.to_owned());
        sbx.started_at = Some(now);
        sbx.expires_at = now.checked_add_signed(ttl);
        sbx.updated_at = now;
        Ok(AuditEntry {
            actor: crate::Actor::System("worker").as_audit(),
            action: "sandbox.running".to_owned(),
            detail: json!({ "backendRef": backend_ref, "pool": sbx.pool }),
        })
    }

    /// `provisioning → queued`, clearing the pool; conflict if the row is elsewhere.
    pub(crate) fn requeue(
        sbx: &mut Sandbox,
        reason: &str,
        not_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<AuditEntry, StoreError> {
        if sbx.status != SandboxStatus::Provisioning {
            return Err(StoreError::StatusConflict {
                current: sbx.status,
            });
        }
        let from_pool = sbx.pool.take();
        sbx.status = SandboxStatus::Queued;
        sbx.status_reason = Some(reason.to_owned());
        sbx.status_version += 1;
        sbx.updated_at = now;
        Ok(AuditEntry {
            actor: crate::Actor::System("scheduler").as_audit(),
            action: "sandbox.requeue".to_owned(),
            detail: json!({ "reason": reason, "fromPool": from_pool, "notBefore": not_before }),
        })
    }

    /// Any other legal change: compare-and-set on `t.from`, then the state machine.
    pub(crate) fn transition(
        sbx: &mut Sandbox,
        t: &Transition,
        now: DateTime<Utc>,
    ) -> Result<AuditEntry, StoreError> {
        let current = sbx.status;
        if !t.from.contains(&current) {
            return Err(StoreError::StatusConflict { current });
        }
        if !can_transition(current, t.to) {
            return Err(StoreError::IllegalTransition {
                from: current,
                to: t.to,
            });
        }
        sbx.status = t.to;
        sbx.status_reason = t.reason.clone();
        sbx.status_version += 1;
        sbx.updated_at = now;
        if t.to == SandboxStatus::Queued {
            sbx.pool = None;
        }
        if t.to.is_final() {
            sbx.ended_at = Some(now);
        }
        Ok(AuditEntry {
            actor: t.actor.as_audit(),
            action: format!("sandbox.{}", t.to),
            detail: json!({ "from": current, "to": t.to, "reason": t.reason }),
        })
    }

    /// The audit entry of an admission.
    pub(crate) fn admit_entry(sbx: &Sandbox, actor: &crate::Actor) -> AuditEntry {
        AuditEntry {
            actor: actor.as_audit(),
            action: "sandbox.admit".to_owned(),
            detail: json!({
                "projectId": sbx.project_id,
                "idempotencyKey": sbx.idempotency_key,
                "resources": sbx.spec.resources,
            }),
        }
    }

    /// Admission refuses rows that are not new queued rows.
    pub(crate) fn check_admissible(sbx: &Sandbox) -> Result<(), StoreError> {
        if sbx.status != SandboxStatus::Queued {
            return Err(StoreError::StatusConflict {
                current: sbx.status,
            });
        }
        Ok(())
    }

    /// `SandboxFilter::limit` of 0 means "no limit".
    pub(crate) fn effective_limit(limit: u32) -> usize {
        if limit == 0 {
            usize::MAX
        } else {
            limit as usize
        }
    }
}

/// A stored sandbox with the fields that are not part of the `Sandbox` document.
#[derive(Debug, Clone)]
struct Row {
    sandbox: Sandbox,
    request_hash: String,
    next_attempt_at: DateTime<Utc>,
}

#[derive(Debug, Default)]
struct State {
    installation_id: Option<InstallationId>,
    orgs: HashMap<OrgId, Org>,
    projects: HashMap<ProjectId, Project>,
    /// Keyed by id, so iteration is id (admission) order.
    sandboxes: BTreeMap<SandboxId, Row>,
    audit: Vec<AuditRecord>,
}

impl State {
    fn audit(
        &mut self,
        org_id: &OrgId,
        resource: &SandboxId,
        e: rules::AuditEntry,
        at: DateTime<Utc>,
    ) {
        let seq = i64::try_from(self.audit.len()).unwrap_or(i64::MAX - 1) + 1;
        self.audit.push(AuditRecord {
            seq,
            org_id: Some(org_id.clone()),
            actor: e.actor,
            action: e.action,
            resource: resource.to_string(),
            at,
            detail: e.detail,
        });
    }

    fn row_mut(&mut self, id: &SandboxId) -> Result<&mut Row, StoreError> {
        self.sandboxes.get_mut(id).ok_or(StoreError::NotFound)
    }
}

/// In-memory `Store`: one `std::sync::Mutex` over plain collections, never held across an
/// await. Leadership is exclusive within the process.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    leader: Arc<AtomicBool>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave half a change behind (every method
        // validates before mutating), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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

    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError> {
        let Admission {
            sandbox,
            request_hash,
            max_queued,
            actor,
        } = admission;
        rules::check_admissible(&sandbox)?;
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
        if let Some(max) = max_queued {
            let queued = st
                .sandboxes
                .values()
                .filter(|r| {
                    r.sandbox.org_id == sandbox.org_id && r.sandbox.status == SandboxStatus::Queued
                })
                .count();
            if queued >= max as usize {
                return Err(StoreError::QuotaExceeded(format!(
                    "org queued limit {max} reached"
                )));
            }
        }
        if st.sandboxes.contains_key(&sandbox.id) {
            return Err(StoreError::Database(format!(
                "sandbox {} already exists",
                sandbox.id
            )));
        }
        let entry = rules::admit_entry(&sandbox, &actor);
        st.audit(&sandbox.org_id, &sandbox.id, entry, sandbox.created_at);
        st.sandboxes.insert(
            sandbox.id.clone(),
            Row {
                sandbox: sandbox.clone(),
                request_hash,
                next_attempt_at: sandbox.created_at,
            },
        );
        Ok(Admitted::New(sandbox))
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        Ok(self.lock().sandboxes.get(id).map(|r| r.sandbox.clone()))
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
            .take(rules::effective_limit(filter.limit))
            .cloned()
            .collect();
        Ok(out)
    }

    async fn activate(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        let mut st = self.lock();
        let sbx = st.row_mut(id)?.sandbox.clone();
        if sbx.status != SandboxStatus::Queued {
            return Ok(Activation::NotQueued(sbx));
        }
        let mut usage = rules::Usage::default();
        let mut pool_used = 0u64;
        for r in st.sandboxes.values() {
            if r.sandbox.org_id == sbx.org_id {
                usage.add(&r.sandbox);
            }
            if r.sandbox.pool.as_deref() == Some(pool.name.as_str())
                && r.sandbox.status.holds_pool_slot()
            {
                pool_used += 1;
            }
        }
        let row = st.row_mut(id)?;
        if let Some(reason) = rules::waiting_reason(&usage, pool_used, &sbx, pool, quota) {
            rules::wait(&mut row.sandbox, reason, now);
            return Ok(Activation::Waiting(row.sandbox.clone()));
        }
        let entry = rules::activate(&mut row.sandbox, pool, now);
        let out = row.sandbox.clone();
        st.audit(&out.org_id, &out.id, entry, now);
        Ok(Activation::Activated(out))
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
        st.audit(&sbx.org_id, &sbx.id, entry, now);
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
        st.audit(&sbx.org_id, &sbx.id, entry, now);
        Ok(sbx)
    }

    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError> {
        let mut st = self.lock();
        let row = st.row_mut(&t.id)?;
        let mut sbx = row.sandbox.clone();
        let entry = rules::transition(&mut sbx, &t, now)?;
        row.sandbox = sbx.clone();
        if t.to == SandboxStatus::Queued {
            row.next_attempt_at = now;
        }
        st.audit(&sbx.org_id, &sbx.id, entry, now);
        Ok(sbx)
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
            rules::wait(&mut row.sandbox, reason.to_owned(), now);
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
                rules::EXPIRABLE.contains(&r.sandbox.status)
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

    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let st = self.lock();
        let skip = st.audit.len().saturating_sub(limit as usize);
        Ok(st.audit[skip..].to_vec())
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
