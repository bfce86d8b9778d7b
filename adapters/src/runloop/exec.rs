//! Running a command line on a devbox: `execute_async`, the two output tails (server-sent
//! events from a byte offset, reconnected where a held connection ends), the completion long
//! poll, and `kill` at the deadline or when the caller goes away. Scripts of the adapter's
//! own read their output from the completed execution instead, when it was not cut.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::api::{self, EXEC_HOLD};
use super::sse::{Decoder, Event};
use crate::http::HttpClient;
use crate::kit::paths::segment;
use crate::{AdapterError, ExecEvent};

/// Lines of each stream a script's completed execution is asked for; a script printing
/// more is read through the tails instead.
const SCRIPT_LINES: u32 = 10_000;

/// Transport failures of one tail in a row before the exec gives up on it.
const TAIL_FAILURES: u32 = 3;

/// An execution as Runloop answers it (`DevboxAsyncExecutionDetailView`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Execution {
    pub execution_id: String,
    pub status: String,
    #[serde(default)]
    pub exit_status: Option<i32>,
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    #[serde(default)]
    pub stdout_truncated: Option<bool>,
    #[serde(default)]
    pub stderr_truncated: Option<bool>,
}

fn exec_path(devbox: &str, eid: &str, rest: &str) -> String {
    format!(
        "/v1/devboxes/{}/executions/{}{rest}",
        segment(devbox),
        segment(eid)
    )
}

/// `POST /v1/devboxes/{id}/execute_async {command}`.
async fn start(c: &HttpClient, devbox: &str, command: &str) -> Result<Execution, AdapterError> {
    let path = format!("/v1/devboxes/{}/execute_async", segment(devbox));
    c.json(
        c.api(Method::POST, &path)
            .json(&serde_json::json!({ "command": command })),
        "exec: start",
    )
    .await
}

/// The execution once completed, or `None` at `deadline`: completion long polls of at most
/// the server's hold each.
async fn completed(
    c: &HttpClient,
    devbox: &str,
    eid: &str,
    deadline: Instant,
    last_n: Option<u32>,
) -> Result<Option<Execution>, AdapterError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let hold = left.min(EXEC_HOLD);
        let mut rb = c
            .api(Method::POST, &exec_path(devbox, eid, "/wait_for_status"))
            .json(&serde_json::json!({
                "statuses": ["completed"],
                "timeout_seconds": hold.as_secs().max(1),
            }))
            .timeout(hold + Duration::from_secs(5));
        if let Some(n) = last_n {
            rb = rb.query(&[("last_n", n.to_string())]);
        }
        if let Some(e) = api::held::<Execution>(c, rb, "exec: wait").await? {
            if e.status == "completed" {
                return Ok(Some(e));
            }
        }
    }
}

/// `POST …/executions/{eid}/kill`, the whole process group. Best effort: the execution may
/// have ended meanwhile.
async fn kill(c: &HttpClient, devbox: &str, eid: &str) {
    let rb = c
        .api(Method::POST, &exec_path(devbox, eid, "/kill"))
        .json(&serde_json::json!({ "kill_process_group": true }));
    if let Err(e) = c.send_ok(rb, "exec: kill").await {
        tracing::warn!(execution = eid, error = %e, "runloop: kill of an execution failed");
    }
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    output: String,
}

/// Why a tail stopped early.
enum TailEnd {
    Failed(AdapterError),
    /// The receiver of the output went away.
    Gone,
}

/// One output tail to its end (the execution completed and all of it was sent), from byte
/// `offset` on, reconnecting from the bytes received where a connection ends first.
async fn tail(
    c: &HttpClient,
    devbox: &str,
    eid: &str,
    stderr: bool,
    out: &mpsc::Sender<ExecEvent>,
) -> Result<(), TailEnd> {
    let which = if stderr { "stderr" } else { "stdout" };
    let path = exec_path(devbox, eid, &format!("/stream_{which}_updates"));
    let op = format!("exec: {which} tail");
    let mut offset: u64 = 0;
    let mut failures = 0;
    loop {
        let rb = c
            .api(Method::GET, &path)
            .query(&[("offset", offset.to_string())])
            .header("Accept", "text/event-stream")
            // The tail lasts as long as the command: no whole-request timeout.
            .timeout(Duration::from_secs(7 * 24 * 3600));
        let resp = c.send_ok(rb, &op).await.map_err(TailEnd::Failed)?;
        let mut body = resp.bytes_stream();
        let mut decoder = Decoder::default();
        let mut reconnect = false;
        'read: while let Some(piece) = body.next().await {
            let piece: Bytes = match piece {
                Ok(p) => p,
                Err(e) => {
                    failures += 1;
                    if failures > TAIL_FAILURES {
                        return Err(TailEnd::Failed(c.transport_error(&op, e)));
                    }
                    reconnect = true;
                    break 'read;
                }
            };
            for Event { name, data } in decoder.feed(&piece) {
                if name == "error" {
                    let code = serde_json::from_str::<serde_json::Value>(&data)
                        .ok()
                        .and_then(|v| v.get("code").and_then(serde_json::Value::as_u64));
                    if code == Some(408) {
                        // The server's hold ended: pick up where we are.
                        reconnect = true;
                        break 'read;
                    }
                    return Err(TailEnd::Failed(AdapterError::transient(format!(
                        "{op}: Runloop error event: {}",
                        c.scrub(&data)
                    ))));
                }
                let chunk: Chunk = serde_json::from_str(&data).map_err(|e| {
                    TailEnd::Failed(AdapterError::transient(format!(
                        "{op}: unexpected event from Runloop: {e}"
                    )))
                })?;
                if chunk.output.is_empty() {
                    continue;
                }
                failures = 0;
                offset += chunk.output.len() as u64;
                let bytes = Bytes::from(chunk.output.into_bytes());
                let ev = if stderr {
                    ExecEvent::Stderr(bytes)
                } else {
                    ExecEvent::Stdout(bytes)
                };
                if out.send(ev).await.is_err() {
                    return Err(TailEnd::Gone);
                }
            }
        }
        if !reconnect {
            return Ok(());
        }
    }
}

