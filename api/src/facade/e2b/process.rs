//! envd's `process.Process` streams, `Start` and `Connect`, over `/v1`'s processes resource
//! (docs/processes.md): a `Start` is `POST …/processes`, whose answer hands this API process
//! the new process to follow in place (one inner request); a `Connect` relays
//! `GET …/processes/{pid}/output` (binary frames), which any API process serves. Both relay
//! the output as envd's events.
//!
//! A stream answers the start event (with the `/v1` pid, which is E2B's pid) first, the
//! output as it arrives (base64; `stdout`/`stderr`, or `pty` for a terminal), keepalives
//! after `Keepalive-Ping-Interval` seconds of silence, and the end event with the exit code,
//! then the end envelope. Closing a stream detaches: the process goes on, as with envd, and
//! `Connect(pid)` re-attaches from the output produced from then on (envd replays nothing).
//!
//! `Connect-Timeout-Ms` on `Start` is the process's deadline, as envd makes it (the SDKs'
//! `timeout`, 60 s by default, `0` for none): at it the process is killed and the stream ends
//! `deadline_exceeded`; a detached process is killed by `/v1` a second later (its
//! `timeoutSeconds`). On `Connect` it bounds only the stream. The unary calls and
//! `StreamInput` are in `process_calls`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::facade::opensandbox::error::OsbError;
use crate::facade::opensandbox::inner::{q, read_all};
use crate::processes::entry::{Ending as ProcessEnding, Stream};
use crate::processes::follow::{Attached, Follow, Piece};
use crate::routes::exec::frames::{Frame, FrameDecoder, FrameType, MEDIA_TYPE};

use super::connect::{self, ConnectError};
use super::envd::{ctx, Ctx, EnvdError};
use super::{home, Facade};

/// Largest `Start` or `Connect` request accepted.
const MAX_REQUEST: usize = 1 << 20;
/// Keepalive interval when the request names none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// `/v1`'s longest process timeout.
const MAX_TIMEOUT_SECONDS: u64 = 86_400;
/// A terminal's size when `pty` names none.
const DEFAULT_PTY: (u32, u32) = (80, 24);

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    #[serde(default)]
    stdin: Option<bool>,
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

/// envd's `PTY`: `{"size": {"cols", "rows"}}`.
#[derive(Debug, Deserialize)]
pub(super) struct Pty {
    pub(super) size: Option<PtySize>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
pub(super) struct PtySize {
    #[serde(default)]
    pub(super) cols: u32,
    #[serde(default)]
    pub(super) rows: u32,
}

fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// `/v1/sandboxes/{id}/processes`, then `/{pid}` and `tail` when given.
pub(super) fn uri(c: &Ctx, pid: Option<u32>, tail: &str) -> String {
    let mut u = format!("/v1/sandboxes/{}/processes", q(&c.sandbox));
    if let Some(pid) = pid {
        u.push_str(&format!("/{pid}{tail}"));
    }
    u
}

/// Which process a request names: envd's `ProcessSelector` (`{"pid": N}` or `{"tag": …}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Selector {
    Pid(u32),
    Tag(String),
}

/// The selector under `req["process"]`.
pub(super) fn selector(req: &Value) -> Result<Selector, ConnectError> {
    let p = &req["process"];
    if let Some(pid) = p.get("pid").filter(|v| !v.is_null()) {
        return pid
            .as_u64()
            .or_else(|| pid.as_str().and_then(|s| s.trim().parse().ok()))
            .and_then(|n| u32::try_from(n).ok())
            .map(Selector::Pid)
            .ok_or_else(|| ConnectError::field("process.pid", "not a uint32"));
    }
    match p.get("tag").and_then(Value::as_str) {
        Some(tag) => Ok(Selector::Tag(tag.to_owned())),
        None => Err(ConnectError::field("process", "names no pid or tag")),
    }
}

/// The pid `sel` names: a tag is looked up among the sandbox's running processes.
pub(super) async fn resolve(f: &Facade, c: &Ctx, sel: &Selector) -> Result<u32, EnvdError> {
    let tag = match sel {
        Selector::Pid(p) => return Ok(*p),
        Selector::Tag(t) => t,
    };
    let listed = c
        .json(
            f,
            Method::GET,
            &format!("{}?status=running", uri(c, None, "")),
            None,
        )
        .await?;
    listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["tag"].as_str() == Some(tag))
        .and_then(|p| p["pid"].as_u64())
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            ConnectError::new("not_found", format!("process with tag {tag:?} not found")).into()
        })
}

