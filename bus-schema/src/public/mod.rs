//! The public event contract: what tenants receive on `dly.pub.<org>.<project>.<sandbox>.<type>`
//! (NATS, replayable from the `DLY_PUB` stream), on `GET /v1/events` (SSE) and by webhook.
//!
//! Separate from the internal messages on purpose: an internal message may grow a field for
//! one of our processes (`backendRef`, `auditHead`) and that must never reach a tenant. Public
//! events are built only through the constructors here, which name every field they copy, and
//! each type has a JSON Schema ([`schema`]) pinned by golden fixtures.

mod data;
mod schema;

use chrono::{DateTime, Utc};
use differently_core::{OrgId, ProjectId, SandboxId};
use serde::{Deserialize, Serialize};

pub use data::{
    EventData, EventError, ExecFinished, ExecStarted, FileWritten, Operation, PlacementDecided,
    SnapshotEvent, StatusData, WebhookDisabled,
};
pub use schema::{envelope_schema, schema, schemas};

use crate::{Envelope, StatusChanged};

/// Major version of the public envelope and every `data` shape. Added optional fields and new
/// event types do not bump it (subscribers ignore what they do not know); a removed, renamed or
/// re-typed field does.
pub const PUBLIC_EVENT_VERSION: u32 = 1;

/// Why something happened: whether a change was the tenant's or automatic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// An API call by one of the tenant's keys (`actor` names it).
    User,
    /// The sandbox's time to live ran out.
    Ttl,
    /// The sandbox was idle past its idle timeout.
    Idle,
    /// The control plane's reconciler followed the backend or repaired a lost step.
    Reconciler,
    /// Placement decided it under quotas and capacity: where the sandbox goes
    /// (`placement.decided`), that it waits, or that it cannot be placed.
    Quota,
    /// An operator's administrative action (org suspended, pool drained).
    Admin,
    /// The backend reported it (an instance started, failed or vanished).
    Backend,
}

impl Cause {
    /// Every cause, in documentation order.
    pub const ALL: [Cause; 7] = [
        Cause::User,
        Cause::Ttl,
        Cause::Idle,
        Cause::Reconciler,
        Cause::Quota,
        Cause::Admin,
        Cause::Backend,
    ];

    /// The wire form (`user`, `ttl`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::User => "user",
            Cause::Ttl => "ttl",
            Cause::Idle => "idle",
            Cause::Reconciler => "reconciler",
            Cause::Quota => "quota",
            Cause::Admin => "admin",
            Cause::Backend => "backend",
        }
    }
}

/// Who acted, when a key did: its public id only, never the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventActor {
    pub key_id: String,
}

/// The cause and actor of a change, as its publisher knows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Origin {
    pub cause: Cause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<EventActor>,
}

impl Origin {
    /// A change made by key `key_id` through the API.
    pub fn user(key_id: impl Into<String>) -> Origin {
        Origin {
            cause: Cause::User,
            actor: Some(EventActor {
                key_id: key_id.into(),
            }),
        }
    }

    /// A change the control plane made on its own, for `cause`.
    pub fn system(cause: Cause) -> Origin {
        Origin { cause, actor: None }
    }

    /// The origin of a change recorded with audit actor `actor` (`key:<id>` or
    /// `system:<role>`, as the store writes them): a key is `user`; the roles map to
    /// `ttl`, `idle`, `reconciler` (scheduler, sweeps, reconciler), `quota` (admission),
    /// `admin` (configuration) and `backend` (workers, and anything unknown).
    pub fn from_audit_actor(actor: &str) -> Origin {
        if let Some(key) = actor.strip_prefix("key:") {
            return Origin::user(key);
        }
        let cause = match actor.strip_prefix("system:").unwrap_or("") {
            "ttl" => Cause::Ttl,
            "idle" => Cause::Idle,
            "reconciler" | "sweep" | "scheduler" => Cause::Reconciler,
            "admission" => Cause::Quota,
            "config" => Cause::Admin,
            _ => Cause::Backend,
        };
        Origin::system(cause)
    }
}

/// Every public event type. The string form is also the subject's last tokens and the SSE
/// `event:` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    StatusChanged,
    OperationRequested,
    OperationFinished,
    OperationFailed,
    ExecStarted,
    ExecFinished,
    FileWritten,
    SnapshotCreated,
    SnapshotFailed,
    SnapshotDeleted,
    PlacementDecided,
    WebhookDisabled,
}

