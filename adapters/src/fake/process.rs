//! The fake's background processes ([`Adapter::process`]), simulated as its exec is: the
//! program's [`plan`] runs (sleeps, then writes its output), except that `cat` started with
//! stdin (`exec.stdin`) echoes each chunk of stdin to stdout as it comes and exits 0 when
//! stdin is closed. A signal ends any of them with 128+n (`INT` 130, `TERM` 143, `KILL` 137,
//! `HUP` 129), `spec.timeout` with 124, and a closed `out` as a streamed exec's reader going
//! away does (a second `exec` ledger line, `cancelled`). A terminal process is the scripted
//! terminal, through the default [`crate::process::by_stream_or_pty`].

use differently_core::process::ProcessSignal;

use crate::go_ahead::GoAhead;
use crate::process::{ProcessInput, ProcessSpec};

use super::*;

/// How a simulated process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Exit(i32),
    /// Nobody reads its output any more.
    Abandoned,
}

impl FakeAdapter {
    /// Runs a simulated background process; see the module docs.
    pub(super) async fn run_process(
        &self,
        at: &InstanceRef,
        spec: &ProcessSpec,
        input: mpsc::Receiver<ProcessInput>,
        out: mpsc::Sender<ExecEvent>,
        go: GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        if spec.pty.is_some() {
            return crate::process::by_stream_or_pty(self, at, spec, input, out, go).await;
        }
        self.require(Capability::ExecStream)?;
        if spec.stdin {
            self.require(Capability::ExecStdin)?;
        }
        go.wait().await?;
        timed_exit(async {
            self.exec_line(at, spec.program(), None).await?;
            Ok(match simulate(spec, input, &out).await {
                Ended::Exit(code) => code,
                Ended::Abandoned => {
                    self.exec_line(at, spec.program(), Some(LedgerOutcome::Cancelled))
                        .await?;
                    128 + ProcessSignal::Kill.number()
                }
            })
        })
        .await
    }
}

/// The program's life: its plan (or `cat`'s echo), cut short by a signal, the timeout or the
/// reader going away.
async fn simulate(
    spec: &ProcessSpec,
    mut input: mpsc::Receiver<ProcessInput>,
    out: &mpsc::Sender<ExecEvent>,
) -> Ended {
    let req = ExecRequest {
        command: spec.command.clone(),
        env: spec.env.clone(),
        cwd: spec.cwd.clone(),
        ..ExecRequest::default()
    };
    let echo = spec.stdin && spec.program() == "cat";
    let plan = plan(&req, Vec::new());
    let run = async {
        if let Some(d) = plan.sleep {
            tokio::time::sleep(d).await;
        }
        emit(&plan, out).await
    };
    tokio::pin!(run);
    let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut input_open = true;
    loop {
        tokio::select! {
            done = &mut run, if !echo => {
                return match done {
                    Ok(()) => Ended::Exit(plan.exit_code),
                    Err(()) => Ended::Abandoned,
                }
            }
            () = sleep_until(deadline) => return Ended::Exit(TIMEOUT_EXIT_CODE),
            () = out.closed() => return Ended::Abandoned,
            msg = input.recv(), if input_open => match msg {
                Some(ProcessInput::Stdin(chunk)) if echo => {
                    if out.send(ExecEvent::Stdout(chunk)).await.is_err() {
                        return Ended::Abandoned;
                    }
                }
                Some(ProcessInput::CloseStdin) if echo => return Ended::Exit(0),
                Some(ProcessInput::Signal(s)) => return Ended::Exit(128 + s.number()),
                // Stdin to a program that does not read it, or a resize without a terminal.
                Some(_) => {}
                None => input_open = false,
            },
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
