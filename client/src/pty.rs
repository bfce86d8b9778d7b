//! The interactive terminal (`GET /v1/sandboxes/{id}/pty`): a program on a pseudo-terminal
//! inside the sandbox, driven over one WebSocket.
//!
//! The upgrade goes through this crate's own `reqwest` client (its TLS, proxy and timeouts),
//! so a refusal before the upgrade — bad size, unknown sandbox, a pool without `exec.pty` —
//! is the API's JSON envelope, answered as [`Error::Api`] like every other call. After the
//! upgrade, `tokio-tungstenite` speaks the WebSocket protocol over that same connection.
//!
//! ```no_run
//! # async fn demo(c: differently_client::Client) -> differently_client::Result<()> {
//! use differently_client::pty::{PtyEvent, PtyRequest};
//! let mut t = c.pty("sbx_…", &PtyRequest::new().command(["sh"]).size(80, 24)).await?;
//! t.send(b"echo hi; exit 3\n").await?;
//! while let Some(ev) = t.next().await {
//!     match ev? {
//!         PtyEvent::Output(b) => print!("{}", String::from_utf8_lossy(&b)),
//!         PtyEvent::Exit(code) => println!("exit {code}"),
//!         PtyEvent::Error(e) => eprintln!("{}: {}", e.code, e.message),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, Stream, StreamExt};
use reqwest::header::{CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, UPGRADE};
use reqwest::{Method, StatusCode, Version};
use serde::Deserialize;
use serde_json::json;
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

use crate::{query, sandbox_path, ApiError, Client, Error, Result, TransportError};

/// The terminal size the API takes, each side (`1..=1000`).
pub const MAX_SIDE: u16 = 1000;

/// What to open: a new terminal (size, command, env, cwd) or an existing session again.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PtyRequest {
    cols: Option<u16>,
    rows: Option<u16>,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    session: Option<String>,
}

// Env values may be secrets: only their names are shown.
impl fmt::Debug for PtyRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtyRequest")
            .field("cols", &self.cols)
            .field("rows", &self.rows)
            .field("command", &self.command.first())
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("session", &self.session)
            .finish()
    }
}

impl PtyRequest {
    /// A new terminal with the API's defaults: 80 × 24 running `sh -l`.
    pub fn new() -> PtyRequest {
        PtyRequest::default()
    }

    /// Reattaches to `session` (from [`Pty::session_id`]) within its grace period: the
    /// buffered output comes first, then the live stream. The session keeps its own command
    /// and size; a resize after attaching changes it.
    pub fn reattach(session: impl Into<String>) -> PtyRequest {
        PtyRequest {
            session: Some(session.into()),
            ..PtyRequest::default()
        }
    }

    /// The terminal's size in columns and rows.
    pub fn size(mut self, cols: u16, rows: u16) -> Self {
        self.cols = Some(cols);
        self.rows = Some(rows);
        self
    }

    /// The program and its arguments (default `sh -l`).
    pub fn command<S: Into<String>>(mut self, argv: impl IntoIterator<Item = S>) -> Self {
        self.command = argv.into_iter().map(Into::into).collect();
        self
    }

    /// One environment variable, over the sandbox's own. Values travel in the URL: keep
    /// secrets in the sandbox's env from create instead.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// The working directory (absolute).
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Checks what the API would refuse, before any traffic; the query string.
    fn to_query(&self) -> Result<String> {
        if let Some(s) = &self.session {
            if s.is_empty() {
                return Err(Error::invalid("session", "must not be empty"));
            }
            if self.cols.is_some() || !self.command.is_empty() || !self.env.is_empty() {
                return Err(Error::invalid(
                    "session",
                    "a reattach takes no size, command or env (the session keeps its own)",
                ));
            }
            return Ok(query(&[("session", Some(s.clone()))]));
        }
        for (field, v) in [("cols", self.cols), ("rows", self.rows)] {
            check_side(field, v)?;
        }
        if self.command.first().is_some_and(String::is_empty) {
            return Err(Error::invalid("command", "the program name is empty"));
        }
        if let Some(c) = &self.cwd {
            if !c.starts_with('/') {
                return Err(Error::invalid("cwd", format!("{c:?} is not absolute")));
            }
        }
        let mut pairs: Vec<(&str, Option<String>)> = vec![
            ("cols", self.cols.map(|c| c.to_string())),
            ("rows", self.rows.map(|r| r.to_string())),
        ];
        pairs.extend(self.command.iter().map(|a| ("command", Some(a.clone()))));
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') {
                return Err(Error::invalid("env", format!("bad variable name {k:?}")));
            }
            pairs.push(("env", Some(format!("{k}={v}"))));
        }
        pairs.push(("cwd", self.cwd.clone()));
        Ok(query(&pairs))
    }
}

