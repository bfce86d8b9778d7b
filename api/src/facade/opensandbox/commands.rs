//! execd's commands as `/v1` processes (issue 43). Every command the facade starts (a
//! background one, a foreground one, a bash session's run) is a process of the sandbox, and
//! its execd id is the process's pid in decimal. The process supervisor keeps its state and
//! output and routes any call on a pid to the API process that holds it, so status, logs and
//! interrupt work through whichever API process the SDK reaches, with nothing kept here.

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, StatusCode};
use differently_core::process::{Process, ProcessStatus};
use futures::StreamExt;
use serde_json::{json, Value};

use crate::routes::exec::frames::{FrameDecoder, FrameType, MEDIA_TYPE};

use super::error::{OsbError, OsbResult};
use super::inner::{q, read_all, Caller};
use super::Facade;

/// Output handed out per `/logs` answer. The cursor header tells the SDK where the next page
/// starts, so a longer log takes more polls, not a bigger answer (the SDKs poll with it).
pub const LOG_PAGE_BYTES: usize = 512 << 10;

/// The `tag` of a process started from execd's `command` (a `/bin/sh -c` line), so its
/// status shows the line as `content`; `/v1` listings show where it came from.
pub const TAG_COMMAND: &str = "opensandbox.command";
/// The `tag` of a process started from execd's `argv`.
pub const TAG_ARGV: &str = "opensandbox.argv";
/// The `tag` of a bash session's run (its `content` is the run's command, the last argument
/// of the session script).
pub const TAG_SESSION: &str = "opensandbox.session";

/// How often a page read gives up on a moving window (more than the kept output written while
/// it reads) and reads again.
const PAGE_ATTEMPTS: usize = 3;

/// The execd command id of process `pid`.
pub fn command_id(pid: u32) -> String {
    pid.to_string()
}

