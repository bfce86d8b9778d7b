//! The Streamable HTTP transport at `/mcp`: a client POSTs one JSON-RPC message; a request is
//! answered as `application/json`, or as an SSE stream when it is a `sandbox_exec` that asked
//! for progress (its notifications come first, then the response); a notification or response gets 202. GET
//! opens the session's server stream (resource updates); DELETE ends the session.
//!
//! Authentication is `Authorization: Bearer <Differently key>`, checked here (401 with
//! `WWW-Authenticate` when missing or invalid, as the spec asks), and then presented again
//! by every `/v1` call the tools make, in process.
//!
//! Sessions: `initialize` answers an `Mcp-Session-Id` that is signed and bound to the key, so
//! any API process accepts it; what a session keeps (its server stream, subscriptions, the
//! requests it may cancel) lives in the process that serves it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use differently_core::ErrorCode;
use futures::StreamExt;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::{
    code, decode, progress_token, CommandLogs, InProcess, Message, Notifier, RpcError, Server,
    Subscriptions, PROTOCOL_VERSIONS,
};
use crate::auth::Principal;
use crate::AppState;

/// The endpoint.
pub const PATH: &str = "/mcp";
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
/// Sessions one process keeps; beyond it the longest idle ones are forgotten.
const MAX_SESSIONS: usize = 10_000;
/// A session idle this long is forgotten by the process (its id stays valid).
const SESSION_IDLE: Duration = Duration::from_secs(3600);
/// Comment lines on an idle server stream, so proxies keep it open.
const STREAM_PING: Duration = Duration::from_secs(15);

struct Session {
    key_id: String,
    subs: Subscriptions,
    /// The server stream's messages; a GET holds the lock while it is open.
    stream: Arc<tokio::sync::Mutex<mpsc::Receiver<Value>>>,
    inflight: HashMap<String, AbortHandle>,
    last: Instant,
}

struct Mcp {
    v1: Router,
    logs: Arc<CommandLogs>,
    mac_key: [u8; 32],
    sessions: Mutex<HashMap<String, Session>>,
}

/// Aborts the task of a request whose client went away (its answer is no longer wanted, and
/// a streamed command ends with it).
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The `/mcp` routes. `v1` is the stateful `/v1` router the tools call in process.
pub fn router(state: &AppState, v1: Router) -> Router<AppState> {
    let mcp = Arc::new(Mcp {
        v1,
        logs: Arc::default(),
        mac_key: state.bootstrap_key.derive("differently/mcp/session/v1"),
        sessions: Mutex::new(HashMap::new()),
    });
    Router::new().route(
        PATH,
        post({
            let m = mcp.clone();
            move |s, r| handle_post(m, s, r)
        })
        .get({
            let m = mcp.clone();
            move |s, r| handle_get(m, s, r)
        })
        .delete({
            let m = mcp.clone();
            move |s, r| handle_delete(m, s, r)
        }),
    )
}

fn rpc_status(status: StatusCode, e: RpcError) -> Response {
    let mut r = (status, axum::Json(e.response(Value::Null))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(
                "Bearer realm=\"differently\", error=\"invalid_token\", \
                 error_description=\"a Differently API key is required\"",
            ),
        );
    }
    r
}

