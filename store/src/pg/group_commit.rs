//! Group commit: work that arrives while the previous batch of its kind is committing joins
//! the next batch, so one transaction serves many callers.
//!
//! Each key (an organization for admissions, one key for all status changes) has a lane.
//! A job that finds its lane idle starts the lane's task, which runs batches of at most
//! `max` jobs until the lane is empty, and then removes it. Nothing waits for a timer: a
//! lone job is a batch of one; under load batches grow by themselves. Jobs carry their own
//! reply channels; the batch function answers them.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

/// The lanes of one kind of work.
pub(crate) struct Lanes<K, J> {
    waiting: Mutex<HashMap<K, Vec<J>>>,
}

impl<K, J> Default for Lanes<K, J> {
    fn default() -> Self {
        Lanes {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl<K, J> std::fmt::Debug for Lanes<K, J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lanes")
    }
}

impl<K, J> Lanes<K, J>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    J: Send + 'static,
{
    /// Adds `job` to `key`'s lane; if the lane was idle, starts its task, which calls
    /// `batch` with up to `max` jobs at a time, in arrival order, until the lane is empty.
    pub(crate) fn push<F, Fut>(self: &Arc<Self>, key: K, job: J, max: usize, batch: F)
    where
        F: Fn(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let start = {
            let mut lanes = self.lock();
            match lanes.get_mut(&key) {
                Some(waiting) => {
                    waiting.push(job);
                    false
                }
                None => {
                    lanes.insert(key.clone(), vec![job]);
                    true
                }
            }
        };
        if start {
            let drain = Drain {
                lanes: self.clone(),
                key,
                armed: true,
            };
            tokio::spawn(drain.run(max.max(1), batch));
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Vec<J>>> {
        // Nothing panics while holding the lock; a poisoned map is still consistent.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch of `key`, or `None` after removing the lane when nothing waits.
    fn next(&self, key: &K, max: usize) -> Option<Vec<J>> {
        let mut lanes = self.lock();
        let waiting = lanes.get_mut(key)?;
        if waiting.is_empty() {
            lanes.remove(key);
            return None;
        }
        let n = waiting.len().min(max);
        Some(waiting.drain(..n).collect())
    }
}

/// The task that drains one lane.
struct Drain<K: Hash + Eq, J> {
    lanes: Arc<Lanes<K, J>>,
    key: K,
    /// Cleared when the lane ends normally; still set if the task unwinds or is dropped.
    armed: bool,
}

impl<K, J> Drain<K, J>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    J: Send + 'static,
{
    async fn run<F, Fut>(mut self, max: usize, batch: F)
    where
        F: Fn(Vec<J>) -> Fut,
        Fut: Future<Output = ()>,
    {
        while let Some(jobs) = self.lanes.next(&self.key, max) {
            batch(jobs).await;
        }
        self.armed = false;
    }
}

impl<K: Hash + Eq, J> Drop for Drain<K, J> {
    /// A lane whose task panicked or was dropped (runtime shutdown) must not stay marked busy
    /// with nobody draining it: its jobs are dropped (their callers get an error, nobody
    /// hangs) and the lane is removed.
    fn drop(&mut self) {
        if self.armed {
            let dropped = self
                .lanes
                .waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.key)
                .map_or(0, |w| w.len());
            tracing::error!(waiting = dropped, "group commit lane stopped unexpectedly");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::oneshot;

    type Job = (u32, oneshot::Sender<usize>);
    /// The batches a lane ran: its key and the jobs' numbers.
    type Seen = Arc<Mutex<Vec<(&'static str, Vec<u32>)>>>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_are_batched_per_key_bounded_and_lanes_close() {
        let lanes: Arc<Lanes<&'static str, Job>> = Arc::default();
        let batches: Seen = Arc::default();
        let mut replies = Vec::new();
        for i in 0..50u32 {
            let key = if i % 2 == 0 { "a" } else { "b" };
            let (tx, rx) = oneshot::channel();
            replies.push((i, rx));
            let seen = batches.clone();
            lanes.push(key, (i, tx), 8, move |jobs: Vec<Job>| {
                let seen = seen.clone();
                async move {
                    // Slow enough that later jobs gather behind this batch.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let n = jobs.len();
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((key, jobs.iter().map(|j| j.0).collect()));
                    for (_, reply) in jobs {
                        let _ = reply.send(n);
                    }
                }
            });
        }
        for (i, rx) in replies {
            let n = rx.await.unwrap_or_else(|_| panic!("job {i} got no answer"));
            assert!((1..=8).contains(&n), "batch of {n}");
        }
        let batches = batches.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut done: Vec<u32> = Vec::new();
        for (key, jobs) in &batches {
            assert!(jobs.len() <= 8);
            assert!(
                jobs.iter().all(|j| (j % 2 == 0) == (*key == "a")),
                "{batches:?}"
            );
            assert!(
                jobs.windows(2).all(|w| w[0] < w[1]),
                "arrival order: {jobs:?}"
            );
            done.extend(jobs);
        }
        done.sort_unstable();
        assert_eq!(done, (0..50).collect::<Vec<_>>(), "each job exactly once");
        assert!(batches.len() < 50, "jobs were batched: {}", batches.len());
        // The last batch's task removes its lane right after answering.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(lanes.lock().is_empty(), "idle lanes are removed");
    }

    #[tokio::test]
    async fn a_panicking_batch_fails_its_waiters_and_frees_the_lane() {
        let lanes: Arc<Lanes<u8, Job>> = Arc::default();
        let (tx, rx) = oneshot::channel();
        lanes.push(1, (0, tx), 4, |_jobs: Vec<Job>| async move {
            panic!("batch failed");
        });
        assert!(rx.await.is_err(), "the caller hears the failure");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(lanes.lock().is_empty());
        // The lane works again afterwards.
        let (tx, rx) = oneshot::channel();
        lanes.push(1, (7, tx), 4, |jobs: Vec<Job>| async move {
            for (_, reply) in jobs {
                let _ = reply.send(1);
            }
        });
        assert_eq!(rx.await.ok(), Some(1));
    }
}
