//! execd's interactive terminal (components/execd/PTY.md) through the facade, over `/v1`'s
//! terminal sessions ([`crate::data_plane::pty_sessions`]).
//!
//! `POST /pty {cwd?, command?}` → 201 `{session_id}`: a session record only (checked: the exec
//! scope, the sandbox and that it is not killed, the pool's `exec.pty`; 501 `NOT_SUPPORTED`
//! without it); the program starts on the first socket, as execd's does. `GET /pty/{sid}` →
//! `{session_id, running, output_offset}`; `DELETE /pty/{sid}` forgets the session, sends
//! SIGKILL to the terminal's foreground group and closes an attached socket. The terminal is
//! the WebSocket `GET /pty/{sid}/ws[?since=N][&takeover=1]`: 404
//! `CONTEXT_NOT_FOUND` for a session this key did not make on this sandbox, 409
//! `ALREADY_CONNECTED` while another socket holds it (unless `takeover=1`: the holder is
//! closed with 4001 `TAKEN_OVER`). Server frames: output kept while no socket was attached as
//! a replay (`0x03` + u64 BE offset + bytes), `{"type":"connected","session_id","mode":"pty"}`,
//! output as `0x01` + bytes, and at the end `{"type":"exit","exit_code"}` (or `{"type":"error",
//! "code","error"}`) and a close. Client frames: stdin `0x00` + bytes; JSON `resize`, `signal`
//! (`SIGINT`, `SIGTERM`, `SIGKILL`, `SIGHUP`), `ping` (answered `pong`), `stdin {data}`;
//! frames it cannot use are ignored, as execd (and the adapter tests' fake of it) ignores them.
//!
//! The program is execd's: `bash --norc --noprofile -c <command>` (an interactive
//! `bash --norc --noprofile` when the command is empty), through `sh` where the image has no
//! bash. Opening the program and every later attach go through `/v1`'s own checks and audit
//! (`sandbox.pty`, [`crate::routes::pty`]); the facade only speaks execd's framing.
//!
//! Limits (docs/opensandbox-facade.md): a session lives in this API process; with no socket
//! attached its program is hung up after `api.pty_grace_seconds` (execd keeps it until
//! `DELETE`); the replay is what `/v1` keeps while detached (the newest 64 KiB), so `since`
//! only selects whether it is sent, and an offset past a dropped part is approximate.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use differently_adapters::{PtyInput, PtyRequest, PtySignal};
use differently_core::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::data_plane::pty_sessions::{Ending, Session};
use crate::error::ApiError;
use crate::locks::lock;
use crate::requests::body::JsonError;
use crate::routes::pty as v1_pty;
use crate::AppState;

use super::error::{OsbError, OsbResult};
use super::execd::execd_caller;
use super::inner::Caller;
use super::lifecycle::live_sandbox;
use super::Facade;

/// Close code of a socket whose session another socket took over (execd's).
const CLOSE_TAKEN_OVER: u16 = 4001;
/// Close code of a socket that lost a race for a session to another one (execd answers
/// that case 409 before the upgrade; a race decided after it can only be a close).
const CLOSE_ALREADY_CONNECTED: u16 = 4009;
/// How many sessions one API process keeps records of (ended ones are kept for their
/// status until `DELETE`; past this, ended ones and ones never attached for
/// [`UNSTARTED_KEPT`] go, and a create past it is refused).
const RECORDS_MAX: usize = 4096;
/// How long a session nobody attached to is kept when records run short.
const UNSTARTED_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// The program of a session: execd's bash line, or `sh` where the image has no bash.
pub fn program(command: &str) -> Vec<String> {
    const PICK: &str = "if command -v bash >/dev/null 2>&1; then \
        if [ -n \"$1\" ]; then exec bash --norc --noprofile -c \"$1\"; \
        else exec bash --norc --noprofile; fi; \
        elif [ -n \"$1\" ]; then exec sh -c \"$1\"; else exec sh; fi";
    ["sh", "-c", PICK, "differently-pty", command]
        .map(String::from)
        .to_vec()
}

/// One execd session: who made it, what it runs, and its `/v1` session once started.
struct Record {
    sandbox: String,
    key_id: String,
    request: PtyRequest,
    session: Option<Arc<Session>>,
    /// The socket holding the session (0: none); a takeover bumps it.
    holder: u64,
    next_holder: u64,
    /// Output bytes sent to sockets so far (execd's `output_offset`).
    offset: u64,
    ended: bool,
    created: std::time::Instant,
}