impl EventType {
    /// Every type, in documentation order.
    pub const ALL: [EventType; 12] = [
        EventType::StatusChanged,
        EventType::OperationRequested,
        EventType::OperationFinished,
        EventType::OperationFailed,
        EventType::ExecStarted,
        EventType::ExecFinished,
        EventType::FileWritten,
        EventType::SnapshotCreated,
        EventType::SnapshotFailed,
        EventType::SnapshotDeleted,
        EventType::PlacementDecided,
        EventType::WebhookDisabled,
    ];

    /// The wire name, e.g. `sandbox.status.changed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::StatusChanged => "sandbox.status.changed",
            EventType::OperationRequested => "sandbox.operation.requested",
            EventType::OperationFinished => "sandbox.operation.finished",
            EventType::OperationFailed => "sandbox.operation.failed",
            EventType::ExecStarted => "sandbox.exec.started",
            EventType::ExecFinished => "sandbox.exec.finished",
            EventType::FileWritten => "sandbox.file.written",
            EventType::SnapshotCreated => "snapshot.created",
            EventType::SnapshotFailed => "snapshot.failed",
            EventType::SnapshotDeleted => "snapshot.deleted",
            EventType::PlacementDecided => "placement.decided",
            EventType::WebhookDisabled => "webhook.disabled",
        }
    }

    /// The type named `s`, if it is one.
    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Whether an event of this type matches `filter`: an exact type, `*` (everything) or a
    /// prefix ending in `.*` (`sandbox.exec.*`, `snapshot.*`), the forms webhook filters and
    /// `?types=` accept.
    pub fn matches(self, filter: &str) -> bool {
        let name = self.as_str();
        match filter.strip_suffix('*') {
            Some("") => true,
            Some(prefix) if prefix.ends_with('.') => name.starts_with(prefix),
            Some(_) => false,
            None => name == filter,
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One public event: a versioned envelope (who, what, when, why) and its type's `data`.
///
/// `id` is stable: the same change always has the same id (it is also the NATS message id
/// that de-duplicates re-sends), so a subscriber that sees an id twice has seen one event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicEvent {
    pub version: u32,
    pub id: String,
    pub time: DateTime<Utc>,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    /// The sandbox the event is about; absent only for project-level events
    /// (`webhook.disabled`).
    #[serde(default)]
    pub sandbox_id: Option<SandboxId>,
    pub cause: Cause,
    /// The key that acted, for `cause: user`; null otherwise.
    #[serde(default)]
    pub actor: Option<EventActor>,
    /// `type` and `data`, together.
    #[serde(flatten)]
    pub data: EventData,
}

/// Why bytes are not a public event this build reads.
#[derive(Debug, thiserror::Error)]
pub enum PublicDecodeError {
    #[error("public event version {found} is newer than {supported}, the newest this build reads")]
    NewerVersion { found: u32, supported: u32 },
    #[error("not a public event: {0}")]
    Malformed(#[source] serde_json::Error),
}

impl PublicEvent {
    /// An event at the current version. `discriminator` makes `id` unique per change of
    /// `sandbox` (a status version, an operation or exec id) and stable across re-sends.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        org_id: OrgId,
        project_id: ProjectId,
        sandbox_id: Option<SandboxId>,
        origin: Origin,
        time: DateTime<Utc>,
        discriminator: &str,
        data: EventData,
    ) -> PublicEvent {
        let subject = sandbox_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| project_id.to_string());
        let id = format!("{subject}:{}:{discriminator}", data.event_type());
        // A key id is attributed only to what a key did.
        let actor = origin.actor.filter(|_| origin.cause == Cause::User);
        PublicEvent {
            version: PUBLIC_EVENT_VERSION,
            id,
            time,
            org_id,
            project_id,
            sandbox_id,
            cause: origin.cause,
            actor,
            data,
        }
    }

    /// The public form of an internal status event. Copies status, reason, pool and version,
    /// and nothing else: `backendRef`, `auditHead` and the row view stay internal. An event
    /// from a publisher that did not say why is attributed to `backend` (workers, the only
    /// such publishers left, report what the backend did).
    pub fn from_status(env: &Envelope<StatusChanged>) -> PublicEvent {
        let b = &env.body;
        let origin = b
            .origin
            .clone()
            .unwrap_or_else(|| Origin::system(Cause::Backend));
        PublicEvent::new(
            b.org_id.clone(),
            b.project_id.clone(),
            Some(env.sandbox_id.clone()),
            origin,
            b.at,
            &env.status_version.to_string(),
            EventData::StatusChanged(StatusData {
                status: b.status,
                status_reason: b.status_reason.clone(),
                status_version: env.status_version,
                pool: b.pool.clone(),
            }),
        )
    }

    /// This event's type.
    pub fn event_type(&self) -> EventType {
        self.data.event_type()
    }

    /// The JSON published and served.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Reads a public event, refusing a newer major version even when it fits today's types.
    pub fn decode(payload: &[u8]) -> Result<PublicEvent, PublicDecodeError> {
        // One parse when the event fits today's types (as `envelope::decode` does); the
        // version alone is read again only to say why one does not.
        match serde_json::from_slice::<PublicEvent>(payload) {
            Ok(e) if e.version > PUBLIC_EVENT_VERSION => Err(PublicDecodeError::NewerVersion {
                found: e.version,
                supported: PUBLIC_EVENT_VERSION,
            }),
            Ok(e) => Ok(e),
            Err(source) => {
                #[derive(Deserialize)]
                struct VersionOnly {
                    version: u32,
                }
                let v: VersionOnly =
                    serde_json::from_slice(payload).map_err(PublicDecodeError::Malformed)?;
                if v.version > PUBLIC_EVENT_VERSION {
                    return Err(PublicDecodeError::NewerVersion {
                        found: v.version,
                        supported: PUBLIC_EVENT_VERSION,
                    });
                }
                Err(PublicDecodeError::Malformed(source))
            }
        }
    }
}

