//! The bus contract: subjects, streams, consumers and versioned envelopes.
//!
//! Pure data, so an outside subscriber can depend on this crate alone. Subjects carry ids,
//! never names. Every subject and stream name derives from one configurable prefix so that
//! several installations (or test runs) can share a NATS server.

use std::time::Duration;

use chrono::{DateTime, Utc};
use differently_core::lifecycle::LifecycleOp;
use differently_core::{OrgId, ProjectId, SandboxId, SandboxStatus};
use serde::{Deserialize, Serialize};

/// Version of the envelope layout. Consumers refuse envelopes from a newer major version.
pub const SCHEMA_VERSION: u32 = 1;

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

    /// `dly.evt.<org>.<project>.<sandbox>`: a committed state change.
    pub fn event_subject(&self, org: &OrgId, project: &ProjectId, sandbox: &SandboxId) -> String {
        format!("{}.evt.{org}.{project}.{sandbox}", self.prefix)
    }

    /// Filter for one tenant's events, optionally narrowed to a project and a sandbox.
    pub fn event_filter(
        &self,
        org: &OrgId,
        project: Option<&ProjectId>,
        sandbox: Option<&SandboxId>,
    ) -> String {
        match (project, sandbox) {
            (Some(p), Some(s)) => self.event_subject(org, p, s),
            (Some(p), None) => format!("{}.evt.{org}.{p}.*", self.prefix),
            (None, Some(s)) => format!("{}.evt.{org}.*.{s}", self.prefix),
            (None, None) => format!("{}.evt.{org}.>", self.prefix),
        }
    }

    /// The admission stream (work queue).
    pub fn admit_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("ADMIT"),
            subjects: vec![format!("{}.admit.>", self.prefix)],
            retention: Retention::WorkQueue,
            max_age: None,
        }
    }

    /// The work stream shared by all pools (work queue).
    pub fn work_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("WORK"),
            subjects: vec![format!("{}.work.>", self.prefix)],
            retention: Retention::WorkQueue,
            max_age: None,
        }
    }

    /// The event stream (limits: kept for a day so SSE clients can resume).
    pub fn events_stream(&self) -> StreamDef {
        StreamDef {
            name: self.stream_name("EVENTS"),
            subjects: vec![format!("{}.evt.>", self.prefix)],
            retention: Retention::Limits,
            max_age: Some(Duration::from_secs(24 * 3600)),
        }
    }

    /// Every stream, in creation order.
    pub fn streams(&self) -> Vec<StreamDef> {
        vec![
            self.admit_stream(),
            self.work_stream(),
            self.events_stream(),
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
}

/// A durable pull consumer with explicit acks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerDef {
    pub stream: String,
    pub durable: String,
    pub filter: String,
    /// Unacknowledged messages are redelivered after this long (in-progress acks extend it).
    pub ack_wait: Duration,
}

/// Backend mutations a pool's workers execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkOp {
    Create,
    Delete,
    /// `running → paused` (memory kept).
    Pause,
    /// `paused → running`.
    Resume,
    /// `running → stopped` (disk kept).
    Stop,
    /// `stopped → running`.
    Start,
    /// Takes a snapshot; the status does not change.
    Snapshot,
    /// Deletes a backend snapshot.
    DeleteSnapshot,
    /// Makes a port reachable by URL.
    ExposePort,
    /// Moves the backend-side TTL backstop.
    Renew,
}

impl WorkOp {
    /// The status-changing lifecycle operation this work message executes, if it is one
    /// (its statuses are in `differently_core::lifecycle`).
    pub fn lifecycle(self) -> Option<LifecycleOp> {
        match self {
            WorkOp::Pause => Some(LifecycleOp::Pause),
            WorkOp::Resume => Some(LifecycleOp::Resume),
            WorkOp::Stop => Some(LifecycleOp::Stop),
            WorkOp::Start => Some(LifecycleOp::Start),
            _ => None,
        }
    }

    /// Every operation, in declaration order.
    pub const ALL: [WorkOp; 10] = [
        WorkOp::Create,
        WorkOp::Delete,
        WorkOp::Pause,
        WorkOp::Resume,
        WorkOp::Stop,
        WorkOp::Start,
        WorkOp::Snapshot,
        WorkOp::DeleteSnapshot,
        WorkOp::ExposePort,
        WorkOp::Renew,
    ];

    /// The subject token.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkOp::Create => "create",
            WorkOp::Delete => "delete",
            WorkOp::Pause => "pause",
            WorkOp::Resume => "resume",
            WorkOp::Stop => "stop",
            WorkOp::Start => "start",
            WorkOp::Snapshot => "snapshot",
            WorkOp::DeleteSnapshot => "deletesnapshot",
            WorkOp::ExposePort => "exposeport",
            WorkOp::Renew => "renew",
        }
    }

    /// Parses the subject token.
    pub fn parse(s: &str) -> Option<WorkOp> {
        WorkOp::ALL.into_iter().find(|op| op.as_str() == s)
    }
}