impl Record {
    fn running(&self) -> bool {
        !self.ended && self.session.as_ref().is_some_and(|s| s.input().is_some())
    }
}

/// This process's execd sessions, by the id the facade issued.
#[derive(Default)]
pub struct PtyRecords {
    map: Mutex<HashMap<String, Record>>,
}

impl PtyRecords {
    /// Runs `f` on session `sid` if `key_id` made it on `sandbox` (else `None`: the caller
    /// answers as for an unknown session, so ids of others' sessions reveal nothing).
    fn with<T>(
        &self,
        sid: &str,
        sandbox: &str,
        key_id: &str,
        f: impl FnOnce(&mut Record) -> T,
    ) -> Option<T> {
        let mut map = lock(&self.map);
        let r = map.get_mut(sid)?;
        (r.sandbox == sandbox && r.key_id == key_id).then(|| f(r))
    }

    /// Keeps `record` unless this process already holds [`RECORDS_MAX`] live ones.
    fn insert(&self, sid: String, record: Record) -> OsbResult<()> {
        let mut map = lock(&self.map);
        if map.len() >= RECORDS_MAX {
            map.retain(|_, r| match r.session {
                Some(_) => r.running(),
                None => r.created.elapsed() < UNSTARTED_KEPT,
            });
        }
        if map.len() >= RECORDS_MAX {
            return Err(OsbError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "DIFFERENTLY::QUOTA_EXCEEDED",
                format!("this API process holds {RECORDS_MAX} PTY sessions; delete some"),
            ));
        }
        map.insert(sid, record);
        Ok(())
    }
}

/// The `/v1` principal of an execd caller, authenticated by `/v1`'s own extractor (revoked
/// or expired keys, rate limits, a suspended organization for `method`s that change things).
async fn principal_of(state: &AppState, caller: &Caller, method: Method) -> OsbResult<Principal> {
    let mut req = Request::builder()
        .method(method)
        .uri("/v1/pty")
        .body(())
        .map_err(OsbError::internal)?;
    caller.attach_to(&mut req)?;
    let (mut parts, ()) = req.into_parts();
    Principal::from_request_parts(&mut parts, state)
        .await
        .map_err(|e| mapped(e, caller))
}

/// A `/v1` error in the facade's shape; a pool without `exec.pty` is execd's 501.
fn mapped(e: ApiError, caller: &Caller) -> OsbError {
    if e.code == ErrorCode::UnsupportedOperation {
        return OsbError::new(
            StatusCode::NOT_IMPLEMENTED,
            "NOT_SUPPORTED",
            format!(
                "PTY (/pty) is not supported on this sandbox: {} (no exec.pty capability)",
                e.message
            ),
        );
    }
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // With its details: a killed sandbox's conflict names its status, which makes it a 404.
    let body = json!({ "error": { "code": e.code, "message": e.message, "details": e.details } })
        .to_string();
    let mut o = OsbError::from_v1(status, body.as_bytes(), caller);
    o.retry_after = e.retry_after.map(|s| s.to_string());
    o
}

fn not_found(sid: &str) -> OsbError {
    OsbError::new(
        StatusCode::NOT_FOUND,
        "CONTEXT_NOT_FOUND",
        format!("pty session {sid} not found"),
    )
}

/// `POST /pty` body (execd's).
#[derive(Debug, Default, Deserialize)]
struct CreateBody {
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    command: Option<String>,
}

/// `POST /pty` → 201 `{session_id}`.
pub async fn create(
    Extension(f): Extension<Arc<Facade>>,
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    let principal = principal_of(&state, &caller, Method::POST).await?;
    // `check_can_open` does not look at the status: a killed sandbox is 404 here as on
    // every route, not a session whose socket can only be refused.
    live_sandbox(&f, &caller, &id).await?;
    v1_pty::check_can_open(&state, &principal, &id)
        .await
        .map_err(|e| mapped(e, &caller))?;
    let body: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody::default()
    } else {
        crate::requests::body::read(&body).map_err(|e| OsbError::json("INVALID_REQUEST_BODY", e))?
    };
    let cwd = body.cwd.filter(|c| !c.is_empty());
    let request = v1_pty::checked_request(
        program(body.command.as_deref().unwrap_or("")),
        BTreeMap::new(),
        cwd,
        v1_pty::DEFAULT_SIZE,
    )
    .map_err(|e| mapped(e, &caller))?;
    let sid = format!("pty_{}", ulid::Ulid::new().to_string().to_lowercase());
    f.ptys.insert(
        sid.clone(),
        Record {
            sandbox: id,
            key_id: principal.key_id,
            request,
            session: None,
            holder: 0,
            next_holder: 0,
            offset: 0,
            ended: false,
            created: std::time::Instant::now(),
        },
    )?;
    Ok((StatusCode::CREATED, Json(json!({ "session_id": sid }))).into_response())
}

