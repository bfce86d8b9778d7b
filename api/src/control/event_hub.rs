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

use differently_bus::{decode_event, Bus, Event};
use differently_bus_schema::{Envelope, Naming, StatusChanged, StatusOnly};
use differently_core::sandbox::SandboxView;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use differently_store::Store;
use futures::StreamExt;
use tokio::sync::watch;

use crate::data_plane::running_rows::RunningRow;

/// Per-sandbox delivery of status events inside one process.
#[derive(Clone, Default)]
pub struct EventHub {
    waiters: Arc<Waiters>,
    /// Rows data-plane calls may use without a read; every event of a sandbox drops its row.
    pub running: Arc<crate::data_plane::running_rows::RunningRows>,
    /// The status of each sandbox this process admitted lately, kept current by its events.
    known: Arc<Mutex<HashMap<SandboxId, (Known, std::time::Instant)>>>,
}

/// A sandbox's status as this process last knew it: from its own admission, then from the
/// sandbox's events ([`EventHub::known_status`]). Never newer than what was committed; it may
/// lag an event still on its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_version: i64,
}

/// Sandboxes whose status a process keeps ([`EventHub::remember_status`]) before it starts
/// over, and for how long an entry counts: a create is waited on right after it is made.
const KNOWN_LIMIT: usize = 4096;
const KNOWN_FOR: Duration = Duration::from_secs(60);

/// The last event seen for each sandbox that has a waiter; an entry lives exactly as long as
/// some [`SandboxWatch`] of its sandbox does.
type Waiters = Mutex<HashMap<SandboxId, watch::Sender<Option<Delivered>>>>;

/// A status event as a waiter sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub status: SandboxStatus,
    pub status_version: i64,
    /// The row's client view as committed at `status_version`, when the publisher sent it:
    /// a waiter this event satisfies can answer with it instead of reading the row.
    pub view: Option<Arc<SandboxView>>,
}

impl Delivered {
    /// This event's view if it is newer than the version the waiter already has; an older or
    /// view-less event says only that the row moved, and the waiter reads it.
    pub fn newer_view(&self, than: i64) -> Option<(i64, SandboxView)> {
        let view = self.view.as_ref().filter(|_| self.status_version > than)?;
        Some((self.status_version, SandboxView::clone(view)))
    }
}

