//! Resources: a sandbox's recent events (its audit trail, `GET /v1/audit?resource=`) and the
//! log of commands run on it through this MCP server, both readable and subscribable. Reading
//! first asks `/v1` for the sandbox with the caller's key, so another tenant's sandbox is
//! `not_found` here exactly as it is there.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::http::Method;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::v1::{V1Request, V1};
use super::{code, Notifier, RpcError};

const SCHEME: &str = "differently://sandboxes/";

/// Commands kept per sandbox, and sandboxes kept, in a process's command log.
const LOG_ENTRIES: usize = 50;
const LOG_SANDBOXES: usize = 10_000;
/// Output kept per stream in a log entry (its tail).
const LOG_TAIL_BYTES: usize = 4096;

/// One command run through the MCP server. Only the program name is kept of the command —
/// arguments and env may hold secrets, as for the audit record.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    pub at: DateTime<Utc>,
    pub program: String,
    pub exit_code: Value,
    pub duration_ms: Value,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

fn tail(s: &str) -> String {
    let mut start = s.len().saturating_sub(LOG_TAIL_BYTES);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

impl LogEntry {
    /// The entry for a command named `program` that answered `result` (an exec result).
    pub fn new(program: String, result: &Value) -> LogEntry {
        LogEntry {
            at: Utc::now(),
            program,
            exit_code: result["exitCode"].clone(),
            duration_ms: result["durationMs"].clone(),
            stdout_tail: tail(result["stdout"].as_str().unwrap_or_default()),
            stderr_tail: tail(result["stderr"].as_str().unwrap_or_default()),
        }
    }
}

/// The recent commands of each sandbox, in this process's memory; readers are checked
/// against `/v1` before they see any.
pub struct CommandLogs {
    entries: Mutex<HashMap<String, VecDeque<LogEntry>>>,
    changed: broadcast::Sender<String>,
}

impl Default for CommandLogs {
    fn default() -> Self {
        CommandLogs {
            entries: Mutex::new(HashMap::new()),
            changed: broadcast::channel(256).0,
        }
    }
}

impl CommandLogs {
    /// Records a command run on `sandbox` and tells subscribers.
    pub fn record(&self, sandbox: &str, entry: LogEntry) {
        if let Ok(mut m) = self.entries.lock() {
            if m.len() >= LOG_SANDBOXES && !m.contains_key(sandbox) {
                // Forget the sandbox whose latest command is oldest.
                let oldest = m
                    .iter()
                    .min_by_key(|(_, q)| q.back().map(|e| e.at))
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    m.remove(&k);
                }
            }
            let q = m.entry(sandbox.to_owned()).or_default();
            if q.len() >= LOG_ENTRIES {
                q.pop_front();
            }
            q.push_back(entry);
        }
        let _ = self.changed.send(sandbox.to_owned());
    }

    fn of(&self, sandbox: &str) -> Vec<LogEntry> {
        self.entries
            .lock()
            .map(|m| {
                m.get(sandbox)
                    .map(|q| q.iter().cloned().collect())
                    .unwrap_or_default()
            })
            .unwrap_or_default()
    }
}

/// What a resource URI names.
enum Kind {
    Events,
    Logs,
}

fn parse(uri: &str) -> Option<(&str, Kind)> {
    let rest = uri.strip_prefix(SCHEME)?;
    let (id, kind) = rest.split_once('/')?;
    if id.is_empty() || id.contains(['/', '?', '#', '%']) {
        return None;
    }
    match kind {
        "events" => Some((id, Kind::Events)),
        "logs" => Some((id, Kind::Logs)),
        _ => None,
    }
}

fn not_found(uri: &str) -> RpcError {
    RpcError::new(code::RESOURCE_NOT_FOUND, format!("no resource {uri}"))
        .with_data(json!({ "uri": uri, "code": "not_found" }))
}

/// A `/v1` GET's JSON, or the resource error its envelope maps to.
async fn get(v1: &dyn V1, uri: &str, path: String) -> Result<Value, RpcError> {
    let resp = v1
        .call(V1Request::new(Method::GET, path))
        .await
        .map_err(|e| RpcError::new(code::INTERNAL, format!("the API could not be reached: {e}")))?;
    let status = resp.status;
    let body = resp
        .bytes(8 * 1024 * 1024)
        .await
        .map_err(|e| RpcError::new(code::INTERNAL, e.to_string()))?;
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(v);
    }
    let c = v["error"]["code"].as_str().unwrap_or("internal");
    if c == "not_found" {
        return Err(not_found(uri));
    }
    Err(RpcError::new(
        code::RESOURCE_REFUSED,
        format!(
            "{c}: {}",
            v["error"]["message"].as_str().unwrap_or_default()
        ),
    )
    .with_data(json!({ "uri": uri, "code": c })))
}

