//! The API's request and answer bodies, as `docs/api.md` and `/v1/openapi.json` describe
//! them. Answers keep fields this version does not know in `extra`, so printing one back
//! loses nothing. Documents the API itself serves as free-form objects (placement
//! explanations, audit records, the trust report, policies' inner lists) stay
//! [`serde_json::Value`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// CPU, memory, disk of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// vCPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Disk in GiB.
    #[serde(rename = "diskGiB", skip_serializing_if = "Option::is_none")]
    pub disk_gib: Option<u64>,
}

/// A sandbox as the API serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    pub id: String,
    pub org_id: String,
    pub project_id: String,
    /// `queued`, `provisioning`, `running`, `paused`, `stopped`, `terminating`, `terminated`,
    /// `failed` (a string, so a newer server's status is not an error here).
    pub status: String,
    pub status_reason: Option<String>,
    pub pool: Option<String>,
    pub resources: Resources,
    #[serde(default)]
    pub capabilities: Vec<String>,
    pub classification: String,
    pub region: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub template: Option<String>,
    /// The names of its environment variables (values are never served).
    #[serde(default)]
    pub env_keys: Vec<String>,
    pub ttl_seconds: u64,
    pub idle_timeout_seconds: Option<u64>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub attempts: u64,
    pub created_at: String,
    pub started_at: Option<String>,
    pub expires_at: Option<String>,
    pub ended_at: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

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

/// `POST /v1/sandboxes` (and the placement dry run): every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandbox {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// `small`, `medium`, `large`, `xlarge`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub classification: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A placement strategy (`cheapest`, `fastest`, …; docs/placement.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// External pools: `allow`, `deny`, `prefer` (docs/placement.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Restore or fork: a ready snapshot's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
}

/// `PATCH /v1/sandboxes/{id}`: what to change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateSandbox {
    /// A new TTL, counted from now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Replaces every label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
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

/// `POST …/exec` and `…/exec/stream`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRequest {
    /// The program and its arguments.
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// An absolute path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Standard input as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Standard input as base64 (any bytes); excludes `stdin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
    /// `utf8` (default) or `base64` (binary-safe, for SSE and buffered answers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_encoding: Option<String>,
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

/// A buffered exec's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    /// 124 when the timeout killed it.
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Each stream keeps 1 MiB; the rest is cut.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

/// The end of a streamed exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecExit {
    pub exit_code: i32,
    pub duration_ms: u64,
}

/// An error that ended a stream after it began (the status was already 200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamError {
    pub code: String,
    pub message: String,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    pub path: String,
    /// `file`, `dir`, `symlink`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Permission bits (decimal in JSON: 420 is `0644`).
    pub mode: u32,
    pub modified_at: Option<String>,
}

impl FileEntry {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind == "dir"
    }
}

/// `GET …/files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileList {
    pub items: Vec<FileEntry>,
}

/// An exposed port's URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortAnswer {
    pub url: String,
    pub expires_at: Option<String>,
}

/// Work the API accepted and finishes later (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOperation {
    pub operation: String,
    pub status: String,
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

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub id: String,
    pub org_id: String,
    pub project_id: String,
    pub sandbox_id: String,
    pub pool: String,
    pub name: Option<String>,
    /// `creating`, `ready`, `failed`, `deleting`.
    pub status: String,
    pub status_reason: Option<String>,
    pub created_at: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What `DELETE /v1/snapshots/{id}` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotDeletion {
    /// 204: gone.
    Deleted,
    /// 202: still being deleted.
    Pending(Box<Snapshot>),
}

/// A sandbox status change, as `GET /v1/events` serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusEvent {
    pub sandbox_id: String,
    pub org_id: String,
    pub project_id: String,
    pub status: String,
    pub status_reason: Option<String>,
    pub pool: Option<String>,
    pub status_version: u64,
    pub at: String,
}