/// Who calls, by the `/v1` rules (throttling included); `Err` is the answer to send.
async fn authenticate(
    state: &AppState,
    req: Request,
) -> Result<(Principal, HeaderValue, HeaderMap, Bytes), Response> {
    let (mut parts, body) = req.into_parts();
    // Authenticated as a read: whether the organization may change things is for each `/v1`
    // call to say, so a suspended organization can still list its sandboxes through MCP.
    let method = std::mem::replace(&mut parts.method, Method::GET);
    let principal = Principal::from_request_parts(&mut parts, state).await;
    parts.method = method;
    let principal = match principal {
        Ok(p) => p,
        Err(e) if e.code == ErrorCode::Unauthenticated => {
            return Err(rpc_status(
                StatusCode::UNAUTHORIZED,
                RpcError::new(code::INVALID_REQUEST, e.message)
                    .with_data(json!({ "code": "unauthenticated" })),
            ))
        }
        Err(e) => return Err(e.into_response()),
    };
    let auth = parts
        .headers
        .get(header::AUTHORIZATION)
        .cloned()
        .ok_or_else(|| {
            rpc_status(
                StatusCode::UNAUTHORIZED,
                RpcError::new(
                    code::INVALID_REQUEST,
                    "Authorization: Bearer <key> is required",
                ),
            )
        })?;
    if let Some(origin) = parts.headers.get(header::ORIGIN) {
        // DNS rebinding: a browser page may only reach this endpoint from its own origin.
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let o = origin.to_str().unwrap_or_default();
        let o_host = o.split_once("://").map(|(_, h)| h);
        if host.is_none() || o_host != host {
            return Err(rpc_status(
                StatusCode::FORBIDDEN,
                RpcError::new(
                    code::INVALID_REQUEST,
                    "this Origin may not use the endpoint",
                ),
            ));
        }
    }
    if let Some(v) = parts.headers.get(VERSION_HEADER) {
        let v = v.to_str().unwrap_or_default();
        if !PROTOCOL_VERSIONS.contains(&v) {
            return Err(rpc_status(
                StatusCode::BAD_REQUEST,
                RpcError::new(
                    code::INVALID_REQUEST,
                    format!(
                        "MCP-Protocol-Version {v:?} is not served; served: {PROTOCOL_VERSIONS:?}"
                    ),
                )
                .with_data(json!({ "supported": PROTOCOL_VERSIONS })),
            ));
        }
    }
    let bytes = axum::body::to_bytes(Body::new(body), crate::requests::middleware::MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            rpc_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                RpcError::new(
                    code::INVALID_REQUEST,
                    format!(
                        "a message is at most {} bytes",
                        crate::requests::middleware::MAX_BODY_BYTES
                    ),
                ),
            )
        })?;
    Ok((principal, auth, parts.headers, bytes))
}

impl Mcp {
    fn sign(&self, nonce: &str, key_id: &str) -> String {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.mac_key)
            .expect("HMAC takes a key of any length");
        m.update(nonce.as_bytes());
        m.update(b"|");
        m.update(key_id.as_bytes());
        let tag = m.finalize().into_bytes();
        hex::encode(&tag[..16])
    }

    fn new_session(&self, key_id: &str) -> String {
        let nonce = ulid::Ulid::new().to_string();
        let id = format!("mcps_{nonce}_{}", self.sign(&nonce, key_id));
        self.local(&id, key_id);
        id
    }

    /// Whether `id` is a session this installation issued to `key_id`.
    fn valid(&self, id: &str, key_id: &str) -> bool {
        let mut it = id.splitn(3, '_');
        match (it.next(), it.next(), it.next()) {
            (Some("mcps"), Some(nonce), Some(tag)) => {
                let want = self.sign(nonce, key_id);
                subtle::ConstantTimeEq::ct_eq(want.as_bytes(), tag.as_bytes()).into()
            }
            _ => false,
        }
    }

    /// The session's local state, made on first use in this process.
    fn local(
        &self,
        id: &str,
        key_id: &str,
    ) -> (
        Subscriptions,
        Arc<tokio::sync::Mutex<mpsc::Receiver<Value>>>,
    ) {
        let mut m = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if !m.contains_key(id) && m.len() >= MAX_SESSIONS {
            let now = Instant::now();
            m.retain(|_, s| now.duration_since(s.last) < SESSION_IDLE);
            if m.len() >= MAX_SESSIONS {
                if let Some(k) = m.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone()) {
                    m.remove(&k);
                }
            }
        }
        let s = m.entry(id.to_owned()).or_insert_with(|| {
            let (tx, rx) = Notifier::channel();
            Session {
                key_id: key_id.to_owned(),
                subs: Subscriptions::new(tx),
                stream: Arc::new(tokio::sync::Mutex::new(rx)),
                inflight: HashMap::new(),
                last: Instant::now(),
            }
        });
        s.last = Instant::now();
        (s.subs.clone(), s.stream.clone())
    }

    fn with_session<T>(&self, id: &str, f: impl FnOnce(&mut Session) -> T) -> Option<T> {
        let mut m = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        m.get_mut(id).map(f)
    }
}