fn check_side(field: &str, v: Option<u16>) -> Result<()> {
    match v {
        Some(n) if n == 0 || n > MAX_SIDE => Err(Error::invalid(
            field,
            format!("{n} is out of range (1–{MAX_SIDE})"),
        )),
        _ => Ok(()),
    }
}

/// A signal for the terminal's foreground process group (as ^C would send `Int`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtySignal {
    /// SIGINT.
    Int,
    /// SIGTERM.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hup,
}

impl PtySignal {
    fn name(self) -> &'static str {
        match self {
            PtySignal::Int => "INT",
            PtySignal::Term => "TERM",
            PtySignal::Kill => "KILL",
            PtySignal::Hup => "HUP",
        }
    }
}

/// A failure the server reports on the socket after the upgrade (the backend failed, a
/// `cwd` that does not exist, a takeover by another attach: `conflict`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PtyFailure {
    /// Stable code, as in the API's error envelope.
    pub code: String,
    /// Human message.
    #[serde(default)]
    pub message: String,
    /// The client frame's field at fault, for a bad frame.
    #[serde(default)]
    pub field: Option<String>,
}

/// One piece of the terminal's life, in order; `Exit` or `Error` is the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyEvent {
    /// Bytes the terminal showed (stdout and stderr are one stream on a terminal).
    Output(Bytes),
    /// The program ended with this code (128+n when signal n killed it).
    Exit(i32),
    /// The server ended the terminal with this failure.
    Error(PtyFailure),
}

type Socket = WebSocketStream<reqwest::Upgraded>;

/// An open terminal. [`Pty::split`] gives a reader and a writer for using both at once.
#[derive(Debug)]
pub struct Pty {
    writer: PtyWriter,
    output: PtyOutput,
    session: String,
    grace_seconds: u64,
}

/// The sending half: keystrokes, resizes, signals.
#[derive(Debug)]
pub struct PtyWriter {
    sink: SplitSink<Socket, Message>,
    context: String,
}

/// The receiving half: a [`Stream`] of [`PtyEvent`]s that ends after `Exit` or `Error`.
#[derive(Debug)]
pub struct PtyOutput {
    stream: SplitStream<Socket>,
    context: String,
    done: bool,
}

/// Server → client control frames (text).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
enum Control {
    #[serde(rename_all = "camelCase")]
    Session {
        id: String,
        grace_seconds: Option<u64>,
    },
    #[serde(rename_all = "camelCase")]
    Exit {
        exit_code: i32,
    },
    Error(PtyFailure),
}