/// An organization.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Org {
    pub id: String,
    pub name: String,
    /// `active` or `suspended`.
    pub status: String,
    pub created_at: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `PATCH /v1/orgs/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateOrg {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `active` or `suspended`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A project.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub created_at: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An API key's record (never its secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Key {
    pub id: String,
    pub org_id: Option<String>,
    pub project_id: Option<String>,
    pub name: String,
    pub scopes: Vec<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
    pub last_used_at: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `POST /v1/keys`'s answer: the record and, this once, the secret.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedKey {
    /// The secret, `dly_<keyid>_<secret>`.
    pub key: String,
    #[serde(flatten)]
    pub record: Key,
}

impl std::fmt::Debug for CreatedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedKey")
            .field("key", &"…")
            .field("record", &self.record)
            .finish()
    }
}

/// `POST /v1/keys`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateKey {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub name: String,
    /// `sandboxes:read`, `sandboxes:write`, `sandboxes:exec`, `files:read`, `files:write`, `admin`, …
    pub scopes: Vec<String>,
    /// RFC 3339, in the future.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// An organization's or project's quota (an absent limit does not restrict).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_active: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<u64>,
    #[serde(rename = "maxMemoryMiB", skip_serializing_if = "Option::is_none")]
    pub max_memory_mib: Option<u64>,
    #[serde(rename = "maxDiskGiB", skip_serializing_if = "Option::is_none")]
    pub max_disk_gib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_seconds: Option<u64>,
    /// The largest one sandbox may be (`Resources`-shaped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sandbox: Option<Value>,
}

/// A quota, the limits in force with the parents', and what is used now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaView {
    pub quota: Quota,
    pub effective: Quota,
    /// Active, queued, CPU, memory, disk in use.
    pub usage: Value,
}

/// A placement policy at one level (global, organization, project; docs/placement.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_classifications: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_classifications: Option<BTreeMap<String, Vec<String>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_regions: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_external: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_pools: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denied_pools: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_strategy: Option<String>,
}

/// A pool: its record and, when read, health and capabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub name: String,
    pub kind: String,
    /// `private` or `external`.
    pub trust: String,
    pub region: Option<String>,
    pub max_concurrent: Option<u64>,
    /// `config` or `api`.
    pub source: String,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub healthy: Option<bool>,
    /// The backend version the API's adapter last detected (read answers only).
    #[serde(default)]
    pub backend_version: Option<String>,
    /// `live`, `replayed`, `fake-only` or `unknown` (read answers only).
    #[serde(default)]
    pub verified: Option<String>,
    /// What the verified status rests on (read answers only).
    #[serde(default)]
    pub verified_basis: Option<String>,
    /// `container` or `microvm` as declared (a devhost pool: `bwrap` or `none`).
    #[serde(default)]
    pub isolation: Option<String>,
    /// Currency units per CPU-hour (placement's cost model).
    #[serde(default)]
    pub cost_per_cpu_hour: Option<f64>,
    /// Typical seconds from create to running (placement's speed hint).
    #[serde(default)]
    pub typical_create_seconds: Option<f64>,
    /// Adapter settings: credential references, never credentials.
    #[serde(default)]
    pub settings: Value,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
    /// The last probe's result (read answers only).
    #[serde(default)]
    pub health: Option<Value>,
    /// Sandboxes counted against `maxConcurrent` now (read answers only).
    #[serde(default)]
    pub used_slots: Option<u64>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `POST /v1/admin/pools` and `PATCH …/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_per_cpu_hour: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_create_seconds: Option<f64>,
    /// Adapter settings: credential references only (docs/configuration.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<Value>,
}

/// One warm class of a pool (`PUT /v1/admin/pools/{name}/warm`): instances kept ready so
/// that a create with the same template and resources is answered from one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmClass {
    /// `a-z`, `0-9` and `-`, unique within the pool.
    pub name: String,
    /// Instances kept creating or ready.
    pub size: u32,
    /// Ready instances above which the surplus is retired (none: `size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u32>,
    /// Creates started per second at most while refilling.
    pub refill_per_second: f64,
    /// A ready instance older than this is replaced (none: 3600 when put; served filled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<u64>,
    /// The instances' template (none: the pool's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The instances' resources, all three given (none: a create's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

/// A warm class as served: the class and its instances by state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmClassStatus {
    #[serde(flatten)]
    pub class: WarmClass,
    /// Instances ready to be claimed.
    pub ready: u32,
    /// Instances being created.
    pub creating: u32,
    /// Instances claimed per minute over the last 10 minutes.
    #[serde(default)]
    pub claims_per_minute: f64,
    /// Share of the creates that matched the class over the last 10 minutes answered from a
    /// ready instance (`None`: none matched).
    #[serde(default)]
    pub hit_ratio: Option<f64>,
}

/// `GET /v1/admin/pools/{name}/warm`: the pool's classes in matching order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmClasses {
    pub classes: Vec<WarmClassStatus>,
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

