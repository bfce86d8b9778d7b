//! envd, the daemon inside each E2B sandbox (`envd/envd.yaml`, `process.proto`,
//! `filesystem.proto`): commands over Connect-RPC (`process.Process/Start`, server-streamed),
//! file bodies over REST (`/files`), listing and removal over Connect unary calls.
//!
//! Where envd is and what each request carries is [`Target`]'s (`target.rs`); the API key
//! never goes there (the shared client sends it to the API's origin only).

use std::time::{Duration, Instant};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{envelope, ConnectError, EndStream, Frame, FrameParser};
pub(crate) use super::target::Target;
use crate::http::HttpClient;
use crate::{AdapterError, ByteRange, ByteStream, Download, ExecEvent, FileEntry, FileKind};

/// The port envd listens on inside the sandbox.
pub(crate) const ENVD_PORT: u16 = 49983;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// What went wrong talking to envd, before it is an `AdapterError` (the caller knows
/// whether a 404 is a missing file or a missing sandbox).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The E2B edge proxy, not envd, answered (`502`: the sandbox is not there, paused, or
    /// envd is not up yet). The caller asks the control plane which.
    Proxy(String),
    /// Anything else, already mapped.
    Error(AdapterError),
}

impl From<AdapterError> for Failure {
    fn from(e: AdapterError) -> Self {
        Failure::Error(e)
    }
}

/// Maps an error answer of envd or of the edge in front of it. envd's REST errors are
/// `{"code": <status>, "message"}`; its Connect errors `{"code": "<name>", "message"}`.
async fn answer_error(http: &HttpClient, t: &Target, op: &str, resp: Response) -> Failure {
    let status = resp.status().as_u16();
    let body = resp.bytes().await.unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let message = v
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    let message = t.scrub(http, &message);
    let code = v.get("code").and_then(Value::as_str).unwrap_or_default();
    if !code.is_empty() {
        return Failure::Error(connect_error(op, code, &message));
    }
    let text = format!("{op}: envd HTTP {status}: {message}");
    Failure::Error(match status {
        502 => return Failure::Proxy(text),
        404 => AdapterError::PathNotFound(message),
        401 | 403 => AdapterError::permanent(format!(
            "{op}: envd refused the sandbox's access token or user (HTTP {status})"
        )),
        429 => super::api::capacity(op, &text, None),
        507 => AdapterError::permanent(format!("{op}: the sandbox's disk is full")),
        408 | 500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    })
}

/// A Connect error code → `AdapterError` (`not_found` is a path: envd's calls name paths).
pub(crate) fn connect_error(op: &str, code: &str, message: &str) -> AdapterError {
    let text = format!("{op}: envd {code}: {message}");
    match code {
        "not_found" => AdapterError::PathNotFound(message.to_owned()),
        "unauthenticated" | "permission_denied" => AdapterError::permanent(text),
        "resource_exhausted" => super::api::capacity(op, &text, None),
        "unavailable" | "deadline_exceeded" | "aborted" | "internal" | "unknown" => {
            AdapterError::transient(text)
        }
        "unimplemented" => AdapterError::Unsupported(text),
        _ => AdapterError::permanent(text),
    }
}

async fn send(
    http: &HttpClient,
    t: &Target,
    rb: RequestBuilder,
    op: &str,
) -> Result<Response, Failure> {
    let resp = http.send(rb, op).await?;
    if resp.status().is_success() {
        Ok(resp)
    } else {
        Err(answer_error(http, t, op, resp).await)
    }
}

/// A Connect unary call with a JSON body.
async fn unary(
    http: &HttpClient,
    t: &Target,
    method: &str,
    body: &Value,
    timeout: Duration,
) -> Result<Value, Failure> {
    let op = method.rsplit('/').next().unwrap_or(method);
    let rb = t
        .request(http, Method::POST, &format!("/{method}"))
        .header("Connect-Protocol-Version", "1")
        .json(body)
        .timeout(timeout);
    let resp = send(http, t, rb, op).await?;
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| http.transport_error(op, e))?;
    crate::http::decode_answer(&bytes, op, "envd").map_err(Failure::Error)
}