impl Client {
    /// `GET /v1/sandboxes/{id}/pty`: opens (or reattaches to) a terminal. Answers once the
    /// server has sent the session's id; a refusal before the upgrade is the API's error.
    pub async fn pty(&self, id: &str, req: &PtyRequest) -> Result<Pty> {
        let path = format!("{}{}", sandbox_path(id, "/pty"), req.to_query()?);
        let context = format!("GET {}", sandbox_path(id, "/pty"));
        let key = generate_key();
        let url = format!("{}{path}", self.base_url());
        let resp = self
            .authorized(Method::GET, &path)
            .version(Version::HTTP_11)
            .header(CONNECTION, "Upgrade")
            .header(UPGRADE, "websocket")
            .header("Sec-WebSocket-Version", "13")
            .header(SEC_WEBSOCKET_KEY, &key)
            .send()
            .await
            .map_err(|e| TransportError::new("GET", &url, self.base_url(), e))?;
        let status = resp.status();
        if status != StatusCode::SWITCHING_PROTOCOLS {
            let request_id = resp
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = resp
                .bytes()
                .await
                .map_err(|e| TransportError::new("GET", &url, self.base_url(), e))?;
            if status.is_success() {
                return Err(Error::protocol(
                    &context,
                    format!(
                        "{status} instead of 101 Switching Protocols; is this a Differently API?"
                    ),
                ));
            }
            return Err(ApiError::from_body(status.as_u16(), &body, request_id).into());
        }
        let accept = resp
            .headers()
            .get(SEC_WEBSOCKET_ACCEPT)
            .and_then(|v| v.to_str().ok());
        if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
            return Err(Error::protocol(
                &context,
                "the upgrade's Sec-WebSocket-Accept does not match the key sent",
            ));
        }
        let upgraded = resp
            .upgrade()
            .await
            .map_err(|e| TransportError::new("GET", &url, self.base_url(), e))?;
        let ws = WebSocketStream::from_raw_socket(upgraded, Role::Client, None).await;
        let (sink, stream) = ws.split();
        let mut output = PtyOutput {
            stream,
            context: context.clone(),
            done: false,
        };
        let (session, grace_seconds) = output.session().await?;
        Ok(Pty {
            writer: PtyWriter { sink, context },
            output,
            session,
            grace_seconds,
        })
    }
}

impl Pty {
    /// The session's id, for [`PtyRequest::reattach`] after a dropped connection.
    pub fn session_id(&self) -> &str {
        &self.session
    }

    /// How long the program outlives a dropped socket, waiting for a reattach.
    pub fn grace_seconds(&self) -> u64 {
        self.grace_seconds
    }

    /// Types `bytes` on the terminal (echoed and line-edited there, as a keyboard's are).
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer.send(bytes).await
    }

    /// Changes the terminal's size (the program gets SIGWINCH).
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        self.writer.resize(cols, rows).await
    }

    /// Sends `signal` to the terminal's foreground process group.
    pub async fn signal(&mut self, signal: PtySignal) -> Result<()> {
        self.writer.signal(signal).await
    }

    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<PtyEvent>> {
        self.output.next().await
    }

    /// Reads until the end: everything shown, and the exit code (an `Error` event is an
    /// error here, with its code).
    pub async fn wait(mut self) -> Result<(Vec<u8>, i32)> {
        let mut shown = Vec::new();
        while let Some(ev) = self.output.next().await {
            match ev? {
                PtyEvent::Output(b) => shown.extend_from_slice(&b),
                PtyEvent::Exit(code) => return Ok((shown, code)),
                PtyEvent::Error(f) => {
                    return Err(Error::protocol(
                        &self.output.context,
                        format!("the terminal failed: {}: {}", f.code, f.message),
                    ))
                }
            }
        }
        Err(ended(&self.output.context))
    }

    /// The two halves, to read output while sending input from another task.
    pub fn split(self) -> (PtyWriter, PtyOutput) {
        (self.writer, self.output)
    }
}

impl PtyWriter {
    /// Types `bytes` on the terminal.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.put(Message::Binary(Bytes::copy_from_slice(bytes)))
            .await
    }

    /// Changes the terminal's size; refused here outside `1..=1000`.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> Result<()> {
        check_side("cols", Some(cols))?;
        check_side("rows", Some(rows))?;
        let frame = json!({"type": "resize", "cols": cols, "rows": rows});
        self.put(Message::text(frame.to_string())).await
    }

    /// Sends `signal` to the terminal's foreground process group.
    pub async fn signal(&mut self, signal: PtySignal) -> Result<()> {
        let frame = json!({"type": "signal", "signal": signal.name()});
        self.put(Message::text(frame.to_string())).await
    }

    /// Closes the socket. The program keeps running for the grace period (a reattach
    /// continues it); to end it, type `exit` or send a signal first.
    pub async fn close(&mut self) -> Result<()> {
        match self.sink.close().await {
            Ok(()) | Err(tungstenite::Error::ConnectionClosed) => Ok(()),
            Err(e) => Err(socket(&self.context, e)),
        }
    }

    async fn put(&mut self, m: Message) -> Result<()> {
        self.sink
            .send(m)
            .await
            .map_err(|e| socket(&self.context, e))
    }
}

