//! Runloop's devbox API (`/v1/devboxes`): the wire types and one function per call, with no
//! policy (waiting, idempotency and state mapping are the adapter's). Fields the adapter does
//! not read are ignored, so answers carrying more than the spec says still parse.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use crate::http::HttpClient;
use crate::kit::paths::segment;
use crate::kit::tags::Tagged;
use crate::{AdapterError, InstanceState};

/// The statuses a devbox is listed under until it is shut down: the list call filters by one
/// status and has no metadata filter, and shut-down devboxes stay listed for good, so
/// lookups ask for each of these apart.
pub(crate) const LIVE_STATUSES: [&str; 9] = [
    "scheduled",
    "queued",
    "provisioning",
    "initializing",
    "running",
    "suspending",
    "suspended",
    "resuming",
    "failure",
];

/// Longest hold the server gives a devbox status poll (`STATUS_LONG_POLL_SERVER_MAX_SECONDS`).
pub(crate) const STATUS_HOLD: Duration = Duration::from_secs(30);
/// Longest hold of an execution status poll (`EXEC_LONG_POLL_SERVER_MAX_SECONDS`).
pub(crate) const EXEC_HOLD: Duration = Duration::from_secs(25);
/// What a long poll's client waits beyond the hold, so the server's 408 comes first.
const HOLD_MARGIN: Duration = Duration::from_secs(5);

/// A devbox as Runloop answers it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Devbox {
    pub id: String,
    pub status: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub create_time_ms: i64,
    #[serde(default)]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub tunnel: Option<Tunnel>,
}

impl Devbox {
    /// Runloop's status in ours; `None` once shut down.
    pub(crate) fn our_state(status: &str) -> Option<InstanceState> {
        Some(match status {
            "running" => InstanceState::Running,
            // Suspension keeps the disk, not the processes: a stop, not a pause.
            "suspending" | "suspended" => InstanceState::Stopped,
            "failure" => InstanceState::Failed,
            "shutdown" => return None,
            // scheduled, queued, provisioning, initializing, resuming, and statuses added later.
            _ => InstanceState::Pending,
        })
    }
}

impl Tagged for Devbox {
    fn backend_ref(&self) -> &str {
        &self.id
    }
    fn tag(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }
    fn state(&self) -> Option<InstanceState> {
        Devbox::our_state(&self.status)
    }
}

/// A devbox's tunnel (`TunnelView`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Tunnel {
    pub tunnel_key: String,
    pub auth_mode: String,
}

/// `POST /v1/devboxes`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CreateBody {
    pub name: String,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub environment_variables: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blueprint_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blueprint_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    pub launch_parameters: LaunchParameters,
}

/// The launch parameters the adapter sets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct LaunchParameters {
    pub resource_size_request: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_cpu_cores: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_gb_memory: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub custom_disk_size: Option<u64>,
    pub keep_alive_time_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DevboxPage {
    #[serde(default)]
    devboxes: Vec<Devbox>,
    #[serde(default)]
    has_more: bool,
}

fn devbox_path(id: &str, rest: &str) -> String {
    format!("/v1/devboxes/{}{rest}", segment(id))
}

/// `POST /v1/devboxes`.
pub(crate) async fn create(c: &HttpClient, body: &CreateBody) -> Result<Devbox, AdapterError> {
    c.json(
        c.api(Method::POST, "/v1/devboxes").json(body),
        "create devbox",
    )
    .await
}

/// `GET /v1/devboxes/{id}`.
pub(crate) async fn get(c: &HttpClient, id: &str) -> Result<Devbox, AdapterError> {
    c.json(c.api(Method::GET, &devbox_path(id, "")), "get devbox")
        .await
}

/// Every devbox in `status`, every page (`starting_after` the last id while `has_more`).
pub(crate) async fn list_status(c: &HttpClient, status: &str) -> Result<Vec<Devbox>, AdapterError> {
    let mut out: Vec<Devbox> = Vec::new();
    // Bounded, so a server repeating a page cannot loop us forever.
    for _ in 0..1000 {
        let mut q = vec![
            ("status", status.to_owned()),
            ("limit", "1000".to_owned()),
            ("include_total_count", "false".to_owned()),
        ];
        if let Some(last) = out.last() {
            q.push(("starting_after", last.id.clone()));
        }
        let page: DevboxPage = c
            .json(
                c.api(Method::GET, "/v1/devboxes").query(&q),
                "list devboxes",
            )
            .await?;
        let before = out.len();
        out.extend(page.devboxes);
        if !page.has_more || out.len() == before {
            return Ok(out);
        }
    }
    Ok(out)
}

/// Every devbox that is not shut down: one listing per live status, side by side.
pub(crate) async fn list_live(c: &HttpClient) -> Result<Vec<Devbox>, AdapterError> {
    let pages = futures::future::join_all(LIVE_STATUSES.iter().map(|s| list_status(c, s))).await;
    let mut all = Vec::new();
    for p in pages {
        all.extend(p?);
    }
    // A devbox changing status between two listings may show twice.
    all.sort_by(|a, b| a.id.cmp(&b.id));
    all.dedup_by(|a, b| a.id == b.id);
    Ok(all)
}

