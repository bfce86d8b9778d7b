//! One subscription per API process to every status event, delivered to the local waiters of
//! that sandbox only (`GET /v1/sandboxes/{id}/wait`, operation waits), so waiting costs no
//! database polling on the fast path and an event wakes only the requests that asked for it.
//!
//! Waiters register by sandbox id, so an event costs one lookup however many requests wait.
//! With the broadcast this replaces, every waiting request woke on every event of the process,
//! and an operation wait re-read its operation row on each of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use differently_bus::Bus;
use differently_bus_schema::{Envelope, Naming, StatusChanged};
use differently_core::{SandboxId, SandboxStatus};
use futures::StreamExt;
use tokio::sync::watch;

/// Per-sandbox delivery of status events inside one process.
#[derive(Clone, Default)]
pub struct EventHub {
    waiters: Arc<Waiters>,
    /// Rows data-plane calls may use without a read; every event of a sandbox drops its row.
    pub running: Arc<crate::running_rows::RunningRows>,
}

/// The last status seen for each sandbox that has a waiter; an entry lives exactly as long as
/// some [`SandboxWatch`] of its sandbox does.
type Waiters = Mutex<HashMap<SandboxId, watch::Sender<Option<SandboxStatus>>>>;

impl EventHub {
    /// Starts following the event stream in the background.
    pub fn start(bus: Arc<dyn Bus>, naming: Naming) -> EventHub {
        let hub = EventHub::default();
        let feed = hub.clone();
        tokio::spawn(async move {
            let stream = naming.events_stream().name;
            let filter = format!("{}.evt.>", naming.prefix());
            loop {
                match bus.events(&stream, &filter, None).await {
                    Ok(mut events) => {
                        while let Some(item) = events.next().await {
                            match item {
                                Ok(ev) => {
                                    if let Ok(env) = serde_json::from_slice::<Envelope<StatusChanged>>(
                                        &ev.payload,
                                    ) {
                                        feed.deliver(&env.sandbox_id, env.body.status);
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, "event stream error");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot follow events; retrying"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        hub
    }

    /// Watches one sandbox from now on. Take the watch before reading the sandbox, so a change
    /// between the read and the wait is not missed.
    pub fn watch(&self, id: &SandboxId) -> SandboxWatch {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let rx = match waiters.get(id) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(None);
                waiters.insert(id.clone(), tx);
                rx
            }
        };
        SandboxWatch {
            waiters: self.waiters.clone(),
            id: id.clone(),
            rx,
        }
    }

    /// Hands a status event to the waiters of its sandbox (a no-op when there are none) and
    /// drops its remembered row.
    pub fn deliver(&self, id: &SandboxId, status: SandboxStatus) {
        self.running.forget(id);
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = waiters.get(id) {
            tx.send_replace(Some(status));
        }
    }

    /// How many sandboxes have a waiter in this process.
    pub fn watched(&self) -> usize {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Interest in one sandbox's status events; dropping it unregisters.
pub struct SandboxWatch {
    waiters: Arc<Waiters>,
    id: SandboxId,
    rx: watch::Receiver<Option<SandboxStatus>>,
}

impl SandboxWatch {
    /// The next status event of this sandbox (the latest, if several arrived since the last
    /// call). Pending forever if the process's hub is gone, which callers bound with a timer.
    pub async fn changed(&mut self) -> Option<SandboxStatus> {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.rx.borrow_and_update()
    }
}

impl Drop for SandboxWatch {
    fn drop(&mut self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        // `self.rx` is still alive here, so the last watch of this sandbox sees a count of one.
        if waiters
            .get(&self.id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            waiters.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn within<T>(f: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .ok()
    }

    #[tokio::test]
    async fn an_event_wakes_only_the_watchers_of_its_sandbox() {
        let hub = EventHub::default();
        let (a, b) = (SandboxId::new(), SandboxId::new());
        let mut wa = hub.watch(&a);
        let mut wb = hub.watch(&b);
        hub.deliver(&a, SandboxStatus::Running);
        assert_eq!(
            within(wa.changed()).await,
            Some(Some(SandboxStatus::Running))
        );
        assert_eq!(within(wb.changed()).await, None, "b was woken by a's event");
        // Seen once: no second wake-up without a new event.
        assert_eq!(within(wa.changed()).await, None);
    }

    #[tokio::test]
    async fn several_watchers_of_one_sandbox_all_wake() {
        let hub = EventHub::default();
        let id = SandboxId::new();
        let mut w1 = hub.watch(&id);
        let mut w2 = hub.watch(&id);
        hub.deliver(&id, SandboxStatus::Provisioning);
        hub.deliver(&id, SandboxStatus::Running);
        assert_eq!(
            within(w1.changed()).await,
            Some(Some(SandboxStatus::Running))
        );
        assert_eq!(
            within(w2.changed()).await,
            Some(Some(SandboxStatus::Running))
        );
    }

    #[tokio::test]
    async fn an_event_before_the_watch_is_not_seen_and_one_after_is() {
        let hub = EventHub::default();
        let id = SandboxId::new();
        hub.deliver(&id, SandboxStatus::Running);
        let mut w = hub.watch(&id);
        assert_eq!(within(w.changed()).await, None);
        hub.deliver(&id, SandboxStatus::Terminating);
        assert_eq!(
            within(w.changed()).await,
            Some(Some(SandboxStatus::Terminating))
        );
    }

    #[tokio::test]
    async fn the_registry_forgets_a_sandbox_when_its_last_watch_drops() {
        let hub = EventHub::default();
        let id = SandboxId::new();
        let w1 = hub.watch(&id);
        let mut w2 = hub.watch(&id);
        assert_eq!(hub.watched(), 1);
        drop(w1);
        assert_eq!(hub.watched(), 1, "w2 still watches");
        hub.deliver(&id, SandboxStatus::Running);
        assert_eq!(
            within(w2.changed()).await,
            Some(Some(SandboxStatus::Running))
        );
        drop(w2);
        assert_eq!(hub.watched(), 0);
        // A new watch after that starts fresh.
        let mut w3 = hub.watch(&id);
        assert_eq!(within(w3.changed()).await, None);
        assert_eq!(hub.watched(), 1);
    }
}
