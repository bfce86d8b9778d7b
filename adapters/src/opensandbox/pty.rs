//! execd's interactive terminal behind `Adapter::pty` (execd's components/execd/PTY.md).
//!
//! `POST /pty {cwd, command}` makes a session (execd runs `bash --norc --noprofile -c
//! <command>`, so argv and env go into `command` as `export K='v'; exec 'prog' 'arg'…`:
//! builtins only, nothing else sees the values); `GET /pty/{id}/ws` is the terminal. The
//! WebSocket handshake is sent with this pool's own HTTP client (its headers, timeouts and
//! proxy settings) and the upgraded connection is then framed by tungstenite. execd frames:
//! binary `0x01`/`0x02` + bytes (output), `0x03` + u64 BE offset + bytes (replay), stdin
//! `0x00` + bytes; JSON `connected`, `exit {exit_code}`, `error {code, error}`; client JSON
//! `resize`, `signal` (`SIGTERM` …; `INT` is sent as ^C on the terminal instead). execd starts at 80×24, so the requested size is sent as
//! a resize right after `connected`. The session is deleted when the call ends.

use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use reqwest::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::client::Client;
use super::execd::{enc, execd_error, shell_quote, Target};
use crate::{AdapterError, PtyInput, PtyRequest, PtySignal};

/// How long the socket may stay silent before the call gives up (execd pings every 30 s).
const SILENCE: Duration = Duration::from_secs(90);

/// The shell line execd's bash runs: env as exports, then the program in its place.
pub(crate) fn command_line(req: &PtyRequest) -> String {
    let mut line = String::new();
    if !req.env.is_empty() {
        line.push_str("export");
        for (k, v) in &req.env {
            // Names are checked by the API (`[A-Za-z_][A-Za-z0-9_]*`).
            line.push_str(&format!(" {k}={}", shell_quote(v)));
        }
        line.push_str("; ");
    }
    line.push_str("exec");
    for a in &req.command {
        line.push(' ');
        line.push_str(&shell_quote(a));
    }
    line
}

#[derive(Deserialize)]
struct Created {
    session_id: String,
}

/// A JSON frame from execd; fields not needed are ignored.
#[derive(Deserialize)]
struct ServerFrame {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

fn signal_name(s: PtySignal) -> &'static str {
    match s {
        PtySignal::Int => "SIGINT",
        PtySignal::Term => "SIGTERM",
        PtySignal::Kill => "SIGKILL",
        PtySignal::Hup => "SIGHUP",
    }
}

fn broken(what: impl std::fmt::Display) -> AdapterError {
    AdapterError::transient(format!("execd pty: {what}"))
}

/// Runs one terminal; returns the program's exit code.
pub(crate) async fn run(
    c: &Client,
    target: &Target,
    req: &PtyRequest,
    mut input: mpsc::Receiver<PtyInput>,
    out: mpsc::Sender<Bytes>,
) -> Result<i32, AdapterError> {
    let body = json!({ "cwd": req.cwd.clone().unwrap_or_default(), "command": command_line(req) });
    let rb = target
        .request(c, Method::POST, "/pty")
        .json(&body)
        .timeout(c.request_timeout());
    let resp = c.send(rb, "execd create pty").await?;
    if !resp.status().is_success() {
        return Err(execd_error(c, "execd create pty", resp).await);
    }
    let created: Created = resp
        .json()
        .await
        .map_err(|e| broken(format!("bad create answer: {e}")))?;
    let id = created.session_id;
    let ended = attach(c, target, &id, req, &mut input, &out).await;
    // execd keeps a session until it is deleted; this call owns it.
    let rb = target
        .request(c, Method::DELETE, &format!("/pty/{}", enc(&id)))
        .timeout(Duration::from_secs(5));
    if let Err(e) = c.send(rb, "execd delete pty").await {
        tracing::debug!(error = %e, "execd pty delete failed");
    }
    ended
}

/// The exit code to report for execd's `exit_code` (absent: 0).
fn exit_code(reported: Option<i32>, signalled: Option<PtySignal>) -> i32 {
    match (reported.unwrap_or(0), signalled) {
        (code, Some(s)) if code < 0 => 128 + s.number(),
        (code, _) => code,
    }
}