/// The `/v1` `StartProcess` body of a `Start`.
fn start_body(c: &Ctx, req: &StartRequest, deadline: Option<Duration>) -> Value {
    let p = &req.process;
    let mut argv = vec![p.cmd.clone()];
    argv.extend(p.args.iter().cloned());
    // envd's order: the user's HOME, USER and LOGNAME, then the sandbox's env (applied by the
    // backend), then the request's.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("HOME".into(), c.home.clone());
    env.insert("USER".into(), c.user.clone());
    env.insert("LOGNAME".into(), c.user.clone());
    env.extend(p.envs.clone());
    let cwd = c.resolve(p.cwd.as_deref().unwrap_or(""));
    let pty = req.pty.as_ref().map(|t| {
        let s = t.size.unwrap_or(PtySize {
            cols: DEFAULT_PTY.0,
            rows: DEFAULT_PTY.1,
        });
        json!({ "cols": s.cols, "rows": s.rows })
    });
    // A terminal always takes input (envd's `SendInput` with `pty`).
    let stdin = req.stdin.unwrap_or(false) || pty.is_some();
    let mut body = json!({ "command": argv, "env": env, "cwd": cwd, "stdin": stdin });
    if let Some(pty) = pty {
        body["pty"] = pty;
    }
    if let Some(tag) = &req.tag {
        body["tag"] = json!(tag);
    }
    if let Some(d) = deadline {
        // A backstop a second past the facade's own deadline, which kills it first while a
        // stream is attached (and ends that stream `deadline_exceeded`, not with exit 124).
        let secs = (d.as_millis().div_ceil(1000) as u64 + 1).clamp(1, MAX_TIMEOUT_SECONDS);
        body["timeoutSeconds"] = json!(secs);
    }
    body
}

/// A Connect stream answer fed by `rx`.
pub(super) fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(connect::STREAM_CONTENT_TYPE),
    );
    r
}

/// A stream holding only the end envelope with `e` (how Connect answers an error found before
/// anything was sent).
pub(super) fn failed_stream(e: &ConnectError) -> Response {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(connect::end(Some(e)));
    stream_response(rx)
}

/// The answer of a stream that failed before it began: E2B's 502 for a sandbox the caller
/// cannot reach, else the end envelope with the error.
fn refused(e: EnvdError) -> Response {
    match e {
        EnvdError::Rpc(e) => failed_stream(&e),
        gone => gone.into_response(),
    }
}

/// The caller's context and the decoded JSON body of a server-streaming call, or the answer
/// to give instead: envd's error before the stream opens (the caller), a stream's end envelope
/// after (a body over `limit.0` bytes, answered with `limit.1`; one that does not decode,
/// naming `field`).
pub(super) async fn stream_call<T: serde::de::DeserializeOwned>(
    f: &Facade,
    headers: &HeaderMap,
    body: Body,
    limit: (usize, &str),
    field: &str,
) -> Result<(Ctx, T), Response> {
    let c = ctx(f, headers, None).map_err(IntoResponse::into_response)?;
    let Ok(body) = axum::body::to_bytes(body, limit.0).await else {
        return Err(failed_stream(&ConnectError::new(
            "resource_exhausted",
            limit.1,
        )));
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    connect::request(ct, &body)
        .and_then(|v| serde_json::from_value(v).map_err(|e| ConnectError::field(field, e)))
        .map(|req| (c, req))
        .map_err(|e| failed_stream(&e))
}

/// How a stream is bounded and kept alive, from the request's headers, and whether its
/// process was started in its user's home by default (for the refusal when that is missing).
struct Timing {
    keepalive: Duration,
    deadline: Option<Duration>,
    started: Instant,
    in_home: bool,
}

impl Timing {
    fn of(headers: &HeaderMap) -> Timing {
        Timing {
            keepalive: header_u64(headers, "keepalive-ping-interval")
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_KEEPALIVE),
            deadline: header_u64(headers, "connect-timeout-ms")
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            started: Instant::now(),
            in_home: false,
        }
    }
}

