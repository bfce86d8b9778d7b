//! A Model Context Protocol server: agents reach Differently's sandboxes through MCP tools and
//! resources. Two transports share this engine: Streamable HTTP at `/mcp` ([`http`]) and stdio
//! (`differently mcp` in the CLI). Every tool call is one or more `/v1` requests made with the
//! caller's own key through [`v1::V1`], so scopes, validation, quotas, policy, tenancy and the
//! audit record are the `/v1` ones — the engine itself never reads the store.
//!
//! The JSON-RPC surface is small (initialize, ping, tools, resources, progress, cancellation),
//! so it is written here rather than taken from the `rmcp` crate (see docs/mcp.md).

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::requests::body::JsonError;

pub mod http;
pub mod resources;
pub mod tools;
pub mod v1;

pub use resources::{CommandLogs, Subscriptions};
pub use v1::{InProcess, ReadError, V1Request, V1Response, V1};

/// Protocol revisions served through the `initialize` handshake, newest first.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// What a client that sends no `MCP-Protocol-Version` header is assumed to speak (the spec's
/// rule for Streamable HTTP).
pub const DEFAULT_HTTP_VERSION: &str = "2025-03-26";

/// JSON-RPC error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    /// A resource that does not exist or that the key cannot see.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// A resource the API refused otherwise (the stable code is in `data.code`).
    pub const RESOURCE_REFUSED: i64 = -32003;
}

/// How many messages wait for a client that is not reading before notifications are dropped.
/// Progress messages are at most 16 KiB, so a stalled reader holds at most a few MiB.
pub const NOTIFY_QUEUE: usize = 256;

/// Server → client messages: notifications sent while a request runs (progress) or at any
/// time (resource updates), and responses. Bounded, so a client that stops reading cannot make
/// the server hold an unbounded backlog: notifications are hints (a progress message's output
/// is also in the result, up to the result's bound; a resource update says "read again"), so
/// they are dropped when the queue is full, while responses wait for room.
#[derive(Clone, Debug)]
pub struct Notifier {
    tx: mpsc::Sender<Value>,
}

impl Notifier {
    /// A notifier and the receiver its messages go to, [`NOTIFY_QUEUE`] deep.
    pub fn channel() -> (Notifier, mpsc::Receiver<Value>) {
        let (tx, rx) = mpsc::channel(NOTIFY_QUEUE);
        (Notifier { tx }, rx)
    }

    /// A notifier whose messages nobody reads (a request without a session subscribes to
    /// nothing).
    pub fn discarding() -> Notifier {
        Notifier::channel().0
    }

    /// Queues a notification, dropping it when the reader is [`NOTIFY_QUEUE`] behind.
    /// `false` once the reader is gone (the watcher that sends it can stop).
    pub fn notify(&self, message: Value) -> bool {
        match self.tx.try_send(message) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics::counter!("differently_mcp_notifications_dropped_total").increment(1);
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Sends a response, waiting for room; `false` if the reader is gone.
    pub async fn respond(&self, message: Value) -> bool {
        self.tx.send(message).await.is_ok()
    }
}

/// A JSON-RPC protocol error (not a tool error: those are results with `isError`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with `code` and `message`.
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The same error carrying `data`.
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// The response message answering request `id`.
    pub fn response(&self, id: Value) -> Value {
        let mut err = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.data {
            err["data"] = d.clone();
        }
        json!({ "jsonrpc": "2.0", "id": id, "error": err })
    }
}

/// One decoded client message.
#[derive(Debug)]
pub enum Message {
    /// A request: answered with a response carrying `id`.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification: never answered.
    Notification { method: String, params: Value },
    /// A response to a server request (this server sends none, so it is ignored).
    Response,
}

