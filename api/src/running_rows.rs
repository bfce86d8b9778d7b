//! Rows of running sandboxes that data-plane calls (exec, streamed exec, files) read recently, so
//! the next call on the same sandbox skips the read.
//!
//! Why it is safe: such a call's audit record is appended only if the row is still at the
//! remembered status and version, checked in the append's own statement
//! (`AuditStore::append_audit_if`), and the call runs only once its record is written. A
//! stale entry (its change event not seen yet) therefore costs a fallback read, never a call
//! on a row that moved. Entries are dropped on every status event of their sandbox
//! (`EventHub::deliver`) and trusted for a few seconds at most.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use differently_core::{Sandbox, SandboxId, SandboxStatus};

/// How long an entry is used without a read (its events normally drop it much sooner).
const FRESH_FOR: Duration = Duration::from_secs(5);
/// Entries kept at most; a process busier than that starts over rather than grow.
const MAX_ROWS: usize = 10_000;

/// The remembered rows of one API process.
#[derive(Debug, Default)]
pub struct RunningRows(Mutex<HashMap<SandboxId, (Instant, Sandbox)>>);

impl RunningRows {
    /// The remembered row of `id`, if fresh.
    pub fn get(&self, id: &SandboxId) -> Option<Sandbox> {
        let rows = self.lock();
        rows.get(id)
            .filter(|(at, _)| at.elapsed() < FRESH_FOR)
            .map(|(_, s)| s.clone())
    }

    /// Remembers `s` if it is running (only running rows serve data-plane calls).
    pub fn remember(&self, s: &Sandbox) {
        if s.status != SandboxStatus::Running {
            return;
        }
        let mut rows = self.lock();
        if rows.len() >= MAX_ROWS && !rows.contains_key(&s.id) {
            rows.clear();
        }
        rows.insert(s.id.clone(), (Instant::now(), s.clone()));
    }

    /// Forgets `id` (its row changed).
    pub fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (Instant, Sandbox)>> {
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
        s
    }

    #[test]
    fn only_running_rows_are_remembered_until_forgotten() {
        let rows = RunningRows::default();
        let queued = sandbox(SandboxStatus::Queued);
        rows.remember(&queued);
        assert_eq!(rows.get(&queued.id), None);
        let running = sandbox(SandboxStatus::Running);
        rows.remember(&running);
        assert_eq!(rows.get(&running.id), Some(running.clone()));
        rows.forget(&running.id);
        assert_eq!(rows.get(&running.id), None);
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