/// W3C trace context carried across the bus so one trace spans API → worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceContext {
    pub traceparent: Option<String>,
}

impl TraceContext {
    /// Takes a caller's `traceparent` header when it is a valid W3C version-00 value
    /// (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all zero).
    pub fn from_header(value: &str) -> Option<TraceContext> {
        let v = value.trim();
        let parts: Vec<&str> = v.split('-').collect();
        let hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let zero = |s: &str| s.bytes().all(|b| b == b'0');
        match parts.as_slice() {
            [ver, trace, parent, flags]
                if *ver == "00"
                    && hex(trace, 32)
                    && hex(parent, 16)
                    && hex(flags, 2)
                    && !zero(trace)
                    && !zero(parent) =>
            {
                Some(TraceContext {
                    traceparent: Some(v.to_owned()),
                })
            }
            _ => None,
        }
    }

    /// A new root context from 16 random bytes of trace id and 8 of parent id.
    pub fn from_random(trace: [u8; 16], parent: [u8; 8]) -> TraceContext {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let (mut t, mut p) = (trace, parent);
        // All-zero ids are invalid in W3C trace context.
        if t.iter().all(|b| *b == 0) {
            t[15] = 1;
        }
        if p.iter().all(|b| *b == 0) {
            p[7] = 1;
        }
        TraceContext {
            traceparent: Some(format!("00-{}-{}-01", hex(&t), hex(&p))),
        }
    }

    /// The 32-hex-digit trace id, the part that stays the same across processes.
    pub fn trace_id(&self) -> Option<&str> {
        let tp = self.traceparent.as_deref()?;
        tp.split('-').nth(1).filter(|t| t.len() == 32)
    }
}

/// Every bus message: schema version, the sandbox it is about, the status version it was
/// derived from (consumers drop work whose version is stale), a trace context, and a body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope<T> {
    pub v: u32,
    pub sandbox_id: SandboxId,
    pub status_version: i64,
    #[serde(default)]
    pub trace: TraceContext,
    /// When the envelope was built; consumers measure bus lag from it. Absent in messages
    /// from before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<DateTime<Utc>>,
    pub body: T,
}

impl<T> Envelope<T> {
    /// Wraps `body` at the current schema version.
    pub fn new(sandbox_id: SandboxId, status_version: i64, body: T) -> Self {
        Envelope {
            v: SCHEMA_VERSION,
            sandbox_id,
            status_version,
            trace: TraceContext::default(),
            published_at: Some(Utc::now()),
            body,
        }
    }
}

/// Body on `dly.admit.<org>`: a sandbox was admitted and waits for placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Admitted {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    /// The queued row as committed, so placement needs no read to learn what it places.
    /// Placement treats it as a hint: the activation re-reads and re-checks under locks.
    /// Absent from older publishers; then placement reads the row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Box<differently_core::Sandbox>>,
}

/// Body on `dly.work.<pool>.<op>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Work {
    pub op: WorkOp,
    pub pool: String,
    /// The operation record (`op_…`) a lifecycle message executes; the worker reads its
    /// arguments from the store and records the outcome there. Absent for create and delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_id: Option<String>,
    /// On a delete: the row was committed `terminating` at the envelope's version, for this
    /// reason. That is all a worker needs (the instance is named by the sandbox id, and
    /// `terminated` keeps the reason), so it deletes without reading the row. Absent from
    /// older publishers; then the worker reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating: Option<Terminating>,
}

/// See [`Work::terminating`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminating {
    pub reason: Option<String>,
}

/// Body on `dly.evt.…`: a committed status change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusChanged {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    pub pool: Option<String>,
    pub at: DateTime<Utc>,
    /// The backend's instance reference at this version, so an API replica can serve a
    /// data-plane call on a just-started sandbox without reading its row (the call's audit
    /// append re-checks the row's status and version). Internal: never sent to clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<String>,
    /// The client view of the row as committed at this version (env keys only, never values),
    /// so a `wait` that this event satisfies answers without reading the row. Absent from
    /// older publishers; then the waiter reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<Box<differently_core::sandbox::SandboxView>>,
    /// The head of the audit chain the change's record went to, right after it: an API
    /// process that appends the next record of this sandbox on its own (an exec) hashes it
    /// onto this head instead of missing once on a head it last saw before the change.
    /// Internal, like `backend_ref`; absent from older publishers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_head: Option<AuditHead>,
}

/// An audit chain's head: its name, its last record's sequence and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditHead {
    pub chain: String,
    pub seq: i64,
    pub hash: String,
}

impl StatusChanged {
    /// The event of row `s` as committed: its status, and its client view and backend ref at
    /// that version.
    pub fn of(s: &differently_core::Sandbox) -> StatusChanged {
        StatusChanged {
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            status: s.status,
            status_reason: s.status_reason.clone(),
            pool: s.pool.clone(),
            at: s.updated_at,
            backend_ref: s.backend_ref.clone(),
            view: Some(Box::new(s.view())),
            audit_head: None,
        }
    }
}

