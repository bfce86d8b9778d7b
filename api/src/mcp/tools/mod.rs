//! The tools: each a JSON Schema, a description, and the `/v1` calls it makes with the
//! caller's key. Arguments that are a `/v1` body (create, exec) are sent as that body, so
//! `/v1` validates them exactly as it validates its own callers; what the engine reads itself
//! (ids, paths, encodings) is checked here with the `/v1` codes (`invalid_argument` for a
//! missing argument, a wrong type or an unknown field, `validation_failed` for a bad value),
//! naming the field, and the request's id as `/v1` errors carry it.
//!
//! Results are structured content plus a text rendering. Any refusal — a missing scope,
//! another tenant's sandbox (`not_found`), a bad argument, a quota — is a tool error
//! (`isError: true`) carrying the API's stable code, never a protocol error.

mod args;
mod exec_tool;
mod output;
mod processes;
mod schemas;

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Method, StatusCode};
use base64::Engine as _;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Map, Value};

use super::resources::{CommandLogs, LogEntry};
use super::v1::{ReadError, V1Request, V1};
use super::{code, Notifier, RpcError};
use crate::routes::exec::frames::{FrameDecoder, FrameType, MEDIA_TYPE};
use args::{enc, opt_int, opt_string, sandbox_id, string, wait_seconds};

pub use schemas::list;

/// Output kept per stream of a command, as `/v1` exec keeps it (the rest is counted, and the
/// `…Truncated` flag set, while the command runs on). A result carries less of it
/// ([`output::RESULT_OUTPUT_BYTES`]) so that it fits one SSE event.
pub const MAX_OUTPUT_BYTES: usize = differently_core::exec::OUTPUT_CAP_BYTES;

pub use output::{RESULT_OUTPUT_BYTES, TEXT_OUTPUT_BYTES};

/// Largest file `files_read` returns (a longer one is cut there, `truncated: true`).
pub const MAX_READ_BYTES: usize = 1024 * 1024;

/// Largest file `files_write` sends (after base64 decoding). The JSON-RPC message carrying it
/// is also bounded: 2 MiB over HTTP (the API's JSON body limit), 4 MiB over stdio.
pub const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// Largest JSON answer read from `/v1` (a page of 1000 sandboxes fits).
const MAX_JSON_BYTES: usize = 8 * 1024 * 1024;

/// The most bytes JSON takes for one byte of output: a control character is `\u0001`.
const MAX_JSON_BYTES_PER_BYTE: usize = 6;

/// Room in `/v1` exec's answer for everything but the two streams: the field names, the exit
/// code, the duration and the flags take about 120 bytes.
const EXEC_ANSWER_OVERHEAD: usize = 4 * 1024;

/// Largest answer of `/v1` exec (buffered) read: the worst the documented limits allow, each
/// stream's [`MAX_OUTPUT_BYTES`] with every byte escaped, not a round number it could exceed
/// (1 MiB of control characters on each stream is 12 MiB of JSON).
const MAX_EXEC_ANSWER_BYTES: usize =
    2 * MAX_OUTPUT_BYTES * MAX_JSON_BYTES_PER_BYTE + EXEC_ANSWER_OVERHEAD;

/// Longest a progress notification's `message` gets (output beyond it is in the result).
const MAX_PROGRESS_MESSAGE: usize = 16 * 1024;

/// Default and largest wait for a sandbox to run or a snapshot to be ready.
const DEFAULT_WAIT_SECONDS: u64 = 120;
const MAX_WAIT_SECONDS: u64 = 600;

/// Where progress notifications of a call go.
pub struct Progress {
    pub token: Value,
    pub out: Notifier,
}

impl Progress {
    fn send(&self, progress: u64, message: String) {
        self.out.notify(json!({
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": { "progressToken": self.token, "progress": progress, "message": message },
        }));
    }
}

/// A tool's failure: the API's envelope (or the same shape for what the engine checks).
#[derive(Debug, Clone)]
pub struct ToolError {
    pub code: String,
    pub message: String,
    pub details: Option<Value>,
    pub request_id: Option<String>,
}

