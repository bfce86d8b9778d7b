//! `dly.work.<pool>.<op>`: one backend mutation for a pool's workers.

use differently_core::lifecycle::LifecycleOp;
use serde::{Deserialize, Serialize};

use crate::Message;

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
    /// Creates a warm instance ahead of any sandbox: the envelope's sandbox id is the warm
    /// instance's id (there is no sandbox row), [`Work::warm`] names its class.
    WarmCreate,
    /// Deletes a retired warm instance (envelope sandbox id = the warm id; no sandbox row).
    WarmDelete,
    /// Makes the backend call a claimed warm instance needs (e.g. its TTL set to the
    /// tenant's) before the sandbox that claimed it, `provisioning`, becomes `running`.
    Claim,
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
    pub const ALL: [WorkOp; 13] = [
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
        WorkOp::WarmCreate,
        WorkOp::WarmDelete,
        WorkOp::Claim,
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
            WorkOp::WarmCreate => "warmcreate",
            WorkOp::WarmDelete => "warmdelete",
            WorkOp::Claim => "claim",
        }
    }

    /// Whether the message is about a warm instance, not a sandbox: no sandbox row exists
    /// under the envelope's id, so a worker must not look one up.
    pub fn is_warm(self) -> bool {
        matches!(self, WorkOp::WarmCreate | WorkOp::WarmDelete)
    }

    /// Parses the subject token.
    pub fn parse(s: &str) -> Option<WorkOp> {
        WorkOp::ALL.into_iter().find(|op| op.as_str() == s)
    }
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
    /// On a warm create or delete: the warm instance's class (the envelope's sandbox id is
    /// the instance's id). Absent on every other operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmWork>,
}

/// See [`Work::warm`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmWork {
    /// The class of the pool the instance belongs to; the worker reads its template and
    /// resources from the pool's warm classes when it creates.
    pub class: String,
}

/// See [`Work::terminating`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terminating {
    pub reason: Option<String>,
}

impl Message for Work {
    const KIND: &'static str = "work";
}
