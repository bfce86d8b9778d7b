//! Subject, stream and consumer names, all derived from one configurable prefix so that
//! several installations (or test runs) can share a NATS server.

use std::time::Duration;

use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};

use crate::{EventType, WorkOp};

/// Derives every subject, stream and consumer name from one prefix (default `dly`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    prefix: String,
}

impl Default for Naming {
    fn default() -> Self {
        Naming {
            prefix: "dly".to_owned(),
        }
    }
}

impl Naming {
    /// A naming scheme under `prefix`, which must be a lowercase token (`a-z0-9_`).
    pub fn new(prefix: &str) -> Result<Naming, String> {
        let ok = !prefix.is_empty()
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if ok {
            Ok(Naming {
                prefix: prefix.to_owned(),
            })
        } else {
            Err(format!(
                "bus prefix {prefix:?} must be non-empty and use only a-z, 0-9 and _"
            ))
        }
    }

    /// The prefix itself.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn stream_name(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix.to_ascii_uppercase())
    }

    /// `dly.admit.<org>`: one admitted sandbox to place.
    pub fn admit_subject(&self, org: &OrgId) -> String {
        format!("{}.admit.{org}", self.prefix)
    }

    /// `dly.work.<pool>.<op>`: one backend mutation for a pool's workers.
    pub fn work_subject(&self, pool: &str, op: WorkOp) -> String {
        format!("{}.work.{pool}.{}", self.prefix, op.as_str())
    }

    /// `dly.evt.<org>.<project>.<sandbox>.<phase>`: a committed state change. The phase is
    /// [`FINAL_PHASE`] for a status no transition leaves (terminated, failed) and
    /// [`LIVE_PHASE`] otherwise, so a reader that needs only the ends (the placement leader,
    /// which places into the room they free) filters on it ([`final_event_filter`]) and is
    /// not sent the other three of a sandbox's four changes (issue #47).
    ///
    /// [`final_event_filter`]: Self::final_event_filter
    pub fn event_subject(
        &self,
        org: &OrgId,
        project: &ProjectId,
        sandbox: &SandboxId,
        status: SandboxStatus,
    ) -> String {
        let phase = if status.is_final() {
            FINAL_PHASE
        } else {
            LIVE_PHASE
        };
        format!("{}.evt.{org}.{project}.{sandbox}.{phase}", self.prefix)
    }

    /// Every final status change ([`event_subject`](Self::event_subject)'s phase
    /// [`FINAL_PHASE`]). Events stored by earlier versions, without a phase, do not match:
    /// a reader of this filter must not depend on seeing every end (placement tries its
    /// queue again every tick whether or not one came).
    pub fn final_event_filter(&self) -> String {
        format!("{}.evt.*.*.*.{FINAL_PHASE}", self.prefix)
    }

    /// The sandbox a subject of [`event_subject`](Self::event_subject) is about, read from the
    /// subject alone, so a reader can pass over another sandbox's event without decoding it.
    /// Also reads the subjects of earlier versions, which had no phase. `None` for anything
    /// else (the caller then decodes as usual).
    pub fn event_subject_sandbox(&self, subject: &str) -> Option<SandboxId> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".evt.")?;
        let mut tokens = rest.split('.');
        let (_org, _project, sandbox) = (tokens.next()?, tokens.next()?, tokens.next()?);
        match tokens.next() {
            None | Some(FINAL_PHASE | LIVE_PHASE) => {}
            Some(_) => return None,
        }
        if tokens.next().is_some() {
            return None;
        }
        SandboxId::parse(sandbox).ok()
    }

    /// Filter for one tenant's events, optionally narrowed to a project and a sandbox.
    pub fn event_filter(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        sandbox: Option<&SandboxId>,
    ) -> String {
        match (project, sandbox) {
            (Some(p), Some(s)) => format!("{}.evt.{org}.{p}.{s}.*", self.prefix),
            (Some(p), None) => format!("{}.evt.{org}.{p}.*.*", self.prefix),
            (None, Some(s)) => format!("{}.evt.{org}.*.{s}.*", self.prefix),
            (None, None) => format!("{}.evt.{org}.>", self.prefix),
        }
    }

    /// `dly.pub.<org>.<project>.<sandbox>.<type>`: a public event, the only kind of message
    /// tenants may read. Project-level events (no sandbox) use `_` for the sandbox token.
    pub fn public_subject(
        &self,
        org: &OrgId,
        project: &ProjectId,
        sandbox: Option<&SandboxId>,
        ty: EventType,
    ) -> String {
        let sandbox = sandbox.map_or_else(|| "_".to_owned(), ToString::to_string);
        format!("{}.pub.{org}.{project}.{sandbox}.{ty}", self.prefix)
    }

    /// The org and project a subject of [`public_subject`](Self::public_subject) is about,
    /// read from the subject alone, so a reader can pass over the events of a project it has
    /// nothing for without decoding them. `None` for anything else.
    pub fn public_subject_scope(&self, subject: &str) -> Option<(OrgId, ProjectId)> {
        let rest = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".pub.")?;
        // org, project, sandbox (or `_`), then the type, which has dots of its own.
        let mut tokens = rest.splitn(4, '.');
        let (org, project) = (tokens.next()?, tokens.next()?);
        let (_sandbox, ty) = (tokens.next()?, tokens.next()?);
        if ty.is_empty() {
            return None;
        }
        Some((OrgId::parse(org).ok()?, ProjectId::parse(project).ok()?))
    }

    /// Filter for one tenant's public events, optionally narrowed to a project and a sandbox
    /// (every type).
    pub fn public_filter(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        sandbox: Option<&SandboxId>,
    ) -> String {
        let project = project.map_or_else(|| "*".to_owned(), ToString::to_string);
        let sandbox = sandbox.map_or_else(|| "*".to_owned(), ToString::to_string);
        if project == "*" && sandbox == "*" {
            return self.public_org_filter(org);
        }
        format!("{}.pub.{org}.{project}.{sandbox}.>", self.prefix)
    }

    /// `dly.pub.<org>.>`: everything an org's credentials may subscribe to.
    pub fn public_org_filter(&self, org: &OrgId) -> String {
        format!("{}.pub.{org}.>", self.prefix)
    }

    /// `dly.internal.proc.<slot>`: the request/reply subject of the API process whose
    /// process supervisor holds `slot` (the top bits of the pids it hands out), so any API
    /// process can act on any pid. Core NATS only, never readable by a tenant credential:
    /// the answers carry process output.
    pub fn process_subject(&self, slot: u16) -> String {
        format!("{}.internal.proc.{slot}", self.prefix)
    }

    /// `dly.internal.proc.list`: every process supervisor answers it with the processes it
    /// holds in one sandbox (a list gathers every API process's answer).
    pub fn process_list_subject(&self) -> String {
        format!("{}.internal.proc.list", self.prefix)
    }

    /// `dly.internal.>`: every process-to-process request subject.
    pub fn internal_filter(&self) -> String {
        format!("{}.internal.>", self.prefix)
    }

    /// The admission stream (work queue).
    pub fn admit_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("ADMIT"),
            subjects: vec![format!("{}.admit.>", self.prefix)],
            retention: Retention::WorkQueue,
            max_age: None,
            max_bytes: None,
        }
    }

    /// The work stream shared by all pools (work queue).
    pub fn work_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("WORK"),
            subjects: vec![format!("{}.work.>", self.prefix)],
            retention: Retention::WorkQueue,
            max_age: None,
            max_bytes: None,
        }
    }

    /// The event stream (limits: kept for a day so SSE clients can resume).
    pub fn events_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("EVENTS"),
            subjects: vec![format!("{}.evt.>", self.prefix)],
            retention: Retention::Limits,
            max_age: Some(Duration::from_secs(24 * 3600)),
            max_bytes: None,
        }
    }

    /// The public event stream `DLY_PUB` (limits: 24 h and at most [`PUBLIC_STREAM_MAX_BYTES`],
    /// whichever comes first), which tenants replay from a sequence or a time. Separate from
    /// `DLY_EVENTS` so that no internal message is ever on a subject a tenant can read.
    pub fn public_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("PUB"),
            subjects: vec![format!("{}.pub.>", self.prefix)],
            retention: Retention::Limits,
            max_age: Some(PUBLIC_RETENTION),
            max_bytes: Some(PUBLIC_STREAM_MAX_BYTES),
        }
    }

    /// The key-value bucket of issued event credentials (hashes, never secrets).
    pub fn event_credentials_bucket(&self) -> String {
        self.stream_name("EVENT_CREDENTIALS")
    }

    /// Durable consumers Differently itself runs on the public stream: tenant credentials
    /// may not read or acknowledge through them.
    pub fn public_internal_consumers(&self) -> Vec<String> {
        vec![WEBHOOK_CONSUMER.to_owned()]
    }

    /// Every stream, in creation order.
    pub fn streams(&self) -> Vec<StreamDef> {
        vec![
            self.admit_stream(),
            self.work_stream(),
            self.events_stream(),
            self.public_stream(),
        ]
    }

    /// The placement leader's durable consumer on the admission stream.
    pub fn placement_consumer(&self, ack_wait: Duration) -> ConsumerDef {
        ConsumerDef {
            stream: self.stream_name("ADMIT"),
            durable: "placement".to_owned(),
            filter: format!("{}.admit.>", self.prefix),
            ack_wait,
        }
    }

    /// One durable consumer per pool, shared by that pool's worker processes.
    pub fn work_consumer(&self, pool: &str, ack_wait: Duration) -> ConsumerDef {
        ConsumerDef {
            stream: self.stream_name("WORK"),
            durable: format!("work-{pool}"),
            filter: format!("{}.work.{pool}.>", self.prefix),
            ack_wait,
        }
    }
}