/// `POST /process.Process/Start`.
pub async fn start(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (c, req): (_, StartRequest) = match stream_call(
        &f,
        &headers,
        body,
        (MAX_REQUEST, "the Start request is over 1 MiB"),
        "process",
    )
    .await
    {
        Ok(x) => x,
        Err(answer) => return answer,
    };
    let timing = Timing::of(&headers);
    let pty = req.pty.is_some();
    let v1_body = start_body(&c, &req, timing.deadline);
    let in_home = v1_body["cwd"] == c.home.as_str();
    if in_home && home::is_made(&c.home) {
        f.homes.ensure(&f, &c.caller, &c.sandbox).await;
    }
    let mut resp = match start_v1(&f, &c, &v1_body).await {
        Ok(r) => r,
        Err(e) => return failed_stream(&ConnectError::new("internal", e.message)),
    };
    let status = resp.status();
    if !status.is_success() {
        let bytes = read_all(resp).await.unwrap_or_default();
        if in_home && cwd_refused(&bytes) {
            return failed_stream(&no_home(&c.home, &c.user));
        }
        return refused(EnvdError::from_v1(&c.sandbox, status, &bytes));
    }
    // The supervisor here holds the new process: its output is followed in place, with no
    // second request (the answer's body says nothing the extension does not).
    let Some(attached) = resp.extensions_mut().remove::<Attached>() else {
        return failed_stream(&ConnectError::internal(
            "a started process without its attachment",
        ));
    };
    let pid = attached.pid();
    let source = Source::Local(attached.follow(0));
    let mut timing = timing;
    timing.in_home = in_home;
    pump(f, c, pid, pty, timing, true, source)
}

/// Whether a `/v1` refusal of a start is about the request's `cwd` (one that does not exist).
fn cwd_refused(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| v["error"]["details"]["field"] == "cwd")
}

/// Whether a process's failure says its `cwd` does not exist (each backend words it its own
/// way: devhost names the directory, the others say "the cwd").
fn cwd_missing(e: &ConnectError) -> bool {
    e.code == "invalid_argument"
        && e.message.contains("cwd")
        && e.message.contains("does not exist")
}

/// The refusal of a command that was to start in its user's home `home`, which the sandbox
/// lacks (the facade makes only `/home/user` and `/root`): what is missing and what to do.
fn no_home(home: &str, user: &str) -> ConnectError {
    ConnectError::field(
        "cwd",
        format!(
            "the home directory {home} of user {user:?} does not exist in the sandbox, and \
             commands start there by default: pass cwd (e.g. cwd=\"/tmp\"), or make the \
             directory first (files.make_dir({home:?}))"
        ),
    )
}

/// The `/v1` process start of `body`.
async fn start_v1(f: &Facade, c: &Ctx, body: &Value) -> Result<Response, OsbError> {
    let json = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    f.v1.call(
        &c.caller,
        Method::POST,
        &uri(c, None, ""),
        &json,
        Body::from(body.to_string()),
    )
    .await
}

/// `POST /process.Process/Connect`: re-attaches to a process from its output's current end.
pub async fn connect(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (c, req): (_, Value) = match stream_call(
        &f,
        &headers,
        body,
        (MAX_REQUEST, "the Connect request is over 1 MiB"),
        "process",
    )
    .await
    {
        Ok(x) => x,
        Err(answer) => return answer,
    };
    let timing = Timing::of(&headers);
    let sel = match selector(&req) {
        Ok(s) => s,
        Err(e) => return failed_stream(&e),
    };
    let found = match resolve(&f, &c, &sel).await {
        Ok(pid) => c
            .json(&f, Method::GET, &uri(&c, Some(pid), ""), None)
            .await
            .map(|p| (pid, p)),
        Err(e) => Err(e),
    };
    let (pid, p) = match found {
        Ok(x) => x,
        Err(e) => return refused(e),
    };
    let from = p["outputBytes"].as_u64().unwrap_or(0);
    let pty = p["pty"].as_bool().unwrap_or(false);
    attach(f, c, pid, from, pty, timing).await
}