/// A webhook as the API serves it: never its secret (only create and rotate answer that).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    pub id: String,
    pub org_id: String,
    pub project_id: String,
    pub url: String,
    /// Exact types, prefixes (`sandbox.exec.*`) or `*`; empty: every type.
    #[serde(default)]
    pub event_types: Vec<String>,
    pub description: Option<String>,
    /// `false` once disabled (by a `PATCH`, or automatically after failing for a day).
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// Failed attempts in a row (any success resets it).
    #[serde(default)]
    pub consecutive_failures: u64,
    pub failing_since: Option<String>,
    /// Until when the secret replaced by the last rotation still signs next to the new one.
    pub previous_secret_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The answer of create and rotate-secret: the webhook and, this once, its signing secret.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookWithSecret {
    /// `whsec_<base64>`: the Standard Webhooks signing key. Never served again.
    pub secret: String,
    #[serde(flatten)]
    pub webhook: Webhook,
}

impl std::fmt::Debug for WebhookWithSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookWithSecret")
            .field("secret", &"…")
            .field("webhook", &self.webhook)
            .finish()
    }
}

/// `POST /v1/webhooks`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateWebhook {
    /// Default: the key's project.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// `https://…` (`http` only where the operator allows it).
    pub url: String,
    /// `None` or empty: every type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `PATCH /v1/webhooks/{id}`: only the fields that are set change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateWebhook {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `Some(vec![])`: every type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    /// `Some(None)` clears it (sent as `null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<Option<String>>,
    /// `true` re-enables a disabled webhook and forgets the failures that disabled it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

impl UpdateWebhook {
    /// Whether it would change nothing.
    pub fn is_empty(&self) -> bool {
        self == &UpdateWebhook::default()
    }
}

/// One event's delivery to one webhook, and how its attempts went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDelivery {
    pub id: String,
    pub webhook_id: String,
    /// The public event's `id`: also the `webhook-id` header of every attempt.
    pub event_id: String,
    pub event_type: String,
    /// `pending`, `succeeded` or `failed` (a string, so a newer server's is not an error).
    pub status: String,
    #[serde(default)]
    pub attempts: u64,
    pub next_attempt_at: Option<String>,
    pub response_code: Option<u16>,
    pub latency_ms: Option<u64>,
    pub last_error: Option<String>,
    /// The first 1 KiB of the last answer.
    pub response_body: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub delivered_at: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A public event (`docs/events.md`): the same JSON on SSE (`format=public`), NATS and
/// webhooks. `data` depends on the type; its JSON Schema is `GET /v1/events/schemas/{type}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicEvent {
    /// The envelope's major version.
    pub version: u32,
    /// Stable across re-sends: de-duplicate on it.
    pub id: String,
    /// `sandbox.status.changed`, … (a string: ignore types you do not know).
    #[serde(rename = "type")]
    pub event_type: String,
    pub time: String,
    pub org_id: String,
    pub project_id: String,
    /// `None` for project-level events (`webhook.disabled`).
    pub sandbox_id: Option<String>,
    /// `user`, `ttl`, `idle`, `reconciler`, `quota`, `admin`, `backend`.
    pub cause: String,
    /// `{"keyId": …}` for `cause: user`.
    pub actor: Option<Value>,
    pub data: Value,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `GET /v1/events/schemas`: the envelope's schema and every type's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventSchemaList {
    pub version: u32,
    /// The JSON Schema every event's envelope follows.
    pub envelope: Value,
    pub items: Vec<EventTypeSchema>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One public event type and its JSON Schema (draft 2020-12).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventTypeSchema {
    #[serde(rename = "type")]
    pub event_type: String,
    pub schema: Value,
}

/// `POST /v1/events/credentials`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventCredentialsRequest {
    /// 60 … 86400 (default 3600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Only this project's subjects (a project-bound key gets its own anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
}

/// NATS credentials for an organization's (or project's) public subjects; the token is
/// shown this once.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventCredentials {
    /// `evc_…`: what `DELETE /v1/events/credentials/{id}` revokes.
    pub id: String,
    /// The NATS connection token.
    pub token: String,
    pub expires_at: String,
    pub org_id: String,
    pub project_id: Option<String>,
    /// The subject filter it may subscribe to.
    pub subscribe: String,
    /// The inbox prefix to connect with.
    pub inbox_prefix: String,
    pub stream: String,
    /// The consumer-create subject its JetStream consumers must use.
    pub consumer_create: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl std::fmt::Debug for EventCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventCredentials")
            .field("id", &self.id)
            .field("token", &"…")
            .field("expires_at", &self.expires_at)
            .field("org_id", &self.org_id)
            .field("project_id", &self.project_id)
            .field("subscribe", &self.subscribe)
            .finish_non_exhaustive()
    }
}