impl EventHub {
    /// Starts following the event stream in the background. The audit heads events carry
    /// for sandboxes watched here go to `store` (`AuditStore::note_audit_head`): the watcher's
    /// next data-plane call appends its record onto that head.
    pub fn start(bus: Arc<dyn Bus>, naming: Naming, store: Arc<dyn Store>) -> EventHub {
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
                                Ok(ev) => feed.take(&naming, store.as_ref(), &ev),
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

    /// One event from the stream. Most are about sandboxes nobody here waits on: for those
    /// the subject says which sandbox, its remembered row is dropped, and the payload (a whole
    /// client view) is never decoded. Each process reads every status event, so this is most
    /// of what a process that serves no waiter does per sandbox.
    fn take(&self, naming: &Naming, store: &dyn Store, ev: &Event) {
        if let Some(id) = naming.event_subject_sandbox(&ev.subject) {
            // A sandbox admitted here lately: its known status moves with the event (only the
            // status is decoded), before anyone who starts watching it now looks.
            if self.knows(&id) {
                match decode_event::<StatusOnly>(ev) {
                    Some(env) => self.note_known(&id, env.body.status, env.status_version),
                    None => self.forget_known(&id),
                }
            }
            if !self.watches(&id) {
                self.running.forget(&id);
                return;
            }
        }
        let Some(env) = decode_event::<StatusChanged>(ev) else {
            return;
        };
        if let Some(h) = &env.body.audit_head {
            if self.watches(&env.sandbox_id) {
                store.note_audit_head(&h.chain, h.seq, &h.hash);
            }
        }
        self.deliver_envelope(env);
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

    /// Whether someone in this process waits on `id`.
    pub fn watches(&self, id: &SandboxId) -> bool {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(id)
    }

    /// Hands a decoded status event to [`deliver`](EventHub::deliver).
    pub fn deliver_envelope(&self, env: Envelope<StatusChanged>) {
        let b = env.body;
        let row = match (b.status, b.pool, b.backend_ref) {
            (SandboxStatus::Running, Some(pool), Some(backend_ref)) => Some(RunningRow {
                id: env.sandbox_id.clone(),
                org_id: b.org_id,
                project_id: b.project_id,
                pool,
                backend_ref,
                status_version: env.status_version,
                // Events carry no env values: a warm sandbox's calls read the row for them.
                env: if b.warm { None } else { Some(Arc::default()) },
            }),
            _ => None,
        };
        let delivered = Delivered {
            status: b.status,
            status_version: env.status_version,
            view: b.view.map(|v| Arc::new(SandboxView::from(*v))),
        };
        self.deliver(&env.sandbox_id, delivered, row);
    }

    /// Hands a status event to the waiters of its sandbox (a no-op when there are none) and
    /// drops its remembered row. When someone here waits on the sandbox and the event says
    /// where it now runs (`row`), that row is remembered instead: the waiter is most likely
    /// about to call it.
    pub fn deliver(&self, id: &SandboxId, event: Delivered, row: Option<RunningRow>) {
        let waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        // Before any waiter is woken: one that wakes and looks finds the status it woke for.
        self.note_known(id, event.status, event.status_version);
        let Some(tx) = waiters.get(id) else {
            self.running.forget(id);
            return;
        };
        match row {
            Some(row) => self.running.remember_row(row),
            None => self.running.forget(id),
        }
        tx.send_replace(Some(event));
    }

    /// A change this process committed and announces in public only
    /// (`Announcer::public_status_by`, a delete's `terminating`): this process's own waiters,
    /// remembered row and known status take it as they would take its internal event.
    pub fn committed_here(&self, s: &Sandbox) {
        let delivered = Delivered {
            status: s.status,
            status_version: s.status_version,
            view: Some(Arc::new(s.view())),
        };
        self.deliver(&s.id, delivered, RunningRow::of(s));
    }

    /// Keeps `s`'s status, committed by this process (its admission), for a wait that comes
    /// next: it starts without reading the row ([`EventHub::known_status`]).
    pub fn remember_status(&self, s: &Sandbox) {
        let mut known = self.known_lock();
        if known.len() >= KNOWN_LIMIT {
            known.retain(|_, (_, at)| at.elapsed() < KNOWN_FOR);
            if known.len() >= KNOWN_LIMIT {
                known.clear();
            }
        }
        let entry = Known {
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            status: s.status,
            status_version: s.status_version,
        };
        known.insert(s.id.clone(), (entry, std::time::Instant::now()));
    }

    /// The status this process knows for `id`, if it admitted it lately and it has not
    /// ended. Take the watch first: an event after that either moved this status already or
    /// wakes the watch.
    pub fn known_status(&self, id: &SandboxId) -> Option<Known> {
        let known = self.known_lock();
        let (k, at) = known.get(id)?;
        (at.elapsed() < KNOWN_FOR).then(|| k.clone())
    }

    fn knows(&self, id: &SandboxId) -> bool {
        self.known_lock().contains_key(id)
    }

    /// Moves a known status forward (an older event changes nothing); a final one ends it.
    fn note_known(&self, id: &SandboxId, status: SandboxStatus, version: i64) {
        let mut known = self.known_lock();
        let Some((k, _)) = known.get_mut(id) else {
            return;
        };
        if status.is_final() {
            known.remove(id);
        } else if version > k.status_version {
            k.status = status;
            k.status_version = version;
        }
    }

    fn forget_known(&self, id: &SandboxId) {
        self.known_lock().remove(id);
    }

    fn known_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (Known, std::time::Instant)>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
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
    rx: watch::Receiver<Option<Delivered>>,
}

impl SandboxWatch {
    /// The next status event of this sandbox (the latest, if several arrived since the last
    /// call). Pending forever if the process's hub is gone, which callers bound with a timer.
    pub async fn changed(&mut self) -> Option<Delivered> {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.rx.borrow_and_update().clone()
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

    fn ev(status: SandboxStatus) -> Delivered {
        Delivered {
            status,
            status_version: 1,
            view: None,
        }
    }

    fn status(woke: Option<Option<Delivered>>) -> Option<Option<SandboxStatus>> {
        woke.map(|d| d.map(|d| d.status))
    }

    /// A committed running row, and the envelope its status event carries.
    fn started() -> (differently_core::Sandbox, Envelope<StatusChanged>) {
        use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec};
        let mut s = Sandbox::queued(
            OrgId::new(),
            ProjectId::new(),
            SandboxSpec::build(&CreateSandboxRequest::default()).expect("spec"),
            None,
            chrono::Utc::now(),
        );
        s.status = SandboxStatus::Running;
        s.status_version = 3;
        s.pool = Some("fake".into());
        s.backend_ref = Some("ref-7".into());
        let env = Envelope::new(s.id.clone(), s.status_version, StatusChanged::of(&s));
        (s, env)
    }

    #[tokio::test]
    async fn an_event_with_its_view_answers_a_waiter_only_when_newer() {
        let hub = EventHub::default();
        let (s, env) = started();
        let mut w = hub.watch(&s.id);
        hub.deliver_envelope(env);
        let got = within(w.changed()).await.flatten().expect("woken");
        assert_eq!(got.status, SandboxStatus::Running);
        assert_eq!(got.newer_view(2), Some((3, s.view())));
        // The waiter already read version 3 or later: the event adds nothing.
        assert_eq!(got.newer_view(3), None);
        // An event from a publisher that sent no view says only that the row moved.
        assert_eq!(ev(SandboxStatus::Running).newer_view(0), None);
    }

    #[tokio::test]
    async fn a_start_is_remembered_for_the_data_plane_only_while_someone_here_waits() {
        let hub = EventHub::default();
        let (s, env) = started();
        // Nobody waits here: nothing is remembered (a replica does not hold every row).
        hub.deliver_envelope(env.clone());
        assert_eq!(hub.running.get(&s.id), None);
        let w = hub.watch(&s.id);
        hub.deliver_envelope(env.clone());
        let row = hub.running.get(&s.id).expect("remembered");
        assert_eq!(
            Some(row.clone()),
            crate::data_plane::running_rows::RunningRow::of(&s)
        );
        assert_eq!(row.backend_ref, "ref-7");
        // Any later change of the row drops it.
        let mut stopping = env;
        stopping.status_version = 4;
        stopping.body.status = SandboxStatus::Terminating;
        hub.deliver_envelope(stopping);
        assert_eq!(hub.running.get(&s.id), None);
        drop(w);
    }

    /// The stream's view of one event: the subject it was published on and its bytes.
    fn on_the_wire(env: &Envelope<StatusChanged>, payload: Vec<u8>) -> Event {
        Event {
            seq: 1,
            subject: Naming::default().event_subject(
                &env.body.org_id,
                &env.body.project_id,
                &env.sandbox_id,
                env.body.status,
            ),
            payload: payload.into(),
        }
    }

    #[tokio::test]
    async fn an_event_nobody_here_waits_on_is_passed_over_by_its_subject_undecoded() {
        let hub = EventHub::default();
        let store = differently_store::memory::MemoryStore::new();
        let naming = Naming::default();
        let (s, env) = started();
        let row = crate::data_plane::running_rows::RunningRow::of(&s).expect("a running row");
        hub.running.remember_row(row);
        // Bytes that would not decode: nobody waits, so nobody reads them, and the row this
        // process remembered for the sandbox is dropped all the same.
        hub.take(&naming, &store, &on_the_wire(&env, b"{not json".to_vec()));
        assert_eq!(hub.running.get(&s.id), None);

        // With a waiter the same sandbox's event is decoded and delivered.
        let mut w = hub.watch(&s.id);
        hub.take(
            &naming,
            &store,
            &on_the_wire(&env, env.encode().expect("encodes")),
        );
        let got = within(w.changed()).await.flatten().expect("woken");
        assert_eq!(
            (got.status, got.status_version),
            (SandboxStatus::Running, 3)
        );
        assert!(
            hub.running.get(&s.id).is_some(),
            "remembered for the waiter"
        );
        // An undecodable one for a watched sandbox is skipped (and counted), not delivered.
        hub.take(&naming, &store, &on_the_wire(&env, b"{not json".to_vec()));
        assert!(within(w.changed()).await.is_none());
    }

    #[tokio::test]
    async fn an_event_wakes_only_the_watchers_of_its_sandbox() {
        let hub = EventHub::default();
        let (a, b) = (SandboxId::new(), SandboxId::new());
        let mut wa = hub.watch(&a);
        let mut wb = hub.watch(&b);
        hub.deliver(&a, ev(SandboxStatus::Running), None);
        assert_eq!(
            status(within(wa.changed()).await),
            Some(Some(SandboxStatus::Running))
        );
        assert_eq!(
            status(within(wb.changed()).await),
            None,
            "b was woken by a's event"
        );
        // Seen once: no second wake-up without a new event.
        assert_eq!(status(within(wa.changed()).await), None);
    }

    #[tokio::test]
    async fn several_watchers_of_one_sandbox_all_wake() {
        let hub = EventHub::default();
        let id = SandboxId::new();
        let mut w1 = hub.watch(&id);
        let mut w2 = hub.watch(&id);
        hub.deliver(&id, ev(SandboxStatus::Provisioning), None);
        hub.deliver(&id, ev(SandboxStatus::Running), None);
        assert_eq!(
            status(within(w1.changed()).await),
            Some(Some(SandboxStatus::Running))
        );
        assert_eq!(
            status(within(w2.changed()).await),
            Some(Some(SandboxStatus::Running))
        );
    }

    #[tokio::test]
    async fn an_event_before_the_watch_is_not_seen_and_one_after_is() {
        let hub = EventHub::default();
        let id = SandboxId::new();
        hub.deliver(&id, ev(SandboxStatus::Running), None);
        let mut w = hub.watch(&id);
        assert_eq!(status(within(w.changed()).await), None);
        hub.deliver(&id, ev(SandboxStatus::Terminating), None);
        assert_eq!(
            status(within(w.changed()).await),
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
        hub.deliver(&id, ev(SandboxStatus::Running), None);
        assert_eq!(
            status(within(w2.changed()).await),
            Some(Some(SandboxStatus::Running))
        );
        drop(w2);
        assert_eq!(hub.watched(), 0);
        // A new watch after that starts fresh.
        let mut w3 = hub.watch(&id);
        assert_eq!(status(within(w3.changed()).await), None);
        assert_eq!(hub.watched(), 1);
    }

    /// A provisioning row this process admitted, and its status event's envelope at
    /// `status`/`version`.
    fn admitted_then(
        status: SandboxStatus,
        version: i64,
    ) -> (differently_core::Sandbox, Envelope<StatusChanged>) {
        let (mut s, _) = started();
        s.status = SandboxStatus::Provisioning;
        s.status_version = 2;
        let mut later = s.clone();
        later.status = status;
        later.status_version = version;
        let env = Envelope::new(s.id.clone(), version, StatusChanged::of(&later));
        (s, env)
    }

    #[tokio::test]
    async fn an_admitted_sandbox_s_status_moves_with_its_events_watched_or_not() {
        let hub = EventHub::default();
        let store = differently_store::memory::MemoryStore::new();
        let naming = Naming::default();
        let (s, running) = admitted_then(SandboxStatus::Running, 3);
        assert_eq!(hub.known_status(&s.id), None, "not admitted here");
        hub.remember_status(&s);
        let known = hub.known_status(&s.id).expect("known");
        assert_eq!(
            (known.status, known.status_version, &known.org_id),
            (SandboxStatus::Provisioning, 2, &s.org_id)
        );
        // Nobody waits: only the status is decoded, and it moves the known one.
        hub.take(
            &naming,
            &store,
            &on_the_wire(&running, running.encode().expect("encodes")),
        );
        let known = hub.known_status(&s.id).expect("known");
        assert_eq!(
            (known.status, known.status_version),
            (SandboxStatus::Running, 3)
        );
        // An older event (out of order) changes nothing.
        let (_, late) = admitted_then(SandboxStatus::Provisioning, 2);
        let mut late = late;
        late.sandbox_id = s.id.clone();
        hub.take(
            &naming,
            &store,
            &on_the_wire(&late, late.encode().expect("encodes")),
        );
        assert_eq!(hub.known_status(&s.id).map(|k| k.status_version), Some(3));
        // An event that does not decode: the status is no longer known (a wait reads).
        hub.take(
            &naming,
            &store,
            &on_the_wire(&running, b"{not json".to_vec()),
        );
        assert_eq!(hub.known_status(&s.id), None);
        // Watched: the status moves before the waiter wakes, and a final one ends it.
        hub.remember_status(&s);
        let mut w = hub.watch(&s.id);
        hub.deliver_envelope(running.clone());
        let woke = within(w.changed()).await.flatten().expect("woken");
        assert_eq!(woke.status, SandboxStatus::Running);
        assert_eq!(
            hub.known_status(&s.id).map(|k| k.status),
            Some(SandboxStatus::Running)
        );
        let (_, ended) = admitted_then(SandboxStatus::Terminated, 5);
        let mut ended = ended;
        ended.sandbox_id = s.id.clone();
        hub.deliver_envelope(ended);
        assert_eq!(hub.known_status(&s.id), None, "a final status is not kept");
    }

    /// A change this process announces in public only reaches its own waiters, remembered
    /// row and known status as its internal event would.
    #[tokio::test]
    async fn a_change_committed_here_is_delivered_here() {
        let hub = EventHub::default();
        let (mut s, running) = started();
        hub.remember_status(&s);
        let mut w = hub.watch(&s.id);
        hub.deliver_envelope(running);
        within(w.changed())
            .await
            .flatten()
            .expect("woken by running");
        assert!(
            hub.running.get(&s.id).is_some(),
            "watched and running: remembered"
        );
        s.status = SandboxStatus::Terminating;
        s.status_version += 1;
        hub.committed_here(&s);
        let woke = within(w.changed()).await.flatten().expect("woken");
        assert_eq!(woke.status, SandboxStatus::Terminating);
        assert_eq!(woke.view.as_deref(), Some(&s.view()));
        assert_eq!(
            hub.known_status(&s.id)
                .map(|k| (k.status, k.status_version)),
            Some((SandboxStatus::Terminating, s.status_version))
        );
        assert!(hub.running.get(&s.id).is_none(), "no longer running");
    }

    #[test]
    fn the_known_statuses_are_bounded() {
        let hub = EventHub::default();
        let (s, _) = started();
        for _ in 0..KNOWN_LIMIT + 10 {
            let mut other = s.clone();
            other.id = SandboxId::new();
            hub.remember_status(&other);
        }
        assert!(hub.known_lock().len() <= KNOWN_LIMIT);
    }
}
