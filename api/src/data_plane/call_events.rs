//! Public events of data-plane calls: `sandbox.exec.started|finished` and
//! `sandbox.file.written`.
//!
//! They are published from a task of their own, after the call has its outcome, so an exec's
//! answer never waits on the bus (its overhead over the backend is a target of its own). Unlike
//! status and operation events they are not re-sent when the bus drops one: nothing durable
//! says an event is owed, and the audit chain already holds the record of every exec and write
//! (`docs/events.md` says so).

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;

use differently_bus::Announcer;
use differently_bus_schema::public::{program_name, ExecFinished, ExecStarted, FileWritten};
use differently_bus_schema::{EventData, Origin, PublicEvent};
use differently_core::exec::TIMEOUT_EXIT_CODE;
use differently_core::{OrgId, ProjectId, SandboxId};
use differently_store::audit::AuditEvent;

use crate::auth::Principal;
use crate::locks::lock;
use crate::AppState;

/// Longest a background publish of a data-plane event may take before it is given up.
const PUBLISH_LIMIT: Duration = Duration::from_secs(5);

/// Who and what a data-plane call's events are about, taken from the call's audit record.
#[derive(Clone)]
pub(crate) struct CallEvents {
    announcer: Announcer,
    org: OrgId,
    project: ProjectId,
    sandbox: SandboxId,
    origin: Origin,
}

impl CallEvents {
    /// The events of a call on `sandbox` whose audit record is `record`; `None` (and no
    /// events) if the record does not name its tenant, which a sandbox call's always does.
    pub(crate) fn new(
        state: &AppState,
        principal: &Principal,
        record: &AuditEvent,
        sandbox: &SandboxId,
    ) -> Option<CallEvents> {
        let org = OrgId::parse(record.org_id.as_deref()?).ok()?;
        let project = ProjectId::parse(record.project_id.as_deref()?).ok()?;
        Some(CallEvents {
            announcer: state.announcer.clone(),
            org,
            project,
            sandbox: sandbox.clone(),
            origin: principal.origin(),
        })
    }

    /// The event of `data` at `at`; `discriminator` makes the event id unique per call and
    /// type (an exec id, a write's audit position).
    fn event(&self, at: DateTime<Utc>, discriminator: &str, data: EventData) -> PublicEvent {
        PublicEvent::new(
            self.org.clone(),
            self.project.clone(),
            Some(self.sandbox.clone()),
            self.origin.clone(),
            at,
            discriminator,
            data,
        )
    }

    /// Publishes `data` in the background.
    fn emit(&self, discriminator: &str, data: EventData) {
        let event = self.event(Utc::now(), discriminator, data);
        spawn(publish(self.announcer.clone(), event));
    }

    /// `sandbox.file.written`: `path` and how many bytes, never the content.
    pub(crate) fn file_written(&self, path: &str, size_bytes: u64) {
        self.emit(
            &format!("write_{}", ulid::Ulid::new()),
            EventData::FileWritten(FileWritten {
                path: path.to_owned(),
                size_bytes,
            }),
        );
    }
}

/// Spawns `task` on the current runtime; nothing when there is none (a drop at shutdown).
fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Option<JoinHandle<()>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    Some(runtime.spawn(task))
}

/// Publishes one event, giving up after [`PUBLISH_LIMIT`] (logged, never retried).
async fn publish(announcer: Announcer, event: PublicEvent) {
    let what = event.event_type();
    match tokio::time::timeout(PUBLISH_LIMIT, announcer.public(&event)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(sandbox = ?event.sandbox_id, event = %what, error = %e, "public event not published");
        }
        Err(_) => {
            tracing::warn!(sandbox = ?event.sandbox_id, event = %what, "public event not published in time");
        }
    }
}

/// The two events of one exec: `started`, stamped when it is made, and `finished` by
/// [`ExecEvents::finish`] or, for an exec whose caller went away (its handler or stream
/// dropped), when it is dropped, without an exit code. So every `started` has its `finished`,
/// and `started` is always published first.
///
/// `started` goes out [`START_GRACE`] after the start if the command is still running then
/// ([`ExecEvents::around`] watches the call); a command that ends sooner has both events
/// published together once it has its answer. Publishing means work for the bus and for every
/// consumer of the public stream (the webhook fan-out reads the store for each event), which
/// on a busy machine slowed the exec's own answer by about half a millisecond when `started`
/// went out as the command started (`docs/opensandbox.md`, "Again on 2026-12-02"). The grace
/// is a timer polled by the call itself, not a task of its own: on two cores a task per exec
/// (spawned, then aborted) was thread wake-ups the exec paid for.
pub(crate) struct ExecEvents {
    events: Option<CallEvents>,
    /// `exec_<ulid>`: both events of one exec share it.
    id: String,
    program: String,
    timeout_ms: u64,
    started: std::time::Instant,
    /// `started`, ready to publish; taken by whoever publishes it (the grace's end or the
    /// end of the call).
    start_event: Mutex<Option<PublicEvent>>,
    /// `started`'s publish once the grace ran out; the `finished` publish waits for it, so
    /// `started` comes first.
    start_publish: Mutex<Option<JoinHandle<()>>>,
    finished: bool,
}

