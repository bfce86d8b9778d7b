//! The `data` of each public event type. Written out field by field; nothing here may hold a
//! secret, an exec argument, an env value or an internal reference.

use differently_core::SandboxStatus;
use serde::{Deserialize, Serialize};

use super::EventType;

/// `type` and `data` of a public event (adjacently tagged, so the envelope reads
/// `"type": "sandbox.exec.finished", "data": {…}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum EventData {
    #[serde(rename = "sandbox.status.changed")]
    StatusChanged(StatusData),
    #[serde(rename = "sandbox.operation.requested")]
    OperationRequested(Operation),
    #[serde(rename = "sandbox.operation.finished")]
    OperationFinished(Operation),
    #[serde(rename = "sandbox.operation.failed")]
    OperationFailed(Operation),
    #[serde(rename = "sandbox.exec.started")]
    ExecStarted(ExecStarted),
    #[serde(rename = "sandbox.exec.finished")]
    ExecFinished(ExecFinished),
    #[serde(rename = "sandbox.file.written")]
    FileWritten(FileWritten),
    #[serde(rename = "snapshot.created")]
    SnapshotCreated(SnapshotEvent),
    #[serde(rename = "snapshot.failed")]
    SnapshotFailed(SnapshotEvent),
    #[serde(rename = "snapshot.deleted")]
    SnapshotDeleted(SnapshotEvent),
    #[serde(rename = "placement.decided")]
    PlacementDecided(PlacementDecided),
    #[serde(rename = "webhook.disabled")]
    WebhookDisabled(WebhookDisabled),
}

impl EventData {
    /// The type this data belongs to.
    pub fn event_type(&self) -> EventType {
        match self {
            EventData::StatusChanged(_) => EventType::StatusChanged,
            EventData::OperationRequested(_) => EventType::OperationRequested,
            EventData::OperationFinished(_) => EventType::OperationFinished,
            EventData::OperationFailed(_) => EventType::OperationFailed,
            EventData::ExecStarted(_) => EventType::ExecStarted,
            EventData::ExecFinished(_) => EventType::ExecFinished,
            EventData::FileWritten(_) => EventType::FileWritten,
            EventData::SnapshotCreated(_) => EventType::SnapshotCreated,
            EventData::SnapshotFailed(_) => EventType::SnapshotFailed,
            EventData::SnapshotDeleted(_) => EventType::SnapshotDeleted,
            EventData::PlacementDecided(_) => EventType::PlacementDecided,
            EventData::WebhookDisabled(_) => EventType::WebhookDisabled,
        }
    }
}

/// `sandbox.status.changed`. `statusVersion` increases with every change of one sandbox:
/// a subscriber that sees a lower version after a higher one can drop it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusData {
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    pub status_version: i64,
    pub pool: Option<String>,
}

/// An error as events carry it: a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventError {
    pub code: String,
    pub message: String,
}

/// `sandbox.operation.*`: a lifecycle operation (`pause`, `resume`, `stop`, `start`,
/// `snapshot`, `delete`, …) requested, finished or failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    pub operation_id: String,
    pub operation: String,
    /// Set on `failed`.
    #[serde(default)]
    pub error: Option<EventError>,
}

/// `sandbox.exec.started`: the program only, never its arguments, env or stdin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecStarted {
    pub exec_id: String,
    pub program: String,
}

/// `sandbox.exec.finished`: the program, its exit code (null when it was killed or timed
/// out) and how long it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecFinished {
    pub exec_id: String,
    pub program: String,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    #[serde(default)]
    pub timed_out: bool,
}

/// `sandbox.file.written`: where and how many bytes, never the content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileWritten {
    pub path: String,
    pub size_bytes: u64,
}

/// `snapshot.created`, `snapshot.failed`, `snapshot.deleted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotEvent {
    pub snapshot_id: String,
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// Set on `failed`.
    #[serde(default)]
    pub error: Option<EventError>,
}

/// `placement.decided`: the pool (and region) a queued sandbox was placed in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementDecided {
    pub pool: String,
    pub region: Option<String>,
    /// 1 for the first placement; more after a failed start was re-placed.
    pub attempt: u32,
}

/// `webhook.disabled`: a project's webhook was switched off after failing persistently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDisabled {
    pub webhook_id: String,
    pub reason: String,
}
