//! Freestyle's v5 VM API: the client (bearer key, error bodies with a SCREAMING_SNAKE_CASE
//! `code` or `error` and a `message`) and one function per call, with no policy.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::config::Settings;
use crate::credentials::Credentials;
use crate::daytona::client::{capacity, segment};
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::AdapterError;

/// Metadata key carrying Differently's sandbox id.
pub(crate) const META_SANDBOX: &str = "differently-sandbox-id";
/// Metadata key carrying the installation id.
pub(crate) const META_INSTALLATION: &str = "differently-installation-id";

#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: HttpClient,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    code: Option<String>,
    error: Option<String>,
    message: Option<String>,
}

/// A parsed error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

pub(crate) fn parse_error(status: StatusCode, body: &[u8]) -> ServerError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let code = parsed.code.or(parsed.error).unwrap_or_default();
    let mut message = parsed.message.unwrap_or_default();
    if message.is_empty() && code.is_empty() {
        message = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    }
    ServerError {
        status: status.as_u16(),
        code,
        message,
    }
}

/// Status and body → `AdapterError` (callers scrub).
pub(crate) fn map_status(op: &str, err: &ServerError) -> AdapterError {
    let text = format!(
        "{op}: Freestyle HTTP {} {}: {}",
        err.status, err.code, err.message
    );
    let limit = err.code.contains("LIMIT") || err.code.contains("QUOTA");
    if err.status == 429 || (limit && matches!(err.status, 400 | 402 | 403)) {
        return capacity(op, "Freestyle", err.status, &err.message);
    }
    match err.status {
        401 | 403 => AdapterError::permanent(format!(
            "{op}: Freestyle refused the API key (HTTP {}); check the pool's apiKeyEnv, apiKeyFile or apiKeySecret",
            err.status
        )),
        404 => AdapterError::NotFound,
        408 | 409 => AdapterError::transient(text),
        501 => AdapterError::Unsupported(text),
        500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

impl Client {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, HttpConfigError> {
        let http = HttpClientBuilder::new("Freestyle", settings.api_url.clone())
            .auth(
                "Authorization",
                "API key",
                settings.credential.clone(),
                settings.initial_key.clone(),
            )
            .bearer()
            .request_timeout(settings.request_timeout)
            .ca_bundle(settings.ca_bundle.clone())
            .retries(2, Duration::from_millis(100))
            .build(credentials)?;
        Ok(Client { http })
    }

    pub(crate) fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.api(method, path)
    }

    pub(crate) fn transport_error(&self, op: &str, e: reqwest::Error) -> AdapterError {
        self.http.transport_error(op, e)
    }

    pub(crate) fn map(&self, op: &str, err: &ServerError) -> AdapterError {
        if matches!(err.status, 401 | 403) {
            self.http.forget_credential();
        }
        self.http.scrub_error(map_status(op, err))
    }

    pub(crate) async fn error_of(&self, resp: Response) -> ServerError {
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        parse_error(status, &body)
    }

    /// Sends; a non-2xx answer is returned parsed, for callers that read its status.
    pub(crate) async fn call(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Result<Response, ServerError>, AdapterError> {
        let resp = self.http.send(rb, op).await?;
        if resp.status().is_success() {
            Ok(Ok(resp))
        } else {
            Ok(Err(self.error_of(resp).await))
        }
    }

    pub(crate) async fn send_ok(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        match self.call(rb, op).await? {
            Ok(r) => Ok(r),
            Err(e) => Err(self.map(op, &e)),
        }
    }

    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        let resp = self.send_ok(rb, op).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error(op, e))?;
        crate::http::decode_answer(&bytes, op, "Freestyle")
    }
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
        Ok(resp) => {
            let bytes = resp.bytes().await.map_err(|e| c.transport_error(op, e))?;
            serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                AdapterError::transient(format!("{op}: unexpected answer from Freestyle: {e}"))
            })
        }
        Err(e) if e.status == 409 => Ok(None),
        Err(e) => Err(c.map(op, &e)),
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

/// A file operation's error: a 404 is the path, not the VM.
async fn file_call(
    c: &Client,
    rb: RequestBuilder,
    op: &str,
    path: &str,
) -> Result<Response, AdapterError> {
    match c.call(rb, op).await? {
        Ok(r) => Ok(r),
        Err(e) if e.status == 404 => Err(AdapterError::PathNotFound(path.to_owned())),
        Err(e) => Err(c.map(op, &e)),
    }
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
    let bytes = resp.bytes().await.map_err(|e| c.transport_error(op, e))?;
    let d: Dir = serde_json::from_slice(&bytes)
        .map_err(|e| AdapterError::transient(format!("{op}: unexpected answer: {e}")))?;
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
    let bytes = resp.bytes().await.map_err(|e| c.transport_error(op, e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| AdapterError::transient(format!("{op}: unexpected answer: {e}")))
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
