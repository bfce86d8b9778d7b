//! Starting a process: the data plane's one walk (record staged, call prepared beside it,
//! command let go, record durable before the answer), then a task of this API process that
//! holds the adapter's call for the process's life.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_adapters::process::ProcessSpec;
use differently_adapters::{AdapterError, ExecEvent, ExecExit};
use differently_core::exec::MAX_EXEC_TIMEOUT_SECONDS;
use differently_core::process::{Process, ProcessSignal, StartProcess};
use differently_core::{ErrorCode, SandboxId};
use serde_json::json;
use tokio::sync::mpsc;

use super::entry::{Ending, Entry, Stream};
use super::follow::Attached;
use super::registry::Full;
use crate::auth::Principal;
use crate::data_plane::call_events::{CallEvents, ExecEvents};
use crate::data_plane::{DataCall, Detached};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Input messages queued between the API and the adapter's call.
const INPUT_QUEUE: usize = 16;
/// Output chunks queued between the adapter's call and the process's buffer.
const OUTPUT_QUEUE: usize = 16;
/// How often a running process counts as the sandbox's activity (the idle sweep needs it
/// within seconds of its timeout, which is at least a minute).
const ACTIVITY_EVERY: Duration = Duration::from_secs(20);

/// The capability a start needs of the pool.
fn capability(req: &StartProcess) -> &'static str {
    if req.pty.is_some() {
        "exec.pty"
    } else if req.stdin {
        "exec.stdin"
    } else {
        "exec.stream"
    }
}

/// Starts `req` in sandbox `raw_id` (as the path gave it) for `principal`, whose
/// `sandboxes:exec` scope the route has checked; answers once the command was sent and its
/// audit record is durable, with the process to follow in place.
pub(crate) async fn start(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    req: StartProcess,
) -> ApiResult<(Process, Attached)> {
    req.validate()
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    let registry = state.processes.registry(state).await?;
    let pid = registry.admit(raw_id).map_err(|e| match e {
        Full::Sandbox(_) | Full::Process => ApiError::new(ErrorCode::QuotaExceeded, e.to_string()),
    })?;
    let detail = json!({ "program": req.program(), "pid": pid });
    let call = DataCall::new(
        state,
        principal,
        raw_id,
        capability(&req),
        "sandbox.process.start",
        detail,
    );
    let timeout = req.timeout_seconds.map(Duration::from_secs);
    // The channels of the attempt that was let go (a refused one is dropped unsent).
    let mut wiring = None;
    let staged = call
        .start(|target, go| {
            let spec = ProcessSpec {
                command: req.command.clone(),
                env: crate::data_plane::running_rows::merged_env(&target.env, req.env.clone()),
                cwd: req.cwd.clone(),
                timeout,
                pty: req.pty,
                stdin: req.stdin,
            };
            let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
            let (out_tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
            wiring = Some((in_tx, out_rx));
            let adapter = target.pool.adapter.clone();
            let at = target.at.clone();
            Ok(async move { adapter.process(&at, &spec, in_rx, out_tx, go).await })
        })
        .await?;
    let (input, output) =
        wiring.ok_or_else(|| ApiError::internal("process: started without its channels"))?;
    let sandbox = staged.target().at.sandbox_id.clone();
    let events = CallEvents::new(state, principal, staged.record(), &sandbox);
    let call = staged.detach().await?;
    let view = Process::running(pid, sandbox.as_str(), &req, Utc::now());
    let entry = Entry::new(sandbox.clone(), view, Some(input));
    registry.insert(entry.clone());
    tracing::info!(sandbox = %sandbox, pid, program = req.program(), "process started");
    let exec_events = ExecEvents::start(
        events,
        &req.command,
        timeout.unwrap_or(Duration::from_secs(MAX_EXEC_TIMEOUT_SECONDS)),
    );
    let view = entry.view();
    tokio::spawn(supervise(
        state.clone(),
        entry.clone(),
        call,
        output,
        exec_events,
    ));
    Ok((view, Attached(entry)))
}

/// Holds the adapter's call until the process ends: its output into the entry, the
/// sandbox's activity while it runs, its public events, and its end.
async fn supervise<C>(
    state: AppState,
    entry: Arc<Entry>,
    call: Detached<C>,
    mut output: mpsc::Receiver<ExecEvent>,
    exec_events: ExecEvents,
) where
    C: Future<Output = Result<ExecExit, AdapterError>>,
{
    let sandbox: SandboxId = entry.sandbox.clone();
    let pump = async {
        while let Some(event) = output.recv().await {
            match event {
                ExecEvent::Stdout(b) => entry.append(Stream::Stdout, b),
                ExecEvent::Stderr(b) => entry.append(Stream::Stderr, b),
            }
        }
    };
    let busy = async {
        let mut every = tokio::time::interval(ACTIVITY_EVERY);
        loop {
            every.tick().await;
            state.activity.record(&state.store, &sandbox, Utc::now());
        }
    };
    let run = async {
        let (result, ()) = tokio::join!(call, pump);
        result
    };
    let started = std::time::Instant::now();
    let result = exec_events
        .around(async {
            tokio::select! {
                r = run => r,
                () = busy => unreachable_busy(),
                // Dropping the call (and the pump) ends the process on the backend.
                () = entry.kill.notified() => Ok(ExecExit {
                    exit_code: 128 + ProcessSignal::Kill.number(),
                    duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                }),
            }
        })
        .await;
    exec_events.finish(result.as_ref().ok().map(|x| (x.exit_code, x.duration_ms)));
    let ending = match result {
        Ok(exit) => Ending::Exit {
            exit_code: exit.exit_code,
            duration_ms: exit.duration_ms,
        },
        Err(e) => {
            let api = ApiError::from(e);
            tracing::info!(sandbox = %sandbox, pid = entry.pid, code = ?api.code, "process failed");
            Ending::Error {
                code: api.code.as_str().to_owned(),
                message: api.message,
            }
        }
    };
    state.activity.record(&state.store, &sandbox, Utc::now());
    entry.end(ending);
}

/// The activity loop never ends; this keeps the `select!` arms' types equal.
fn unreachable_busy() -> Result<ExecExit, AdapterError> {
    Err(AdapterError::permanent("the activity loop ended"))
}
