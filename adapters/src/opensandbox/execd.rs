//! execd, the agent inside each sandbox: command execution and its event stream.
//!
//! execd answers `POST /command` with a stream of JSON events. The spec says SSE (`data: {…}`
//! frames); execd 1.1 sends bare JSON objects separated by blank lines. [`FrameParser`] takes
//! both, incrementally, line by line. A stream that ends before the command's end event is
//! truncated and surfaces as `Transient`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::client::Client;
use super::config::LineEndings;
use crate::error::Reason;
use crate::go_ahead::{GoAhead, Withdrawn};
use crate::{AdapterError, ExecEvent};

pub(crate) use super::execd_errors::{execd_error, execd_error_at};

/// execd's port inside every sandbox.
pub(crate) const EXECD_PORT: u16 = 44772;

/// Largest single line the parser buffers before calling the stream broken.
const MAX_LINE: usize = 64 * 1024 * 1024;

/// How to reach one sandbox's execd.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `http://…` without a trailing slash.
    pub base: String,
    /// Headers the endpoint API said execd needs (e.g. its access token). Never the API key.
    pub headers: BTreeMap<String, String>,
}

/// The header values are credentials (execd's access token): only their names print.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("base", &self.base)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What an execd 401 says: the access token the endpoint API gave was refused.
pub(super) const TOKEN_REFUSED: &str = "execd refused the access token";

/// Whether `e` is execd refusing the access token. From server 1.3 the token is derived
/// from a versioned key the operator can rotate, so a refused token is worth resolving the
/// endpoint again (a new token) once; the command was never taken.
pub(crate) fn token_refused(e: &AdapterError) -> bool {
    matches!(e, AdapterError::Permanent(r) if r.to_string().contains(TOKEN_REFUSED))
}

impl Target {
    pub(crate) fn request(
        &self,
        c: &Client,
        method: Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let mut rb = c.to(method, &format!("{}{}", self.base, path));
        for (k, v) in &self.headers {
            rb = rb.header(k.as_str(), v.as_str());
        }
        rb
    }
}

/// One execd event; fields not needed are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Event {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub error: Option<EventError>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// An `error` event's cause, as execd names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct EventError {
    #[serde(default)]
    pub ename: String,
    #[serde(default)]
    pub evalue: String,
    /// execd puts the Go error here: `["signal: terminated"]` for a killed command.
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// The shell's exit code (128 + signal number) for execd's `signal: <name>` traceback, so a
/// command killed by something other than our timeout reports how it died: recorded on the
/// real server, `signal: terminated` (our interrupt) and, now and then, `signal: broken pipe`
/// on a plain `echo hi` (execd closed the output pipe). Unknown names give `None`.
pub(crate) fn signal_exit(traceback: &[String]) -> Option<i32> {
    let name = traceback
        .iter()
        .find_map(|l| l.trim().strip_prefix("signal: "))?;
    let n = match name.trim() {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "user defined signal 1" => 10,
        "segmentation fault" => 11,
        "user defined signal 2" => 12,
        "broken pipe" => 13,
        "alarm clock" => 14,
        "terminated" => 15,
        _ => return None,
    };
    Some(128 + n)
}

/// Why parsing stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("malformed event: {0}")]
    Malformed(String),
    #[error("event line longer than {MAX_LINE} bytes")]
    TooLong,
}

/// Incremental parser for both framings: SSE (`data:` lines, blank line ends a frame) and bare
/// JSON (one object per line, frames separated by blank lines or not).
#[derive(Debug, Default)]
pub struct FrameParser {
    line: Vec<u8>,
    data: Option<String>,
}