/// The pid an execd command id names: decimal digits only, so no other form (an older
/// facade's `<instance>-<ulid>`, a path trick) reaches `/v1`.
pub fn pid_of(id: &str) -> Option<u32> {
    if id.is_empty() || id.len() > 10 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// execd's `exit_code` and `error` for a `/v1` exit code. `/v1` reports a signal's end as
/// 128+n; execd (Go) reports `-1` and `signal: <name>`, which the SDKs show, so the signals a
/// `/v1` client can send map back (an interrupt is `KILL`: `-1`, `signal: killed`). Any other
/// non-zero code is Go's `exit status <n>`.
pub fn execd_ending(code: i64) -> (i64, Option<String>) {
    let signal = match code {
        0 => return (0, None),
        129 => "hangup",
        130 => "interrupt",
        137 => "killed",
        143 => "terminated",
        n => return (n, Some(format!("exit status {n}"))),
    };
    (-1, Some(format!("signal: {signal}")))
}

/// What execd calls the command's `content`: the shell line of a `command`, the run's command
/// of a session, the argv joined by spaces otherwise.
pub fn content_of(p: &Process) -> String {
    let arg = |i: usize| p.command.get(i).cloned();
    let found = match p.tag.as_deref() {
        Some(TAG_COMMAND) => arg(2),
        Some(TAG_SESSION) => p.command.last().cloned(),
        _ => None,
    };
    found.unwrap_or_else(|| p.command.join(" "))
}

/// execd's status body of a process.
pub fn status_of(p: &Process) -> Value {
    let (exit_code, error) = match (p.status, p.exit_code) {
        (ProcessStatus::Running, _) => (None, None),
        (ProcessStatus::Exited, Some(code)) => {
            let (c, e) = execd_ending(i64::from(code));
            (Some(c), e)
        }
        (_, _) => (None, p.error.clone()),
    };
    json!({
        "id": command_id(p.pid),
        "content": content_of(p),
        "running": p.status == ProcessStatus::Running,
        "exit_code": exit_code,
        "error": error,
        "started_at": p.started_at,
        "finished_at": p.ended_at,
    })
}

/// 404 for a command this API cannot find. `/v1` answers the same 404 for a pid that never
/// was, one forgotten after it ended, and one whose supervising API process is gone, so the
/// message names each.
pub fn command_not_found(cmd: &str) -> OsbError {
    OsbError::new(
        StatusCode::NOT_FOUND,
        "INVALID_REQUEST_BODY",
        format!(
            "command {cmd} not found: unknown, no longer kept, or the API process that ran it is gone"
        ),
    )
}

/// The facade's answer for a failed `/v1` call on command `cmd`: 404 is the command's, a 503
/// (its supervising API process did not answer) keeps the facade's retryable code.
fn command_error(cmd: &str, status: StatusCode, body: &[u8], caller: &Caller) -> OsbError {
    match status {
        StatusCode::NOT_FOUND => command_not_found(cmd),
        StatusCode::SERVICE_UNAVAILABLE => {
            let v1 = OsbError::from_v1(status, body, caller);
            let mut e = OsbError::new(
                status,
                "DIFFERENTLY::COMMAND_OWNER_UNAVAILABLE",
                // `/v1`'s message already says to retry.
                format!("command {cmd}: {}", v1.message),
            );
            e.retry_after = Some("1".into());
            e
        }
        _ => OsbError::from_v1(status, body, caller),
    }
}

fn processes(sandbox: &str) -> String {
    format!("/v1/sandboxes/{}/processes", q(sandbox))
}

/// Starts `body` (a `/v1` `StartProcess`) in `sandbox`.
pub async fn start(f: &Facade, caller: &Caller, sandbox: &str, body: &Value) -> OsbResult<Process> {
    let (_, v) =
        f.v1.json(caller, Method::POST, &processes(sandbox), Some(body))
            .await?;
    serde_json::from_value(v).map_err(|e| OsbError::internal(format!("started process: {e}")))
}

/// One `/v1` call on command `cmd` (`suffix` after its pid), with the command's errors.
async fn call(
    f: &Facade,
    caller: &Caller,
    sandbox: &str,
    cmd: &str,
    method: Method,
    suffix: &str,
    accept: Option<&'static str>,
) -> OsbResult<axum::response::Response> {
    let pid = pid_of(cmd).ok_or_else(|| command_not_found(cmd))?;
    let uri = format!("{}/{pid}{suffix}", processes(sandbox));
    let extra: Vec<_> = accept
        .map(|a| (header::ACCEPT, HeaderValue::from_static(a)))
        .into_iter()
        .collect();
    let resp =
        f.v1.call(caller, method, &uri, &extra, Body::empty())
            .await?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let bytes = read_all(resp).await?;
    Err(command_error(cmd, status, &bytes, caller))
}

/// The process of command `cmd`.
pub async fn get(f: &Facade, caller: &Caller, sandbox: &str, cmd: &str) -> OsbResult<Process> {
    let resp = call(f, caller, sandbox, cmd, Method::GET, "", None).await?;
    let bytes = read_all(resp).await?;
    serde_json::from_slice(&bytes).map_err(|e| OsbError::internal(format!("process {cmd}: {e}")))
}

/// Interrupts command `cmd`: `KILL` (an ended one is fine).
pub async fn interrupt(f: &Facade, caller: &Caller, sandbox: &str, cmd: &str) -> OsbResult<()> {
    call(f, caller, sandbox, cmd, Method::DELETE, "", None).await?;
    Ok(())
}

/// Command `cmd`'s output stream (the `/v1` binary frames) from byte offset `from`;
/// `follow` keeps it open until the command ends.
pub async fn output(
    f: &Facade,
    caller: &Caller,
    sandbox: &str,
    cmd: &str,
    from: u64,
    follow: bool,
) -> OsbResult<Body> {
    let suffix = format!("/output?from={from}&follow={follow}");
    let resp = call(
        f,
        caller,
        sandbox,
        cmd,
        Method::GET,
        &suffix,
        Some(MEDIA_TYPE),
    )
    .await?;
    Ok(resp.into_body())
}

/// Up to `max` bytes of output (stdout and stderr in order) from a frame stream; the rest of
/// the stream is dropped unread.
async fn read_frames(body: Body, max: usize) -> Result<Vec<u8>, String> {
    let mut dec = FrameDecoder::default();
    let mut data = body.into_data_stream();
    let mut out = Vec::new();
    while out.len() < max {
        let Some(chunk) = data.next().await else {
            break;
        };
        let chunk = chunk.map_err(|e| format!("output stream: {e}"))?;
        for fr in dec
            .push(&chunk)
            .map_err(|e| format!("output frames: {e}"))?
        {
            if matches!(fr.kind, FrameType::Stdout | FrameType::Stderr) {
                let room = max - out.len().min(max);
                out.extend_from_slice(&fr.payload[..fr.payload.len().min(room)]);
            }
        }
    }
    Ok(out)
}

/// One page of command `cmd`'s output from byte offset `from` (an offset older than the
/// output kept starts at the oldest kept byte, one past the end is the end), at most
/// [`LOG_PAGE_BYTES`], and the offset after it.
///
/// The frame stream does not say where it starts, so the process is read first and the
/// page asked from an offset inside what is kept; a page of a running command that wrote
/// more than the kept output meanwhile (its start was dropped under it) is read again.
pub async fn logs_page(
    f: &Facade,
    caller: &Caller,
    sandbox: &str,
    cmd: &str,
    from: u64,
) -> OsbResult<(Vec<u8>, u64)> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let before = get(f, caller, sandbox, cmd).await?;
        let start = from.clamp(before.output_dropped, before.output_bytes);
        let body = output(f, caller, sandbox, cmd, start, false).await?;
        let page = read_frames(body, LOG_PAGE_BYTES)
            .await
            .map_err(OsbError::internal)?;
        let settled = before.status != ProcessStatus::Running
            || get(f, caller, sandbox, cmd).await?.output_dropped <= start;
        if settled || attempt >= PAGE_ATTEMPTS {
            let next = start + page.len() as u64;
            return Ok((page, next));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(command: &[&str], tag: Option<&str>) -> Process {
        Process {
            pid: 1_048_577,
            sandbox_id: "sbx_01jd0000000000000000000000".into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            cwd: None,
            tag: tag.map(str::to_owned),
            pty: false,
            stdin_open: false,
            status: ProcessStatus::Running,
            exit_code: None,
            error: None,
            started_at: chrono::Utc::now(),
            ended_at: None,
            output_bytes: 0,
            output_dropped: 0,
        }
    }

    #[test]
    fn ids_are_pids_and_nothing_else_passes() {
        assert_eq!(pid_of(&command_id(1_048_577)), Some(1_048_577));
        assert_eq!(pid_of("4294967295"), Some(u32::MAX));
        for bad in [
            "",
            "+1",
            "-1",
            "4294967296",
            "01jd0000000000000000000000-01jd0000000000000000000001",
            "1.%3E",
            "１",
        ] {
            assert_eq!(pid_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn endings_read_as_execd_writes_them() {
        assert_eq!(execd_ending(0), (0, None));
        assert_eq!(execd_ending(5), (5, Some("exit status 5".into())));
        assert_eq!(execd_ending(124), (124, Some("exit status 124".into())));
        assert_eq!(execd_ending(137), (-1, Some("signal: killed".into())));
        assert_eq!(execd_ending(143), (-1, Some("signal: terminated".into())));
    }

    #[test]
    fn status_shows_the_command_as_given() {
        let mut p = process(&["/bin/sh", "-c", "echo $K"], Some(TAG_COMMAND));
        let s = status_of(&p);
        assert_eq!(s["id"], "1048577");
        assert_eq!(s["content"], "echo $K");
        assert_eq!(
            (s["running"].clone(), s["exit_code"].clone()),
            (json!(true), Value::Null)
        );
        p.status = ProcessStatus::Exited;
        p.exit_code = Some(137);
        let s = status_of(&p);
        assert_eq!(
            (s["running"].clone(), s["exit_code"].clone()),
            (json!(false), json!(-1))
        );
        assert_eq!(s["error"], "signal: killed");
        let argv = process(&["/bin/sh", "-c", "x"], Some(TAG_ARGV));
        assert_eq!(content_of(&argv), "/bin/sh -c x");
        let run = process(
            &["/bin/sh", "-c", "script", "s", "sid", "", "cd x"],
            Some(TAG_SESSION),
        );
        assert_eq!(content_of(&run), "cd x");
        let mut failed = process(&["x"], None);
        failed.status = ProcessStatus::Failed;
        failed.error = Some("backend gone".into());
        let s = status_of(&failed);
        assert_eq!(
            (s["exit_code"].clone(), s["error"].clone()),
            (Value::Null, json!("backend gone"))
        );
    }
}