async fn attach(
    c: &Client,
    target: &Target,
    id: &str,
    req: &PtyRequest,
    input: &mut mpsc::Receiver<PtyInput>,
    out: &mpsc::Sender<Bytes>,
) -> Result<i32, AdapterError> {
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let rb = target
        .request(c, Method::GET, &format!("/pty/{}/ws", enc(id)))
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header(SEC_WEBSOCKET_KEY, key.as_str())
        .timeout(c.request_timeout());
    let resp = c.send(rb, "execd pty websocket").await?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(execd_error(c, "execd pty websocket", resp).await);
    }
    let expected = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let accepted = resp
        .headers()
        .get(SEC_WEBSOCKET_ACCEPT)
        .and_then(|v| v.to_str().ok());
    if accepted != Some(expected.as_str()) {
        return Err(broken(
            "the upgrade answer has a wrong Sec-WebSocket-Accept",
        ));
    }
    let upgraded = resp
        .upgrade()
        .await
        .map_err(|e| broken(format!("upgrade: {e}")))?;
    let mut ws = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
    let mut sized = false;
    // execd reports Go's `ExitCode()`, -1 for a program a signal killed: the last signal this
    // call sent names it (128+n, as every other terminal reports); one nobody here sent
    // stays -1, as execd said.
    let mut signalled: Option<PtySignal> = None;
    loop {
        tokio::select! {
            msg = tokio::time::timeout(SILENCE, ws.next()) => {
                let msg = match msg {
                    Err(_) => return Err(broken("no frame for 90 s")),
                    Ok(None) => return Err(broken("the socket closed without an exit frame")),
                    Ok(Some(Err(e))) => return Err(broken(e)),
                    Ok(Some(Ok(m))) => m,
                };
                match msg {
                    Message::Binary(b) => {
                        let payload = match b.first() {
                            Some(0x01 | 0x02) => b.slice(1..),
                            Some(0x03) if b.len() >= 9 => b.slice(9..),
                            _ => continue,
                        };
                        if !payload.is_empty() && out.send(payload).await.is_err() {
                            // The client hung up.
                            let _ = ws.close(None).await;
                            return Ok(128 + PtySignal::Hup.number());
                        }
                    }
                    Message::Text(t) => {
                        let Ok(frame) = serde_json::from_str::<ServerFrame>(t.as_str()) else {
                            continue;
                        };
                        match frame.kind.as_str() {
                            "connected" if !sized => {
                                sized = true;
                                let resize = json!({ "type": "resize",
                                    "cols": req.size.cols, "rows": req.size.rows });
                                ws.send(Message::Text(resize.to_string().into()))
                                    .await
                                    .map_err(broken)?;
                            }
                            "exit" => return Ok(exit_code(frame.exit_code, signalled)),
                            "error" => {
                                return Err(AdapterError::permanent(format!(
                                    "execd pty: {} {}",
                                    frame.code.unwrap_or_default(),
                                    frame.error.unwrap_or_default()
                                )))
                            }
                            _ => {}
                        }
                    }
                    Message::Close(f) => {
                        let why = f.map(|f| format!("{} {}", u16::from(f.code), f.reason));
                        return Err(broken(format!(
                            "the socket closed without an exit frame ({})",
                            why.unwrap_or_default()
                        )));
                    }
                    _ => {}
                }
            }
            // Input waits for `connected` and the size sent after it, so the first keystrokes
            // never reach a terminal of the wrong size.
            msg = input.recv(), if sized => {
                let frame = match msg {
                    Some(PtyInput::Stdin(b)) => {
                        let mut f = Vec::with_capacity(b.len() + 1);
                        f.push(0x00);
                        f.extend_from_slice(&b);
                        Message::Binary(f.into())
                    }
                    Some(PtyInput::Resize(s)) => Message::Text(
                        json!({ "type": "resize", "cols": s.cols, "rows": s.rows })
                            .to_string()
                            .into(),
                    ),
                    // execd signals bash's own process group, which misses a foreground job
                    // of a shell with job control; ^C through the terminal reaches it, as
                    // the contract says (the line discipline signals the foreground group).
                    Some(PtyInput::Signal(PtySignal::Int)) => {
                        signalled = Some(PtySignal::Int);
                        Message::Binary(vec![0x00, 0x03].into())
                    }
                    Some(PtyInput::Signal(s)) => {
                        signalled = Some(s);
                        Message::Text(
                            json!({ "type": "signal", "signal": signal_name(s) })
                                .to_string()
                                .into(),
                        )
                    }
                    None => {
                        // Hung up: the session is deleted by the caller, which kills bash.
                        let _ = ws.close(None).await;
                        return Ok(128 + PtySignal::Hup.number());
                    }
                };
                ws.send(frame).await.map_err(broken)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PtySize;

    #[test]
    fn env_is_exported_and_argv_quoted() {
        let req = PtyRequest {
            command: vec!["sh".into(), "-c".into(), "echo 'a b'".into()],
            env: [
                ("A".to_owned(), "x y".to_owned()),
                ("B".to_owned(), "it's".to_owned()),
            ]
            .into_iter()
            .collect(),
            cwd: None,
            size: PtySize { cols: 80, rows: 24 },
        };
        assert_eq!(
            command_line(&req),
            r#"export A='x y' B='it'\''s'; exec sh -c 'echo '\''a b'\'''"#
        );
    }
}
