//! Interactive terminal: `GET /v1/sandboxes/{id}/pty`, a WebSocket (docs/api.md, "Terminal").
//!
//! Everything the open needs is in the query, so bad input is answered before the upgrade
//! with the usual JSON envelope: `cols`, `rows` (1–1000, default 80×24), `command` (repeated,
//! the argv in order; default `sh -l`, a login shell), `env` (repeated `NAME=value`), `cwd`
//! (absolute), or `session=<id>` alone to reattach. After the upgrade the server sends
//! `{"type":"session","id","graceSeconds"}` first; binary frames carry the terminal's bytes
//! both ways; text frames carry JSON control messages (`resize`, `signal` from the client;
//! `exit`, `error` from the server, each followed by a close). Sessions outlive a dropped
//! socket for the grace period ([`crate::data_plane::pty_sessions`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use differently_adapters::{
    InstanceRef, PtyInput, PtyRequest, PtySignal, PtySize, SharedAdapter, PTY_MAX_SIDE,
};
use differently_core::exec::ExecRequest;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError, SandboxId};
use serde::Deserialize;
use serde_json::json;

use crate::auth::access::load_sandbox;
use crate::auth::Principal;
use crate::control::sandbox_pool::{pool_of, require_capability};
use crate::data_plane::pty_sessions::{Ending, Owner, Session};
use crate::data_plane::{DataCall, Target};
use crate::error::{ApiError, ApiResult};
use crate::requests::body::JsonError;
use crate::AppState;

/// The program a terminal runs when the open names none: a login shell.
pub const DEFAULT_COMMAND: [&str; 2] = ["sh", "-l"];
/// Size of a terminal whose open gives none.
pub const DEFAULT_SIZE: PtySize = PtySize { cols: 80, rows: 24 };
/// Close code of a socket whose session another connection took over (as execd's).
const CLOSE_TAKEN_OVER: u16 = 4001;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/sandboxes/{id}/pty", get(pty))
}

/// What the query asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Open {
    New(PtyRequest),
    Reattach(String),
}

/// A bad query parameter: 400 `invalid_argument` naming it, as the other routes' queries.
fn bad(field: &str, why: impl Into<String>) -> ApiError {
    ApiError::field(ErrorCode::InvalidArgument, FieldError::new(field, why))
}

fn side(field: &str, raw: &str) -> ApiResult<u16> {
    match raw.parse::<u16>() {
        Ok(n) if (1..=PTY_MAX_SIDE).contains(&n) => Ok(n),
        _ => Err(bad(
            field,
            format!("must be a whole number from 1 to {PTY_MAX_SIDE}"),
        )),
    }
}

/// Parses the open's query; public for the router tests and fuzzers.
pub fn parse_open(query: Option<&str>) -> ApiResult<Open> {
    let mut size = DEFAULT_SIZE;
    let mut command = Vec::new();
    let mut env = BTreeMap::new();
    let mut cwd = None;
    let mut session = None;
    let mut others = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "cols" => size.cols = side("cols", &v)?,
            "rows" => size.rows = side("rows", &v)?,
            "command" => command.push(v.into_owned()),
            "env" => {
                let Some((name, value)) = v.split_once('=') else {
                    return Err(bad("env", "each env is NAME=value"));
                };
                if env.insert(name.to_owned(), value.to_owned()).is_some() {
                    return Err(bad(&format!("env.{name}"), "is given twice"));
                }
            }
            "cwd" => {
                if cwd.replace(v.into_owned()).is_some() {
                    return Err(bad("cwd", "is given twice"));
                }
            }
            "session" => {
                if session.replace(v.into_owned()).is_some() {
                    return Err(bad("session", "is given twice"));
                }
            }
            other => {
                others.push(other.to_owned());
            }
        }
    }
    if let Some(name) = others.first() {
        return Err(bad(
            name,
            "is not a parameter of this route (cols, rows, command, env, cwd, session)",
        ));
    }
    if let Some(id) = session {
        if query_has_open_fields(query) {
            return Err(bad(
                "session",
                "a reattach takes no other parameter (the session keeps its own)",
            ));
        }
        if id.is_empty() {
            return Err(bad("session", "is empty"));
        }
        return Ok(Open::Reattach(id));
    }
    if command.is_empty() {
        command = DEFAULT_COMMAND.map(String::from).to_vec();
    }
    checked_request(command, env, cwd, size).map(Open::New)
}