/// The stream of process `pid` re-attached through `/v1` (`GET …/output`, which any API
/// process serves): its start event, then its output from byte `from`.
async fn attach(
    f: Arc<Facade>,
    c: Ctx,
    pid: u32,
    from: u64,
    pty: bool,
    timing: Timing,
) -> Response {
    let inner =
        f.v1.call(
            &c.caller,
            Method::GET,
            &uri(&c, Some(pid), &format!("/output?from={from}&follow=true")),
            &[(header::ACCEPT, HeaderValue::from_static(MEDIA_TYPE))],
            Body::empty(),
        )
        .await;
    let failed = match inner {
        Ok(r) if r.status().is_success() => {
            let source = Source::Frames {
                data: r.into_body().into_data_stream(),
                dec: FrameDecoder::default(),
            };
            return pump(f, c, pid, pty, timing, false, source);
        }
        Ok(r) => {
            let status = r.status();
            let bytes = read_all(r).await.unwrap_or_default();
            match EnvdError::from_v1(&c.sandbox, status, &bytes) {
                EnvdError::Rpc(e) => e,
                EnvdError::SandboxGone(id) => {
                    ConnectError::new("unavailable", format!("The sandbox {id} was not found"))
                }
            }
        }
        Err(e) => ConnectError::new("internal", e.message),
    };
    let (tx, rx) = mpsc::channel(2);
    let _ = tx.try_send(start_event(pid));
    let _ = tx.try_send(connect::end(Some(&failed)));
    stream_response(rx)
}

/// envd's first event of a stream: the process's pid.
fn start_event(pid: u32) -> Bytes {
    connect::message(&json!({ "event": { "start": { "pid": pid } } }))
}

/// The stream of process `pid`: its start event, then what [`Pump`] relays of `source`;
/// `kill` makes the deadline kill the process.
fn pump(
    f: Arc<Facade>,
    c: Ctx,
    pid: u32,
    pty: bool,
    timing: Timing,
    kill: bool,
    source: Source,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let _ = tx.try_send(start_event(pid));
    let job = Pump {
        f,
        c,
        pid,
        pty,
        kill,
        keepalive: timing.keepalive,
        deadline: timing.deadline.map(|d| timing.started + d),
        in_home: timing.in_home,
    };
    tokio::spawn(job.run(source, tx));
    stream_response(rx)
}

/// Where an attachment's output comes from.
enum Source {
    /// `/v1`'s binary frames (a re-attach through `GET …/output`).
    Frames {
        data: axum::body::BodyDataStream,
        dec: FrameDecoder,
    },
    /// This API process's supervisor (the process a `Start` just made).
    Local(Follow),
}

/// One thing an attachment relays.
enum Item {
    Output(FrameType, Bytes),
    Ended(Ending),
}

impl Source {
    /// What came next, in order (maybe nothing yet: half a frame). Cancel safe: the only
    /// wait is for the next chunk or change, and nothing is taken before it.
    async fn next(&mut self) -> Vec<Item> {
        match self {
            Source::Frames { data, dec } => {
                let Some(Ok(chunk)) = data.next().await else {
                    return vec![Item::Ended(Ending::Failed(ConnectError::new(
                        "unavailable",
                        "the process's output stream ended before its exit",
                    )))];
                };
                let frames = match dec.push(&chunk) {
                    Ok(fr) => fr,
                    Err(e) => {
                        let e = ConnectError::internal(format!("process frames: {e}"));
                        return vec![Item::Ended(Ending::Failed(e))];
                    }
                };
                frames.into_iter().map(item_of_frame).collect()
            }
            Source::Local(follow) => match follow.next().await {
                Piece::Output(chunks) => chunks
                    .into_iter()
                    .map(|c| {
                        let kind = match c.stream {
                            Stream::Stdout => FrameType::Stdout,
                            Stream::Stderr => FrameType::Stderr,
                        };
                        Item::Output(kind, c.bytes)
                    })
                    .collect(),
                Piece::End(ProcessEnding::Exit { exit_code, .. }) => {
                    vec![Item::Ended(Ending::Exit(i64::from(exit_code)))]
                }
                Piece::End(ProcessEnding::Error { code, message }) => {
                    let code = ConnectError::code_of_v1(&code);
                    vec![Item::Ended(Ending::Failed(ConnectError::new(
                        code, message,
                    )))]
                }
                Piece::Behind { at, kept } => {
                    let e = ConnectError::new(
                        "failed_precondition",
                        format!(
                            "output from byte {at} to {kept} was dropped before it was read \
                             (the reader fell behind by more than the output kept)"
                        ),
                    );
                    vec![Item::Ended(Ending::Failed(e))]
                }
            },
        }
    }
}

