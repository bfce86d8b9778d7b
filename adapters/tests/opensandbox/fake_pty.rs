//! execd's PTY API in the fake (components/execd/PTY.md and execd's pty_ws.go, 1.1):
//! `POST /pty {cwd?, command?}` → 201 `{session_id}`; `GET /pty/{id}` → `{session_id, running,
//! output_offset}`; `DELETE /pty/{id}`; WebSocket `GET /pty/{id}/ws[?since=N][&takeover=1]`:
//! 404 `CONTEXT_NOT_FOUND` for an unknown session, 409 `ALREADY_CONNECTED` while another socket
//! holds it (unless `takeover=1`: the holder is closed with 4001 `TAKEN_OVER`); the shell starts
//! on the first socket at 80×24; a replay frame (`0x03` + u64 BE offset + bytes) when `since`
//! is behind, then `{"type":"connected","session_id","mode":"pty"}`, then output as `0x01` +
//! bytes; stdin is `0x00` + bytes; JSON `resize`/`signal` (`SIGINT` …)/`ping` frames; the end is
//! `{"type":"exit","exit_code":N}` and a close (N is -1 when a signal killed the shell, as Go
//! reports it).
//!
//! The "shell" is scripted: it echoes input (newline as `\r\n`), answers `stty size`, `echo`,
//! `sleep S` (SIGINT or a typed ^C interrupts it), `exit N`; ^D on an empty line exits 0. The session's command (where the adapter puts argv and env) is
//! recorded for tests, not run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, watch};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the shell is told.
enum ShellIn {
    Stdin(Vec<u8>),
    Resize(u16, u16),
    Signal(String),
}

/// One PTY session.
struct Session {
    cwd: String,
    command: String,
    /// Every byte the shell wrote (execd keeps a replay buffer).
    log: Vec<u8>,
    exit: Option<i32>,
    started: bool,
    /// Bumped when `log` or `exit` changes.
    changed: watch::Sender<u64>,
    input: Option<mpsc::Sender<ShellIn>>,
    /// The connected socket's generation (0: none); a takeover bumps it.
    holder: u64,
    next_holder: u64,
}

/// The fake's PTY sessions, and what tests look at.
#[derive(Default)]
pub struct FakePtys {
    sessions: Mutex<HashMap<String, Session>>,
    seq: Mutex<u64>,
}

/// What a test can see of a session.
#[derive(Debug, Clone)]
pub struct PtyView {
    pub cwd: String,
    pub command: String,
    pub running: bool,
}

impl FakePtys {
    /// The sessions created so far (deleted ones are gone).
    pub fn views(&self) -> Vec<PtyView> {
        lock(&self.sessions)
            .values()
            .map(|s| PtyView {
                cwd: s.cwd.clone(),
                command: s.command.clone(),
                running: s.started && s.exit.is_none(),
            })
            .collect()
    }
}

type St = Arc<FakePtys>;

/// The routes, to merge into the execd listener's router.
pub fn router(ptys: St) -> Router {
    // The fake's direct execd endpoint is `<execd listener>/<sandbox>/proxy/44772`.
    Router::new()
        .route("/{sbx}/proxy/{port}/pty", post(create))
        .route("/{sbx}/proxy/{port}/pty/{id}", get(status).delete(delete))
        .route("/{sbx}/proxy/{port}/pty/{id}/ws", get(ws))
        .with_state(ptys)
}

fn err(status: StatusCode, code: &str, message: String) -> Response {
    (status, Json(json!({ "code": code, "message": message }))).into_response()
}

#[derive(Deserialize, Default)]
struct CreateBody {
    #[serde(default)]
    cwd: String,
    #[serde(default)]
    command: String,
}

async fn create(State(p): State<St>, body: Option<Json<CreateBody>>) -> Response {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let id = {
        let mut n = lock(&p.seq);
        *n += 1;
        format!("{:08x}-0000-4000-8000-{:012x}", *n, std::process::id())
    };
    lock(&p.sessions).insert(
        id.clone(),
        Session {
            cwd: body.cwd,
            command: body.command,
            log: Vec::new(),
            exit: None,
            started: false,
            changed: watch::Sender::new(0),
            input: None,
            holder: 0,
            next_holder: 0,
        },
    );
    (StatusCode::CREATED, Json(json!({ "session_id": id }))).into_response()
}

async fn status(State(p): State<St>, Path((_, _, id)): Path<(String, String, String)>) -> Response {
    let sessions = lock(&p.sessions);
    let Some(s) = sessions.get(&id) else {
        return err(
            StatusCode::NOT_FOUND,
            "CONTEXT_NOT_FOUND",
            format!("pty session {id} not found"),
        );
    };
    Json(
        json!({ "session_id": id, "running": s.started && s.exit.is_none(),
                 "output_offset": s.log.len() }),
    )
    .into_response()
}