/// `GET /pty/{sid}`.
pub async fn status(
    Extension(f): Extension<Arc<Facade>>,
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, sid)): Path<(String, String)>,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    let principal = principal_of(&state, &caller, Method::GET).await?;
    live_sandbox(&f, &caller, &id).await?;
    f.ptys
        .with(&sid, &id, &principal.key_id, |r| {
            Json(json!({ "session_id": sid, "running": r.running(),
                "output_offset": r.offset }))
        })
        .ok_or_else(|| not_found(&sid))
}

/// `DELETE /pty/{sid}`: forgets the session and sends SIGKILL to the terminal's foreground
/// group; an attached socket is closed, as execd closes it.
pub async fn delete(
    Extension(f): Extension<Arc<Facade>>,
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, sid)): Path<(String, String)>,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let principal = principal_of(&state, &caller, Method::DELETE).await?;
    live_sandbox(&f, &caller, &id).await?;
    let session = f
        .ptys
        .with(&sid, &id, &principal.key_id, |r| r.session.clone())
        .ok_or_else(|| not_found(&sid))?;
    lock(&f.ptys.map).remove(&sid);
    if let Some(input) = session.and_then(|s| s.input()) {
        let _ = input.try_send(PtyInput::Signal(PtySignal::Kill));
    }
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub struct WsQuery {
    since: Option<i64>,
    takeover: Option<String>,
}

/// What a socket attaches to.
enum Attach {
    /// The first socket: the program starts with it.
    Start(v1_pty::Opening),
    Resume(Arc<Session>),
}

/// `GET /pty/{sid}/ws`: the terminal.
pub async fn ws(
    Extension(f): Extension<Arc<Facade>>,
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, sid)): Path<(String, String)>,
    Query(qr): Query<WsQuery>,
    up: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    let principal = principal_of(&state, &caller, Method::GET).await?;
    live_sandbox(&f, &caller, &id).await?;
    let takeover = qr.takeover.as_deref() == Some("1");
    let (session, request, held) = f
        .ptys
        .with(&sid, &id, &principal.key_id, |r| {
            (r.session.clone(), r.request.clone(), r.holder != 0)
        })
        .ok_or_else(|| not_found(&sid))?;
    if held && !takeover {
        return Err(OsbError::new(
            StatusCode::CONFLICT,
            "ALREADY_CONNECTED",
            format!("another client is already connected to pty session {sid}"),
        ));
    }
    let up = up.map_err(|e| {
        OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            format!("this route is a WebSocket: open it with an upgrade request ({e})"),
        )
    })?;
    let attach = match session {
        Some(s) => {
            v1_pty::audit_reattach(&state, &principal, &id, &s)
                .await
                .map_err(|e| mapped(e, &caller))?;
            Attach::Resume(s)
        }
        None => Attach::Start(
            v1_pty::open_new(&state, &principal, &id, request)
                .await
                .map_err(|e| mapped(e, &caller))?,
        ),
    };
    let replay = qr.since.is_none_or(|s| s >= 0);
    Ok(up.on_upgrade(move |socket| async move {
        // Claimed under the lock: of two sockets racing for a session one gets it (and
        // starts the program), the other is closed as a refused second socket.
        let claimed = f.ptys.with(&sid, &id, &principal.key_id, |r| {
            if r.holder != 0 && !takeover {
                return None;
            }
            let (session, attachment) = match (&r.session, attach) {
                (Some(s), _) => (s.clone(), s.attach()),
                (None, Attach::Start(opening)) => {
                    let (s, a) = opening.start(&state);
                    r.session = Some(s.clone());
                    (s, a)
                }
                // Deleted and made again cannot happen: ids are not reused.
                (None, Attach::Resume(s)) => (s.clone(), s.attach()),
            };
            r.next_holder += 1;
            r.holder = r.next_holder;
            Some((session, attachment, r.holder))
        });
        let (session, attachment, holder) = match claimed {
            Some(Some(c)) => c,
            Some(None) => {
                let mut socket = socket;
                let err = json!({ "type": "error", "code": "ALREADY_CONNECTED",
                    "error": format!("another client is already connected to pty session {sid}") });
                let _ = socket.send(text(err)).await;
                let close = CloseFrame {
                    code: CLOSE_ALREADY_CONNECTED,
                    reason: "ALREADY_CONNECTED".into(),
                };
                let _ = socket.send(Message::Close(Some(close))).await;
                return;
            }
            None => {
                // Deleted while upgrading.
                let mut socket = socket;
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        };
        let grace = state.limits.pty_grace;
        let link = Link {
            facade: f,
            sid,
            sandbox: id,
            key_id: principal.key_id,
            holder,
        };
        serve(socket, &state, &link, session, attachment, replay, grace).await;
    }))
}

