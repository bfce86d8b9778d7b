//! Group commit of admissions, per organization.
//!
//! Admissions of one org serialize on its row in the store, so concurrent creates of an org
//! would each wait for the previous one's transaction. Instead each org has a lane here: a
//! create joins its org's lane, and one task per busy lane admits whatever has gathered
//! while the previous group was committing (`Store::admit_many`: one transaction per group).
//! Nothing waits for a timer: a create that finds its lane idle is admitted at once, alone;
//! under load the groups grow by themselves, up to `MAX_GROUP`.
//!
//! The request that submitted an admission only waits for its outcome. If it goes away (the
//! client disconnected), the admission still commits with its group and is published by the
//! scheduler's repair pass, like any admission whose publish was lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use differently_core::OrgId;
use differently_store::{Admission, Admitted, Store, StoreError};
use tokio::sync::oneshot;

/// Most admissions decided in one transaction.
pub const MAX_GROUP: usize = 64;

type Reply = oneshot::Sender<Result<Admitted, StoreError>>;
/// Admissions waiting in an organization's lane, with where their outcomes go.
type Waiting = Vec<(Admission, Reply)>;

/// Lanes of the organizations with admissions in flight.
#[derive(Clone, Default)]
pub struct AdmissionQueue {
    lanes: Arc<Mutex<HashMap<OrgId, Waiting>>>,
}

impl AdmissionQueue {
    /// Admits `admission` with whatever else its organization has waiting.
    pub async fn admit(
        &self,
        store: &Arc<dyn Store>,
        admission: Admission,
    ) -> Result<Admitted, StoreError> {
        let (tx, rx) = oneshot::channel();
        let org = admission.sandbox.org_id.clone();
        let start_lane = {
            let mut lanes = self.lock();
            match lanes.get_mut(&org) {
                // A lane task exists and will take this with its next group.
                Some(waiting) => {
                    waiting.push((admission, tx));
                    false
                }
                None => {
                    lanes.insert(org.clone(), vec![(admission, tx)]);
                    true
                }
            }
        };
        if start_lane {
            tokio::spawn(Lane::new(self.clone(), store.clone(), org).run());
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the admission group stopped before deciding".into(),
            ))
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<OrgId, Waiting>> {
        // Nothing panics while holding the lock; a poisoned map is still consistent.
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the next group of `org`, or removes the lane when nothing is waiting.
    fn next_group(&self, org: &OrgId) -> Waiting {
        let mut lanes = self.lock();
        let Some(waiting) = lanes.get_mut(org) else {
            return Vec::new();
        };
        if waiting.is_empty() {
            lanes.remove(org);
            return Vec::new();
        }
        let n = waiting.len().min(MAX_GROUP);
        waiting.drain(..n).collect()
    }
}

/// The task that drains one organization's lane.
struct Lane {
    queue: AdmissionQueue,
    store: Arc<dyn Store>,
    org: OrgId,
    /// Cleared when the lane ends normally; still set if the task unwinds.
    armed: bool,
}

impl Lane {
    fn new(queue: AdmissionQueue, store: Arc<dyn Store>, org: OrgId) -> Lane {
        Lane {
            queue,
            store,
            org,
            armed: true,
        }
    }

    async fn run(mut self) {
        loop {
            let group = self.queue.next_group(&self.org);
            if group.is_empty() {
                self.armed = false;
                return;
            }
            metrics::histogram!("differently_admission_group_size").record(group.len() as f64);
            let (admissions, replies): (Vec<_>, Vec<_>) = group.into_iter().unzip();
            let outcomes = self.store.admit_many(admissions).await;
            let mut outcomes = outcomes.into_iter();
            for reply in replies {
                let outcome = outcomes
                    .next()
                    .unwrap_or_else(|| Err(StoreError::Database("admission not decided".into())));
                // A requester that went away does not undo a committed admission.
                let _ = reply.send(outcome);
            }
        }
    }
}

impl Drop for Lane {
    /// A lane task that panicked must not leave its org's lane marked busy with nobody
    /// draining it: the waiting admissions get an error and the lane is removed.
    fn drop(&mut self) {
        if self.armed {
            let waiting = self.queue.lock().remove(&self.org);
            tracing::error!(org = %self.org, waiting = waiting.map_or(0, |w| w.len()),
                "admission lane stopped unexpectedly");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tenant;
    use chrono::Utc;
    use differently_core::{CreateSandboxRequest, ProjectId, Sandbox, SandboxSpec};
    use differently_store::memory::MemoryStore;
    use differently_store::{Actor, Quota};

    fn admission(org: &OrgId, prj: &ProjectId, max_queued: u32) -> Admission {
        let spec = SandboxSpec::build(&CreateSandboxRequest::default()).expect("spec");
        Admission {
            sandbox: Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now()),
            request_hash: "h".into(),
            defaults: Quota {
                max_queued: Some(max_queued),
                ..Default::default()
            },
            actor: Actor::Key("key_t".into()),
            request_id: None,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_admissions_each_get_their_own_outcome_and_lanes_close() {
        let mem = MemoryStore::new();
        let store: Arc<dyn Store> = Arc::new(mem.clone());
        let (a, pa) = tenant(&mem).await;
        let (b, pb) = tenant(&mem).await;
        let queue = AdmissionQueue::default();
        let mut tasks = Vec::new();
        for i in 0..200 {
            let (queue, store) = (queue.clone(), store.clone());
            let adm = if i % 2 == 0 {
                admission(&a, &pa, 60)
            } else {
                admission(&b, &pb, 1000)
            };
            let id = adm.sandbox.id.clone();
            tasks.push(tokio::spawn(
                async move { (id, queue.admit(&store, adm).await) },
            ));
        }
        let (mut new_a, mut refused_a, mut new_b) = (0, 0, 0);
        for t in tasks {
            let (id, outcome) = t.await.expect("task");
            match outcome {
                Ok(Admitted::New(s)) => {
                    assert_eq!(s.id, id, "each requester gets its own sandbox back");
                    if s.org_id == a {
                        new_a += 1
                    } else {
                        new_b += 1
                    }
                }
                Err(StoreError::QuotaExceeded(_)) => refused_a += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((new_a, refused_a, new_b), (60, 40, 100));
        assert!(queue.lock().is_empty(), "idle lanes are removed");
    }
}