/// The session a request names: `Ok(None)` without the header, `Err(404)` for one not
/// issued to this key (the spec's answer to an unknown session).
// The error is the answer itself, built once per refused request: boxing it buys nothing.
#[allow(clippy::result_large_err)]
fn session_of(mcp: &Mcp, headers: &HeaderMap, key_id: &str) -> Result<Option<String>, Response> {
    let Some(v) = headers.get(SESSION_HEADER) else {
        return Ok(None);
    };
    let id = v.to_str().unwrap_or_default();
    if !mcp.valid(id, key_id) {
        return Err(rpc_status(
            StatusCode::NOT_FOUND,
            RpcError::new(
                code::INVALID_REQUEST,
                "no such session; initialize a new one",
            ),
        ));
    }
    Ok(Some(id.to_owned()))
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

async fn handle_post(mcp: Arc<Mcp>, State(state): State<AppState>, req: Request) -> Response {
    let (principal, auth, headers, body) = match authenticate(&state, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let msg = match decode(&body) {
        Ok(m) => m,
        Err(e) => return (StatusCode::BAD_REQUEST, axum::Json(e)).into_response(),
    };
    let session = match session_of(&mcp, &headers, &principal.key_id) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (id, method, params) = match msg {
        Message::Response => return StatusCode::ACCEPTED.into_response(),
        Message::Notification { method, params } => {
            if method == "notifications/cancelled" {
                if let (Some(s), Some(rid)) = (&session, params.get("requestId")) {
                    let key = id_key(rid);
                    if let Some(h) = mcp.with_session(s, |s| s.inflight.remove(&key)).flatten() {
                        h.abort();
                    }
                }
            }
            return StatusCode::ACCEPTED.into_response();
        }
        Message::Request { id, method, params } => (id, method, params),
    };
    let mut session_header = None;
    let (subs, session) = if method == "initialize" {
        let s = mcp.new_session(&principal.key_id);
        session_header = Some(s.clone());
        (mcp.local(&s, &principal.key_id).0, Some(s))
    } else if let Some(s) = session {
        (mcp.local(&s, &principal.key_id).0, Some(s))
    } else {
        // Without a session the request is answered on its own; updates have nowhere to go.
        if method == "resources/subscribe" {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(
                    RpcError::new(
                        code::INVALID_REQUEST,
                        "subscriptions need a session (Mcp-Session-Id)",
                    )
                    .response(id),
                ),
            )
                .into_response();
        }
        (Subscriptions::new(Notifier::discarding()), None)
    };
    let server = Server::new(
        Arc::new(InProcess::new(mcp.v1.clone(), auth)),
        mcp.logs.clone(),
    );
    // Only a streamed exec sends progress, so only it is answered as SSE: any other result
    // (a 1 MiB file read, say) is one JSON answer, which no SSE event limit of a client cuts.
    let streamed = method == "tools/call"
        && params.get("name").and_then(Value::as_str) == Some("sandbox_exec")
        && progress_token(&params).is_some()
        && accepts_sse(&headers);
    let (tx, mut rx) = Notifier::channel();
    let key = id_key(&id);
    // The audit records of the `/v1` calls carry this request's id and trace, also when the
    // answer streams after the handler returned.
    let request_id = differently_core::request_id::current_request_id();
    let trace = differently_bus::trace::current();
    let run = {
        let tx = tx.clone();
        async move {
            let resp = server.request(id, &method, params, &tx, &subs).await;
            tx.respond(resp).await;
        }
    };
    let task = tokio::spawn(differently_bus::trace::scope("mcp", trace, async move {
        match request_id {
            Some(r) => differently_core::request_id::with_request_id(r, run).await,
            None => run.await,
        }
    }));
    drop(tx);
    let guard = AbortOnDrop(task.abort_handle());
    if let Some(s) = &session {
        mcp.with_session(s, |s| s.inflight.insert(key.clone(), task.abort_handle()));
    }
    let done = {
        let mcp = mcp.clone();
        let (session, key) = (session.clone(), key.clone());
        move || {
            if let Some(s) = &session {
                mcp.with_session(s, |s| s.inflight.remove(&key));
            }
        }
    };
    let mut resp = if streamed {
        let stream = futures::stream::unfold(
            (rx, guard, Some(done)),
            |(mut rx, g, mut done)| async move {
                let msg = rx.recv().await;
                if msg.is_none() {
                    if let Some(d) = done.take() {
                        d();
                    }
                }
                msg.map(|m| {
                    let frame = Bytes::from(format!("event: message\ndata: {m}\n\n"));
                    (Ok::<_, Infallible>(frame), (rx, g, done))
                })
            },
        );
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    } else {
        let mut last = None;
        while let Some(m) = rx.recv().await {
            last = Some(m);
        }
        drop(guard);
        done();
        match last {
            Some(m) if m.get("method").is_none() => axum::Json(m).into_response(),
            // Cancelled: the spec sends no response to a cancelled request; the POST still
            // needs an answer, and the client has stopped waiting for one.
            _ => StatusCode::ACCEPTED.into_response(),
        }
    };
    if let Some(s) = session_header.and_then(|s| HeaderValue::from_str(&s).ok()) {
        resp.headers_mut().insert(SESSION_HEADER, s);
    }
    resp
}

fn accepts_sse(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// GET: the session's server stream (resource updates), one at a time per session.
async fn handle_get(mcp: Arc<Mcp>, State(state): State<AppState>, req: Request) -> Response {
    let (principal, _, headers, _) = match authenticate(&state, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if !accepts_sse(&headers) {
        let mut r = rpc_status(
            StatusCode::METHOD_NOT_ALLOWED,
            RpcError::new(code::INVALID_REQUEST, "GET serves text/event-stream only"),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
        return r;
    }
    let session = match session_of(&mcp, &headers, &principal.key_id) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return rpc_status(
                StatusCode::BAD_REQUEST,
                RpcError::new(
                    code::INVALID_REQUEST,
                    "the server stream needs Mcp-Session-Id",
                ),
            )
        }
        Err(r) => return r,
    };
    let (_, stream) = mcp.local(&session, &principal.key_id);
    let Ok(rx) = stream.try_lock_owned() else {
        return rpc_status(
            StatusCode::CONFLICT,
            RpcError::new(
                code::INVALID_REQUEST,
                "this session's server stream is already open",
            ),
        );
    };
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let frame = match tokio::time::timeout(STREAM_PING, rx.recv()).await {
            Ok(Some(m)) => format!("event: message\ndata: {m}\n\n"),
            Ok(None) => return None,
            Err(_) => ": ping\n\n".to_owned(),
        };
        Some((Ok::<_, Infallible>(Bytes::from(frame)), rx))
    });
    let mut r = Response::new(Body::from_stream(body.boxed()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// DELETE: ends the session here (its subscriptions and running requests).
async fn handle_delete(mcp: Arc<Mcp>, State(state): State<AppState>, req: Request) -> Response {
    let (principal, _, headers, _) = match authenticate(&state, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match session_of(&mcp, &headers, &principal.key_id) {
        Ok(Some(s)) => {
            let gone = mcp
                .sessions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&s);
            if let Some(s) = gone {
                debug_assert!(s.key_id == principal.key_id);
                s.subs.clear();
                for (_, h) in s.inflight {
                    h.abort();
                }
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(None) => rpc_status(
            StatusCode::BAD_REQUEST,
            RpcError::new(code::INVALID_REQUEST, "DELETE needs Mcp-Session-Id"),
        ),
        Err(r) => r,
    }
}