async fn delete(State(p): State<St>, Path((_, _, id)): Path<(String, String, String)>) -> Response {
    match lock(&p.sessions).remove(&id) {
        // Dropping the input ends the shell.
        Some(_) => StatusCode::OK.into_response(),
        None => err(
            StatusCode::NOT_FOUND,
            "CONTEXT_NOT_FOUND",
            format!("pty session {id} not found"),
        ),
    }
}

#[derive(Deserialize)]
struct WsQuery {
    since: Option<i64>,
    takeover: Option<String>,
}

async fn ws(
    State(p): State<St>,
    Path((_, _, id)): Path<(String, String, String)>,
    Query(q): Query<WsQuery>,
    up: WebSocketUpgrade,
) -> Response {
    let generation = {
        let mut sessions = lock(&p.sessions);
        let Some(s) = sessions.get_mut(&id) else {
            return err(
                StatusCode::NOT_FOUND,
                "CONTEXT_NOT_FOUND",
                format!("pty session {id} not found"),
            );
        };
        if s.holder != 0 && q.takeover.as_deref() != Some("1") {
            return err(
                StatusCode::CONFLICT,
                "ALREADY_CONNECTED",
                format!("another client is already connected to pty session {id}"),
            );
        }
        s.next_holder += 1;
        s.holder = s.next_holder;
        s.changed.send_modify(|v| *v += 1);
        if !s.started {
            s.started = true;
            let (tx, rx) = mpsc::channel(16);
            s.input = Some(tx);
            tokio::spawn(shell(p.clone(), id.clone(), rx));
        }
        s.holder
    };
    let since = q.since.unwrap_or(0).max(0) as usize;
    up.on_upgrade(move |socket| serve(p, id, generation, since, socket))
}

/// Appends shell output; false once the session is gone.
fn write(p: &FakePtys, id: &str, bytes: &[u8]) -> bool {
    let mut sessions = lock(&p.sessions);
    let Some(s) = sessions.get_mut(id) else {
        return false;
    };
    s.log.extend_from_slice(bytes);
    s.changed.send_modify(|v| *v += 1);
    true
}

fn finish(p: &FakePtys, id: &str, code: i32) {
    if let Some(s) = lock(&p.sessions).get_mut(id) {
        s.exit = Some(code);
        s.input = None;
        s.changed.send_modify(|v| *v += 1);
    }
}

/// What execd reports for a program a signal killed: Go's `ProcessState.ExitCode()`, which is
/// -1 for a signal death (not 128+n as a shell would say).
const SIGNAL_KILLED: i32 = -1;

/// Whether a `signal` frame ends the shell. execd signals the shell's own process group: an
/// interactive `sh` or `bash` on a terminal ignores `SIGTERM` (and `SIGINT`, handled apart
/// as the typed ^C), so only `SIGHUP` and `SIGKILL` end it, and a foreground `sleep` is in
/// another group. Seen on execd (main at 3bb6fad3) behind server 1.1.1, 2026-12-07.
fn kills_the_shell(name: &str) -> bool {
    matches!(name, "SIGHUP" | "SIGKILL")
}

