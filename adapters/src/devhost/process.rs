//! A devhost background process ([`Adapter::process`]): a plain command whose stdin is a pipe
//! fed while it runs, signalled through its process group, ended by its own timeout (124) or
//! by its output's reader going away. A terminal process runs on the PTY code through the
//! default [`crate::process::by_stream_or_pty`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use super::*;
use crate::go_ahead::GoAhead;
use crate::process::{ProcessInput, ProcessSpec};

/// Bytes of stdin queued for a program that has not read them yet before its input is read
/// no further: a program that does not read its stdin then holds the writer back (the
/// backpressure `POST …/stdin` promises), and a signal behind that input waits for it.
const STDIN_QUEUE: usize = 4 * 1024 * 1024;

/// How the loop watching a process ended.
enum End {
    Exited(io::Result<ExitStatus>),
    TimedOut,
    /// Nobody reads the output any more.
    Abandoned,
}

impl DevhostAdapter {
    /// Runs a background process; see the module docs and [`Adapter::process`].
    pub(super) async fn run_process(
        &self,
        at: &InstanceRef,
        spec: &ProcessSpec,
        mut input: mpsc::Receiver<ProcessInput>,
        out: mpsc::Sender<ExecEvent>,
        go: GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        if spec.pty.is_some() {
            return crate::process::by_stream_or_pty(self, at, spec, input, out, go).await;
        }
        // Checked before the go-ahead (nothing runs), so a refusal costs no audit wait.
        let (sandbox_dir, tag, cwd) = self.ready_to_run(at, spec.cwd.as_deref()).await?;
        let Some((program, args)) = spec.command.split_first() else {
            return Err(AdapterError::invalid_field("command", "command is empty"));
        };
        go.wait().await?;
        let started = Instant::now();
        let env = self.command_env(&sandbox_dir, &tag, &spec.env);
        let stdin = if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let (mut child, mut guard) = match self
            .spawn_group(at, &sandbox_dir, &cwd, program, args, &env, stdin)
            .await?
        {
            Ok(spawned) => spawned,
            Err((code, why)) => {
                let msg = format!("devhost: {program}: {why}\n");
                let _ = out.send(ExecEvent::Stderr(Bytes::from(msg))).await;
                return Ok(ExecExit {
                    exit_code: code,
                    duration_ms: millis(started.elapsed()),
                });
            }
        };
        let pgid = child.id();

        // The pipe is written by a task of its own, so a program that does not read its
        // stdin never keeps a signal (which comes on the same input) from being delivered,
        // until STDIN_QUEUE bytes wait for it: input is then read no further (backpressure).
        let queued = Arc::new(AtomicUsize::new(0));
        let drained = Arc::new(Notify::new());
        let mut stdin_tx = child
            .stdin
            .take()
            .map(|pipe| feed_stdin(pipe, queued.clone(), drained.clone()));
        let mut input_open = true;

        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(tokio::spawn(pump(pipe, out.clone(), ExecEvent::Stdout)));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(tokio::spawn(pump(pipe, out.clone(), ExecEvent::Stderr)));
        }

        let deadline = spec.timeout.map(|t| tokio::time::Instant::now() + t);
        let end = loop {
            tokio::select! {
                status = child.wait() => break End::Exited(status),
                () = sleep_until(deadline) => break End::TimedOut,
                () = out.closed() => break End::Abandoned,
                () = drained.notified(), if stdin_tx.is_some() && full(&queued) => {}
                msg = input.recv(), if input_open && !(stdin_tx.is_some() && full(&queued)) => match msg {
                    Some(ProcessInput::Stdin(chunk)) => {
                        if let Some(tx) = &stdin_tx {
                            queued.fetch_add(chunk.len(), Ordering::AcqRel);
                            if tx.send(chunk).is_err() {
                                // The program closed its stdin or ended: input is dropped.
                                stdin_tx = None;
                            }
                        }
                    }
                    // Queued chunks are still written; then the pipe closes.
                    Some(ProcessInput::CloseStdin) => stdin_tx = None,
                    Some(ProcessInput::Signal(s)) => {
                        if let Some(pgid) = pgid {
                            local_pty::signal_group(pgid, s);
                        }
                    }
                    Some(ProcessInput::Resize(_)) => {}
                    None => input_open = false,
                },
            }
        };
        drop(stdin_tx);
        let exit_code = match end {
            End::Exited(status) => exit_code(status.map_err(|e| io_err("wait", e))?),
            End::TimedOut | End::Abandoned => {
                match pgid {
                    Some(pgid) => {
                        local_pty::signal_group(pgid, PtySignal::Kill);
                    }
                    None => {
                        let _ = child.start_kill();
                    }
                }
                let _ = tokio::time::timeout(DRAIN_GRACE, child.wait()).await;
                if matches!(end, End::TimedOut) {
                    TIMEOUT_EXIT_CODE
                } else {
                    tracing::info!(sandbox = %at.sandbox_id, "devhost: process abandoned by its reader");
                    128 + PtySignal::Kill.number()
                }
            }
        };
        // Output written just before the end is still in the pipes. Whatever of its group
        // still holds them open is killed with it: a child the signal missed (a signal sent
        // while bubblewrap was still starting reaches it before the program exists, and the
        // sandbox's init ignores it), or a background job left writing to its output.
        if !drain(&mut readers).await {
            if let Some(pgid) = pgid {
                local_pty::signal_group(pgid, PtySignal::Kill);
            }
            drain(&mut readers).await;
        }
        // A process that left the group and keeps the pipes open is not waited for.
        for r in &readers {
            r.abort();
        }
        guard.armed = false;
        Ok(ExecExit {
            exit_code,
            duration_ms: millis(started.elapsed()),
        })
    }
}

/// Waits up to [`DRAIN_GRACE`] for the output readers to reach the end of their pipes;
/// false if one is still open.
async fn drain(readers: &mut Vec<tokio::task::JoinHandle<()>>) -> bool {
    tokio::time::timeout(DRAIN_GRACE, async {
        while let Some(r) = readers.last_mut() {
            let _ = r.await;
            readers.pop();
        }
    })
    .await
    .is_ok()
}

/// Whether as much stdin waits for the program as is queued at most.
fn full(queued: &AtomicUsize) -> bool {
    queued.load(Ordering::Acquire) >= STDIN_QUEUE
}

/// Starts the task writing queued chunks to the program's stdin, in order; dropping the
/// returned sender is end of input (the pipe closes once the queue is written). `queued`
/// counts the bytes not yet written; `drained` is told each time it shrinks.
fn feed_stdin(
    mut pipe: tokio::process::ChildStdin,
    queued: Arc<AtomicUsize>,
    drained: Arc<Notify>,
) -> mpsc::UnboundedSender<Bytes> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        while let Some(chunk) = rx.recv().await {
            let written = pipe.write_all(&chunk).await.is_ok();
            queued.fetch_sub(chunk.len(), Ordering::AcqRel);
            if !written {
                // The program closed its stdin or ended: what is queued has nowhere to go.
                drop(rx);
                queued.store(0, Ordering::Release);
                drained.notify_one();
                return;
            }
            drained.notify_one();
        }
        let _ = pipe.shutdown().await;
    });
    tx
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