/// Decodes one JSON-RPC message; `Err` is the error response to send (id `null` when the id
/// could not be read). A key named twice in an object is refused (`-32600`, naming its path),
/// as `/v1` refuses it in a body: the tool would act on the last value, a proxy in front
/// may read the first.
pub fn decode(raw: &[u8]) -> Result<Message, Value> {
    let v: Value = crate::requests::body::read_value(raw).map_err(|e| {
        let e = match e {
            JsonError::DuplicateKey { path } => {
                RpcError::new(code::INVALID_REQUEST, format!("{path}: duplicate key"))
                    .with_data(json!({ "field": path }))
            }
            other => RpcError::new(code::PARSE_ERROR, format!("not JSON: {other}")),
        };
        e.response(Value::Null)
    })?;
    let Value::Object(mut m) = v else {
        return Err(RpcError::new(
            code::INVALID_REQUEST,
            "a message is one JSON-RPC object (batches are not accepted)",
        )
        .response(Value::Null));
    };
    let id = m.remove("id");
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(
            RpcError::new(code::INVALID_REQUEST, "jsonrpc must be \"2.0\"")
                .response(id.unwrap_or(Value::Null)),
        );
    }
    let params = m.remove("params").unwrap_or(Value::Null);
    match (m.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => {
            if !(id.is_string() || id.is_i64() || id.is_u64()) {
                return Err(RpcError::new(
                    code::INVALID_REQUEST,
                    "id must be a string or an integer",
                )
                .response(Value::Null));
            }
            Ok(Message::Request { id, method, params })
        }
        (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
        (None, Some(_)) if m.contains_key("result") || m.contains_key("error") => {
            Ok(Message::Response)
        }
        (_, id) => Err(
            RpcError::new(code::INVALID_REQUEST, "method must be a string")
                .response(id.unwrap_or(Value::Null)),
        ),
    }
}

/// A request's `_meta.progressToken`, when the client asked for progress.
pub fn progress_token(params: &Value) -> Option<Value> {
    params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
        .cloned()
}

/// The protocol version answered to an `initialize` asking for `requested`: the same one when
/// served, else the newest (the client then decides whether it can speak it).
pub fn negotiate(requested: Option<&str>) -> &'static str {
    requested
        .and_then(|r| PROTOCOL_VERSIONS.iter().find(|v| **v == r).copied())
        .unwrap_or(PROTOCOL_VERSIONS[0])
}

/// The engine one caller talks to: its `/v1` access and the process's command logs.
#[derive(Clone)]
pub struct Server {
    v1: Arc<dyn V1>,
    logs: Arc<CommandLogs>,
}

impl Server {
    /// A server acting through `v1` (which carries the caller's key), recording commands in
    /// `logs`.
    pub fn new(v1: Arc<dyn V1>, logs: Arc<CommandLogs>) -> Server {
        Server { v1, logs }
    }

    /// Answers one request with its response message. `out` receives the notifications sent
    /// while it runs (progress); `subs` is the session's subscriptions.
    pub async fn request(
        &self,
        id: Value,
        method: &str,
        params: Value,
        out: &Notifier,
        subs: &Subscriptions,
    ) -> Value {
        match self.dispatch(method, params, out, subs).await {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            Err(e) => e.response(id),
        }
    }

    async fn dispatch(
        &self,
        method: &str,
        params: Value,
        out: &Notifier,
        subs: &Subscriptions,
    ) -> Result<Value, RpcError> {
        if !(params.is_object() || params.is_null()) {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "params must be an object",
            ));
        }
        match method {
            "initialize" => Ok(initialize_result(negotiate(
                params.get("protocolVersion").and_then(Value::as_str),
            ))),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": tools::list() })),
            "tools/call" => {
                let name = params
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "name must be a string"))?;
                let args = match params.get("arguments") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(a) => a.clone(),
                };
                let progress = progress_token(&params).map(|token| tools::Progress {
                    token,
                    out: out.clone(),
                });
                tools::call(&*self.v1, &self.logs, name, args, progress).await
            }
            "resources/list" => resources::list(&*self.v1).await,
            "resources/templates/list" => Ok(resources::templates()),
            "resources/read" => resources::read(&*self.v1, &self.logs, uri_param(&params)?).await,
            "resources/subscribe" => {
                let uri = uri_param(&params)?;
                resources::subscribe(self.v1.clone(), self.logs.clone(), subs, uri).await
            }
            "resources/unsubscribe" => {
                subs.remove(uri_param(&params)?);
                Ok(json!({}))
            }
            "logging/setLevel" => Ok(json!({})),
            _ => Err(RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("method {method:?} is not served"),
            )),
        }
    }
}