impl ToolError {
    /// An error the MCP layer raises itself: it carries the id of the request it answers
    /// (`/mcp`'s, as `/v1` errors carry theirs; none over stdio, where there is no request).
    fn new(code: &str, message: impl Into<String>) -> ToolError {
        ToolError {
            code: code.to_owned(),
            message: message.into(),
            details: None,
            request_id: differently_core::request_id::current_request_id(),
        }
    }

    fn field(code: &str, field: &str, message: impl Into<String>) -> ToolError {
        let mut e = ToolError::new(code, message);
        e.details = Some(json!({ "field": field }));
        e
    }

    /// The tool result carrying this error.
    pub fn result(&self) -> Value {
        let mut err = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.details {
            err["details"] = d.clone();
        }
        if let Some(r) = &self.request_id {
            err["requestId"] = json!(r);
        }
        json!({
            "content": [{ "type": "text", "text": format!("{}: {}", self.code, self.message) }],
            "structuredContent": { "error": err },
            "isError": true,
        })
    }

    /// The error a `/v1` answer carries (its envelope), whatever its status.
    fn from_v1(status: StatusCode, body: &[u8]) -> ToolError {
        let env: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let e = &env["error"];
        match e.get("code").and_then(Value::as_str) {
            Some(c) => ToolError {
                code: c.to_owned(),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
                details: e.get("details").filter(|d| !d.is_null()).cloned(),
                request_id: e["requestId"].as_str().map(str::to_owned),
            },
            None => ToolError::new("internal", format!("the API answered {status}")),
        }
    }

    fn transport(e: String) -> ToolError {
        ToolError::new(
            "provider_unavailable",
            format!("the API could not be reached: {e}"),
        )
    }

    /// A `/v1` answer to `req` that could not be read whole. A broken-off body is the API
    /// going away; one over the cap is this server's own limit (`internal`: nothing was
    /// unreachable, and the same call gets the same answer).
    fn read(req: &str, e: ReadError) -> ToolError {
        match e {
            ReadError::Transport(e) => ToolError::transport(e),
            ReadError::TooLarge { cap } => ToolError::new(
                "internal",
                format!(
                    "the answer of {req} is longer than the {cap} bytes the MCP server reads \
                     of it (an internal limit)"
                ),
            ),
        }
    }
}

type ToolResult = Result<Value, ToolError>;

/// A successful tool result: `structured` as structured content and as its JSON text.
fn ok(structured: Value) -> ToolResult {
    let text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    Ok(json!({
        "content": [{ "type": "text", "text": text }],
        "structuredContent": structured,
    }))
}