/// A terminal request under the same rules as exec's: a program, no NUL, env names, an
/// absolute cwd (400 `invalid_argument` naming the field).
pub(crate) fn checked_request(
    command: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    size: PtySize,
) -> ApiResult<PtyRequest> {
    let check = ExecRequest {
        command,
        env,
        cwd,
        ..ExecRequest::default()
    };
    check
        .validate()
        .map_err(|e| ApiError::field(ErrorCode::InvalidArgument, e))?;
    Ok(PtyRequest {
        command: check.command,
        env: check.env,
        cwd: check.cwd,
        size,
    })
}

fn query_has_open_fields(query: Option<&str>) -> bool {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, _)| k != "session")
}

/// A control message from the client (a text frame).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum Control {
    Resize { cols: u32, rows: u32 },
    Signal { signal: String },
}

/// Parses a client text frame; the error names the field.
pub fn parse_control(text: &str) -> Result<PtyInput, FieldError> {
    let c: Control = crate::requests::body::read(text.as_bytes()).map_err(|e| match e {
        JsonError::DuplicateKey { path } => FieldError::new(path, "duplicate key"),
        e => FieldError::new(
            "frame",
            format!(
                "a text frame is {{\"type\":\"resize\",\"cols\",\"rows\"}} or \
                 {{\"type\":\"signal\",\"signal\"}}: {e}"
            ),
        ),
    })?;
    match c {
        Control::Resize { cols, rows } => {
            let ok = |n: u32| (1..=u32::from(PTY_MAX_SIDE)).contains(&n);
            for (name, n) in [("cols", cols), ("rows", rows)] {
                if !ok(n) {
                    return Err(FieldError::new(
                        name,
                        format!("must be a whole number from 1 to {PTY_MAX_SIDE}"),
                    ));
                }
            }
            // Both fit: checked against PTY_MAX_SIDE just above.
            Ok(PtyInput::Resize(PtySize {
                cols: u16::try_from(cols).unwrap_or(PTY_MAX_SIDE),
                rows: u16::try_from(rows).unwrap_or(PTY_MAX_SIDE),
            }))
        }
        Control::Signal { signal } => PtySignal::parse(&signal)
            .map(PtyInput::Signal)
            .ok_or_else(|| FieldError::new("signal", "must be INT, TERM, KILL or HUP")),
    }
}

/// The upgrade, answering with [`crate::auth::PTY_SUBPROTOCOL`] when the client offered it
/// (a browser passing its key as a subprotocol must get one of its offers back, and never the
/// one carrying the key).
fn upgrade(ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> ApiResult<WebSocketUpgrade> {
    ws.map(|ws| ws.protocols([crate::auth::PTY_SUBPROTOCOL]))
        .map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                format!("this route is a WebSocket: open it with an upgrade request ({e})"),
            )
        })
}

async fn pty(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    principal.require(Scope::SandboxesExec)?;
    let open = parse_open(query.as_deref())?;
    let grace = state.limits.pty_grace;
    match open {
        Open::Reattach(session_id) => {
            let session = find_session(&state, &principal, &id, &session_id).await?;
            let ws = upgrade(ws)?;
            audit_reattach(&state, &principal, &id, &session).await?;
            Ok(ws.on_upgrade(move |socket| async move {
                let attachment = session.attach();
                serve(socket, state, session, attachment, grace).await;
            }))
        }
        Open::New(req) => {
            let ws = upgrade(ws)?;
            let opening = open_new(&state, &principal, &id, req).await?;
            Ok(ws.on_upgrade(move |socket| async move {
                let (session, attachment) = opening.start(&state);
                serve(socket, state, session, attachment, grace).await;
            }))
        }
    }
}

/// Whether `principal` may open a terminal on sandbox `raw_id` at all: the exec scope, the
/// sandbox visible to it (404 otherwise), and its pool's `exec.pty` capability (501
/// `unsupported_operation` otherwise). Nothing is audited: a caller that makes a session
/// before its terminal (the OpenSandbox facade's `POST /pty`) asks this first and audits at
/// [`open_new`].
pub(crate) async fn check_can_open(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
) -> ApiResult<()> {
    principal.require(Scope::SandboxesExec)?;
    let sandbox = load_sandbox(state, principal, raw_id).await?;
    let pool = pool_of(state, &sandbox)?;
    require_capability(&pool, "exec.pty")
}

/// A new terminal that was checked and audited, not yet started: started once the socket
/// is upgraded, so a failed upgrade runs nothing.
pub(crate) struct Opening {
    owner: Owner,
    adapter: SharedAdapter,
    at: InstanceRef,
    req: PtyRequest,
}

impl Opening {
    /// Starts the program; the session and the caller's attachment.
    pub(crate) fn start(self, state: &AppState) -> (Arc<Session>, u64) {
        state
            .ptys
            .start(self.owner, self.adapter, self.at, self.req)
    }
}

