//! Background processes at the adapter: one call that runs a program until it ends, taking
//! input (stdin, close, signals, terminal resizes) while it runs and sending its output as it
//! comes. The API's process supervisor holds this call open for as long as the process lives,
//! so the process outlives any client connection.
//!
//! Every adapter gets [`by_stream_or_pty`] for free: a terminal process runs on
//! [`Adapter::pty`], a plain one on [`Adapter::exec_stream_after`] with its stdin empty, and a
//! signal ends it by cancelling the call (what the backend does on cancel is what the signal
//! does). Adapters that can feed a running command's stdin ([`Capability::ExecStdin`]) or
//! deliver real signals implement [`Adapter::process`] themselves.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use differently_core::exec::{ExecRequest, MAX_EXEC_TIMEOUT_SECONDS, TIMEOUT_EXIT_CODE};
use differently_core::process::ProcessSignal;
use tokio::sync::mpsc;

use crate::contract::{Adapter, ExecEvent, ExecExit, InstanceRef, PtyInput, PtyRequest, PtySize};
use crate::go_ahead::GoAhead;
use crate::AdapterError;

/// What a background process is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Program and arguments; never empty.
    pub command: Vec<String>,
    /// Added to the sandbox's environment (these win).
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `None` is the sandbox's default.
    pub cwd: Option<String>,
    /// Killed after this long, ending with exit code 124; `None`: no limit of its own.
    pub timeout: Option<Duration>,
    /// Runs on a terminal of this size instead of pipes.
    pub pty: Option<PtySize>,
    /// Stdin stays open for [`ProcessInput::Stdin`]; otherwise the program reads an empty one.
    pub stdin: bool,
}

impl ProcessSpec {
    /// The program's name, for logs and audit (never its arguments).
    pub fn program(&self) -> &str {
        self.command.first().map_or("", String::as_str)
    }
}

/// What a running process is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessInput {
    /// Bytes for its stdin (or typed on its terminal).
    Stdin(Bytes),
    /// End of input: its stdin is closed (on a terminal, an end-of-file character is typed).
    CloseStdin,
    Signal(ProcessSignal),
    /// A new terminal size (terminal processes only; ignored otherwise).
    Resize(PtySize),
}

/// How long a cancelled call may take to notice and return before it is dropped.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// The keyboard's end-of-file (^D): how a terminal's program learns its input ended.
const EOT: u8 = 0x04;

/// [`Adapter::process`] for an adapter with no process support of its own: see the module
/// documentation. A plain process asking for stdin is refused ([`Capability::ExecStdin`] is
/// what promises it), as is a terminal on an adapter without one.
///
/// [`Capability::ExecStdin`]: crate::Capability::ExecStdin
pub async fn by_stream_or_pty<A: Adapter + ?Sized>(
    adapter: &A,
    at: &InstanceRef,
    spec: &ProcessSpec,
    input: mpsc::Receiver<ProcessInput>,
    out: mpsc::Sender<ExecEvent>,
    go: GoAhead,
) -> Result<ExecExit, AdapterError> {
    match spec.pty {
        Some(size) => on_terminal(adapter, at, spec, size, input, out, go).await,
        None if spec.stdin => Err(AdapterError::Unsupported("exec.stdin".into())),
        None => on_stream(adapter, at, spec, input, out, go).await,
    }
}

/// A plain process over a streamed exec: a signal (or the timeout) cancels the call.
async fn on_stream<A: Adapter + ?Sized>(
    adapter: &A,
    at: &InstanceRef,
    spec: &ProcessSpec,
    mut input: mpsc::Receiver<ProcessInput>,
    out: mpsc::Sender<ExecEvent>,
    go: GoAhead,
) -> Result<ExecExit, AdapterError> {
    let req = ExecRequest {
        command: spec.command.clone(),
        env: spec.env.clone(),
        cwd: spec.cwd.clone(),
        timeout_seconds: Some(
            spec.timeout
                .map_or(MAX_EXEC_TIMEOUT_SECONDS, |t| t.as_secs().max(1)),
        ),
        ..ExecRequest::default()
    };
    let (tx, mut rx) = mpsc::channel::<ExecEvent>(16);
    let started = tokio::time::Instant::now();
    let call = adapter.exec_stream_after(at, &req, tx, go);
    tokio::pin!(call);
    // Set once the process is being ended from here: the exit code it then gets.
    let mut ended_by: Option<i32> = None;
    let mut input_open = true;
    let mut output_open = true;
    let grace = tokio::time::sleep(Duration::from_secs(365 * 24 * 3600));
    tokio::pin!(grace);
    let result = loop {
        tokio::select! {
            result = &mut call => break result,
            event = rx.recv(), if output_open && ended_by.is_none() => match event {
                Some(event) => {
                    if out.send(event).await.is_err() {
                        // Nobody reads the output any more: end the process, as a hang-up.
                        ended_by = Some(128 + ProcessSignal::Hup.number());
                    }
                }
                None => output_open = false, // the call is ending; its result comes next
            },
            msg = input.recv(), if input_open && ended_by.is_none() => match msg {
                Some(ProcessInput::Signal(s)) => ended_by = Some(128 + s.number()),
                // Stdin is empty and there is no terminal: nothing to do.
                Some(ProcessInput::Stdin(_) | ProcessInput::CloseStdin | ProcessInput::Resize(_)) => {}
                None => input_open = false,
            },
            // A call that does not notice its output closed (a quiet command) is dropped.
            _ = &mut grace, if ended_by.is_some() => break Err(AdapterError::Unsupported("cancel".into())),
        }
        if ended_by.is_some() && !rx.is_closed() {
            // Closing the output cancels the command on the backend (the exec.stream contract).
            rx.close();
            grace
                .as_mut()
                .reset(tokio::time::Instant::now() + CANCEL_GRACE);
        }
    };
    // Output the backend sent before it ended, still queued here.
    if ended_by.is_none() {
        while let Ok(event) = rx.try_recv() {
            let _ = out.send(event).await;
        }
    }
    let elapsed = started.elapsed().as_millis() as u64;
    match (ended_by, result) {
        (Some(code), _) => Ok(ExecExit {
            exit_code: code,
            duration_ms: elapsed,
        }),
        (None, result) => result,
    }
}