/// The program of a command line as public events name it: the last path component of its
/// first word, at most 64 characters. Never an argument: `["sh", "-c", "TOKEN=x …"]` is `sh`,
/// and a one-string command `"env TOKEN=x run"` is `env`.
pub fn program_name(command: &[String]) -> String {
    let first = command
        .first()
        .and_then(|c| c.split_whitespace().next())
        .unwrap_or("");
    let base = first.rsplit('/').next().unwrap_or(first);
    base.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_exact_types_prefixes_and_everything() {
        let t = EventType::ExecStarted;
        assert!(t.matches("sandbox.exec.started"));
        assert!(t.matches("sandbox.exec.*"));
        assert!(t.matches("sandbox.*"));
        assert!(t.matches("*"));
        assert!(!t.matches("sandbox.exec"));
        assert!(!t.matches("sandbox.ex*"));
        assert!(!t.matches("snapshot.*"));
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
    }

    #[test]
    fn program_names_never_carry_arguments() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(program_name(&v(&["sh", "-c", "TOKEN=secret run"])), "sh");
        assert_eq!(program_name(&v(&["/usr/bin/python3", "x.py"])), "python3");
        assert_eq!(program_name(&v(&["env TOKEN=secret run"])), "env");
        assert_eq!(program_name(&[]), "");
        assert_eq!(program_name(&v(&[&"a".repeat(100)])).len(), 64);
    }

    #[test]
    fn audit_actors_map_to_causes() {
        assert_eq!(Origin::from_audit_actor("key:key_1"), Origin::user("key_1"));
        for (actor, cause) in [
            ("system:ttl", Cause::Ttl),
            ("system:idle", Cause::Idle),
            ("system:reconciler", Cause::Reconciler),
            ("system:worker", Cause::Backend),
            ("system:admission", Cause::Quota),
            ("nonsense", Cause::Backend),
        ] {
            assert_eq!(
                Origin::from_audit_actor(actor),
                Origin::system(cause),
                "{actor}"
            );
        }
    }

    #[test]
    fn an_actor_is_kept_only_for_what_a_key_did() {
        let mut o = Origin::user("key_1");
        o.cause = Cause::Ttl;
        let e = PublicEvent::new(
            OrgId::new(),
            ProjectId::new(),
            None,
            o,
            Utc::now(),
            "1",
            EventData::WebhookDisabled(WebhookDisabled {
                webhook_id: "whk_1".into(),
                reason: "failing".into(),
            }),
        );
        assert_eq!(e.actor, None);
        assert_eq!(e.cause, Cause::Ttl);
    }
}
