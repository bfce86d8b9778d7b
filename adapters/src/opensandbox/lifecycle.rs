//! The lifecycle API (OpenSandbox server, `…/v1`): wire types and one function per call.

use std::collections::BTreeMap;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use super::client::{code_suffix, parse_error, Client};
use super::versions::{self, Behaviour};
use crate::AdapterError;

/// Longest wait for one `Retry-After` on create that the adapter sits out itself; a longer
/// one goes back to the worker as a transient error carrying the wait.
pub(crate) const MAX_THROTTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Most creates a throttling server (429) is asked in one call.
const MAX_THROTTLED_TRIES: u32 = 4;

/// Metadata key holding Differently's sandbox id.
pub(crate) const META_SANDBOX: &str = "differently-sandbox-id";
/// Metadata key holding Differently's installation id.
pub(crate) const META_INSTALLATION: &str = "differently-installation-id";

/// `status` of a sandbox or snapshot. Unknown states are kept as strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Status {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ImageRef {
    pub uri: String,
}

/// A sandbox as GET/list/create answer it (create omits image and snapshotId).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sandbox {
    pub id: String,
    #[serde(default)]
    pub status: Status,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub image: Option<ImageRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pagination {
    #[serde(default)]
    has_next_page: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct Page<T> {
    items: Vec<T>,
    pagination: Option<Pagination>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ImageSpec {
    pub uri: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EgressRule {
    pub action: &'static str,
    pub target: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NetworkPolicy {
    pub default_action: &'static str,
    pub egress: Vec<EgressRule>,
}

/// Body of `POST /sandboxes`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_limits: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicy>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub secure_access: bool,
}

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Snapshot {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub status: Status,
}

/// `GET /sandboxes/{id}/endpoints/{port}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct EndpointAnswer {
    pub endpoint: String,
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
}

/// Where to ask for an endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EndpointMode {
    Direct,
    ServerProxy,
    Signed { expires_epoch: i64 },
}

fn seg(s: &str) -> String {
    // Backend ids are server-made; refuse anything that could change the path.
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Creates a sandbox. A refusal that is about the image names `image` and is permanent (the
/// pool itself is fine), except Kubernetes' readiness timeout, which a slow pull looks like.
/// The body is checked against the fields the server's version knows before it is sent; a
/// 429 (1.3 may throttle creates) is waited out when its `Retry-After` is short, and is
/// otherwise a transient error carrying the wait.
pub(crate) async fn create(
    c: &Client,
    body: &CreateBody,
    image: &str,
    timeout: std::time::Duration,
    behaviour: &Behaviour,
) -> Result<Sandbox, AdapterError> {
    let op = "create sandbox";
    let body = serde_json::to_value(body)
        .map_err(|e| AdapterError::permanent(format!("{op}: cannot encode the body: {e}")))?;
    versions::audit(&body, behaviour.create_fields, op, behaviour.version)?;
    let started = std::time::Instant::now();
    let mut tries = 0;
    let resp = loop {
        tries += 1;
        let left = timeout.saturating_sub(started.elapsed());
        let resp = c
            .send(
                c.api(Method::POST, "/sandboxes").json(&body).timeout(left),
                op,
            )
            .await?;
        if resp.status() != StatusCode::TOO_MANY_REQUESTS {
            break resp;
        }
        let wait = crate::http::retry_after(resp.headers());
        let fits = wait.is_some_and(|w| {
            w <= MAX_THROTTLE_WAIT && started.elapsed() + w < timeout && tries < MAX_THROTTLED_TRIES
        });
        match wait {
            Some(w) if fits => {
                tracing::debug!(
                    wait_ms = w.as_millis() as u64,
                    "OpenSandbox throttled a create; waiting"
                );
                tokio::time::sleep(w).await;
            }
            _ => return Err(c.status_error(op, resp).await),
        }
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap_or_default();
        let err = parse_error(status, &bytes);
        if let Some(e) = image_failure(image, &err.code, &err.message) {
            return Err(e);
        }
        return Err(c.map(op, status, &bytes));
    }
    let bytes = resp.bytes().await.map_err(|e| c.transport_error(op, e))?;
    crate::http::decode_answer(&bytes, op, "OpenSandbox")
}

/// An image pull failure, recognised by code or message, as an error naming the image.
///
/// The server's own message is not passed on: the real Docker runtime's carries the Docker
/// API URL, the registry it dialled and the host's DNS resolver address, none of which is the
/// tenant's business. The tenant gets the image, the kind of failure and the code; the
/// operator's log gets the whole message.
pub(crate) fn image_failure(image: &str, code: &str, message: &str) -> Option<AdapterError> {
    let text = format!("{code} {message}");
    let lower = text.to_ascii_lowercase();
    let short = if code.is_empty() {
        "no code"
    } else {
        code_suffix(code)
    };
    if code_suffix(code) == "POD_READY_TIMEOUT" || text.contains("POD_READY_TIMEOUT") {
        tracing::warn!(
            image,
            code,
            message,
            "opensandbox: sandbox not ready in time"
        );
        return Some(AdapterError::transient(format!(
            "sandbox did not become ready in time; image `{image}` may still be pulling or may \
             not exist ({short})"
        )));
    }
    let about_image = lower.contains("pull")
        || lower.contains("manifest unknown")
        || lower.contains("no such image")
        || lower.contains("image not found");
    about_image.then(|| {
        tracing::warn!(image, code, message, "opensandbox: image pull failed");
        AdapterError::permanent(format!(
            "image `{image}` could not be pulled: {} ({short})",
            pull_cause(&lower)
        ))
    })
}

/// What kind of pull failure a server message describes, in words safe to show a tenant.
fn pull_cause(lower: &str) -> &'static str {
    if [
        "dial tcp",
        "lookup ",
        "connection refused",
        "i/o timeout",
        "tls handshake",
    ]
    .iter()
    .any(|m| lower.contains(m))
    {
        "the backend could not reach the image's registry"
    } else if [
        "pull access denied",
        "repository does not exist",
        "manifest unknown",
        "not found",
        "unauthorized",
    ]
    .iter()
    .any(|m| lower.contains(m))
    {
        "the image does not exist or needs registry credentials the backend lacks"
    } else {
        "the backend's pull failed"
    }
}

pub(crate) async fn get(c: &Client, id: &str) -> Result<Sandbox, AdapterError> {
    c.json(
        c.api(Method::GET, &format!("/sandboxes/{}", seg(id))),
        "get sandbox",
    )
    .await
}

/// Every sandbox whose metadata has `key=value`, across all pages.
pub(crate) async fn list_by_metadata(
    c: &Client,
    key: &str,
    value: &str,
) -> Result<Vec<Sandbox>, AdapterError> {
    let filter = format!("{key}={value}");
    let mut out = Vec::new();
    for page in 1..=1000u32 {
        let rb = c.api(Method::GET, "/sandboxes").query(&[
            ("metadata", filter.as_str()),
            ("page", &page.to_string()),
            ("pageSize", "200"),
        ]);
        let p: Page<Sandbox> = c.json(rb, "list sandboxes").await?;
        let more = p.pagination.is_some_and(|p| p.has_next_page) && !p.items.is_empty();
        // The filter is the server's; check it again so a server that ignores it cannot make
        // us act on someone else's sandbox.
        out.extend(
            p.items
                .into_iter()
                .filter(|s| s.metadata.get(key).map(String::as_str) == Some(value)),
        );
        if !more {
            break;
        }
    }
    Ok(out)
}

/// Any authenticated call, for health: one item of the list.
pub(crate) async fn probe(c: &Client) -> Result<(), AdapterError> {
    let rb = c
        .api(Method::GET, "/sandboxes")
        .query(&[("page", "1"), ("pageSize", "1")]);
    let _: Page<serde_json::Value> = c.json(rb, "health check").await?;
    Ok(())
}

/// Deletes a sandbox; a missing one is fine.
pub(crate) async fn delete(c: &Client, id: &str) -> Result<(), AdapterError> {
    let op = "delete sandbox";
    let resp = c
        .send(
            c.api(Method::DELETE, &format!("/sandboxes/{}", seg(id))),
            op,
        )
        .await?;
    match resp.status() {
        s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
        _ => Err(c.status_error(op, resp).await),
    }
}

/// `pause` or `resume`. `Ok(false)`: 409, the sandbox is not in the state the action needs.
pub(crate) async fn transition(c: &Client, id: &str, action: &str) -> Result<bool, AdapterError> {
    let op = format!("{action} sandbox");
    let resp = c
        .send(
            c.api(Method::POST, &format!("/sandboxes/{}/{action}", seg(id))),
            &op,
        )
        .await?;
    match resp.status() {
        s if s.is_success() => Ok(true),
        StatusCode::CONFLICT => Ok(false),
        _ => Err(c.status_error(&op, resp).await),
    }
}

/// Moves the expiry. A refusal because the new time is not later than the current one is
/// fine: the backstop then stays later than Differently's own expiry.
pub(crate) async fn renew(
    c: &Client,
    id: &str,
    expires_at: chrono::DateTime<chrono::Utc>,
) -> Result<(), AdapterError> {
    let op = "renew sandbox expiration";
    let body = serde_json::json!({
        "expiresAt": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    });
    let resp = c
        .send(
            c.api(
                Method::POST,
                &format!("/sandboxes/{}/renew-expiration", seg(id)),
            )
            .json(&body),
            op,
        )
        .await?;
    if resp.status().is_success() {
        return Ok(());
    }
    let status = resp.status();
    let bytes = resp.bytes().await.unwrap_or_default();
    let err = parse_error(status, &bytes);
    if status == StatusCode::BAD_REQUEST && code_suffix(&err.code) == "INVALID_EXPIRATION" {
        tracing::debug!("OpenSandbox kept its later expiry");
        return Ok(());
    }
    Err(c.map(op, status, &bytes))
}

pub(crate) async fn endpoint(
    c: &Client,
    id: &str,
    port: u16,
    mode: EndpointMode,
) -> Result<EndpointAnswer, AdapterError> {
    let rb = c.api(
        Method::GET,
        &format!("/sandboxes/{}/endpoints/{port}", seg(id)),
    );
    let rb = match mode {
        EndpointMode::Direct => rb,
        EndpointMode::ServerProxy => rb.query(&[("use_server_proxy", "true")]),
        EndpointMode::Signed { expires_epoch } => {
            rb.query(&[("expires", expires_epoch.to_string())])
        }
    };
    c.json(rb, "get sandbox endpoint").await
}

/// Creates a snapshot named `name`; `mode` (`rootfsOnly`) only where the version has it.
pub(crate) async fn create_snapshot(
    c: &Client,
    sandbox: &str,
    name: &str,
    mode: Option<&str>,
    behaviour: &Behaviour,
) -> Result<Snapshot, AdapterError> {
    let op = "create snapshot";
    let mut body = serde_json::json!({ "name": name });
    if let Some(mode) = mode {
        body["mode"] = serde_json::json!(mode);
    }
    versions::audit(&body, behaviour.snapshot_fields, op, behaviour.version)?;
    c.json(
        c.api(
            Method::POST,
            &format!("/sandboxes/{}/snapshots", seg(sandbox)),
        )
        .json(&body),
        op,
    )
    .await
}

pub(crate) async fn list_snapshots(
    c: &Client,
    sandbox: &str,
) -> Result<Vec<Snapshot>, AdapterError> {
    let mut out = Vec::new();
    for page in 1..=1000u32 {
        let rb = c.api(Method::GET, "/snapshots").query(&[
            ("sandboxId", sandbox),
            ("page", &page.to_string()),
            ("pageSize", "200"),
        ]);
        let p: Page<Snapshot> = c.json(rb, "list snapshots").await?;
        let more = p.pagination.is_some_and(|p| p.has_next_page) && !p.items.is_empty();
        out.extend(p.items);
        if !more {
            break;
        }
    }
    Ok(out)
}

/// Deletes a snapshot; `Ok(false)` if it was already gone.
pub(crate) async fn delete_snapshot(c: &Client, id: &str) -> Result<bool, AdapterError> {
    let op = "delete snapshot";
    let resp = c
        .send(
            c.api(Method::DELETE, &format!("/snapshots/{}", seg(id))),
            op,
        )
        .await?;
    match resp.status() {
        s if s.is_success() => Ok(true),
        StatusCode::NOT_FOUND => Ok(false),
        StatusCode::CONFLICT => {
            let body = resp.bytes().await.unwrap_or_default();
            let err = parse_error(StatusCode::CONFLICT, &body);
            Err(AdapterError::transient(conflict_reason(op, &err.code)))
        }
        _ => Err(c.status_error(op, resp).await),
    }
}

/// Why OpenSandbox refused a snapshot delete with 409, in words an operator can act on: the
/// real server says `DELETE_CONFLICT` while a sandbox restored from the snapshot still uses
/// its image, and `INVALID_STATE` while it is still being written. Both pass.
fn conflict_reason(op: &str, code: &str) -> String {
    match code_suffix(code) {
        "DELETE_CONFLICT" => format!(
            "{op}: the snapshot is in use by a sandbox restored from it ({code}); it can go once that sandbox is deleted"
        ),
        "INVALID_STATE" => format!("{op}: the snapshot is still being written ({code})"),
        _ => format!("{op}: the snapshot is still being written or is in use ({code})"),
    }
}