/// The item of one `/v1` frame.
fn item_of_frame(fr: Frame) -> Item {
    match fr.kind {
        FrameType::Exit => {
            let v: Value = serde_json::from_slice(&fr.payload).unwrap_or(Value::Null);
            Item::Ended(Ending::Exit(v["exitCode"].as_i64().unwrap_or(-1)))
        }
        FrameType::Error => {
            let v: Value = serde_json::from_slice(&fr.payload).unwrap_or(Value::Null);
            let code = ConnectError::code_of_v1(v["code"].as_str().unwrap_or(""));
            let msg = v["message"].as_str().unwrap_or("the process failed");
            Item::Ended(Ending::Failed(ConnectError::new(code, msg)))
        }
        kind => Item::Output(kind, fr.payload),
    }
}

/// How a process's stream ended.
enum Ending {
    Exit(i64),
    Failed(ConnectError),
}

/// Relays one attachment's frames as envd's events.
struct Pump {
    f: Arc<Facade>,
    c: Ctx,
    pid: u32,
    pty: bool,
    /// Kill the process at the deadline (a `Start`'s `Connect-Timeout-Ms`).
    kill: bool,
    keepalive: Duration,
    deadline: Option<Instant>,
    /// The process was to start in its user's home (no `cwd` asked).
    in_home: bool,
}

impl Pump {
    /// Relays `source` as envd's events. Returns when the stream ends or the client goes
    /// (dropping the source then detaches; the process goes on).
    async fn run(self, mut source: Source, tx: mpsc::Sender<Bytes>) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut quiet_since = Instant::now();
        let far = Instant::now() + Duration::from_secs(10 * 365 * 86_400);
        let ending = 'outer: loop {
            let wake = (quiet_since + self.keepalive).min(self.deadline.unwrap_or(far));
            let items = tokio::select! {
                items = source.next() => items,
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(wake) => {
                    if self.deadline.is_some_and(|d| Instant::now() >= d) {
                        break Ending::Failed(self.deadline_passed().await);
                    }
                    let ka = connect::message(&json!({ "event": { "keepalive": {} } }));
                    if tx.send(ka).await.is_err() {
                        return;
                    }
                    quiet_since = Instant::now();
                    continue;
                }
            };
            for item in items {
                match item {
                    Item::Output(kind, payload) => {
                        let name = match (self.pty, kind) {
                            (true, _) => "pty",
                            (false, FrameType::Stdout) => "stdout",
                            (false, FrameType::Stderr) => "stderr",
                            // Heartbeats carry nothing.
                            _ => continue,
                        };
                        let ev = json!({ "event": { "data": { name: b64.encode(&payload) } } });
                        if tx.send(connect::message(&ev)).await.is_err() {
                            return;
                        }
                        quiet_since = Instant::now();
                    }
                    Item::Ended(ending) => break 'outer ending,
                }
            }
        };
        drop(source);
        match ending {
            Ending::Exit(code) => {
                let _ = tx.send(connect::message(&end_event(code))).await;
                let _ = tx.send(connect::end(None)).await;
            }
            Ending::Failed(e) => {
                let e = if self.in_home && cwd_missing(&e) {
                    no_home(&self.c.home, &self.c.user)
                } else {
                    e
                };
                let _ = tx.send(connect::end(Some(&e))).await;
            }
        }
    }

    /// At the deadline: a `Start`'s process is killed (as envd does); the stream's error.
    async fn deadline_passed(&self) -> ConnectError {
        if !self.kill {
            return ConnectError::new(
                "deadline_exceeded",
                "the stream ran past its deadline (Connect-Timeout-Ms); the process goes on",
            );
        }
        let killed = self
            .c
            .json(
                &self.f,
                Method::DELETE,
                &uri(&self.c, Some(self.pid), ""),
                None,
            )
            .await;
        if let Err(e) = killed {
            tracing::warn!(pid = self.pid, error = ?e, "e2b facade: kill at the deadline failed");
        }
        ConnectError::new(
            "deadline_exceeded",
            "the command ran past its deadline (Connect-Timeout-Ms) and was killed",
        )
    }
}