/// Opens a new terminal on sandbox `raw_id` for `principal` (who holds the exec scope): the
/// running sandbox's pool with `exec.pty` (woken if idle) and the audited `sandbox.pty`
/// record, committed before anything runs.
pub(crate) async fn open_new(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    req: PtyRequest,
) -> ApiResult<Opening> {
    let detail = json!({ "program": req.program() });
    let call = DataCall::new(state, principal, raw_id, "exec.pty", "sandbox.pty", detail);
    let (Target { pool, at, env }, _) = call.open().await?;
    let mut req = req;
    req.env = crate::data_plane::running_rows::merged_env(&env, std::mem::take(&mut req.env));
    tracing::info!(sandbox = %at.sandbox_id, program = req.program(), "pty open");
    Ok(Opening {
        owner: Owner {
            key_id: principal.key_id.clone(),
            sandbox: at.sandbox_id.clone(),
        },
        adapter: pool.adapter.clone(),
        at,
        req,
    })
}

/// The running session `session_id` that `principal`'s key opened on sandbox `raw_id`
/// (404 `pty session` otherwise, and 404 for a sandbox it cannot see).
pub(crate) async fn find_session(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    session_id: &str,
) -> ApiResult<Arc<Session>> {
    let sandbox = load_sandbox(state, principal, raw_id).await?;
    let owner = Owner {
        key_id: principal.key_id.clone(),
        sandbox: sandbox.id.clone(),
    };
    state
        .ptys
        .find(session_id, &owner)
        .ok_or_else(|| ApiError::not_found("pty session"))
}

/// The audited `sandbox.pty` record of a reattach to `session` (capability checked again:
/// the pool may have changed since the open).
pub(crate) async fn audit_reattach(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    session: &Session,
) -> ApiResult<()> {
    let detail = json!({ "program": session.program, "reattach": true });
    DataCall::new(state, principal, raw_id, "exec.pty", "sandbox.pty", detail)
        .open()
        .await?;
    tracing::info!(sandbox = %session.sandbox(), session = %session.id, "pty reattach");
    Ok(())
}

fn control_text(value: serde_json::Value) -> Message {
    Message::Text(value.to_string().into())
}

/// Sends a last JSON frame and closes the socket.
async fn finish(socket: &mut WebSocket, last: serde_json::Value, close: Option<CloseFrame>) {
    let _ = socket.send(control_text(last)).await;
    let _ = socket.send(Message::Close(close)).await;
}

/// Serves one attached socket until the program ends, the socket goes away, or another
/// attachment takes the session over.
async fn serve(
    mut socket: WebSocket,
    state: AppState,
    session: Arc<Session>,
    attachment: u64,
    grace: Duration,
) {
    let mut changed = session.subscribe();
    let hello = json!({ "type": "session", "id": session.id, "graceSeconds": grace.as_secs() });
    if socket.send(control_text(hello)).await.is_err() {
        session.detach(&state.ptys, attachment, grace);
        return;
    }
    let sandbox: SandboxId = session.sandbox().clone();
    // Input read from the socket but not yet taken by the adapter: output keeps flowing
    // while it waits, so a program that does not read cannot stall its own output.
    let mut waiting: Option<PtyInput> = None;
    let input = session.input();
    loop {
        let taken = session.take(attachment);
        if !taken.current {
            let err = json!({ "type": "error", "code": ErrorCode::Conflict,
                "message": "another connection took this terminal session over" });
            let close = CloseFrame {
                code: CLOSE_TAKEN_OVER,
                reason: "TAKEN_OVER".into(),
            };
            finish(&mut socket, err, Some(close)).await;
            return;
        }
        for chunk in taken.chunks {
            if socket.send(Message::Binary(chunk)).await.is_err() {
                session.detach(&state.ptys, attachment, grace);
                return;
            }
        }
        if let Some(ending) = taken.ending {
            let last = match ending {
                Ending::Exit(code) => json!({ "type": "exit", "exitCode": code }),
                Ending::Error { code, message } => {
                    json!({ "type": "error", "code": code, "message": message })
                }
            };
            finish(&mut socket, last, None).await;
            state.ptys.remove(&session.id);
            return;
        }
        tokio::select! {
            r = changed.changed() => {
                if r.is_err() {
                    // The session is gone (cannot happen while we hold it); end cleanly.
                    return;
                }
            }
            permit = reserve(&input), if waiting.is_some() => {
                // Without a permit the input is closed: the program is ending and its exit
                // comes next, so the message is dropped.
                if let (Some(p), Some(msg)) = (permit, waiting.take()) {
                    p.send(msg);
                }
            }
            msg = socket.recv(), if waiting.is_none() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    state.activity.record(&state.store, &sandbox, Utc::now());
                    waiting = Some(PtyInput::Stdin(b));
                }
                Some(Ok(Message::Text(t))) => match parse_control(t.as_str()) {
                    Ok(c) => waiting = Some(c),
                    Err(e) => {
                        let err = json!({ "type": "error", "code": ErrorCode::InvalidArgument,
                            "message": e.to_string(), "field": e.field });
                        finish(&mut socket, err, None).await;
                        session.detach(&state.ptys, attachment, grace);
                        return;
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    session.detach(&state.ptys, attachment, grace);
                    return;
                }
            },
        }
    }
}

