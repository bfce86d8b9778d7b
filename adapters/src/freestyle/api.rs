//! Freestyle's v5 VM API: the client (bearer key, error bodies with a SCREAMING_SNAKE_CASE
//! `code` or `error` and a `message`) and one function per call, with no policy.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response};
use serde::{Deserialize, Serialize};

use super::config::Settings;
use crate::credentials::Credentials;
use crate::http::HttpClient;
use crate::kit::paths::segment;
use crate::kit::{self, ConfigError, ErrorAnswer, Statuses};
use crate::AdapterError;

pub(crate) use crate::kit::{INSTALLATION_TAG as META_INSTALLATION, SANDBOX_TAG as META_SANDBOX};

/// Freestyle's statuses: a 409 is a change under way, a 429 its rate or plan limits.
const STATUSES: Statuses = Statuses::api_key("Freestyle");

/// An error answer → `AdapterError`: a `…LIMIT…`/`…QUOTA…` code on a 400, 402 or 403 is the
/// plan's limit ([`AdapterError::Capacity`]); the rest goes by the common table.
pub(crate) fn map_answer(op: &str, a: &ErrorAnswer) -> AdapterError {
    let err = a.error();
    let limit = err.code.contains("LIMIT") || err.code.contains("QUOTA");
    if limit && matches!(err.status, 400 | 402 | 403) {
        return STATUSES.capacity(op, &err, a.retry_after);
    }
    STATUSES.map(op, &err, a.retry_after)
}

/// The client of one Freestyle account.
pub(crate) type Client = HttpClient;

/// Builds the client (bearer key, Freestyle's error answers).
pub(crate) fn client(
    settings: &Settings,
    credentials: &Credentials,
) -> Result<Client, ConfigError> {
    kit::bearer_key_client!(
        settings,
        credentials,
        "Freestyle",
        &settings.api_url,
        map_answer
    )
}

/// A VM record (fields we do not read are ignored: live answers carry more, e.g.
/// `firewallRules`, `tlsRules`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Vm {
    pub id: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// `POST /v5/vms`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateBody {
    pub slug: String,
    pub snapshot_id: String,
    pub metadata: BTreeMap<String, String>,
    /// Required by v5; no rules means no outbound traffic.
    pub firewall: serde_json::Value,
    /// Off: a powered-off VM would boot again about 5 s later (seen live), so stop would not.
    pub automatic_restart: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u64>,
}

fn vm_path(id: &str, tail: &str) -> String {
    format!("/v5/vms/{}{tail}", segment(id))
}