async fn shell(p: St, id: String, mut rx: mpsc::Receiver<ShellIn>) {
    let (mut cols, mut rows) = (80u16, 24u16);
    let mut line = Vec::new();
    if !write(&p, &id, b"$ ") {
        return;
    }
    while let Some(msg) = rx.recv().await {
        let bytes = match msg {
            ShellIn::Resize(c, r) => {
                (cols, rows) = (c, r);
                continue;
            }
            ShellIn::Signal(s) if s == "SIGINT" => {
                line.clear();
                write(&p, &id, b"^C\r\n$ ");
                continue;
            }
            ShellIn::Signal(s) if kills_the_shell(&s) => return finish(&p, &id, SIGNAL_KILLED),
            ShellIn::Signal(_) => continue,
            ShellIn::Stdin(b) => b,
        };
        for byte in bytes {
            if byte == 0x04 {
                // ^D: end of input on an empty line ends bash (its last status, 0 here);
                // mid-line the script waits for the rest.
                if line.is_empty() {
                    write(&p, &id, b"exit\r\n");
                    return finish(&p, &id, 0);
                }
                continue;
            }
            if byte == 0x03 {
                // ^C: the line discipline's SIGINT to the foreground job.
                line.clear();
                write(&p, &id, b"^C\r\n$ ");
                continue;
            }
            if byte != b'\n' && byte != b'\r' {
                write(&p, &id, &[byte]);
                line.push(byte);
                continue;
            }
            write(&p, &id, b"\r\n");
            let cmd = String::from_utf8_lossy(&line).into_owned();
            line.clear();
            let words: Vec<&str> = cmd.split_whitespace().collect();
            match words.as_slice() {
                ["stty", "size"] => {
                    write(&p, &id, format!("{rows} {cols}\r\n").as_bytes());
                }
                ["echo", rest @ ..] => {
                    write(&p, &id, format!("{}\r\n", rest.join(" ")).as_bytes());
                }
                ["exit"] => return finish(&p, &id, 0),
                ["exit", n] => return finish(&p, &id, n.parse().unwrap_or(2)),
                ["sleep", s] => {
                    let wait =
                        tokio::time::sleep(Duration::from_secs_f64(s.parse().unwrap_or(0.0)));
                    tokio::pin!(wait);
                    loop {
                        tokio::select! {
                            () = &mut wait => break,
                            m = rx.recv() => match m {
                                None => return,
                                Some(ShellIn::Signal(s)) if s == "SIGINT" => {
                                    write(&p, &id, b"^C\r\n");
                                    break;
                                }
                                Some(ShellIn::Signal(s)) => {
                                    if kills_the_shell(&s) {
                                        return finish(&p, &id, SIGNAL_KILLED);
                                    }
                                }
                                Some(ShellIn::Resize(c, r)) => (cols, rows) = (c, r),
                                Some(ShellIn::Stdin(b)) if b.contains(&0x03) => {
                                    write(&p, &id, b"^C\r\n");
                                    break;
                                }
                                Some(ShellIn::Stdin(_)) => {}
                            },
                        }
                    }
                }
                [] => {}
                [program, ..] => {
                    write(
                        &p,
                        &id,
                        format!("bash: {program}: command not found\r\n").as_bytes(),
                    );
                }
            }
            if !write(&p, &id, b"$ ") {
                return;
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ClientFrame {
    Resize { cols: u16, rows: u16 },
    Signal { signal: String },
    Ping,
    Stdin { data: String },
}

async fn serve(p: St, id: String, generation: u64, since: usize, mut socket: WebSocket) {
    // One look: the replay and the live stream meet exactly at the current end.
    let (mut changed, input, mut sent, replay) = {
        let sessions = lock(&p.sessions);
        let Some(s) = sessions.get(&id) else { return };
        let replay = s.log[since.min(s.log.len())..].to_vec();
        (s.changed.subscribe(), s.input.clone(), s.log.len(), replay)
    };
    if !replay.is_empty() {
        let mut frame = vec![0x03];
        frame.extend_from_slice(&(since as u64).to_be_bytes());
        frame.extend_from_slice(&replay);
        if socket.send(Message::Binary(frame.into())).await.is_err() {
            return release(&p, &id, generation);
        }
    }
    let hello = json!({ "type": "connected", "session_id": id, "mode": "pty" });
    if socket
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return release(&p, &id, generation);
    }
    loop {
        let now = {
            let sessions = lock(&p.sessions);
            sessions
                .get(&id)
                .map(|s| (s.log[sent.min(s.log.len())..].to_vec(), s.exit, s.holder))
        };
        let Some((fresh, exit, holder)) = now else {
            // Deleted: execd closes the socket.
            let _ = socket.send(Message::Close(None)).await;
            return;
        };
        if holder != generation {
            let close = CloseFrame {
                code: 4001,
                reason: "TAKEN_OVER".into(),
            };
            let _ = socket.send(Message::Close(Some(close))).await;
            return;
        }
        if !fresh.is_empty() {
            sent += fresh.len();
            let mut frame = vec![0x01];
            frame.extend_from_slice(&fresh);
            if socket.send(Message::Binary(frame.into())).await.is_err() {
                return release(&p, &id, generation);
            }
            continue;
        }
        if let Some(code) = exit {
            let ex = json!({ "type": "exit", "exit_code": code });
            let _ = socket.send(Message::Text(ex.to_string().into())).await;
            let close = CloseFrame {
                code: 1000,
                reason: "process exited".into(),
            };
            let _ = socket.send(Message::Close(Some(close))).await;
            return release(&p, &id, generation);
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return release(&p, &id, generation) },
            m = socket.recv() => {
                let to_shell = match m {
                    Some(Ok(Message::Binary(b))) if b.first() == Some(&0x00) => {
                        Some(ShellIn::Stdin(b[1..].to_vec()))
                    }
                    Some(Ok(Message::Text(t))) => match serde_json::from_str::<ClientFrame>(t.as_str()) {
                        Ok(ClientFrame::Resize { cols, rows }) if cols > 0 && rows > 0 => {
                            Some(ShellIn::Resize(cols, rows))
                        }
                        Ok(ClientFrame::Signal { signal }) => Some(ShellIn::Signal(signal)),
                        Ok(ClientFrame::Stdin { data }) => Some(ShellIn::Stdin(data.into_bytes())),
                        Ok(ClientFrame::Ping) => {
                            let pong = json!({ "type": "pong" });
                            let _ = socket.send(Message::Text(pong.to_string().into())).await;
                            None
                        }
                        _ => None,
                    },
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        return release(&p, &id, generation);
                    }
                    Some(Ok(_)) => None,
                };
                if let (Some(msg), Some(tx)) = (to_shell, &input) {
                    let _ = tx.send(msg).await;
                }
            }
        }
    }
}

/// The socket of `generation` is gone: the session is free for the next one.
fn release(p: &FakePtys, id: &str, generation: u64) {
    if let Some(s) = lock(&p.sessions).get_mut(id) {
        if s.holder == generation {
            s.holder = 0;
        }
    }
}