/// `GET /health` (204 once envd runs).
pub(crate) async fn health(
    http: &HttpClient,
    t: &Target,
    timeout: Duration,
) -> Result<(), Failure> {
    let rb = t.request(http, Method::GET, "/health").timeout(timeout);
    send(http, t, rb, "envd health").await.map(drop)
}

/// One command as `process.Process/Start` takes it.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub argv: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Option<Vec<u8>>,
    /// Past it the command is killed and the exit code is 124.
    pub deadline: Duration,
    /// Longest silence (not even a keep-alive) before the stream counts as lost.
    pub idle: Duration,
}

/// `ProcessEvent` in protobuf's JSON mapping: zero values are omitted (an exit code of 0
/// does not appear), bytes are base64.
#[derive(Debug, Default, Deserialize)]
struct StartResponse {
    #[serde(default)]
    event: Option<Event>,
}

#[derive(Debug, Default, Deserialize)]
struct Event {
    #[serde(default)]
    start: Option<StartEvent>,
    #[serde(default)]
    data: Option<DataEvent>,
    #[serde(default)]
    end: Option<EndEvent>,
}

#[derive(Debug, Default, Deserialize)]
struct StartEvent {
    #[serde(default)]
    pid: u32,
}

#[derive(Debug, Default, Deserialize)]
struct DataEvent {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndEvent {
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    exited: bool,
    #[serde(default)]
    status: String,
}

/// The exit code of an `EndEvent`: the code when the process exited, 128+n when a signal
/// (`status` "signal: killed") ended it.
fn exit_code(end: &EndEvent) -> i32 {
    if end.exited || !end.status.starts_with("signal: ") {
        return end.exit_code;
    }
    let n = match end.status.trim_start_matches("signal: ") {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "segmentation fault" => 11,
        "broken pipe" => 13,
        "terminated" => 15,
        _ => {
            return if end.exit_code != 0 {
                end.exit_code
            } else {
                128 + 9
            }
        }
    };
    128 + n
}

/// How a run ended, when it did not end with a code.
pub(crate) enum RunError {
    /// envd never took the command (sending it again cannot run it twice).
    NotStarted(Failure),
    /// The command ran; what happened after.
    Started(AdapterError),
}

/// Runs `cmd`, sending its output to `out` as it comes; returns its exit code (124 past the
/// deadline, 137 when `out` closed, noticed even while the command is quiet, and it was
/// killed).
pub(crate) async fn run(
    http: &HttpClient,
    t: &Target,
    cmd: &Command,
    out: &mpsc::Sender<ExecEvent>,
) -> Result<i32, RunError> {
    let started = Instant::now();
    let (program, args) = match cmd.argv.split_first() {
        Some(p) => p,
        None => {
            return Err(RunError::NotStarted(Failure::Error(
                AdapterError::invalid_field("command", "command is empty"),
            )))
        }
    };
    let mut process = json!({ "cmd": program, "args": args, "envs": cmd.env });
    if let Some(cwd) = &cmd.cwd {
        process["cwd"] = json!(cwd);
    }
    let msg = json!({ "process": process, "stdin": cmd.stdin.is_some() });
    let body = envelope(msg.to_string().as_bytes());
    let deadline_ms = u64::try_from(cmd.deadline.as_millis()).unwrap_or(u64::MAX);
    let rb = t
        .request(http, Method::POST, "/process.Process/Start")
        .header("Content-Type", "application/connect+json")
        .header("Connect-Protocol-Version", "1")
        // envd ends the call (and kills the command) past it, even if we are gone.
        .header("Connect-Timeout-Ms", (deadline_ms + 2000).to_string())
        .body(body);
    let resp = match tokio::time::timeout(cmd.idle.min(cmd.deadline), http.send(rb, "exec")).await {
        Err(_) => {
            return Err(RunError::Started(AdapterError::transient(
                "exec: envd did not answer the start",
            )))
        }
        Ok(Err(e)) => return Err(RunError::NotStarted(Failure::Error(e))),
        Ok(Ok(r)) => r,
    };
    if !resp.status().is_success() {
        return Err(RunError::NotStarted(
            answer_error(http, t, "exec", resp).await,
        ));
    }
    let mut stream = resp.bytes_stream();
    let mut parser = FrameParser::default();
    let mut pid: Option<u32> = None;
    let mut end: Option<i32> = None;
    loop {
        let left = cmd.deadline.saturating_sub(started.elapsed());
        let wait = left.min(cmd.idle);
        let next = tokio::select! {
            // A caller hanging up while the command is quiet: envd keeps a process whose
            // client went away, so it is killed by pid (known once envd has started it).
            () = out.closed(), if pid.is_some() => {
                kill(http, t, pid).await;
                return Ok(128 + 9);
            }
            next = tokio::time::timeout(wait, stream.next()) => next,
        };
        let chunk = match next {
            Err(_) if left <= cmd.idle => {
                kill(http, t, pid).await;
                return Ok(124);
            }
            Err(_) => {
                kill(http, t, pid).await;
                return Err(RunError::Started(AdapterError::transient(format!(
                    "exec: envd sent nothing for {} s",
                    cmd.idle.as_secs()
                ))));
            }
            Ok(None) => {
                let e = AdapterError::transient(
                    "exec: the stream from envd ended before the command did (truncated)",
                );
                return Err(if pid.is_none() {
                    RunError::NotStarted(Failure::Error(e))
                } else {
                    RunError::Started(e)
                });
            }
            Ok(Some(Err(e))) => {
                let e = http.transport_error("exec", e);
                return Err(if pid.is_none() {
                    RunError::NotStarted(Failure::Error(e))
                } else {
                    RunError::Started(e)
                });
            }
            Ok(Some(Ok(c))) => c,
        };
        parser.push(&chunk);
        loop {
            let frame = match parser.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    kill(http, t, pid).await;
                    return Err(RunError::Started(AdapterError::transient(format!(
                        "exec: envd sent a broken stream: {e}"
                    ))));
                }
            };
            match frame {
                Frame::Message(m) => {
                    let ev: StartResponse = serde_json::from_slice(&m).unwrap_or_default();
                    let Some(ev) = ev.event else { continue };
                    if let Some(s) = ev.start {
                        pid = Some(s.pid);
                        if let Some(input) = &cmd.stdin {
                            if let Err(e) = feed_stdin(http, t, s.pid, input).await {
                                kill(http, t, pid).await;
                                return Err(RunError::Started(failure_error(e)));
                            }
                        }
                    }
                    if let Some(d) = ev.data {
                        let piece = match (d.stdout, d.stderr.or(d.pty)) {
                            (Some(o), _) => B64.decode(o).ok().map(|b| ExecEvent::Stdout(b.into())),
                            (None, Some(e)) => {
                                B64.decode(e).ok().map(|b| ExecEvent::Stderr(b.into()))
                            }
                            (None, None) => None,
                        };
                        if let Some(piece) = piece {
                            // A slow reader slows the command down, but not past its deadline.
                            let left = cmd.deadline.saturating_sub(started.elapsed());
                            match tokio::time::timeout(left, out.send(piece)).await {
                                Ok(Ok(())) => {}
                                Err(_) => {
                                    kill(http, t, pid).await;
                                    return Ok(124);
                                }
                                Ok(Err(_)) => {
                                    // The caller went away: stop the command on the backend.
                                    kill(http, t, pid).await;
                                    return Ok(128 + 9);
                                }
                            }
                        }
                    }
                    if let Some(e) = ev.end {
                        end = Some(exit_code(&e));
                    }
                }
                Frame::End(m) => {
                    let es: EndStream = serde_json::from_slice(&m).unwrap_or_default();
                    if let Some(code) = end {
                        return Ok(code);
                    }
                    let err = es.error.unwrap_or(ConnectError {
                        code: "unknown".to_owned(),
                        message: "the stream ended without the command's end".to_owned(),
                    });
                    if err.code == "deadline_exceeded" {
                        return Ok(124);
                    }
                    let message = t.scrub(http, &err.message);
                    if pid.is_none() {
                        return Err(RunError::NotStarted(Failure::Error(start_error(
                            &err.code, &message, cmd,
                        ))));
                    }
                    return Err(RunError::Started(connect_error(
                        "exec", &err.code, &message,
                    )));
                }
            }
        }
    }
}