/// `resources/templates/list`.
pub fn templates() -> Value {
    json!({ "resourceTemplates": [
        {
            "uriTemplate": "differently://sandboxes/{sandboxId}/events",
            "name": "sandbox-events",
            "title": "Sandbox events",
            "description": "The sandbox's recent events, newest first: status changes, commands, file and lifecycle calls (its audit records). Subscribable.",
            "mimeType": "application/json",
        },
        {
            "uriTemplate": "differently://sandboxes/{sandboxId}/logs",
            "name": "sandbox-command-logs",
            "title": "Sandbox command log",
            "description": "Commands run on the sandbox through this MCP server: program, exit code, duration and the tail of their output. Subscribable.",
            "mimeType": "application/json",
        },
    ]})
}

/// `resources/list`: both resources of each sandbox on the key's first page.
pub async fn list(v1: &dyn V1) -> Result<Value, RpcError> {
    let page = get(
        v1,
        "differently://sandboxes",
        "/v1/sandboxes?limit=100".to_owned(),
    )
    .await?;
    let mut out = Vec::new();
    for s in page["items"].as_array().into_iter().flatten() {
        let Some(id) = s["id"].as_str() else { continue };
        out.push(json!({
            "uri": format!("{SCHEME}{id}/events"), "name": format!("{id} events"),
            "mimeType": "application/json",
        }));
        out.push(json!({
            "uri": format!("{SCHEME}{id}/logs"), "name": format!("{id} command log"),
            "mimeType": "application/json",
        }));
    }
    Ok(json!({ "resources": out }))
}

/// `resources/read`.
pub async fn read(v1: &dyn V1, logs: &CommandLogs, uri: &str) -> Result<Value, RpcError> {
    let (id, kind) = parse(uri).ok_or_else(|| not_found(uri))?;
    // The sandbox itself first: another tenant's is not found, whatever the resource.
    get(v1, uri, format!("/v1/sandboxes/{id}")).await?;
    let body = match kind {
        Kind::Events => {
            let page = get(v1, uri, format!("/v1/audit?resource={id}&limit=100")).await?;
            json!({ "sandboxId": id, "events": page["items"] })
        }
        Kind::Logs => json!({ "sandboxId": id, "commands": logs.of(id) }),
    };
    Ok(json!({ "contents": [{
        "uri": uri, "mimeType": "application/json",
        "text": serde_json::to_string_pretty(&body).unwrap_or_default(),
    }]}))
}

/// A session's subscriptions: one watching task per URI, sending
/// `notifications/resources/updated` to the session's stream.
#[derive(Clone)]
pub struct Subscriptions {
    out: Notifier,
    tasks: Arc<Mutex<HashMap<String, AbortHandle>>>,
}

impl Subscriptions {
    /// Subscriptions whose updates go to `out`.
    pub fn new(out: Notifier) -> Subscriptions {
        Subscriptions {
            out,
            tasks: Arc::default(),
        }
    }

    /// Ends the subscription to `uri`, if any.
    pub fn remove(&self, uri: &str) {
        if let Some(h) = self.tasks.lock().ok().and_then(|mut t| t.remove(uri)) {
            h.abort();
        }
    }

    /// Ends every subscription.
    pub fn clear(&self) {
        if let Ok(mut t) = self.tasks.lock() {
            for (_, h) in t.drain() {
                h.abort();
            }
        }
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        // The last handle of a session ends its watchers.
        if Arc::strong_count(&self.tasks) == 1 {
            self.clear();
        }
    }
}

fn updated(out: &Notifier, uri: &str) -> bool {
    out.notify(json!({
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": { "uri": uri },
    }))
}

/// `resources/subscribe`: checks the sandbox as a read would, then watches it — its status
/// stream (`GET /v1/events?sandboxId=`, with the caller's key) for events, this process's
/// command log for logs.
pub async fn subscribe(
    v1: Arc<dyn V1>,
    logs: Arc<CommandLogs>,
    subs: &Subscriptions,
    uri: &str,
) -> Result<Value, RpcError> {
    let (id, kind) = parse(uri).ok_or_else(|| not_found(uri))?;
    get(&*v1, uri, format!("/v1/sandboxes/{id}")).await?;
    let (id, uri_owned, out) = (id.to_owned(), uri.to_owned(), subs.out.clone());
    let task = match kind {
        Kind::Logs => {
            let mut rx = logs.changed.subscribe();
            tokio::spawn(async move {
                loop {
                    match rx.recv().await {
                        Ok(s) if s == id => {
                            if !updated(&out, &uri_owned) {
                                return;
                            }
                        }
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            })
        }
        Kind::Events => tokio::spawn(async move {
            let path = format!("/v1/events?sandboxId={id}");
            let Ok(resp) = v1.call(V1Request::new(Method::GET, path)).await else {
                return;
            };
            if !resp.status.is_success() {
                return;
            }
            let mut body = resp.body;
            let mut line = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                for b in chunk.iter() {
                    if *b != b'\n' {
                        line.push(*b);
                        continue;
                    }
                    // Each event has one `event:` line; pings are comments.
                    if line.starts_with(b"event:") && !updated(&out, &uri_owned) {
                        return;
                    }
                    line.clear();
                }
            }
        }),
    };
    if let Ok(mut t) = subs.tasks.lock() {
        if let Some(old) = t.insert(uri.to_owned(), task.abort_handle()) {
            old.abort();
        }
    }
    Ok(json!({}))
}
