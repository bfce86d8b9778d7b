//! Rows of running sandboxes that data-plane calls (exec, streamed exec, files) read recently, so
//! the next call on the same sandbox skips the read. A status event that starts a sandbox
//! someone in this process is waiting on is remembered too (`EventHub::deliver`): the usual
//! client waits for running and then execs, and that first exec needs no read either.
//!
//! Why it is safe: such a call's audit record is appended only if the row is still at the
//! remembered status and version, checked in the append's own statement
//! (`AuditStore::append_audit_if`), and the call runs only once its record is written. A
//! stale entry (its change event not seen yet) therefore costs a fallback read, never a call
//! on a row that moved. Entries are dropped on every other status event of their sandbox
//! and trusted for a few seconds at most.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};

/// How long an entry is used without a read (its events normally drop it much sooner).
const FRESH_FOR: Duration = Duration::from_secs(5);
/// Entries kept at most; a process busier than that starts over rather than grow.
const MAX_ROWS: usize = 10_000;

/// What a data-plane call needs of a running row: whose it is, where it runs, and the
/// version its audit append is guarded on. Small, and free of the spec, so it can come from a
/// status event as well as from a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningRow {
    pub id: SandboxId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub pool: String,
    pub backend_ref: String,
    pub status_version: i64,
    /// What every call must add to its own env: the sandbox's env when it runs on a claimed
    /// warm instance (created without it), else nothing (`Some` of an empty map: the backend
    /// has it from the create). `None`: the row is warm but came from an event, which never
    /// carries env values, so a call must read the row ([`RunningRows::get`] skips it).
    pub env: Option<Arc<BTreeMap<String, String>>>,
}

impl RunningRow {
    /// The row of `s` if it is running on an instance (only such rows serve data-plane calls).
    pub fn of(s: &Sandbox) -> Option<RunningRow> {
        if s.status != SandboxStatus::Running {
            return None;
        }
        Some(RunningRow {
            id: s.id.clone(),
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            pool: s.pool.clone()?,
            backend_ref: s.backend_ref.clone()?,
            status_version: s.status_version,
            env: Some(Arc::new(call_env_of(s))),
        })
    }
}

/// What a data-plane call on `s` must add to its own env: the sandbox's env if its instance
/// was claimed warm (created before the sandbox, with none), else nothing.
pub fn call_env_of(s: &Sandbox) -> BTreeMap<String, String> {
    if s.warm_class.is_some() {
        s.spec.env.clone()
    } else {
        BTreeMap::new()
    }
}

/// `call`'s env over the sandbox's `base` (the call's own keys win).
pub fn merged_env(
    base: &BTreeMap<String, String>,
    call: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    if base.is_empty() {
        return call;
    }
    let mut env = base.clone();
    env.extend(call);
    env
}

/// The remembered rows of one API process.
#[derive(Debug, Default)]
pub struct RunningRows(Mutex<HashMap<SandboxId, (Instant, RunningRow)>>);

impl RunningRows {
    /// The remembered row of `id`, if fresh and complete (a warm row from an event lacks
    /// the env its calls need).
    pub fn get(&self, id: &SandboxId) -> Option<RunningRow> {
        let rows = self.lock();
        rows.get(id)
            .filter(|(at, r)| at.elapsed() < FRESH_FOR && r.env.is_some())
            .map(|(_, r)| r.clone())
    }

    /// Remembers `s` if it is running on an instance.
    pub fn remember(&self, s: &Sandbox) {
        if let Some(row) = RunningRow::of(s) {
            self.remember_row(row);
        }
    }

    /// Remembers `row`.
    pub fn remember_row(&self, row: RunningRow) {
        let mut rows = self.lock();
        if rows.len() >= MAX_ROWS && !rows.contains_key(&row.id) {
            rows.clear();
        }
        rows.insert(row.id.clone(), (Instant::now(), row));
    }

    /// Forgets `id` (its row changed).
    pub fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (Instant, RunningRow)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use differently_core::{CreateSandboxRequest, OrgId, ProjectId, SandboxSpec};

    fn sandbox(status: SandboxStatus) -> Sandbox {
        let mut s = Sandbox::queued(
            OrgId::new(),
            ProjectId::new(),
            SandboxSpec::build(&CreateSandboxRequest::default()).expect("spec"),
            None,
            Utc::now(),
        );
        s.status = status;
        s.pool = Some("fake".into());
        s.backend_ref = Some("ref-1".into());
        s
    }

    #[test]
    fn a_warm_rows_calls_carry_its_env_and_a_cold_rows_nothing() {
        let mut cold = sandbox(SandboxStatus::Running);
        cold.spec.env.insert("TOKEN".into(), "cold".into());
        let cold_row = RunningRow::of(&cold).expect("running");
        assert_eq!(
            cold_row.env.as_deref(),
            Some(&BTreeMap::new()),
            "the backend has it"
        );
        let mut warm = cold.clone();
        warm.id = SandboxId::new();
        warm.warm_class = Some("small".into());
        let warm_row = RunningRow::of(&warm).expect("running");
        assert_eq!(
            warm_row.env.as_deref().and_then(|e| e.get("TOKEN")),
            Some(&"cold".to_owned())
        );
        // The call's own keys win over the sandbox's.
        let call = BTreeMap::from([("TOKEN".to_owned(), "call".to_owned())]);
        let base = warm_row.env.clone().expect("known");
        assert_eq!(merged_env(&base, call.clone())["TOKEN"], "call");
        let other = BTreeMap::from([("OTHER".to_owned(), "x".to_owned())]);
        let both = merged_env(&base, other);
        assert_eq!(
            (both["TOKEN"].as_str(), both["OTHER"].as_str()),
            ("cold", "x")
        );
    }

    #[test]
    fn a_warm_row_from_an_event_is_not_served_without_a_read() {
        let rows = RunningRows::default();
        let warm = sandbox(SandboxStatus::Running);
        let mut from_event = RunningRow::of(&warm).expect("running");
        from_event.env = None;
        rows.remember_row(from_event);
        assert_eq!(rows.get(&warm.id), None, "its env is not known");
        rows.remember(&warm);
        assert!(rows.get(&warm.id).is_some(), "a read made it whole");
    }

    #[test]
    fn only_running_rows_are_remembered_until_forgotten() {
        let rows = RunningRows::default();
        let queued = sandbox(SandboxStatus::Queued);
        rows.remember(&queued);
        assert_eq!(rows.get(&queued.id), None);
        let running = sandbox(SandboxStatus::Running);
        rows.remember(&running);
        assert_eq!(rows.get(&running.id), RunningRow::of(&running));
        assert_eq!(
            rows.get(&running.id).map(|r| r.backend_ref),
            Some("ref-1".into())
        );
        rows.forget(&running.id);
        assert_eq!(rows.get(&running.id), None);
    }

    #[test]
    fn a_running_row_without_an_instance_is_not_remembered() {
        let rows = RunningRows::default();
        let mut s = sandbox(SandboxStatus::Running);
        s.backend_ref = None;
        rows.remember(&s);
        assert_eq!(rows.get(&s.id), None);
    }

    #[test]
    fn a_full_cache_starts_over() {
        let rows = RunningRows::default();
        let first = sandbox(SandboxStatus::Running);
        rows.remember(&first);
        for _ in 1..MAX_ROWS {
            rows.remember(&sandbox(SandboxStatus::Running));
        }
        assert!(rows.get(&first.id).is_some());
        let last = sandbox(SandboxStatus::Running);
        rows.remember(&last);
        assert_eq!(rows.get(&first.id), None);
        assert!(rows.get(&last.id).is_some());
    }
}