impl FrameParser {
    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<Vec<Event>, FrameError> {
        let mut out = Vec::new();
        while let Some(i) = chunk.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&chunk[..i]);
            chunk = &chunk[i + 1..];
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out)?;
        }
        self.line.extend_from_slice(chunk);
        if self.line.len() > MAX_LINE {
            return Err(FrameError::TooLong);
        }
        Ok(out)
    }

    /// End of stream: a last frame without its terminator still counts if it is complete.
    pub fn finish(&mut self) -> Result<Vec<Event>, FrameError> {
        let mut out = Vec::new();
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, &mut out)?;
        }
        self.dispatch(&mut out)?;
        Ok(out)
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) -> Result<(), FrameError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text =
            std::str::from_utf8(line).map_err(|_| FrameError::Malformed("not UTF-8".to_owned()))?;
        if text.trim().is_empty() {
            return self.dispatch(out);
        }
        if let Some(rest) = text.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => self.data = Some(rest.to_owned()),
            }
            return Ok(());
        }
        if text.starts_with(':')
            || text.starts_with("event:")
            || text.starts_with("id:")
            || text.starts_with("retry:")
        {
            return Ok(());
        }
        if text.trim_start().starts_with('{') {
            self.dispatch(out)?;
            out.push(parse_event(text)?);
            return Ok(());
        }
        Err(FrameError::Malformed(format!(
            "unexpected line starting {:?}",
            text.chars().take(20).collect::<String>()
        )))
    }

    fn dispatch(&mut self, out: &mut Vec<Event>) -> Result<(), FrameError> {
        if let Some(data) = self.data.take() {
            if !data.trim().is_empty() {
                out.push(parse_event(&data)?);
            }
        }
        Ok(())
    }
}

fn parse_event(text: &str) -> Result<Event, FrameError> {
    serde_json::from_str(text).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Body of `POST /command`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CommandBody {
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Milliseconds; omitted means no timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
}

/// How a command ended, as far as execd said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Exited(i32),
    /// `evalue: "-1"`: killed (timeout, interrupt, or a signal named in the traceback, whose
    /// exit code this is).
    Killed(Option<i32>),
}

/// `GET /command/status/{id}`.
#[derive(Debug, Clone, Deserialize)]
struct CommandStatus {
    #[serde(default)]
    running: bool,
    #[serde(default)]
    exit_code: Option<i32>,
}

/// Where output goes while a command runs.
pub(crate) trait Sink {
    /// Takes one event; `false` means the receiver is gone (cancel).
    fn accept(&mut self, ev: ExecEvent) -> impl std::future::Future<Output = bool> + Send;

    /// Completes when the receiver has gone away, even while the command prints nothing;
    /// never, for a sink that cannot go away.
    fn gone(&self) -> impl std::future::Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Interrupts a command execd has taken unless it ended: real execd does not kill a
/// foreground command when its stream's client goes away (recorded: still running 8 s
/// later, direct and through the server proxy), so every way out of [`run`] that leaves it
/// running, the caller dropping the call included, ends it with `DELETE /command?id=`.
struct Interrupt {
    client: Client,
    target: Target,
    id: Option<String>,
}

impl Interrupt {
    /// Interrupts now and waits for execd's answer.
    async fn now(&mut self) {
        if let Some(id) = self.id.take() {
            interrupt(&self.client, &self.target, Some(&id)).await;
        }
    }

    /// The command ended: nothing to interrupt.
    fn ended(&mut self) {
        self.id = None;
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, target) = (self.client.clone(), self.target.clone());
        rt.spawn(async move { interrupt(&client, &target, Some(&id)).await });
    }
}

/// Runs `body` and feeds output to `sink`. Returns the exit code (124 on timeout) or an error;
/// `accepted` is set once execd has taken the command.
/// How to run one command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOptions {
    pub line_endings: LineEndings,
    /// Longest silence tolerated on the stream.
    pub stream_idle: Duration,
    /// The command's timeout; past it (plus a grace) the stream is dropped and 124 returned.
    pub deadline: Option<Duration>,
}