/// A start refused by envd: a `cwd` that does not exist names the field.
fn start_error(code: &str, message: &str, cmd: &Command) -> AdapterError {
    let lower = message.to_ascii_lowercase();
    if cmd.cwd.is_some()
        && (lower.contains("cwd") || lower.contains("chdir") || lower.contains("working dir"))
    {
        return AdapterError::invalid_field("cwd", format!("exec: {message}"));
    }
    if code == "not_found" {
        return AdapterError::permanent(format!("exec: {message}"));
    }
    connect_error("exec", code, message)
}

fn failure_error(f: Failure) -> AdapterError {
    match f {
        Failure::Error(e) => e,
        Failure::Proxy(m) => AdapterError::transient(m),
    }
}

async fn feed_stdin(http: &HttpClient, t: &Target, pid: u32, input: &[u8]) -> Result<(), Failure> {
    let timeout = http.request_timeout();
    for chunk in input.chunks(64 * 1024) {
        let body = json!({"process": {"pid": pid}, "input": {"stdin": B64.encode(chunk)}});
        unary(http, t, "process.Process/SendInput", &body, timeout).await?;
    }
    let body = json!({"process": {"pid": pid}});
    unary(http, t, "process.Process/CloseStdin", &body, timeout)
        .await
        .map(drop)
}