/// Room for one input message on the session's channel; `None` once the program is gone (or
/// was never attached). Shared by the facade's execd PTY socket.
pub(crate) async fn reserve(
    input: &Option<tokio::sync::mpsc::Sender<PtyInput>>,
) -> Option<tokio::sync::mpsc::Permit<'_, PtyInput>> {
    match input {
        Some(tx) => tx.reserve().await.ok(),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: ApiError) -> String {
        e.details
            .and_then(|d| d["field"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    #[test]
    fn open_defaults_to_a_login_shell_of_80_by_24() {
        assert_eq!(
            parse_open(None).ok(),
            Some(Open::New(PtyRequest {
                command: vec!["sh".into(), "-l".into()],
                env: BTreeMap::new(),
                cwd: None,
                size: DEFAULT_SIZE,
            }))
        );
    }

    #[test]
    fn open_reads_repeated_command_and_env() {
        let q = "cols=120&rows=40&command=bash&command=-c&command=echo%20a%26b&env=A%3D1&env=B=x%3Dy&cwd=%2Ftmp";
        let Ok(Open::New(req)) = parse_open(Some(q)) else {
            panic!("parses");
        };
        assert_eq!(req.command, ["bash", "-c", "echo a&b"]);
        assert_eq!(req.env["A"], "1");
        assert_eq!(req.env["B"], "x=y");
        assert_eq!(req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(
            req.size,
            PtySize {
                cols: 120,
                rows: 40
            }
        );
    }

    #[test]
    fn bad_open_parameters_name_their_field() {
        for (q, field) in [
            ("cols=0", "cols"),
            ("cols=1001", "cols"),
            ("rows=-3", "rows"),
            ("rows=abc", "rows"),
            ("env=NOVALUE", "env"),
            ("env=1BAD=x", "env.1BAD"),
            ("env=A=1&env=A=2", "env.A"),
            ("cwd=relative", "cwd"),
            ("command=", "command[0]"),
            ("colour=red", "colour"),
            ("session=pty_x&cols=3", "session"),
            ("session=", "session"),
        ] {
            match parse_open(Some(q)) {
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::InvalidArgument, "{q}");
                    assert_eq!(field_of(e), field, "{q}");
                }
                Ok(o) => panic!("{q} parsed as {o:?}"),
            }
        }
        assert_eq!(
            parse_open(Some("session=pty_1")).ok(),
            Some(Open::Reattach("pty_1".into()))
        );
    }

    #[test]
    fn control_frames_parse_and_name_bad_fields() {
        assert_eq!(
            parse_control(r#"{"type":"resize","cols":100,"rows":30}"#).ok(),
            Some(PtyInput::Resize(PtySize {
                cols: 100,
                rows: 30
            }))
        );
        assert_eq!(
            parse_control(r#"{"type":"signal","signal":"INT"}"#).ok(),
            Some(PtyInput::Signal(PtySignal::Int))
        );
        assert_eq!(
            parse_control(r#"{"type":"signal","signal":"SIGKILL"}"#).ok(),
            Some(PtyInput::Signal(PtySignal::Kill))
        );
        for (text, field) in [
            (r#"{"type":"resize","cols":0,"rows":30}"#, "cols"),
            (r#"{"type":"resize","cols":10,"rows":100000}"#, "rows"),
            (r#"{"type":"signal","signal":"STOP"}"#, "signal"),
            (r#"{"type":"dance"}"#, "frame"),
            ("not json", "frame"),
            // A key named twice is named, not read as its last value.
            (r#"{"type":"resize","cols":10,"rows":5,"cols":200}"#, "cols"),
            (
                r#"{"type":"signal","signal":"INT","type":"resize"}"#,
                "type",
            ),
        ] {
            match parse_control(text) {
                Err(e) => assert_eq!(e.field, field, "{text}"),
                Ok(c) => panic!("{text} parsed as {c:?}"),
            }
        }
    }
}