/// envd's end event of an exit code (`exitCode` and `error` only when it is not 0).
fn end_event(code: i64) -> Value {
    let mut end = json!({ "exited": true, "status": format!("exit status {code}") });
    if code != 0 {
        end["exitCode"] = json!(code);
        end["error"] = json!(format!("exit status {code}"));
    }
    json!({ "event": { "end": end } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facade::opensandbox::inner::Caller;

    #[test]
    fn a_missing_home_says_which_and_how_to_go_on() {
        for said in [
            "cwd /home/alice does not exist in the sandbox",
            "exec: the cwd does not exist in the sandbox",
        ] {
            assert!(
                cwd_missing(&ConnectError::new("invalid_argument", said)),
                "{said}"
            );
        }
        assert!(!cwd_missing(&ConnectError::new(
            "not_found",
            "cwd does not exist"
        )));
        let e = no_home("/home/alice", "alice");
        assert_eq!(e.code, "invalid_argument");
        assert!(
            e.message.contains("home directory /home/alice") && e.message.contains("pass cwd"),
            "{}",
            e.message
        );
        let refused =
            br#"{"error":{"code":"validation_failed","message":"x","details":{"field":"cwd"}}}"#;
        assert!(cwd_refused(refused));
        assert!(!cwd_refused(
            br#"{"error":{"code":"conflict","message":"x"}}"#
        ));
    }

    fn c() -> Ctx {
        Ctx {
            caller: Caller::Anonymous,
            sandbox: "sbx_1".into(),
            user: "user".into(),
            home: "/home/user".into(),
        }
    }

    #[test]
    fn selectors_take_a_pid_as_number_or_string_or_a_tag() {
        assert_eq!(
            selector(&json!({"process": {"pid": 7}})).unwrap(),
            Selector::Pid(7)
        );
        assert_eq!(
            selector(&json!({"process": {"pid": "8"}})).unwrap(),
            Selector::Pid(8)
        );
        assert_eq!(
            selector(&json!({"process": {"tag": "web"}})).unwrap(),
            Selector::Tag("web".into())
        );
        let e = selector(&json!({"process": {"pid": -1}})).unwrap_err();
        assert!(e.message.starts_with("process.pid"), "{e:?}");
        let e = selector(&json!({"process": {"pid": 1u64 << 33}})).unwrap_err();
        assert_eq!(e.code, "invalid_argument");
        assert!(selector(&json!({})).is_err());
    }

    #[test]
    fn a_start_becomes_a_v1_process() {
        let req: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm"},
                        "cwd": "w"},
            "pty": {"size": {"cols": 100, "rows": 30}}, "tag": "t"
        }))
        .unwrap();
        let b = start_body(&c(), &req, Some(Duration::from_millis(1500)));
        assert_eq!(b["command"], json!(["/bin/bash", "-i", "-l"]));
        assert_eq!(b["cwd"], "/home/user/w");
        assert_eq!(b["env"]["TERM"], "xterm");
        assert_eq!(b["env"]["HOME"], "/home/user");
        assert_eq!(b["pty"], json!({"cols": 100, "rows": 30}));
        assert_eq!(b["stdin"], true, "a terminal takes input");
        assert_eq!(b["tag"], "t");
        assert_eq!(
            b["timeoutSeconds"], 3,
            "a second past the stream's deadline"
        );
        let plain: StartRequest =
            serde_json::from_value(json!({"process": {"cmd": "cat"}, "stdin": false})).unwrap();
        let b = start_body(&c(), &plain, None);
        assert_eq!(b["stdin"], false);
        assert!(b.get("timeoutSeconds").is_none() && b.get("pty").is_none());
        let differently_core::process::StartProcess { command, .. } =
            serde_json::from_value(b).expect("the /v1 wire type takes it");
        assert_eq!(command, vec!["cat".to_owned()]);
    }

    #[test]
    fn end_events_say_exit_codes_as_envd() {
        assert_eq!(
            end_event(0),
            json!({"event": {"end": {"exited": true, "status": "exit status 0"}}})
        );
        assert_eq!(end_event(3)["event"]["end"]["error"], "exit status 3");
        assert_eq!(end_event(137)["event"]["end"]["exitCode"], 137);
    }
}