/// Runs tool `name`. An unknown tool is a protocol error (`-32602`, as the spec says); every
/// other failure is a tool error result.
pub async fn call(
    v1: &dyn V1,
    logs: &CommandLogs,
    name: &str,
    args: Value,
    progress: Option<Progress>,
) -> Result<Value, RpcError> {
    let Some(tool) = schemas::tools()
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == name))
    else {
        return Err(RpcError::new(
            code::INVALID_PARAMS,
            format!("unknown tool {name:?}"),
        ));
    };
    let run = async {
        let Value::Object(args) = args else {
            return Err(ToolError::new(
                "invalid_argument",
                "arguments must be an object",
            ));
        };
        // The schema is the contract: an argument it does not name is refused, by every
        // tool (the body tools' /v1 bodies would take fields their schemas leave out).
        if let Some(unknown) = args
            .keys()
            .find(|k| tool["inputSchema"]["properties"].get(k.as_str()).is_none())
        {
            return Err(ToolError::field(
                "invalid_argument",
                unknown,
                format!("unknown field {unknown:?}"),
            ));
        }
        match name {
            "sandbox_create" => create(v1, args, None).await,
            "sandbox_fork" => fork(v1, args).await,
            "sandbox_list" => list_sandboxes(v1, &args).await,
            "sandbox_get" => {
                let id = sandbox_id(&args)?;
                ok(get_json(
                    v1,
                    V1Request::new(Method::GET, format!("/v1/sandboxes/{id}")),
                )
                .await?)
            }
            "sandbox_exec" => exec_tool::exec(v1, logs, args, progress).await,
            "files_read" => read_file(v1, &args).await,
            "files_write" => write_file(v1, &args).await,
            "files_list" => {
                let id = sandbox_id(&args)?;
                let path = string(&args, "path")?;
                let mut q = format!("path={}", enc(path));
                if let Some(d) = opt_int(&args, "depth")? {
                    q.push_str(&format!("&depth={d}"));
                }
                ok(get_json(
                    v1,
                    V1Request::new(Method::GET, format!("/v1/sandboxes/{id}/files/list?{q}")),
                )
                .await?)
            }
            "files_mkdir" => {
                let id = sandbox_id(&args)?;
                let mut body = json!({ "path": string(&args, "path")? });
                if let Some(m) = opt_string(&args, "mode")? {
                    body["mode"] = json!(m);
                }
                let req = V1Request::json(
                    Method::POST,
                    format!("/v1/sandboxes/{id}/files/directories"),
                    &body,
                );
                ok(get_json(v1, req).await?)
            }
            "snapshot_create" => snapshot(v1, &args).await,
            "port_url" => {
                let id = sandbox_id(&args)?;
                let mut body = Map::new();
                for k in ["port", "expiresSeconds"] {
                    if let Some(v) = args.get(k) {
                        body.insert(k.to_owned(), v.clone());
                    }
                }
                let req = V1Request::json(
                    Method::POST,
                    format!("/v1/sandboxes/{id}/ports"),
                    &Value::Object(body),
                );
                ok(get_json(v1, req).await?)
            }
            "sandbox_extend" => {
                let id = sandbox_id(&args)?;
                let body =
                    json!({ "ttlSeconds": args.get("ttlSeconds").cloned().unwrap_or(Value::Null) });
                if body["ttlSeconds"].is_null() {
                    return Err(args::missing("ttlSeconds"));
                }
                let req = V1Request::json(Method::PATCH, format!("/v1/sandboxes/{id}"), &body);
                ok(get_json(v1, req).await?)
            }
            "sandbox_delete" => {
                let id = sandbox_id(&args)?;
                ok(get_json(
                    v1,
                    V1Request::new(Method::DELETE, format!("/v1/sandboxes/{id}")),
                )
                .await?)
            }
            other => match processes::call(v1, other, args).await {
                Some(result) => result,
                None => Err(ToolError::new("internal", "tool without an implementation")),
            },
        }
    };
    Ok(run.await.unwrap_or_else(|e| e.result()))
}

/// A `/v1` call answering JSON: the value on success (`null` for an empty body), the
/// envelope's error otherwise.
async fn get_json(v1: &dyn V1, req: V1Request) -> ToolResult {
    get_json_capped(v1, req, MAX_JSON_BYTES).await
}

/// [`get_json`], reading at most `cap` bytes of the answer.
async fn get_json_capped(v1: &dyn V1, req: V1Request, cap: usize) -> ToolResult {
    let what = format!("{} {}", req.method, req.path);
    let resp = v1.call(req).await.map_err(ToolError::transport)?;
    let status = resp.status;
    let body = resp
        .bytes(cap)
        .await
        .map_err(|e| ToolError::read(&what, e))?;
    if !status.is_success() {
        return Err(ToolError::from_v1(status, &body));
    }
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&body)
        .map_err(|e| ToolError::new("internal", format!("the API's answer is not JSON: {e}")))
}

/// A `/v1` call whose success is a stream the caller reads: the answer on success, the
/// envelope's error (read up to [`MAX_JSON_BYTES`]) otherwise.
async fn call_streamed(v1: &dyn V1, req: V1Request) -> Result<super::V1Response, ToolError> {
    let what = format!("{} {}", req.method, req.path);
    let resp = v1.call(req).await.map_err(ToolError::transport)?;
    if resp.status.is_success() {
        return Ok(resp);
    }
    let status = resp.status;
    let body = resp
        .bytes(MAX_JSON_BYTES)
        .await
        .map_err(|e| ToolError::read(&what, e))?;
    Err(ToolError::from_v1(status, &body))
}