/// Which record a socket serves and which holder it is.
struct Link {
    facade: Arc<Facade>,
    sid: String,
    sandbox: String,
    key_id: String,
    holder: u64,
}

impl Link {
    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> Option<T> {
        self.facade
            .ptys
            .with(&self.sid, &self.sandbox, &self.key_id, f)
    }

    /// The socket is gone: the session is free for the next one.
    fn release(&self) {
        self.with(|r| {
            if r.holder == self.holder {
                r.holder = 0;
            }
        });
    }
}

fn text(v: Value) -> Message {
    Message::Text(v.to_string().into())
}

fn framed(kind: u8, offset: Option<u64>, bytes: &[u8]) -> Message {
    let mut f = Vec::with_capacity(bytes.len() + 9);
    f.push(kind);
    if let Some(o) = offset {
        f.extend_from_slice(&o.to_be_bytes());
    }
    f.extend_from_slice(bytes);
    Message::Binary(f.into())
}

/// A client frame of execd's protocol, as `/v1` input (`None`: nothing to pass on).
enum FromClient {
    Input(PtyInput),
    Ping,
    Ignore,
    Bad(String),
}

/// Parses a client text frame: execd's own `ping` and `stdin` here, `resize` and `signal`
/// by `/v1`'s parser (the same bounds and signal names).
fn from_client_text(t: &str) -> FromClient {
    let v: Value = match crate::requests::body::read_value(t.as_bytes()) {
        Ok(v) => v,
        Err(JsonError::DuplicateKey { path }) => {
            return FromClient::Bad(format!("{path}: duplicate key"))
        }
        Err(e) => return FromClient::Bad(format!("a text frame is JSON: {e}")),
    };
    match v["type"].as_str() {
        Some("ping") => FromClient::Ping,
        Some("stdin") => match v["data"].as_str() {
            Some(d) => FromClient::Input(PtyInput::Stdin(Bytes::from(d.to_owned()))),
            None => FromClient::Bad("stdin: data must be a string".into()),
        },
        Some("resize" | "signal") => match v1_pty::parse_control(t) {
            Ok(i) => FromClient::Input(i),
            Err(e) => FromClient::Bad(e.to_string()),
        },
        _ => FromClient::Ignore,
    }
}

