//! The API's request and answer bodies, as `docs/api.md` and `/v1/openapi.json` describe
//! them. The wire models are generated from the document ([`generated`], written by
//! `scripts/gen-sdk-models`): answers keep fields this version does not know in `extra`, so
//! printing one back loses nothing, and statuses and other enumerations are strings, so a
//! newer server's value is not an error. This module adds what a generator cannot: filters,
//! the answers that are one of two shapes, and helpers.

use serde::{Deserialize, Serialize};

mod generated;

pub use generated::*;
impl Sandbox {
    /// `terminated` or `failed`: it will not change again.
    pub fn is_final(&self) -> bool {
        is_final_status(&self.status)
    }
}

/// Whether a sandbox status is final.
pub fn is_final_status(status: &str) -> bool {
    matches!(status, "terminated" | "failed")
}

/// Filters of `GET /v1/sandboxes`.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    pub status: Option<String>,
    /// `key=value`.
    pub label: Option<String>,
    pub project_id: Option<String>,
    /// Items per page (the stream still yields every item).
    pub limit: Option<u32>,
}

impl ExecRequest {
    /// A request running `command`.
    pub fn new<S: Into<String>>(command: impl IntoIterator<Item = S>) -> ExecRequest {
        ExecRequest {
            command: command.into_iter().map(Into::into).collect(),
            ..ExecRequest::default()
        }
    }

    /// With these bytes on standard input (sent as base64, so any bytes pass).
    pub fn stdin_bytes(mut self, bytes: &[u8]) -> ExecRequest {
        use base64::Engine;
        self.stdin = None;
        self.stdin_base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        self
    }
}

impl FileEntry {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind == "dir"
    }
}

/// What `POST …/ports` answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortExposure {
    /// 200: the URL.
    Ready(PortAnswer),
    /// 202: still being exposed; ask again.
    Pending(PendingOperation),
}

/// What `DELETE /v1/snapshots/{id}` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotDeletion {
    /// 204: gone.
    Deleted,
    /// 202: still being deleted.
    Pending(Box<Snapshot>),
}

/// Filters of `GET /v1/audit`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub org_id: Option<String>,
    pub project_id: Option<String>,
    /// e.g. `sandbox.exec`.
    pub action: Option<String>,
    pub actor: Option<String>,
    pub resource: Option<String>,
    /// RFC 3339.
    pub since: Option<String>,
    /// RFC 3339.
    pub until: Option<String>,
    pub limit: Option<u32>,
}

impl UpdateWebhook {
    /// Whether it would change nothing.
    pub fn is_empty(&self) -> bool {
        self == &UpdateWebhook::default()
    }
}
