//! Public events of data-plane calls: `sandbox.exec.started|finished` and
//! `sandbox.file.written`.
//!
//! They are published from a task of their own, after the call has its outcome, so an exec's
//! answer never waits on the bus (its overhead over the backend is a target of its own). Unlike
//! status and operation events they are not re-sent when the bus drops one: nothing durable
//! says an event is owed, and the audit chain already holds the record of every exec and write
//! (`docs/events.md` says so).

use std::time::Duration;

use differently_bus::Announcer;
use differently_bus_schema::public::{program_name, ExecFinished, ExecStarted, FileWritten};
use differently_bus_schema::{EventData, Origin, PublicEvent};
use differently_core::exec::TIMEOUT_EXIT_CODE;
use differently_core::{OrgId, ProjectId, SandboxId};
use differently_store::audit::AuditEvent;

use crate::auth::Principal;
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

    /// Publishes `data` in the background; `discriminator` makes the event id unique per call
    /// and type (an exec id, a write's audit position).
    fn emit(&self, discriminator: &str, data: EventData) {
        let event = PublicEvent::new(
            self.org.clone(),
            self.project.clone(),
            Some(self.sandbox.clone()),
            self.origin.clone(),
            chrono::Utc::now(),
            discriminator,
            data,
        );
        let announcer = self.announcer.clone();
        let what = event.event_type();
        // Also called from a drop, which may run outside the runtime (at shutdown).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            match tokio::time::timeout(PUBLISH_LIMIT, announcer.public(&event)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(sandbox = ?event.sandbox_id, event = %what, error = %e, "public event not published");
                }
                Err(_) => {
                    tracing::warn!(sandbox = ?event.sandbox_id, event = %what, "public event not published in time");
                }
            }
        });
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

/// The two events of one exec: `started` when it is made, `finished` by [`ExecEvents::finish`]
/// or, for an exec whose caller went away (its handler or stream dropped), when it is dropped,
/// without an exit code. So every `started` has its `finished`.
pub(crate) struct ExecEvents {
    events: Option<CallEvents>,
    /// `exec_<ulid>`: both events of one exec share it.
    id: String,
    program: String,
    timeout_ms: u64,
    started: std::time::Instant,
    finished: bool,
}

impl ExecEvents {
    /// An exec of `command` with `timeout`, starting now: publishes `sandbox.exec.started`.
    pub(crate) fn start(events: Option<CallEvents>, command: &[String], timeout: Duration) -> Self {
        let exec = ExecEvents {
            events,
            id: format!("exec_{}", ulid::Ulid::new()),
            program: program_name(command),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            started: std::time::Instant::now(),
            finished: false,
        };
        if let Some(e) = &exec.events {
            e.emit(
                &exec.id,
                EventData::ExecStarted(ExecStarted {
                    exec_id: exec.id.clone(),
                    program: exec.program.clone(),
                }),
            );
        }
        exec
    }

    /// Publishes `sandbox.exec.finished`: `exit` is the exit code and duration the caller
    /// got, `None` when the call ended without one.
    pub(crate) fn finish(mut self, exit: Option<(i32, u64)>) {
        self.finished = true;
        self.publish_finished(exit);
    }

    fn publish_finished(&self, exit: Option<(i32, u64)>) {
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
        e.emit(
            &self.id,
            EventData::ExecFinished(ExecFinished {
                exec_id: self.id.clone(),
                program: self.program.clone(),
                exit_code,
                duration_ms,
                timed_out,
            }),
        );
    }
}

impl Drop for ExecEvents {
    fn drop(&mut self) {
        if !self.finished {
            self.publish_finished(None);
        }
    }
}
