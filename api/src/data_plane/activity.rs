//! Data-plane activity (exec, files, ports, keepalive), buffered per process and written in
//! batches.
//!
//! The idle sweep needs a sandbox's last activity within seconds, not within the call that
//! caused it. Writing it per call was one more commit beside every exec's audit commit; now
//! a call records the time here, and the first call after a quiet spell schedules one write of
//! everything gathered `FLUSH_AFTER` later (one statement, one commit, however many calls).
//! Activity still in the buffer when the process dies is lost: at worst a sandbox idles up to
//! `FLUSH_AFTER` early, which the next call undoes by waking it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use differently_core::SandboxId;
use differently_store::Store;

/// How long activity waits in the buffer before it is written.
pub const FLUSH_AFTER: Duration = Duration::from_millis(250);

/// The activity of this process not yet written.
#[derive(Clone, Default)]
pub struct ActivityBuffer {
    inner: Arc<Mutex<Pending>>,
}

#[derive(Default)]
struct Pending {
    latest: HashMap<SandboxId, DateTime<Utc>>,
    flush_scheduled: bool,
}

impl ActivityBuffer {
    /// Records a data-plane call on `id` at `at`; written within `FLUSH_AFTER`.
    pub fn record(&self, store: &Arc<dyn Store>, id: &SandboxId, at: DateTime<Utc>) {
        let schedule = {
            let mut p = self.lock();
            let e = p.latest.entry(id.clone()).or_insert(at);
            *e = (*e).max(at);
            !std::mem::replace(&mut p.flush_scheduled, true)
        };
        if schedule {
            let (buffer, store) = (self.clone(), store.clone());
            tokio::spawn(async move {
                tokio::time::sleep(FLUSH_AFTER).await;
                buffer.flush(store.as_ref()).await;
            });
        }
    }

    /// Writes everything buffered now.
    pub async fn flush(&self, store: &dyn Store) {
        let touches: Vec<(SandboxId, DateTime<Utc>)> = {
            let mut p = self.lock();
            p.flush_scheduled = false;
            p.latest.drain().collect()
        };
        if touches.is_empty() {
            return;
        }
        if let Err(e) = store.touch_activity_many(&touches).await {
            tracing::warn!(sandboxes = touches.len(), error = %e, "cannot record activity");
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use differently_core::{CreateSandboxRequest, Sandbox, SandboxSpec};
    use differently_store::memory::MemoryStore;
    use differently_store::prelude::*;
    use differently_store::{Actor, Admission, Admitted, Quota};

    async fn sandbox(store: &MemoryStore) -> SandboxId {
        let (org, project) = crate::test_support::tenant(store).await;
        let spec = SandboxSpec::build(&CreateSandboxRequest::default()).expect("spec");
        let sbx = Sandbox::queued(org, project, spec, None, Utc::now());
        let admitted = store
            .admit(Admission {
                sandbox: sbx,
                request_hash: "h".into(),
                defaults: Quota::default(),
                actor: Actor::Key("key_t".into()),
                request_id: None,
                direct: None,
            })
            .await
            .expect("admit");
        match admitted {
            Admitted::New(s) | Admitted::Replayed(s) => s.id,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_are_written_once_after_the_delay_with_the_latest_time() {
        let mem = MemoryStore::new();
        let store: Arc<dyn Store> = Arc::new(mem.clone());
        let (a, b) = (sandbox(&mem).await, sandbox(&mem).await);
        let buffer = ActivityBuffer::default();
        let t0 = Utc::now();
        let t1 = t0 + chrono::TimeDelta::seconds(1);
        buffer.record(&store, &a, t1);
        buffer.record(&store, &a, t0); // older: does not move it back
        buffer.record(&store, &b, t0);
        assert_eq!(store.last_activity(&a).await.expect("read"), None);
        tokio::time::sleep(FLUSH_AFTER + Duration::from_millis(10)).await;
        assert_eq!(store.last_activity(&a).await.expect("read"), Some(t1));
        assert_eq!(store.last_activity(&b).await.expect("read"), Some(t0));
        assert!(buffer.lock().latest.is_empty());
        assert!(
            !buffer.lock().flush_scheduled,
            "the next call schedules again"
        );
    }
}