/// A terminal process over [`Adapter::pty`]; its timeout hangs the terminal up.
async fn on_terminal<A: Adapter + ?Sized>(
    adapter: &A,
    at: &InstanceRef,
    spec: &ProcessSpec,
    size: PtySize,
    mut input: mpsc::Receiver<ProcessInput>,
    out: mpsc::Sender<ExecEvent>,
    go: GoAhead,
) -> Result<ExecExit, AdapterError> {
    go.wait().await?;
    let req = PtyRequest {
        command: spec.command.clone(),
        env: spec.env.clone(),
        cwd: spec.cwd.clone(),
        size,
    };
    let (keys, key_rx) = mpsc::channel::<PtyInput>(16);
    let (screen_tx, mut screen) = mpsc::channel::<Bytes>(16);
    let started = tokio::time::Instant::now();
    let call = adapter.pty(at, &req, key_rx, screen_tx);
    tokio::pin!(call);
    let deadline = spec.timeout.map(|t| started + t);
    let mut keys = Some(keys);
    let mut timed_out = false;
    let mut input_open = true;
    let mut screen_open = true;
    // When the terminal was hung up: a call that has not ended CANCEL_GRACE later is dropped.
    let mut hung_up_at: Option<tokio::time::Instant> = None;
    let result = loop {
        tokio::select! {
            result = &mut call => break result,
            bytes = screen.recv(), if screen_open => match bytes {
                Some(bytes) => {
                    if out.send(ExecEvent::Stdout(bytes)).await.is_err() && keys.is_some() {
                        keys = None; // hang the terminal up
                        hung_up_at = Some(tokio::time::Instant::now());
                    }
                }
                None => screen_open = false,
            },
            msg = input.recv(), if input_open => {
                let key = match msg {
                    Some(ProcessInput::Stdin(b)) => Some(PtyInput::Stdin(b)),
                    Some(ProcessInput::CloseStdin) => Some(PtyInput::Stdin(Bytes::from_static(&[EOT]))),
                    Some(ProcessInput::Signal(s)) => Some(PtyInput::Signal(s)),
                    Some(ProcessInput::Resize(size)) => Some(PtyInput::Resize(size)),
                    None => { input_open = false; None }
                };
                if let (Some(key), Some(k)) = (key, &keys) {
                    let _ = k.send(key).await;
                }
            }
            _ = sleep_until(deadline), if !timed_out && deadline.is_some() => {
                timed_out = true;
                keys = None; // hang up: the program gets SIGHUP and is killed soon after
                hung_up_at = hung_up_at.or(Some(tokio::time::Instant::now()));
            }
            // A terminal that does not notice its hang-up (the backend's call never ends).
            _ = sleep_until(hung_up_at.map(|t| t + CANCEL_GRACE)), if hung_up_at.is_some() => {
                break Ok(ExecExit {
                    exit_code: 128 + ProcessSignal::Hup.number(),
                    duration_ms: started.elapsed().as_millis() as u64,
                });
            }
        }
    };
    while let Ok(bytes) = screen.try_recv() {
        let _ = out.send(ExecEvent::Stdout(bytes)).await;
    }
    if timed_out {
        return Ok(ExecExit {
            exit_code: TIMEOUT_EXIT_CODE,
            duration_ms: started.elapsed().as_millis() as u64,
        });
    }
    result
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