/// How a stream keeps messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// A message is removed once acknowledged.
    WorkQueue,
    /// Messages are kept until age or size limits.
    Limits,
}

/// A stream to create (idempotently) at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDef {
    pub name: String,
    pub subjects: Vec<String>,
    pub retention: Retention,
    pub max_age: Option<Duration>,
    /// Oldest messages are dropped beyond this many bytes (`None`: no size bound).
    pub max_bytes: Option<i64>,
}

/// The last token of an internal status event's subject when the status is final.
pub const FINAL_PHASE: &str = "final";

/// The last token of an internal status event's subject when the status is not final.
pub const LIVE_PHASE: &str = "live";

/// Durable name of the webhook fan-out on the public stream in earlier versions. The fan-out
/// now keeps its own position in Postgres and reads with an ordered consumer; it removes this
/// consumer when it first leads, and tenants stay denied it by name.
pub const WEBHOOK_CONSUMER: &str = "webhooks";

/// How long the public stream keeps an event: a subscriber can replay up to a day back.
pub const PUBLIC_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Size bound of the public stream (1 GiB): a burst of events cannot fill the server's disk;
/// beyond it the oldest events go first, even if younger than [`PUBLIC_RETENTION`].
pub const PUBLIC_STREAM_MAX_BYTES: i64 = 1 << 30;

/// A durable pull consumer with explicit acks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerDef {
    pub stream: String,
    pub durable: String,
    pub filter: String,
    /// Unacknowledged messages are redelivered after this long (in-progress acks extend it).
    pub ack_wait: Duration,
}