/// SIGKILL to the command, best effort (it may have ended already).
async fn kill(http: &HttpClient, t: &Target, pid: Option<u32>) {
    let Some(pid) = pid else { return };
    let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
    if let Err(Failure::Error(e)) = unary(
        http,
        t,
        "process.Process/SendSignal",
        &body,
        Duration::from_secs(10),
    )
    .await
    {
        if !matches!(e, AdapterError::PathNotFound(_)) {
            tracing::warn!(error = %e, "e2b: killing a command failed");
        }
    }
}

/// Absolute paths only: envd resolves a relative one against the user's home.
pub(crate) fn check_path(path: &str) -> Result<(), AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::invalid_field(
            "path",
            format!("path must be absolute: {path:?}"),
        ));
    }
    Ok(())
}

/// `POST /files?path=`: the body streamed as `application/octet-stream`; envd creates the
/// parent directories and overwrites an existing file.
pub(crate) async fn upload(
    http: &HttpClient,
    t: &Target,
    user: &str,
    path: &str,
    body: ByteStream,
    timeout: Duration,
) -> Result<(), Failure> {
    let rb = t
        .request(http, Method::POST, "/files")
        .query(&[("path", path), ("username", user)])
        .header("Content-Type", "application/octet-stream")
        .body(reqwest::Body::wrap_stream(body))
        .timeout(timeout);
    send(http, t, rb, "upload").await.map(drop)
}

/// `GET /files?path=` with a `Range` header; a server that ignores it (200) is cut here.
pub(crate) async fn download(
    http: &HttpClient,
    t: &Target,
    user: &str,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, Failure> {
    let mut rb = t
        .request(http, Method::GET, "/files")
        .query(&[("path", path), ("username", user)]);
    if let Some(r) = range {
        let end = r.end.map(|e| e.to_string()).unwrap_or_default();
        rb = rb.header("Range", format!("bytes={}-{end}", r.start));
    }
    let resp = http.send(rb, "download").await?;
    let status = resp.status().as_u16();
    if status == 416 {
        return Err(Failure::Error(AdapterError::invalid_field(
            "range",
            "download: the range is past the end of the file",
        )));
    }
    if !resp.status().is_success() {
        return Err(answer_error(http, t, "download", resp).await);
    }
    let total_from_range = resp
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit('/').next())
        .and_then(|v| v.parse::<u64>().ok());
    let total = if status == 206 {
        total_from_range
    } else {
        resp.content_length()
    };
    let body = resp
        .bytes_stream()
        .map(|r| r.map_err(|e| AdapterError::transient(format!("download: {e}"))));
    let body: ByteStream = match (status, range) {
        (200, Some(r)) => crate::files::cut_to_range(body, Some(r)),
        _ => Box::pin(body),
    };
    Ok(Download {
        total_size: total,
        body,
    })
}