/// Serves one socket until the program ends, the socket goes away, or another socket takes
/// the session over.
async fn serve(
    mut socket: WebSocket,
    state: &AppState,
    link: &Link,
    session: Arc<Session>,
    attachment: u64,
    replay: bool,
    grace: std::time::Duration,
) {
    let mut changed = session.subscribe();
    let input = session.input();
    // What waited for a socket is the replay, at the offset the last socket reached.
    let first = session.take(attachment);
    let kept: Vec<u8> = first
        .chunks
        .iter()
        .flat_map(|c| c.iter().copied())
        .collect();
    if !kept.is_empty() && replay {
        let at = link.with(|r| r.offset).unwrap_or(0);
        if socket.send(framed(0x03, Some(at), &kept)).await.is_err() {
            session.detach(&state.ptys, attachment, grace);
            return link.release();
        }
        link.with(|r| r.offset += kept.len() as u64);
    }
    let hello = json!({ "type": "connected", "session_id": link.sid, "mode": "pty" });
    if socket.send(text(hello)).await.is_err() {
        session.detach(&state.ptys, attachment, grace);
        return link.release();
    }
    let mut ending = first.ending;
    let mut waiting: Option<PtyInput> = None;
    loop {
        if ending.is_none() {
            let taken = session.take(attachment);
            let Some(holder) = link.with(|r| r.holder) else {
                // Deleted: execd closes the socket. What the kill missed is hung up when the
                // grace period runs out.
                let _ = socket.send(Message::Close(None)).await;
                session.detach(&state.ptys, attachment, grace);
                return;
            };
            if !taken.current || holder != link.holder {
                let close = CloseFrame {
                    code: CLOSE_TAKEN_OVER,
                    reason: "TAKEN_OVER".into(),
                };
                let _ = socket.send(Message::Close(Some(close))).await;
                return;
            }
            for chunk in taken.chunks {
                link.with(|r| r.offset += chunk.len() as u64);
                if socket.send(framed(0x01, None, &chunk)).await.is_err() {
                    session.detach(&state.ptys, attachment, grace);
                    return link.release();
                }
            }
            ending = taken.ending;
        }
        if let Some(end) = ending.take() {
            let last = match end {
                Ending::Exit(code) => json!({ "type": "exit", "exit_code": code }),
                Ending::Error { code, message } => {
                    json!({ "type": "error", "code": code, "error": message })
                }
            };
            let _ = socket.send(text(last)).await;
            let close = CloseFrame {
                code: 1000,
                reason: "process exited".into(),
            };
            let _ = socket.send(Message::Close(Some(close))).await;
            link.with(|r| r.ended = true);
            state.ptys.remove(&session.id);
            return link.release();
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return link.release() },
            permit = v1_pty::reserve(&input), if waiting.is_some() => {
                if let (Some(p), Some(msg)) = (permit, waiting.take()) {
                    p.send(msg);
                }
            }
            msg = socket.recv(), if waiting.is_none() => match msg {
                // Only `0x00` (stdin) is a client's binary frame; others are ignored, as execd does.
                Some(Ok(Message::Binary(b))) if b.first() == Some(&0x00) => {
                    state.activity.record(&state.store, session.sandbox(), chrono::Utc::now());
                    waiting = Some(PtyInput::Stdin(b.slice(1..)));
                }
                Some(Ok(Message::Text(t))) => match from_client_text(t.as_str()) {
                    FromClient::Input(i) => waiting = Some(i),
                    FromClient::Ping => {
                        let _ = socket.send(text(json!({ "type": "pong" }))).await;
                    }
                    FromClient::Ignore => {}
                    // execd ignores what it cannot use (a zero size, an unknown signal).
                    FromClient::Bad(why) => tracing::debug!(%why, "opensandbox pty: frame ignored"),
                },
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    session.detach(&state.ptys, attachment, grace);
                    return link.release();
                }
                Some(Ok(_)) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_naming_a_key_twice_is_refused_naming_it() {
        match from_client_text(r#"{"type":"stdin","data":"ls\n","data":"rm -rf /\n"}"#) {
            FromClient::Bad(m) => assert_eq!(m, "data: duplicate key"),
            _ => panic!("a frame naming data twice was taken"),
        }
    }

    #[test]
    fn the_program_is_execds_bash_line_with_a_sh_fallback() {
        let p = program("echo hi");
        assert_eq!(p[..2], ["sh", "-c"]);
        assert!(p[2].contains("exec bash --norc --noprofile -c \"$1\""));
        assert!(p[2].contains("exec sh -c \"$1\""));
        assert_eq!(p[3..], ["differently-pty", "echo hi"]);
    }

    #[test]
    fn client_text_frames_map_onto_v1_input() {
        assert!(matches!(
            from_client_text(r#"{"type":"signal","signal":"SIGINT"}"#),
            FromClient::Input(PtyInput::Signal(PtySignal::Int))
        ));
        assert!(matches!(
            from_client_text(r#"{"type":"resize","cols":100,"rows":30}"#),
            FromClient::Input(PtyInput::Resize(_))
        ));
        assert!(matches!(
            from_client_text(r#"{"type":"ping"}"#),
            FromClient::Ping
        ));
        assert!(matches!(
            from_client_text(r#"{"type":"resize","cols":0,"rows":30}"#),
            FromClient::Bad(_)
        ));
        assert!(matches!(
            from_client_text(r#"{"type":"stdin","data":"ls\n"}"#),
            FromClient::Input(PtyInput::Stdin(_))
        ));
    }
}