/// The JetStream message id used for de-duplication: the same sandbox, operation and status
/// version always produce the same id, so a republish by the repair loop is dropped.
pub fn msg_id(sandbox: &SandboxId, what: &str, status_version: i64) -> String {
    format!("{sandbox}:{what}:{status_version}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admission_without_its_row_still_decodes_and_one_with_it_round_trips() {
        let (org, prj) = (OrgId::new(), ProjectId::new());
        let old = format!(r#"{{"orgId":"{org}","projectId":"{prj}"}}"#);
        let body: Admitted = serde_json::from_str(&old).unwrap();
        assert_eq!(body.sandbox, None);
        let spec = differently_core::SandboxSpec::build(&Default::default()).unwrap();
        let row =
            differently_core::Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
        let with = Admitted {
            org_id: org,
            project_id: prj,
            sandbox: Some(Box::new(row)),
        };
        let back: Admitted = serde_json::from_slice(&serde_json::to_vec(&with).unwrap()).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn a_status_event_without_its_view_still_decodes_and_one_with_it_keeps_env_values_out() {
        let (org, prj) = (OrgId::new(), ProjectId::new());
        let at = Utc::now();
        let old = format!(
            r#"{{"orgId":"{org}","projectId":"{prj}","status":"running","statusReason":null,"pool":"p","at":"{}"}}"#,
            at.to_rfc3339()
        );
        let body: StatusChanged = serde_json::from_str(&old).unwrap();
        assert_eq!((body.backend_ref, body.view), (None, None));

        let req: differently_core::CreateSandboxRequest =
            serde_json::from_value(serde_json::json!({"env": {"TOKEN": "s3cret-value"}})).unwrap();
        let spec = differently_core::SandboxSpec::build(&req).unwrap();
        let mut row = differently_core::Sandbox::queued(org, prj, spec, None, at);
        row.status = SandboxStatus::Running;
        row.pool = Some("p".into());
        row.backend_ref = Some("ref".into());
        let with = StatusChanged::of(&row);
        assert_eq!(with.view.as_deref(), Some(&row.view()));
        let wire = serde_json::to_vec(&with).unwrap();
        let text = String::from_utf8(wire.clone()).unwrap();
        assert!(
            text.contains("TOKEN") && !text.contains("s3cret-value"),
            "{text}"
        );
        let back: StatusChanged = serde_json::from_slice(&wire).unwrap();
        assert_eq!(back, with);
    }

    #[test]
    fn names_derive_from_the_prefix() {
        let n = Naming::new("t1").unwrap();
        let org = OrgId::new();
        assert_eq!(n.admit_subject(&org), format!("t1.admit.{org}"));
        assert_eq!(
            n.work_subject("pool-a", WorkOp::Create),
            "t1.work.pool-a.create"
        );
        assert_eq!(n.admit_stream().name, "T1_ADMIT");
        assert_eq!(
            n.work_consumer("p", Duration::from_secs(1)).filter,
            "t1.work.p.>"
        );
        assert!(Naming::new("Bad.Prefix").is_err());
        assert!(Naming::new("").is_err());
    }

    #[test]
    fn work_ops_round_trip_their_subject_token() {
        for op in WorkOp::ALL {
            assert_eq!(WorkOp::parse(op.as_str()), Some(op));
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.as_str()));
        }
        // A message from before `opId` existed still decodes.
        let old: Work = serde_json::from_str(r#"{"op":"create","pool":"p"}"#).unwrap();
        assert_eq!(old.op_id, None);
    }

    #[test]
    fn envelope_round_trips() {
        let env = Envelope::new(
            SandboxId::new(),
            3,
            Work {
                op: WorkOp::Delete,
                pool: "p".into(),
                op_id: None,
                terminating: Some(Terminating {
                    reason: Some("deleted".into()),
                }),
            },
        );
        let json = serde_json::to_vec(&env).unwrap();
        let back: Envelope<Work> = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, env);
        assert!(back.published_at.is_some());
        // An envelope from before `publishedAt` existed still decodes.
        let sid = SandboxId::new();
        let old = format!(
            r#"{{"v":1,"sandboxId":"{sid}","statusVersion":1,"body":{{"op":"create","pool":"p"}}}}"#
        );
        let old: Envelope<Work> = serde_json::from_str(&old).unwrap();
        assert_eq!(old.published_at, None);
        assert_eq!(old.trace, TraceContext::default());
        // …and one without `terminating`: the worker reads the row.
        assert_eq!(old.body.terminating, None);
    }

    #[test]
    fn traceparent_is_validated_and_yields_its_trace_id() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t = TraceContext::from_header(ok).unwrap();
        assert_eq!(t.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ] {
            assert!(TraceContext::from_header(bad).is_none(), "{bad}");
        }
        let r = TraceContext::from_random([7; 16], [0; 8]);
        let back = TraceContext::from_header(r.traceparent.as_deref().unwrap()).unwrap();
        assert_eq!(back.trace_id(), Some("07070707070707070707070707070707"));
    }
}