/// `POST /v1/sandboxes` with `args` as the body, then waits until the sandbox runs.
async fn create(v1: &dyn V1, mut args: Map<String, Value>, from: Option<Value>) -> ToolResult {
    let wait = wait_seconds(&mut args)?;
    if let Some(f) = from {
        args.insert("fromSnapshot".to_owned(), f);
    }
    let created = get_json(
        v1,
        V1Request::json(Method::POST, "/v1/sandboxes", &Value::Object(args)),
    )
    .await?;
    let id = created["id"]
        .as_str()
        .ok_or_else(|| ToolError::new("internal", "the created sandbox has no id"))?
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(wait);
    let mut sandbox = created;
    loop {
        match sandbox["status"].as_str() {
            Some("running") => return ok(sandbox),
            Some("failed" | "terminating" | "terminated") => {
                let mut e = ToolError::new(
                    "sandbox_failed",
                    format!(
                        "sandbox {id} is {}: {}",
                        sandbox["status"].as_str().unwrap_or_default(),
                        sandbox["statusReason"]
                            .as_str()
                            .unwrap_or("no reason given")
                    ),
                );
                e.details = Some(json!({ "sandbox": sandbox }));
                return Err(e);
            }
            _ => {}
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        if left == 0 {
            let mut e = ToolError::new(
                "deadline_exceeded",
                format!(
                    "sandbox {id} is still {} after {wait} s; sandbox_get shows when it runs",
                    sandbox["status"].as_str().unwrap_or("unknown")
                ),
            );
            e.details = Some(json!({ "sandbox": sandbox }));
            return Err(e);
        }
        sandbox = get_json(
            v1,
            V1Request::new(
                Method::GET,
                format!(
                    "/v1/sandboxes/{}/wait?status=running&timeoutSeconds={}",
                    enc(&id),
                    left.min(30)
                ),
            ),
        )
        .await?;
    }
}

async fn fork(v1: &dyn V1, mut args: Map<String, Value>) -> ToolResult {
    let snap = args.remove("snapshotId");
    match &snap {
        Some(Value::String(_)) => {}
        None | Some(Value::Null) => return Err(args::missing("snapshotId")),
        Some(_) => {
            return Err(ToolError::field(
                "invalid_argument",
                "snapshotId",
                "snapshotId must be a string",
            ))
        }
    }
    create(v1, args, snap).await
}

async fn list_sandboxes(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let mut q: Vec<String> = Vec::new();
    for k in ["status", "projectId", "cursor"] {
        if let Some(v) = opt_string(args, k)? {
            q.push(format!("{k}={}", enc(v)));
        }
    }
    if let Some(l) = opt_int(args, "limit")? {
        q.push(format!("limit={l}"));
    }
    match args.get("labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let v = v.as_str().ok_or_else(|| {
                    ToolError::field("invalid_argument", "labels", "label values must be strings")
                })?;
                q.push(format!("label={}", enc(&format!("{k}={v}"))));
            }
        }
        Some(_) => {
            return Err(ToolError::field(
                "invalid_argument",
                "labels",
                "labels must be an object",
            ))
        }
    }
    let path = if q.is_empty() {
        "/v1/sandboxes".to_owned()
    } else {
        format!("/v1/sandboxes?{}", q.join("&"))
    };
    ok(get_json(v1, V1Request::new(Method::GET, path)).await?)
}

async fn read_file(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let path = string(args, "path")?;
    let forced = opt_string(args, "encoding")?;
    if !matches!(forced, None | Some("text" | "base64")) {
        return Err(ToolError::field(
            "validation_failed",
            "encoding",
            "encoding must be text or base64",
        ));
    }
    let resp = v1
        .call(V1Request::new(
            Method::GET,
            format!("/v1/sandboxes/{id}/files?path={}", enc(path)),
        ))
        .await
        .map_err(ToolError::transport)?;
    let status = resp.status;
    let mut body = resp.body;
    if !status.is_success() {
        let mut b = Vec::new();
        while let Some(c) = body.next().await {
            b.extend_from_slice(&c.map_err(ToolError::transport)?);
            if b.len() > MAX_JSON_BYTES {
                break;
            }
        }
        return Err(ToolError::from_v1(status, &b));
    }
    let mut data = Vec::new();
    let mut truncated = false;
    while let Some(c) = body.next().await {
        let c = c.map_err(ToolError::transport)?;
        let room = MAX_READ_BYTES - data.len();
        if c.len() > room {
            data.extend_from_slice(&c[..room]);
            truncated = true;
            break;
        }
        data.extend_from_slice(&c);
    }
    let (encoding, content) = match (forced, String::from_utf8(data)) {
        (Some("base64"), Ok(s)) => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(s),
        ),
        (_, Ok(s)) => ("text", s),
        (_, Err(e)) => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
        ),
    };
    let structured = json!({
        "path": path, "encoding": encoding, "content": content, "truncated": truncated,
    });
    Ok(json!({
        "content": [{ "type": "text", "text": read_text(path, encoding, &content, truncated) }],
        "structuredContent": structured,
    }))
}