/// `GET /v1/devboxes?limit=1`: the key works and the API answers.
pub(crate) async fn ping(c: &HttpClient) -> Result<(), AdapterError> {
    c.send_ok(
        c.api(Method::GET, "/v1/devboxes")
            .query(&[("limit", "1"), ("include_total_count", "false")]),
        "health",
    )
    .await
    .map(drop)
}

/// `POST /v1/devboxes/{id}/{action}` for `suspend`, `resume`, `shutdown`.
pub(crate) async fn action(c: &HttpClient, id: &str, action: &str) -> Result<Devbox, AdapterError> {
    c.json(
        c.api(Method::POST, &devbox_path(id, &format!("/{action}"))),
        &format!("{action} devbox"),
    )
    .await
}

/// `POST /v1/devboxes/{id}/wait_for_status`: the devbox once in one of `statuses`, or
/// `None` when the hold (at most `hold`, capped at the server's) passed first (a 408).
pub(crate) async fn wait_status(
    c: &HttpClient,
    id: &str,
    statuses: &[&str],
    hold: Duration,
) -> Result<Option<Devbox>, AdapterError> {
    let hold = hold.min(STATUS_HOLD);
    let op = "wait for devbox status";
    let rb = c
        .api(Method::POST, &devbox_path(id, "/wait_for_status"))
        .json(&serde_json::json!({
            "statuses": statuses,
            "timeout_seconds": hold.as_secs().max(1),
        }))
        .timeout(hold + HOLD_MARGIN);
    held(c, rb, op).await
}

/// The answer of a long poll: `None` for its 408 (nothing yet), else the decoded 2xx.
pub(crate) async fn held<T: serde::de::DeserializeOwned>(
    c: &HttpClient,
    rb: reqwest::RequestBuilder,
    op: &str,
) -> Result<Option<T>, AdapterError> {
    match c.call(rb, op).await? {
        Ok(resp) => c.decode(op, resp).await.map(Some),
        Err(a) if a.status == StatusCode::REQUEST_TIMEOUT => Ok(None),
        Err(a) => Err(c.map_answer(op, &a)),
    }
}

/// `POST /v1/devboxes/{id}/enable_tunnel {auth_mode: "open"}`.
pub(crate) async fn enable_open_tunnel(c: &HttpClient, id: &str) -> Result<Tunnel, AdapterError> {
    c.json(
        c.api(Method::POST, &devbox_path(id, "/enable_tunnel"))
            .json(&serde_json::json!({"auth_mode": "open", "http_keep_alive": true})),
        "enable tunnel",
    )
    .await
}

/// A disk snapshot (`DevboxSnapshotView`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Snapshot {
    pub id: String,
}

#[derive(Debug, Deserialize)]
struct SnapshotPage {
    #[serde(default)]
    snapshots: Vec<Snapshot>,
}

/// `POST /v1/devboxes/{id}/snapshot_disk_async {name, metadata}`: answers at once.
pub(crate) async fn take_snapshot(
    c: &HttpClient,
    id: &str,
    name: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<Snapshot, AdapterError> {
    c.json(
        c.api(Method::POST, &devbox_path(id, "/snapshot_disk_async"))
            .json(&serde_json::json!({"name": name, "metadata": metadata})),
        "snapshot devbox",
    )
    .await
}

/// The snapshots whose metadata has `key` = `value` (`metadata[key]=value`).
pub(crate) async fn snapshots_tagged(
    c: &HttpClient,
    key: &str,
    value: &str,
) -> Result<Vec<Snapshot>, AdapterError> {
    let page: SnapshotPage = c
        .json(
            c.api(Method::GET, "/v1/devboxes/disk_snapshots").query(&[
                (format!("metadata[{key}]"), value.to_owned()),
                ("limit".to_owned(), "100".to_owned()),
                ("include_total_count".to_owned(), "false".to_owned()),
            ]),
            "find snapshot",
        )
        .await?;
    Ok(page.snapshots)
}

/// `GET /v1/devboxes/disk_snapshots/{id}/status` (`DevboxSnapshotAsyncStatusView`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SnapshotStatus {
    pub status: String,
    #[serde(default)]
    pub error_message: Option<String>,
}

pub(crate) async fn snapshot_status(
    c: &HttpClient,
    id: &str,
) -> Result<SnapshotStatus, AdapterError> {
    let path = format!("/v1/devboxes/disk_snapshots/{}/status", segment(id));
    c.json(c.api(Method::GET, &path), "snapshot status").await
}

/// `POST /v1/devboxes/disk_snapshots/{id}/delete`.
pub(crate) async fn delete_snapshot(c: &HttpClient, id: &str) -> Result<(), AdapterError> {
    let path = format!("/v1/devboxes/disk_snapshots/{}/delete", segment(id));
    c.send_ok(c.api(Method::POST, &path), "delete snapshot")
        .await
        .map(drop)
}