/// `GET /v5/vms/{id or slug}`; `None` when there is none.
pub(crate) async fn get(c: &Client, id: &str) -> Result<Option<Vm>, AdapterError> {
    match c.json(c.api(Method::GET, &vm_path(id, "")), "get VM").await {
        Ok(vm) => Ok(Some(vm)),
        Err(AdapterError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `POST /v5/vms`; `None` when the slug is taken (409).
pub(crate) async fn create(c: &Client, body: &CreateBody) -> Result<Option<Vm>, AdapterError> {
    let op = "create VM";
    match c
        .call(c.api(Method::POST, "/v5/vms").json(body), op)
        .await?
    {
        Ok(resp) => c.decode(op, resp).await.map(Some),
        Err(a) if a.status == reqwest::StatusCode::CONFLICT => Ok(None),
        Err(a) => Err(c.map_answer(op, &a)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListAnswer {
    Vms { vms: Vec<Vm> },
    Items { items: Vec<Vm> },
    Bare(Vec<Vm>),
}

/// `GET /v5/vms`: every VM of the account (the API filters by state and slug, not metadata).
pub(crate) async fn list(c: &Client) -> Result<Vec<Vm>, AdapterError> {
    let ans: ListAnswer = c.json(c.api(Method::GET, "/v5/vms"), "list VMs").await?;
    Ok(match ans {
        ListAnswer::Vms { vms } | ListAnswer::Items { items: vms } | ListAnswer::Bare(vms) => vms,
    })
}

/// `DELETE /v5/vms/{id}`; a missing one is fine.
pub(crate) async fn delete(c: &Client, id: &str) -> Result<(), AdapterError> {
    match c
        .send_ok(c.api(Method::DELETE, &vm_path(id, "")), "delete VM")
        .await
    {
        Ok(_) | Err(AdapterError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `POST /v5/vms/{id}/{action}` (`start`, `pause`).
pub(crate) async fn action(c: &Client, id: &str, action: &str) -> Result<(), AdapterError> {
    c.send_ok(
        c.api(Method::POST, &vm_path(id, &format!("/{action}")))
            .json(&serde_json::json!({})),
        &format!("{action} VM"),
    )
    .await
    .map(drop)
}

/// `POST /v5/vms/{id}/exec-await`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecBody {
    pub command: String,
    pub timeout_ms: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Base64, at most 1 MiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linux_user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecAnswer {
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    /// `null`: killed by the timeout.
    #[serde(default)]
    pub status_code: Option<i32>,
}

pub(crate) async fn exec(
    c: &Client,
    id: &str,
    body: &ExecBody,
    http_timeout: Duration,
) -> Result<ExecAnswer, AdapterError> {
    c.json(
        c.api(Method::POST, &vm_path(id, "/exec-await"))
            .json(body)
            .timeout(http_timeout),
        "exec",
    )
    .await
}

/// A file operation: a 404 is the path, not the VM.
async fn file_call(
    c: &Client,
    rb: RequestBuilder,
    op: &str,
    path: &str,
) -> Result<Response, AdapterError> {
    c.file_call(rb, op, path).await
}

/// `PUT /v5/vms/{id}/fs/write?path=&mode=`: the mode is read as a decimal number (seen live),
/// so 0o644 is sent as `420`.
pub(crate) async fn write(
    c: &Client,
    id: &str,
    path: &str,
    mode: Option<u32>,
    body: reqwest::Body,
) -> Result<(), AdapterError> {
    let mut q = vec![("path", path.to_owned())];
    if let Some(m) = mode {
        q.push(("mode", (m & 0o7777).to_string()));
    }
    file_call(
        c,
        c.api(Method::PUT, &vm_path(id, "/fs/write"))
            .query(&q)
            .header("Content-Type", "application/octet-stream")
            .body(body),
        "upload",
        path,
    )
    .await
    .map(drop)
}

/// `GET /v5/vms/{id}/fs/read?path=` (with `Range` when asked).
pub(crate) async fn read(
    c: &Client,
    id: &str,
    path: &str,
    range: Option<crate::ByteRange>,
) -> Result<Response, AdapterError> {
    let mut rb = c
        .api(Method::GET, &vm_path(id, "/fs/read"))
        .query(&[("path", path)])
        .timeout(Duration::from_secs(3600));
    if let Some(r) = range {
        let end = r.end.map(|e| e.to_string()).unwrap_or_default();
        rb = rb.header(reqwest::header::RANGE, format!("bytes={}-{end}", r.start));
    }
    file_call(c, rb, "download", path).await
}

/// One directory entry (or a stat answer).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    #[serde(default)]
    pub name: String,
    /// `file`, `directory`, `symlink`.
    #[serde(default, alias = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub mode: Option<u32>,
    #[serde(default)]
    pub modified_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Deserialize)]
struct Dir {
    #[serde(default)]
    entries: Vec<Entry>,
}

pub(crate) async fn dir(c: &Client, id: &str, path: &str) -> Result<Vec<Entry>, AdapterError> {
    let op = "list files";
    let resp = file_call(
        c,
        c.api(Method::GET, &vm_path(id, "/fs/dir"))
            .query(&[("path", path)]),
        op,
        path,
    )
    .await?;
    let d: Dir = c.decode(op, resp).await?;
    Ok(d.entries)
}

pub(crate) async fn stat(c: &Client, id: &str, path: &str) -> Result<Entry, AdapterError> {
    let op = "stat";
    let resp = file_call(
        c,
        c.api(Method::GET, &vm_path(id, "/fs/stat"))
            .query(&[("path", path)]),
        op,
        path,
    )
    .await?;
    c.decode(op, resp).await
}

pub(crate) async fn remove(c: &Client, id: &str, path: &str) -> Result<(), AdapterError> {
    file_call(
        c,
        c.api(Method::DELETE, &vm_path(id, "/fs/remove"))
            .query(&[("path", path)]),
        "delete file",
        path,
    )
    .await
    .map(drop)
}