impl PtyOutput {
    /// Reads the first frame, the session's id.
    async fn session(&mut self) -> Result<(String, u64)> {
        loop {
            let Some(m) = self.stream.next().await else {
                return Err(ended(&self.context));
            };
            match m.map_err(|e| socket(&self.context, e))? {
                Message::Text(t) => {
                    return match serde_json::from_str::<Control>(t.as_str()) {
                        Ok(Control::Session { id, grace_seconds }) => {
                            Ok((id, grace_seconds.unwrap_or(0)))
                        }
                        Ok(Control::Error(f)) => Err(Error::protocol(
                            &self.context,
                            format!("the terminal failed: {}: {}", f.code, f.message),
                        )),
                        _ => Err(Error::protocol(
                            &self.context,
                            format!("expected the session frame first, got {t}"),
                        )),
                    }
                }
                Message::Ping(_) | Message::Pong(_) => continue,
                other => {
                    return Err(Error::protocol(
                        &self.context,
                        format!("expected the session frame first, got {other:?}"),
                    ))
                }
            }
        }
    }

    /// One socket message as an event: `None` for one that carries none (a ping).
    fn event(&mut self, m: Message) -> Option<Result<PtyEvent>> {
        match m {
            Message::Binary(b) => Some(Ok(PtyEvent::Output(b))),
            Message::Text(t) => {
                self.done = true;
                Some(match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(Control::Exit { exit_code }) => Ok(PtyEvent::Exit(exit_code)),
                    Ok(Control::Error(f)) => Ok(PtyEvent::Error(f)),
                    Ok(Control::Session { .. }) | Err(_) => Err(Error::protocol(
                        &self.context,
                        format!("unexpected frame {t}"),
                    )),
                })
            }
            Message::Close(_) => {
                self.done = true;
                Some(Err(ended(&self.context)))
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => None,
        }
    }
}

impl Stream for PtyOutput {
    type Item = Result<PtyEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let m = match self.stream.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(ended(&self.context))));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(socket(&self.context, e))));
                }
                Poll::Ready(Some(Ok(m))) => m,
            };
            if let Some(ev) = self.event(m) {
                return Poll::Ready(Some(ev));
            }
        }
    }
}

fn socket(context: &str, e: tungstenite::Error) -> Error {
    Error::Socket {
        context: context.to_owned(),
        source: Box::new(e),
    }
}

fn ended(context: &str) -> Error {
    Error::protocol(
        context,
        "the terminal's socket closed before the program's exit (the session may still be \
         reattached within its grace period)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_terminal_is_one_query_in_order() {
        let q = PtyRequest::new()
            .size(100, 30)
            .command(["sh", "-c", "echo a b"])
            .env("A", "1=2")
            .cwd("/tmp")
            .to_query()
            .expect("query");
        assert_eq!(
            q,
            "?cols=100&rows=30&command=sh&command=-c&command=echo%20a%20b&env=A%3D1%3D2&cwd=%2Ftmp"
        );
        assert_eq!(PtyRequest::new().to_query().expect("defaults"), "");
        assert_eq!(
            PtyRequest::reattach("pty_1").to_query().expect("reattach"),
            "?session=pty_1"
        );
    }

    #[test]
    fn bad_input_is_refused_here_naming_the_field() {
        let field = |r: PtyRequest| match r.to_query() {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(field(PtyRequest::new().size(0, 24)), "cols");
        assert_eq!(field(PtyRequest::new().size(80, 1001)), "rows");
        assert_eq!(field(PtyRequest::new().cwd("tmp")), "cwd");
        assert_eq!(field(PtyRequest::new().command([""])), "command");
        assert_eq!(field(PtyRequest::new().env("", "x")), "env");
        assert_eq!(field(PtyRequest::reattach("")), "session");
        assert_eq!(field(PtyRequest::reattach("pty_1").size(80, 24)), "session");
    }

    #[test]
    fn env_values_stay_out_of_debug() {
        let shown = format!("{:?}", PtyRequest::new().env("TOKEN", "supersecret"));
        assert!(
            shown.contains("TOKEN") && !shown.contains("supersecret"),
            "{shown}"
        );
    }
}