/// Runs `body` on execd and streams its output into `sink`. With `go`, the request is sent
/// at once but its body (the command) only once `go` is given ([`held_command`]).
pub(crate) async fn run(
    c: &Client,
    target: &Target,
    body: &CommandBody,
    opts: RunOptions,
    sink: &mut impl Sink,
    accepted: &mut bool,
    go: Option<&GoAhead>,
) -> Result<i32, AdapterError> {
    let RunOptions {
        line_endings,
        stream_idle,
        deadline,
    } = opts;
    let started = Instant::now();
    let request = || {
        target.request(c, Method::POST, "/command").timeout(
            c.request_timeout().max(Duration::from_secs(30))
                + deadline.unwrap_or(Duration::from_secs(24 * 3600)),
        )
    };
    let resp = match go {
        None => c.send(request().json(body), "exec").await?,
        Some(go) => {
            let (rb, hold) = held_command(request(), body, go)?;
            match c.send(rb, "exec").await {
                Ok(resp) => resp,
                Err(e) => match hold.outcome() {
                    Hold::Withdrawn => return Err(Withdrawn.into()),
                    Hold::TooLong => {
                        // None of the body went: send the command anew once it may go.
                        go.wait().await?;
                        c.send(request().json(body), "exec").await?
                    }
                    Hold::Waiting | Hold::Sent => return Err(e),
                },
            }
        }
    };
    if !resp.status().is_success() {
        return Err(execd_error(c, "exec", resp).await);
    }
    // From here on the command may be running: never send it again.
    *accepted = true;
    let mut stream = resp.bytes_stream();
    let mut parser = FrameParser::default();
    let mut command_id: Option<String> = None;
    let mut running = Interrupt {
        client: c.clone(),
        target: target.clone(),
        id: None,
    };
    let give_up_at = deadline.map(|d| started + d + Duration::from_secs(5));
    let mut receiver_gone = false;
    let cancelled = || AdapterError::permanent("exec cancelled: the output receiver went away");

    let ending: Option<Ending> = 'outer: loop {
        let wait = match give_up_at {
            Some(t) => stream_idle.min(t.saturating_duration_since(Instant::now())),
            None => stream_idle,
        };
        let watch_receiver = async {
            if receiver_gone {
                std::future::pending().await
            } else {
                sink.gone().await
            }
        };
        let next = tokio::select! {
            next = tokio::time::timeout(wait, stream.next()) => next,
            () = watch_receiver => {
                if running.id.is_some() {
                    running.now().await;
                    return Err(cancelled());
                }
                // Gone before execd named the command: interrupt it as soon as it does.
                receiver_gone = true;
                continue;
            }
        };
        let chunk: Option<Bytes> = match next {
            Err(_) => {
                if give_up_at.is_some_and(|t| Instant::now() >= t) {
                    // execd did not enforce the timeout; stop it ourselves.
                    running.now().await;
                    return Ok(differently_core::exec::TIMEOUT_EXIT_CODE);
                }
                running.now().await;
                return Err(AdapterError::transient(format!(
                    "exec: no output or keep-alive from execd for {} s",
                    stream_idle.as_secs()
                )));
            }
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                return Err(AdapterError::transient(format!(
                    "exec: output stream broke: {}",
                    c.transport_error("exec", e)
                )))
            }
            Ok(Some(Ok(b))) => Some(b),
        };
        let events = match &chunk {
            Some(b) => parser.push(b),
            None => parser.finish(),
        }
        .map_err(|e| {
            AdapterError::Transient(Reason::caused_by(
                format!("exec: output stream broke: {e}"),
                e,
            ))
        })?;
        for ev in events {
            match ev.kind.as_str() {
                "init" => {
                    command_id = ev.text.clone();
                    running.id = command_id.clone();
                    if receiver_gone {
                        running.now().await;
                        return Err(cancelled());
                    }
                }
                "stdout" | "stderr" => {
                    let mut text = ev.text.unwrap_or_default();
                    if line_endings == LineEndings::Stripped && !text.ends_with('\n') {
                        text.push('\n');
                    }
                    let bytes = Bytes::from(text);
                    let out = if ev.kind == "stdout" {
                        ExecEvent::Stdout(bytes)
                    } else {
                        ExecEvent::Stderr(bytes)
                    };
                    if !sink.accept(out).await {
                        running.now().await;
                        return Err(cancelled());
                    }
                }
                "execution_complete" => {
                    break 'outer Some(Ending::Exited(ev.exit_code.unwrap_or(0)))
                }
                "error" => {
                    let err = ev.error.unwrap_or_default();
                    if let Some(code) = ev.exit_code {
                        break 'outer Some(Ending::Exited(code));
                    }
                    match err.evalue.trim().parse::<i32>() {
                        Ok(-1) => break 'outer Some(Ending::Killed(signal_exit(&err.traceback))),
                        Ok(n) if n >= 0 => break 'outer Some(Ending::Exited(n)),
                        _ => {
                            // Not an exit status: execd could not start the command. Its
                            // status may still know an exit code.
                            if let Some(code) = status_exit(c, target, command_id.as_deref()).await
                            {
                                break 'outer Some(Ending::Exited(code));
                            }
                            return Err(AdapterError::permanent(format!(
                                "exec: the command could not start: {} {}",
                                err.ename, err.evalue
                            )));
                        }
                    }
                }
                // ping, status, result, execution_count and anything newer: not output.
                _ => {}
            }
        }
        if chunk.is_none() {
            break None;
        }
    };
    if ending.is_some() {
        running.ended();
    }

    match ending {
        Some(Ending::Exited(code)) => Ok(code),
        Some(Ending::Killed(by_signal)) => {
            let timed_out =
                deadline.is_some_and(|d| started.elapsed() + Duration::from_millis(250) >= d);
            if timed_out {
                Ok(differently_core::exec::TIMEOUT_EXIT_CODE)
            } else {
                Ok(status_exit(c, target, command_id.as_deref())
                    .await
                    .filter(|c| *c >= 0)
                    .or(by_signal)
                    .unwrap_or(128 + 9))
            }
        }
        None => Err(AdapterError::transient(
            "exec: execd's output stream ended before the command finished".to_owned(),
        )),
    }
}