/// Runs `command` on `devbox`, sending its output to `out` as it comes; its exit code, or
/// 124 once `timeout` has passed (the command is then killed). A closed `out` kills it too.
pub(crate) async fn run(
    c: &HttpClient,
    devbox: &str,
    command: &str,
    timeout: Duration,
    out: &mpsc::Sender<ExecEvent>,
) -> Result<i32, AdapterError> {
    let deadline = Instant::now() + timeout;
    let exe = start(c, devbox, command).await?;
    let eid = exe.execution_id.as_str();
    let tails = async {
        let (o, e) = tokio::join!(
            tail(c, devbox, eid, false, out),
            tail(c, devbox, eid, true, out)
        );
        o.and(e)
    };
    let done = completed(c, devbox, eid, deadline, Some(1));
    tokio::pin!(tails, done);
    let mut tails_over = false;
    let mut exit: Option<i32> = None;
    // Once the command has completed, its tails end as soon as they have sent the rest.
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        let drained = tokio::time::sleep_until(
            drain_until.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600)),
        );
        tokio::select! {
            // A caller hanging up while the command is quiet (the tails send nothing, so
            // they cannot notice): kill the execution.
            () = out.closed(), if exit.is_none() => {
                kill(c, devbox, eid).await;
                return Err(AdapterError::permanent(
                    "exec cancelled: the output receiver went away",
                ));
            }
            () = drained, if drain_until.is_some() => {
                return Err(AdapterError::transient(
                    "exec: the command completed but Runloop's output tails did not end",
                ));
            }
            t = &mut tails, if !tails_over => match t {
                Ok(()) => tails_over = true,
                Err(end) => {
                    kill(c, devbox, eid).await;
                    return Err(match end {
                        TailEnd::Failed(e) => e,
                        TailEnd::Gone => AdapterError::permanent(
                            "exec cancelled: the output receiver went away",
                        ),
                    });
                }
            },
            d = &mut done, if exit.is_none() => match d? {
                Some(e) => {
                    exit = Some(e.exit_status.ok_or_else(|| AdapterError::transient(
                        "exec: Runloop says the command completed but gives no exit status",
                    ))?);
                    drain_until = Some(tokio::time::Instant::now() + c.request_timeout());
                }
                None => {
                    kill(c, devbox, eid).await;
                    return Ok(124);
                }
            },
        }
        if let (true, Some(code)) = (tails_over, exit) {
            return Ok(code);
        }
    }
}

/// What a script of the adapter's own printed, and its exit code.
#[derive(Debug, Default)]
pub(crate) struct Ran {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs one of the adapter's scripts to completion within `timeout`: its output from the
/// completed execution (two calls), or through the tails when the view cut it.
pub(crate) async fn script(
    c: &HttpClient,
    devbox: &str,
    script: &str,
    timeout: Duration,
) -> Result<Ran, AdapterError> {
    let deadline = Instant::now() + timeout;
    let exe = start(c, devbox, script).await?;
    let eid = exe.execution_id.as_str();
    let Some(done) = completed(c, devbox, eid, deadline, Some(SCRIPT_LINES)).await? else {
        kill(c, devbox, eid).await;
        return Err(AdapterError::transient(format!(
            "a file operation on the devbox did not finish within {} s",
            timeout.as_secs()
        )));
    };
    let exit_code = done.exit_status.ok_or_else(|| {
        AdapterError::transient("Runloop says the command completed but gives no exit status")
    })?;
    let cut = done.stdout_truncated == Some(true) || done.stderr_truncated == Some(true);
    if !cut {
        return Ok(Ran {
            exit_code,
            stdout: done.stdout.unwrap_or_default(),
            stderr: done.stderr.unwrap_or_default(),
        });
    }
    let (tx, mut rx) = mpsc::channel(64);
    let read = async move {
        let (o, e) = tokio::join!(
            tail(c, devbox, eid, false, &tx),
            tail(c, devbox, eid, true, &tx)
        );
        drop(tx);
        o.and(e)
    };
    let gather = async {
        let mut ran = Ran {
            exit_code,
            ..Ran::default()
        };
        while let Some(ev) = rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) => ran.stdout.push_str(&String::from_utf8_lossy(&b)),
                ExecEvent::Stderr(b) => ran.stderr.push_str(&String::from_utf8_lossy(&b)),
            }
        }
        ran
    };
    let (read, ran) = tokio::join!(read, gather);
    match read {
        Ok(()) => Ok(ran),
        Err(TailEnd::Failed(e)) => Err(e),
        Err(TailEnd::Gone) => Err(AdapterError::transient("script output reader went away")),
    }
}