fn uri_param(params: &Value) -> Result<&str, RpcError> {
    params
        .get("uri")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(code::INVALID_PARAMS, "uri must be a string"))
}

/// The `initialize` result for `version`.
pub fn initialize_result(version: &str) -> Value {
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": { "listChanged": false },
            "resources": { "subscribe": true, "listChanged": false },
            "logging": {},
        },
        "serverInfo": {
            "name": "differently",
            "title": "Differently sandboxes",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "instructions": "Tools create, run commands in, read and write files of, snapshot, fork, \
            expose and delete Differently sandboxes. Each call acts with your API key's scopes \
            and tenancy; a refused call is a tool error carrying the API's stable code.",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_tells_requests_notifications_and_errors_apart() {
        assert!(matches!(
            decode(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Ok(Message::Request { .. })
        ));
        assert!(matches!(
            decode(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification { .. })
        ));
        let e = decode(b"{nope").unwrap_err();
        assert_eq!(e["error"]["code"], code::PARSE_ERROR);
        let e = decode(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).unwrap_err();
        assert_eq!(e["error"]["code"], code::INVALID_REQUEST);
        let e = decode(br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#).unwrap_err();
        assert_eq!(e["id"], 7);
    }

    #[test]
    fn a_key_named_twice_is_an_invalid_request_naming_its_path() {
        let e = decode(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_exec",
                "arguments":{"sandboxId":"sbx_x","command":["echo","1"],"command":["echo","2"]}}}"#,
        )
        .unwrap_err();
        assert_eq!(e["error"]["code"], code::INVALID_REQUEST, "{e}");
        assert_eq!(
            e["error"]["message"], "params.arguments.command: duplicate key",
            "{e}"
        );
        assert_eq!(e["error"]["data"]["field"], "params.arguments.command");
        assert_eq!(
            e["id"],
            Value::Null,
            "an id named twice is not trusted either"
        );
        let e = decode(br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#).unwrap_err();
        assert_eq!(e["error"]["message"], "id: duplicate key", "{e}");
        assert_eq!(e["id"], Value::Null);
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_loses_notifications_never_responses() {
        let (out, mut rx) = Notifier::channel();
        for i in 0..NOTIFY_QUEUE + 10 {
            assert!(out.notify(json!({ "n": i })), "the reader is still there");
        }
        // The queue holds NOTIFY_QUEUE; the rest were dropped, not buffered.
        let respond = tokio::spawn({
            let out = out.clone();
            async move { out.respond(json!({ "id": 1 })).await }
        });
        let mut got = Vec::new();
        while got.len() < NOTIFY_QUEUE + 1 {
            got.push(rx.recv().await.expect("a message"));
        }
        assert!(respond.await.expect("join"), "the response waited for room");
        assert_eq!(got[NOTIFY_QUEUE - 1]["n"], NOTIFY_QUEUE - 1);
        assert_eq!(
            got[NOTIFY_QUEUE]["id"], 1,
            "the response after the kept notifications"
        );
        drop(rx);
        assert!(!out.notify(json!({})), "a gone reader stops its watchers");
        assert!(!out.respond(json!({})).await);
    }

    #[test]
    fn negotiation_echoes_a_served_version_and_offers_the_newest_otherwise() {
        assert_eq!(negotiate(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate(Some("1999-01-01")), PROTOCOL_VERSIONS[0]);
        assert_eq!(negotiate(None), PROTOCOL_VERSIONS[0]);
    }
}