/// How long a command runs before its `started` event is published on its own.
pub(crate) const START_GRACE: Duration = Duration::from_millis(100);

impl ExecEvents {
    /// An exec of `command` with `timeout`, starting now: `sandbox.exec.started` is stamped
    /// now and published once the call has run [`START_GRACE`] ([`ExecEvents::around`]) or
    /// with `finished`, whichever comes first.
    pub(crate) fn start(events: Option<CallEvents>, command: &[String], timeout: Duration) -> Self {
        let id = format!("exec_{}", ulid::Ulid::new());
        let program = program_name(command);
        let start_event = Mutex::new(events.as_ref().map(|e| {
            e.event(
                Utc::now(),
                &id,
                EventData::ExecStarted(ExecStarted {
                    exec_id: id.clone(),
                    program: program.clone(),
                }),
            )
        }));
        ExecEvents {
            events,
            id,
            program,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            started: std::time::Instant::now(),
            start_event,
            start_publish: Mutex::new(None),
            finished: false,
        }
    }

    /// Runs `call`, publishing `started` if it is still running [`START_GRACE`] after the
    /// start.
    pub(crate) async fn around<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(call);
        let grace = tokio::time::sleep_until((self.started + START_GRACE).into());
        tokio::pin!(grace);
        let mut graced = self.events.is_none();
        loop {
            tokio::select! {
                biased;
                out = &mut call => return out,
                () = &mut grace, if !graced => {
                    graced = true;
                    self.publish_started();
                }
            }
        }
    }

    /// Publishes `started` in the background now, unless it has gone out already.
    fn publish_started(&self) {
        let Some(e) = &self.events else { return };
        let Some(event) = lock(&self.start_event).take() else {
            return;
        };
        *lock(&self.start_publish) = spawn(publish(e.announcer.clone(), event));
    }

    /// Publishes `sandbox.exec.finished` (after `started`, if that has not gone out yet):
    /// `exit` is the exit code and duration the caller got, `None` when the call ended
    /// without one.
    pub(crate) fn finish(mut self, exit: Option<(i32, u64)>) {
        self.finished = true;
        self.publish_finished(exit);
    }

    fn publish_finished(&mut self, exit: Option<(i32, u64)>) {
        let Some(e) = &self.events else { return };
        let (exit_code, duration_ms, timed_out) = match exit {
            Some((code, ms)) => {
                let timed_out = code == TIMEOUT_EXIT_CODE && ms >= self.timeout_ms;
                (Some(code).filter(|_| !timed_out), ms, timed_out)
            }
            None => (
                None,
                u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
                false,
            ),
        };
        let finished = e.event(
            Utc::now(),
            &self.id,
            EventData::ExecFinished(ExecFinished {
                exec_id: self.id.clone(),
                program: self.program.clone(),
                exit_code,
                duration_ms,
                timed_out,
            }),
        );
        // Still here, `started` is ours to publish first; otherwise its publish is under way,
        // and `finished` waits for it.
        let started = lock(&self.start_event).take();
        let earlier = lock(&self.start_publish).take();
        let announcer = e.announcer.clone();
        spawn(async move {
            if let Some(started) = started {
                // Both sent before either acknowledgement is awaited (`join!` polls `started`
                // first, and a publish hands its message to the connection on its first
                // poll): one connection keeps them in order, and stored next to each other
                // they reach the webhook fan-out in one fetch, which reads the project's
                // webhooks once for both.
                tokio::join!(
                    publish(announcer.clone(), started),
                    publish(announcer, finished)
                );
                return;
            }
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            publish(announcer, finished).await;
        });
    }
}

impl Drop for ExecEvents {
    fn drop(&mut self) {
        if !self.finished {
            self.publish_finished(None);
        }
    }
}