/// `files_read`'s text rendering: what was read, then the text itself up to
/// [`TEXT_OUTPUT_BYTES`] (not the whole file a second time; the rest is in
/// `structuredContent.content`). Base64 is not repeated at all: no reader wants it as prose.
fn read_text(path: &str, encoding: &str, content: &str, truncated: bool) -> String {
    let cut = if truncated {
        " (truncated: the file is longer)"
    } else {
        ""
    };
    if encoding == "base64" {
        return format!(
            "{path}: {} bytes{cut}, base64 in structuredContent.content",
            output::decoded_len(content)
        );
    }
    let mut text = format!("{path}: {} bytes of text{cut}", content.len());
    let file = output::Excerpt {
        field: "content",
        heading: path.to_owned(),
        all: content,
        omitted: 0,
    };
    output::excerpts(&mut text, &[file], false);
    text
}

async fn write_file(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let path = string(args, "path")?;
    let content = string(args, "content")?;
    let data = match opt_string(args, "encoding")? {
        None | Some("text") => content.as_bytes().to_vec(),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(content)
            // The decoder's own words (`Invalid symbol 33, offset 0.`) are not the API's.
            .map_err(|_| {
                ToolError::field(
                    "validation_failed",
                    "content",
                    "content is not valid base64 (standard alphabet, padded)",
                )
            })?,
        Some(_) => {
            return Err(ToolError::field(
                "validation_failed",
                "encoding",
                "encoding must be text or base64",
            ))
        }
    };
    if data.len() > MAX_WRITE_BYTES {
        let mut e = ToolError::field(
            "payload_too_large",
            "content",
            format!(
                "content is {} bytes; at most {MAX_WRITE_BYTES} are written",
                data.len()
            ),
        );
        e.details = Some(json!({ "field": "content", "limitBytes": MAX_WRITE_BYTES }));
        return Err(e);
    }
    let mut q = format!("path={}", enc(path));
    if let Some(m) = opt_string(args, "mode")? {
        q.push_str(&format!("&mode={}", enc(m)));
    }
    let bytes = data.len();
    let req = V1Request {
        method: Method::PUT,
        path: format!("/v1/sandboxes/{id}/files?{q}"),
        headers: vec![(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        body: Bytes::from(data),
    };
    get_json(v1, req).await?;
    ok(json!({ "path": path, "bytes": bytes }))
}

async fn snapshot(v1: &dyn V1, args: &Map<String, Value>) -> ToolResult {
    let id = sandbox_id(args)?;
    let mut a = args.clone();
    let wait = wait_seconds(&mut a)?;
    let body = match opt_string(args, "name")? {
        Some(n) => json!({ "name": n }),
        None => json!({}),
    };
    let mut snap = get_json(
        v1,
        V1Request::json(Method::POST, format!("/v1/sandboxes/{id}/snapshots"), &body),
    )
    .await?;
    let snap_id = snap["id"]
        .as_str()
        .ok_or_else(|| ToolError::new("internal", "the snapshot has no id"))?
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(wait);
    loop {
        match snap["status"].as_str() {
            Some("ready") => return ok(snap),
            Some("failed") => {
                let mut e = ToolError::new(
                    "snapshot_failed",
                    format!(
                        "snapshot {snap_id} failed: {}",
                        snap["statusReason"].as_str().unwrap_or("no reason given")
                    ),
                );
                e.details = Some(json!({ "snapshot": snap }));
                return Err(e);
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            let mut e = ToolError::new(
                "deadline_exceeded",
                format!(
                    "snapshot {snap_id} is still {} after {wait} s",
                    snap["status"]
                ),
            );
            e.details = Some(json!({ "snapshot": snap }));
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        snap = get_json(
            v1,
            V1Request::new(Method::GET, format!("/v1/snapshots/{}", enc(&snap_id))),
        )
        .await?;
    }
}