/// `EntryInfo` in protobuf's JSON mapping (`size` is an int64, so a string).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EntryInfo {
    #[serde(default)]
    path: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    size: Option<Value>,
    #[serde(default)]
    mode: Option<u32>,
    #[serde(default)]
    modified_time: Option<DateTime<Utc>>,
}

impl EntryInfo {
    fn into_entry(self) -> FileEntry {
        let kind = match self.kind.as_deref() {
            Some("FILE_TYPE_FILE") => FileKind::File,
            Some("FILE_TYPE_DIRECTORY") => FileKind::Dir,
            Some("FILE_TYPE_SYMLINK") => FileKind::Symlink,
            _ => FileKind::Other,
        };
        let size = match &self.size {
            Some(Value::String(s)) => s.parse().unwrap_or(0),
            Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
            _ => 0,
        };
        FileEntry {
            path: self.path,
            kind,
            size,
            mode: self.mode.unwrap_or(0) & 0o7777,
            modified_at: self.modified_time,
        }
    }
}

/// `filesystem.Filesystem/ListDir` to `depth` levels (at least 1).
pub(crate) async fn list(
    http: &HttpClient,
    t: &Target,
    path: &str,
    depth: u32,
) -> Result<Vec<FileEntry>, Failure> {
    let body = json!({"path": path, "depth": depth.max(1)});
    let v = unary(
        http,
        t,
        "filesystem.Filesystem/ListDir",
        &body,
        http.request_timeout(),
    )
    .await?;
    let entries: Vec<EntryInfo> = v
        .get("entries")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| {
            Failure::Error(AdapterError::transient(format!(
                "list files: unexpected answer from envd: {e}"
            )))
        })?
        .unwrap_or_default();
    let mut out: Vec<FileEntry> = entries.into_iter().map(EntryInfo::into_entry).collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// `filesystem.Filesystem/Stat`.
pub(crate) async fn stat(http: &HttpClient, t: &Target, path: &str) -> Result<FileEntry, Failure> {
    let v = unary(
        http,
        t,
        "filesystem.Filesystem/Stat",
        &json!({ "path": path }),
        http.request_timeout(),
    )
    .await?;
    let entry: EntryInfo = v
        .get("entry")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .ok()
        .flatten()
        .unwrap_or_default();
    Ok(entry.into_entry())
}

/// Removes a file or an empty directory. envd's `Remove` deletes whole trees, so a
/// directory is listed first and refused unless empty.
pub(crate) async fn remove(http: &HttpClient, t: &Target, path: &str) -> Result<(), Failure> {
    let entry = stat(http, t, path).await?;
    if entry.kind == FileKind::Dir && !list(http, t, path, 1).await?.is_empty() {
        return Err(Failure::Error(AdapterError::permanent(format!(
            "delete: directory not empty: {path}"
        ))));
    }
    unary(
        http,
        t,
        "filesystem.Filesystem/Remove",
        &json!({ "path": path }),
        http.request_timeout(),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_of_end_events() {
        let e = |code, exited, status: &str| EndEvent {
            exit_code: code,
            exited,
            status: status.to_owned(),
        };
        assert_eq!(exit_code(&e(0, true, "exit status 0")), 0);
        assert_eq!(exit_code(&e(3, true, "exit status 3")), 3);
        assert_eq!(exit_code(&e(-1, false, "signal: killed")), 137);
        assert_eq!(exit_code(&e(-1, false, "signal: terminated")), 143);
        // Zero values are omitted in JSON: an empty end event is a clean exit.
        let v: EndEvent = serde_json::from_str("{}").unwrap_or_default();
        assert_eq!(exit_code(&v), 0);
    }
}