/// How long a command's request may stand with its head sent and its body held back. Past
/// it the request is abandoned, none of its body sent, and the command goes on a new request
/// once it may: a slow go-ahead does not keep a half-sent request open on execd.
const HOLD_LIMIT: Duration = Duration::from_secs(1);

/// What became of a held command's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Not asked for yet, or waiting for the go-ahead.
    Waiting,
    /// Given: the body went out.
    Sent,
    /// The go-ahead was withdrawn; the request was abandoned with no body sent.
    Withdrawn,
    /// The go-ahead took longer than [`HOLD_LIMIT`]; the request was abandoned with no body sent.
    TooLong,
}

/// Shared between a held request's body and the call that sent it.
#[derive(Debug, Clone)]
struct HoldState(Arc<Mutex<Hold>>);

impl HoldState {
    fn new() -> HoldState {
        HoldState(Arc::new(Mutex::new(Hold::Waiting)))
    }

    fn set(&self, h: Hold) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    fn outcome(&self) -> Hold {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why a held body was not sent (reqwest ends the request with it).
#[derive(Debug, thiserror::Error)]
#[error("the command was not sent: {0:?}")]
struct NotSent(Hold);

/// `rb` with `body` as a body that waits for `go`: the connection is opened and the request
/// head sent at once, so the connection's set-up (for a Docker sandbox, Docker's proxy dialling
/// the container and execd accepting) overlaps whatever the caller does before it gives the
/// go-ahead. The length is declared up front, so execd sees the same request as an unheld one.
/// execd decodes the command from the body, so a request abandoned before its body (go-ahead
/// withdrawn, or held past [`HOLD_LIMIT`]) cannot run anything: its connection is closed.
fn held_command(
    rb: reqwest::RequestBuilder,
    body: &CommandBody,
    go: &GoAhead,
) -> Result<(reqwest::RequestBuilder, HoldState), AdapterError> {
    let json = serde_json::to_vec(body)
        .map_err(|e| AdapterError::Permanent(Reason::caused_by(format!("exec: {e}"), e)))?;
    let hold = HoldState::new();
    let (go, state) = (go.clone(), hold.clone());
    let len = json.len();
    let body = futures::stream::once(async move {
        let outcome = match tokio::time::timeout(HOLD_LIMIT, go.wait()).await {
            Ok(Ok(())) => Hold::Sent,
            Ok(Err(Withdrawn)) => Hold::Withdrawn,
            Err(_) => Hold::TooLong,
        };
        state.set(outcome);
        match outcome {
            Hold::Sent => Ok(Bytes::from(json)),
            other => Err(NotSent(other)),
        }
    });
    let rb = rb
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(reqwest::header::CONTENT_LENGTH, len)
        .body(reqwest::Body::wrap_stream(body));
    Ok((rb, hold))
}

/// The exit code `/command/status/{id}` reports, if it has one.
async fn status_exit(c: &Client, target: &Target, id: Option<&str>) -> Option<i32> {
    let id = id?;
    let rb = target
        .request(c, Method::GET, &format!("/command/status/{}", enc(id)))
        .timeout(c.request_timeout());
    let st: CommandStatus = c.json(rb, "command status").await.ok()?;
    if st.running {
        None
    } else {
        st.exit_code
    }
}

/// Best effort: tell execd to stop the command (SIGTERM: it ends with `signal: terminated`;
/// execd's own timeout uses SIGKILL). Dropping the stream does not, on real execd.
async fn interrupt(c: &Client, target: &Target, id: Option<&str>) {
    let Some(id) = id else { return };
    let rb = target
        .request(c, Method::DELETE, "/command")
        .query(&[("id", id)])
        .timeout(Duration::from_secs(5));
    if let Err(e) = c.send_ok(rb, "interrupt command").await {
        tracing::debug!(error = %e, "execd interrupt failed");
    }
}

/// `GET /ping`.
pub(crate) async fn ping(c: &Client, target: &Target) -> Result<(), AdapterError> {
    let rb = target
        .request(c, Method::GET, "/ping")
        .timeout(c.request_timeout());
    let resp = c.send(rb, "execd ping").await?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(execd_error(c, "execd ping", resp).await)
    }
}

/// Percent-encodes a path segment.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Quotes argv for `bash -c` so every argument arrives as it was given.
pub(crate) fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
    if plain {
        a.to_owned()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(evs: &[Event]) -> Vec<String> {
        evs.iter().map(|e| e.kind.clone()).collect()
    }

    #[test]
    fn a_killed_command_reports_the_signal_execd_names() {
        // As real execd sent it (through the server proxy) for an `echo hi`.
        let line = b"{\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"-1\",\"traceback\":[\"signal: broken pipe\"]},\"timestamp\":1796130266969,\"type\":\"error\"}\n\n";
        let mut p = FrameParser::default();
        let evs = p.push(line).unwrap_or_default();
        let err = evs[0].error.clone().unwrap_or_default();
        assert_eq!(err.evalue, "-1");
        assert_eq!(signal_exit(&err.traceback), Some(141));
        assert_eq!(signal_exit(&["signal: terminated".to_owned()]), Some(143));
        assert_eq!(signal_exit(&["signal: killed".to_owned()]), Some(137));
        assert_eq!(signal_exit(&["exit status 3".to_owned()]), None);
        assert_eq!(signal_exit(&[]), None);
    }

    #[test]
    fn parses_bare_json_split_anywhere() {
        let stream = b"{\"type\":\"init\",\"text\":\"c1\"}\n\n{\"type\":\"stdout\",\"text\":\"a\"}\n\n{\"type\":\"execution_complete\"}\n\n";
        for split in 0..stream.len() {
            let mut p = FrameParser::default();
            let mut evs = p.push(&stream[..split]).unwrap_or_default();
            evs.extend(p.push(&stream[split..]).unwrap_or_default());
            evs.extend(p.finish().unwrap_or_default());
            assert_eq!(
                kinds(&evs),
                ["init", "stdout", "execution_complete"],
                "split {split}"
            );
        }
    }

    #[test]
    fn parses_sse_with_comments_and_multiline_data() {
        let mut p = FrameParser::default();
        let s = b": hi\r\nevent: message\r\ndata: {\"type\":\"stdout\",\r\ndata: \"text\":\"x\\n\"}\r\n\r\ndata:{\"type\":\"ping\"}\n\n";
        let evs = p.push(s).unwrap_or_default();
        assert_eq!(kinds(&evs), ["stdout", "ping"]);
        assert_eq!(evs[0].text.as_deref(), Some("x\n"));
    }

    #[test]
    fn truncated_frame_is_an_error_at_the_end() {
        let mut p = FrameParser::default();
        assert!(p
            .push(b"{\"type\":\"stdout\",\"te")
            .unwrap_or_default()
            .is_empty());
        assert!(p.finish().is_err());
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(shell_quote("plain-1.txt"), "plain-1.txt");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("it's $HOME"), "'it'\\''s $HOME'");
    }
}
