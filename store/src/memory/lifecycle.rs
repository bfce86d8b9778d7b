//! `LifecycleStore` on the in-memory store: the same rules as Postgres behind one mutex.

use std::collections::{BTreeMap, HashMap};
use std::sync::MutexGuard;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde_json::Value;

use crate::lifecycle::{
    is_idle, LifecycleStore, OpBegun, OpError, OpRecord, OpState, SnapshotRecord, ON_BACKEND,
};
use crate::memory::MemoryStore;
use crate::shared::storable;
use crate::StoreError;

/// Lifecycle state of a `MemoryStore`.
#[derive(Debug, Default)]
pub(crate) struct LifecycleState {
    ops: BTreeMap<OpId, OpRecord>,
    snapshots: BTreeMap<SnapshotId, SnapshotRecord>,
    activity: HashMap<SandboxId, DateTime<Utc>>,
}

impl MemoryStore {
    /// How many snapshots project `id` has (the caller may hold the state lock: lifecycle
    /// is always taken after it).
    pub(crate) fn snapshots_of_project(&self, id: &ProjectId) -> u64 {
        let n = self
            .lifecycle()
            .snapshots
            .values()
            .filter(|s| &s.project_id == id)
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    fn lifecycle(&self) -> MutexGuard<'_, LifecycleState> {
        self.lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl LifecycleStore for MemoryStore {
    async fn begin_op(&self, op: &OpRecord) -> Result<OpBegun, StoreError> {
        let mut st = self.lifecycle();
        if op.exclusive {
            let pending = st.ops.values().find(|o| {
                o.sandbox_id == op.sandbox_id && o.exclusive && o.state == OpState::Pending
            });
            if let Some(p) = pending {
                return Ok(if p.kind == op.kind && p.args == op.args {
                    OpBegun::Joined(p.clone())
                } else {
                    OpBegun::Busy(p.clone())
                });
            }
        }
        st.ops.insert(op.id.clone(), op.clone());
        Ok(OpBegun::New(op.clone()))
    }

    async fn get_op(&self, id: &OpId) -> Result<Option<OpRecord>, StoreError> {
        Ok(self.lifecycle().ops.get(id).cloned())
    }

    async fn finish_op(
        &self,
        id: &OpId,
        state: OpState,
        result: Value,
        error: Option<OpError>,
        now: DateTime<Utc>,
    ) -> Result<OpRecord, StoreError> {
        let mut st = self.lifecycle();
        let op = st.ops.get_mut(id).ok_or(StoreError::NotFound)?;
        if op.state == OpState::Pending {
            op.state = state;
            op.result = result;
            op.error = error;
            op.updated_at = now;
        }
        Ok(op.clone())
    }

    async fn pending_ops(
        &self,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<OpRecord>, StoreError> {
        let st = self.lifecycle();
        let mut out: Vec<OpRecord> = st
            .ops
            .values()
            .filter(|o| o.state == OpState::Pending && o.updated_at < before)
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.updated_at, &a.id).cmp(&(b.updated_at, &b.id)));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        storable::snapshot(s)?;
        // Held across the insert, so a concurrent project delete either sees this snapshot
        // or has already removed the project (then this is `NotFound`), as on Postgres.
        let state = self.lock();
        if state
            .projects
            .get(&s.project_id)
            .is_none_or(|p| p.org_id != s.org_id)
        {
            return Err(StoreError::NotFound);
        }
        let mut st = self.lifecycle();
        if st.snapshots.contains_key(&s.id) {
            return Err(StoreError::AlreadyExists(format!("snapshot {}", s.id)));
        }
        st.snapshots.insert(s.id.clone(), s.clone());
        Ok(())
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> Result<Option<SnapshotRecord>, StoreError> {
        Ok(self.lifecycle().snapshots.get(id).cloned())
    }

    async fn list_snapshots(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let st = self.lifecycle();
        Ok(st
            .snapshots
            .values()
            .filter(|s| &s.org_id == org)
            .filter(|s| project.is_none_or(|p| &s.project_id == p))
            .filter(|s| after.is_none_or(|a| &s.id > a))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn list_sandbox_snapshots(
        &self,
        sandbox: &SandboxId,
        after: Option<&SnapshotId>,
        limit: u32,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let st = self.lifecycle();
        Ok(st
            .snapshots
            .values()
            .filter(|s| &s.sandbox_id == sandbox)
            .filter(|s| after.is_none_or(|a| &s.id > a))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn update_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        storable::snapshot(s)?;
        let mut st = self.lifecycle();
        let slot = st.snapshots.get_mut(&s.id).ok_or(StoreError::NotFound)?;
        *slot = s.clone();
        Ok(())
    }

    async fn remove_snapshot(&self, id: &SnapshotId) -> Result<(), StoreError> {
        self.lifecycle().snapshots.remove(id);
        Ok(())
    }

    async fn touch_activity(&self, id: &SandboxId, at: DateTime<Utc>) -> Result<(), StoreError> {
        let mut st = self.lifecycle();
        let slot = st.activity.entry(id.clone()).or_insert(at);
        *slot = (*slot).max(at);
        Ok(())
    }

    async fn last_activity(&self, id: &SandboxId) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.lifecycle().activity.get(id).copied())
    }

    async fn idle_candidates(
        &self,
        now: DateTime<Utc>,
        default_idle_seconds: Option<u64>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let activity = self.lifecycle().activity.clone();
        let st = self.lock();
        Ok(st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| s.status == SandboxStatus::Running)
            .filter(|s| is_idle(s, activity.get(&s.id).copied(), now, default_idle_seconds))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn live_not_listed(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[SandboxId],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let listed: std::collections::HashSet<&SandboxId> = listed.iter().collect();
        let st = self.lock();
        Ok(st
            .sandboxes
            .values()
            .map(|r| &r.sandbox)
            .filter(|s| s.pool.as_deref() == Some(pool) && s.updated_at < before)
            .filter(|s| ON_BACKEND.contains(&s.status))
            .filter(|s| !listed.contains(&s.id))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn drifted(
        &self,
        pool: &str,
        before: DateTime<Utc>,
        listed: &[(SandboxId, SandboxStatus)],
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let busy: std::collections::HashSet<SandboxId> = self
            .lifecycle()
            .ops
            .values()
            .filter(|o| o.state == OpState::Pending)
            .map(|o| o.sandbox_id.clone())
            .collect();
        let st = self.lock();
        let mut out: Vec<Sandbox> = listed
            .iter()
            .filter_map(|(id, listed)| {
                let s = &st.sandboxes.get(id)?.sandbox;
                (s.status != *listed).then_some(s)
            })
            .filter(|s| s.pool.as_deref() == Some(pool) && s.updated_at < before)
            .filter(|s| ON_BACKEND.contains(&s.status))
            .filter(|s| !busy.contains(&s.id))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn update_spec(
        &self,
        id: &SandboxId,
        labels: Option<std::collections::BTreeMap<String, String>>,
        idle_timeout_seconds: Option<Option<u64>>,
    ) -> Result<Sandbox, StoreError> {
        differently_core::accounting::check_storable_labels(labels.as_ref())?;
        let mut st = self.lock();
        let row = st.sandboxes.get_mut(id).ok_or(StoreError::NotFound)?;
        differently_core::accounting::apply_spec_update(
            &mut row.sandbox,
            labels,
            idle_timeout_seconds,
        );
        Ok(row.sandbox.clone())
    }

    async fn renew_ttl(
        &self,
        id: &SandboxId,
        ttl_seconds: u64,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let mut st = self.lock();
        let row = st.sandboxes.get_mut(id).ok_or(StoreError::NotFound)?;
        differently_core::accounting::apply_ttl(&mut row.sandbox, ttl_seconds, now);
        Ok(row.sandbox.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use differently_core::{CreateSandboxRequest, SandboxSpec};
    use serde_json::json;

    fn sandbox(idle: Option<u64>, updated_secs_ago: i64) -> Sandbox {
        let spec = SandboxSpec::build(&CreateSandboxRequest {
            idle_timeout_seconds: idle,
            ..CreateSandboxRequest::default()
        })
        .expect("spec");
        let mut s = Sandbox::queued(OrgId::new(), ProjectId::new(), spec, None, Utc::now());
        s.status = SandboxStatus::Running;
        s.updated_at = Utc::now() - chrono::Duration::seconds(updated_secs_ago);
        s
    }

    #[tokio::test]
    async fn one_exclusive_op_per_sandbox_and_first_outcome_wins() {
        let store = MemoryStore::new();
        let s = sandbox(None, 0);
        let now = Utc::now();
        let pause = OpRecord::new(&s, "pause", true, json!({}), "key:k".into(), now);
        assert!(matches!(store.begin_op(&pause).await, Ok(OpBegun::New(_))));
        let again = OpRecord::new(&s, "pause", true, json!({}), "key:k".into(), now);
        assert!(matches!(store.begin_op(&again).await, Ok(OpBegun::Joined(o)) if o.id == pause.id));
        let stop = OpRecord::new(&s, "stop", true, json!({}), "key:k".into(), now);
        assert!(matches!(store.begin_op(&stop).await, Ok(OpBegun::Busy(o)) if o.id == pause.id));
        let port = OpRecord::new(&s, "exposeport", false, json!({}), "key:k".into(), now);
        assert!(matches!(store.begin_op(&port).await, Ok(OpBegun::New(_))));
        let done = store
            .finish_op(&pause.id, OpState::Done, json!(1), None, now)
            .await
            .expect("finish");
        assert_eq!(done.state, OpState::Done);
        let again = store
            .finish_op(&pause.id, OpState::Failed, json!(2), None, now)
            .await
            .expect("finish again");
        assert_eq!((again.state, again.result), (OpState::Done, json!(1)));
        assert!(matches!(store.begin_op(&stop).await, Ok(OpBegun::New(_))));
    }

    #[test]
    fn idle_never_panics_for_any_stored_timeout_or_time() {
        let extremes = [
            None,
            Some(1),
            Some(9_223_372_036_854_775),
            Some(9_223_372_036_854_776),
            Some(10_000_000_000_000_000),
            Some(i64::MAX as u64),
            Some(u64::MAX),
        ];
        let times = [
            Utc::now(),
            DateTime::<Utc>::MAX_UTC,
            DateTime::<Utc>::MIN_UTC,
        ];
        for idle in extremes {
            for default in extremes {
                for updated in times {
                    for now in times {
                        let mut s = sandbox(None, 0);
                        s.spec.idle_timeout_seconds = idle;
                        s.updated_at = updated;
                        let _ = is_idle(&s, Some(now), now, default);
                    }
                }
            }
        }
        let mut s = sandbox(None, 0);
        s.spec.idle_timeout_seconds = Some(u64::MAX);
        s.updated_at = DateTime::<Utc>::MIN_UTC;
        assert!(!is_idle(&s, None, DateTime::<Utc>::MAX_UTC, None), "never");
    }

    #[test]
    fn idle_counts_from_the_later_of_activity_and_status_change() {
        let now = Utc::now();
        assert!(is_idle(&sandbox(Some(10), 60), None, now, None));
        assert!(!is_idle(&sandbox(Some(10), 5), None, now, None));
        let recent = Some(now - chrono::Duration::seconds(3));
        assert!(!is_idle(&sandbox(Some(10), 60), recent, now, None));
        assert!(
            !is_idle(&sandbox(None, 600), None, now, None),
            "no timeout, no idling"
        );
        assert!(
            is_idle(&sandbox(None, 600), None, now, Some(300)),
            "the default applies"
        );
    }
}
