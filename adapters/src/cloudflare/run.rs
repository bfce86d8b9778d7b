//! Commands through the bridge's `/exec`. The bridge runs a shell command string and takes
//! no env and no stdin, and its streamed exec ignores `timeout_ms`; so a command goes
//! wrapped in [`script::run`]: the sandbox's env file and the request's variables (staged
//! through the file route, as stdin is: the bridge's SDK logs command lines), coreutils
//! `timeout` as the deadline.
//! The adapter watches the deadline too (a bridge that stops sending must not hold the
//! caller), and kills the command's process group when it stops waiting.

use std::time::{Duration, Instant};

use differently_core::exec::ExecRequest;
use tokio::sync::mpsc;

use super::bridge::{exec_error, Bridge};
use super::sse::Event;
use super::{instances, script};
use crate::exec_output::checked_stdin;
use crate::kit::paths::check_path;
use crate::{AdapterError, ExecEvent, InstanceRef};

/// How long past its timeout the adapter waits for a command's end before answering 124
/// itself (`timeout -k 2` needs up to 2 s to kill a command that ignores TERM).
const GRACE: Duration = Duration::from_secs(4);

/// Exit code of a command that `timeout` had to KILL.
const KILLED: i32 = 137;

/// A name unique within a sandbox, for a run's pid file and staged files.
pub(crate) fn token(prefix: &str) -> String {
    format!("{prefix}-{}", crate::kit::paths::unique())
}

/// Refuses variables a shell cannot export, naming `env`.
pub(crate) fn check_env(
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(), AdapterError> {
    match env.keys().find(|k| !script::valid_env_key(k)) {
        Some(k) => Err(AdapterError::invalid_field(
            "env",
            format!("`{k}` is not a variable name a shell can export"),
        )),
        None => Ok(()),
    }
}

/// Runs `req` in `at`, sending its output to `out`; answers the exit code.
pub(crate) async fn run(
    bridge: &Bridge,
    at: &InstanceRef,
    req: &ExecRequest,
    out: &mpsc::Sender<ExecEvent>,
) -> Result<i32, AdapterError> {
    let stdin = checked_stdin(req)?;
    check_env(&req.env)?;
    instances::ensure(bridge, at).await?;
    let name = &at.backend_ref;
    if let Some(cwd) = &req.cwd {
        check_path("cwd", cwd)?;
        let probe = bridge.run(name, &script::is_dir(cwd)).await?;
        if probe.exit_code != 0 {
            return Err(AdapterError::invalid_field(
                "cwd",
                format!("exec: {cwd} is not a directory in the sandbox"),
            ));
        }
    }
    let run_id = token("run");
    let stdin_name = match stdin {
        Some(bytes) => Some(stage(bridge, name, format!("{run_id}.in"), bytes).await?),
        None => None,
    };
    let env_name = if req.env.is_empty() {
        None
    } else {
        let text = script::env_file(&req.env).into_bytes();
        Some(stage(bridge, name, format!("{run_id}.env"), text).await?)
    };
    let timeout = req.timeout();
    let argv = script::run(
        &req.command,
        &script::RunSpec {
            cwd: req.cwd.as_deref(),
            timeout_seconds: timeout.as_secs().max(1),
            stdin_name: stdin_name.as_deref(),
            env_name: env_name.as_deref(),
            run_id: &run_id,
        },
    );
    let started = Instant::now();
    // Reading waits for the command's end a little past its timeout; output nobody takes
    // is not waited on past the timeout itself (the command is being killed by then).
    let deadline = tokio::time::Instant::now() + timeout + GRACE;
    let send_deadline = tokio::time::Instant::now() + timeout;
    let mut events = bridge.exec(name, &argv, timeout + GRACE).await?;
    loop {
        let ev = tokio::select! {
            biased;
            ev = events.next() => ev?,
            () = tokio::time::sleep_until(deadline) => {
                cancel(bridge, name, &run_id).await;
                return Ok(124);
            }
            () = out.closed() => {
                cancel(bridge, name, &run_id).await;
                return Ok(KILLED);
            }
        };
        let piece = match ev {
            Event::Stdout(b) => ExecEvent::Stdout(b),
            Event::Stderr(b) => ExecEvent::Stderr(b),
            Event::Exit(code) => {
                let timed_out = started.elapsed() >= timeout && matches!(code, 124 | KILLED);
                return Ok(if timed_out { 124 } else { code });
            }
            Event::Error { message, code } => return Err(exec_error(&message, &code)),
        };
        let sent = tokio::select! {
            biased;
            sent = out.send(piece) => sent.is_ok(),
            () = tokio::time::sleep_until(send_deadline) => {
                cancel(bridge, name, &run_id).await;
                return Ok(124);
            }
        };
        if !sent {
            // Nobody reads the output any more: the command is stopped, as if killed (the
            // same when the reader goes away between two pieces, above).
            cancel(bridge, name, &run_id).await;
            return Ok(KILLED);
        }
    }
}

/// Writes `bytes` as staged file `staged` of sandbox `name` and answers its name.
async fn stage(
    bridge: &Bridge,
    name: &str,
    staged: String,
    bytes: Vec<u8>,
) -> Result<String, AdapterError> {
    bridge
        .put_file(name, &format!("{}/{staged}", script::XFER_DIR), bytes)
        .await?;
    Ok(staged)
}

/// Kills the run's process group; best effort (the command's own `timeout` is the backstop).
async fn cancel(bridge: &Bridge, name: &str, run_id: &str) {
    if let Err(e) = bridge.run(name, &script::cancel(run_id)).await {
        tracing::warn!(error = %e, "cloudflare: cancelling a command failed; its timeout ends it");
    }
}
