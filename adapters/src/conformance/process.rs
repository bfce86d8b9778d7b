//! Background processes ([`Adapter::process`]): output and exit code, a signal, the timeout,
//! stdin fed while it runs (`exec.stdin`, or its refusal), and a terminal process
//! (`exec.pty`). An adapter without a `process` of its own is checked through the default
//! ([`crate::process::by_stream_or_pty`]), so these hold its cancel on `exec.stream` too.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_core::process::ProcessSignal;
use tokio::sync::{mpsc, watch};

use super::support::{expect_eq, kind, Ctx, Programs};
use crate::go_ahead::GoAhead;
use crate::process::{ProcessInput, ProcessSpec};
use crate::{Adapter, AdapterError, ExecEvent, ExecExit, InstanceRef, PtySize};

/// Longest a check waits for output it expects.
const OUTPUT_WAIT: Duration = Duration::from_secs(30);

fn spec(command: &[&str]) -> ProcessSpec {
    ProcessSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        timeout: Some(Duration::from_secs(30)),
        pty: None,
        stdin: false,
    }
}

/// What a process wrote, and how its call ended.
struct Ran {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Result<ExecExit, AdapterError>,
}

impl Ran {
    fn exit_code(&self) -> Result<i32, String> {
        match &self.exit {
            Ok(e) => Ok(e.exit_code),
            Err(e) => Err(format!("process failed: {} ({e})", kind(e))),
        }
    }
}

/// Runs `spec` while `drive` feeds it (given its input and a view of all output so far);
/// answers what it wrote and how it ended, or `drive`'s complaint.
async fn run<F, Fut>(
    a: &dyn Adapter,
    at: &InstanceRef,
    spec: &ProcessSpec,
    drive: F,
) -> Result<Ran, String>
where
    F: FnOnce(mpsc::Sender<ProcessInput>, watch::Receiver<Vec<u8>>) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let (input, input_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel::<ExecEvent>(8);
    let (seen_tx, seen) = watch::channel(Vec::new());
    let call = a.process(at, spec, input_rx, out_tx, GoAhead::now());
    let collect = async move {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(ev) = out_rx.recv().await {
            let bytes = match &ev {
                ExecEvent::Stdout(b) => {
                    stdout.extend_from_slice(b);
                    b
                }
                ExecEvent::Stderr(b) => {
                    stderr.extend_from_slice(b);
                    b
                }
            };
            seen_tx.send_modify(|all| all.extend_from_slice(bytes));
        }
        (stdout, stderr)
    };
    let (exit, (stdout, stderr), driven) = tokio::join!(call, collect, drive(input, seen));
    if let Err(complaint) = driven {
        return Err(match &exit {
            Err(e) => format!("{complaint}; the process failed: {} ({e})", kind(e)),
            Ok(x) => format!("{complaint}; it exited {}", x.exit_code),
        });
    }
    Ok(Ran {
        stdout,
        stderr,
        exit,
    })
}

/// Waits until the output so far holds `needle` at least `times` times.
async fn wait_for(
    seen: &mut watch::Receiver<Vec<u8>>,
    needle: &str,
    times: usize,
) -> Result<(), String> {
    let found = |all: &[u8]| String::from_utf8_lossy(all).matches(needle).count() >= times;
    let waited = tokio::time::timeout(OUTPUT_WAIT, async {
        loop {
            if found(&seen.borrow_and_update()) {
                return Ok(());
            }
            if seen.changed().await.is_err() {
                return Err(format!(
                    "the output ended without {needle:?} {times} time(s): {:?}",
                    String::from_utf8_lossy(&seen.borrow())
                ));
            }
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        Err(format!(
            "no {needle:?} {times} time(s) in the output within {} s",
            OUTPUT_WAIT.as_secs()
        ))
    })
}

async fn send(input: &mpsc::Sender<ProcessInput>, msg: ProcessInput) -> Result<(), String> {
    input
        .send(msg)
        .await
        .map_err(|_| "the process stopped taking input while it ran".to_owned())
}

/// A plain process's output arrives and its exit code is kept.
pub(super) async fn output(cx: &Ctx<'_>, p: &Programs) -> Result<String, String> {
    let ran = run(
        cx.a,
        &cx.at,
        &spec(&["echo", "conformance-process"]),
        |_, _| async { Ok(()) },
    )
    .await?;
    expect_eq("exit code", 0, ran.exit_code()?)?;
    expect_eq(
        "stdout",
        "conformance-process\n",
        &*String::from_utf8_lossy(&ran.stdout),
    )?;
    let command = (p.exit)(5);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let ran = run(cx.a, &cx.at, &spec(&command), |_, _| async { Ok(()) }).await?;
    expect_eq("exit code of a process exiting 5", 5, ran.exit_code()?)?;
    Ok("output through, exit codes 0 and 5 kept".to_owned())
}

/// `TERM` ends a quiet `sleep` with 143, long before it would have ended.
pub(super) async fn signal(cx: &Ctx<'_>) -> Result<String, String> {
    let started = Instant::now();
    let ran = run(
        cx.a,
        &cx.at,
        &spec(&["sleep", "30"]),
        |input, _| async move { send(&input, ProcessInput::Signal(ProcessSignal::Term)).await },
    )
    .await?;
    expect_eq("exit code after TERM", 143, ran.exit_code()?)?;
    let took = started.elapsed();
    if took > Duration::from_secs(20) {
        return Err(format!(
            "`sleep 30` ended {} s after TERM: the signal did not end it",
            took.as_secs()
        ));
    }
    let note = if took >= Duration::from_millis(4500) {
        // The default `process` drops a cancelled stream that has not ended 5 s later.
        " (the stream did not end on its cancel: dropped after the grace; the backend may \
         still run the command)"
    } else {
        ""
    };
    Ok(format!("exit 143 after {} ms{note}", took.as_millis()))
}

/// A process past its own timeout ends with 124.
pub(super) async fn timeout(cx: &Ctx<'_>) -> Result<String, String> {
    let mut s = spec(&["sleep", "10"]);
    s.timeout = Some(Duration::from_secs(1));
    let ran = run(cx.a, &cx.at, &s, |_, _| async { Ok(()) }).await?;
    expect_eq("exit code past the timeout", 124, ran.exit_code()?)?;
    Ok("exit 124".to_owned())
}

/// `cat` echoes stdin fed while it runs, and exits 0 once stdin is closed. (`exec.stdin`)
pub(super) async fn stdin(cx: &Ctx<'_>) -> Result<String, String> {
    let mut s = spec(&["cat"]);
    s.stdin = true;
    let ran = run(cx.a, &cx.at, &s, |input, mut seen| async move {
        send(&input, ProcessInput::Stdin(Bytes::from_static(b"first\n"))).await?;
        // Echoed while it runs, not only at the end.
        wait_for(&mut seen, "first", 1).await?;
        send(&input, ProcessInput::Stdin(Bytes::from_static(b"second\n"))).await?;
        send(&input, ProcessInput::CloseStdin).await
    })
    .await?;
    expect_eq("exit code after stdin closed", 0, ran.exit_code()?)?;
    expect_eq(
        "stdout",
        "first\nsecond\n",
        &*String::from_utf8_lossy(&ran.stdout),
    )?;
    expect_eq("stderr", 0, ran.stderr.len())?;
    Ok("echoed as fed, exit 0 on close".to_owned())
}

/// Without `exec.stdin`, a process asking for stdin is refused as unsupported.
pub(super) async fn stdin_refused(cx: &Ctx<'_>) -> Result<String, String> {
    let mut s = spec(&["cat"]);
    s.stdin = true;
    let ran = run(cx.a, &cx.at, &s, |_, _| async { Ok(()) }).await?;
    match ran.exit {
        Err(AdapterError::Unsupported(_)) => {
            Ok("undeclared exec.stdin: unsupported_operation".into())
        }
        Err(e) => Err(format!(
            "undeclared exec.stdin: expected unsupported_operation, got {} ({e})",
            kind(&e)
        )),
        Ok(exit) => Err(format!(
            "undeclared exec.stdin: expected unsupported_operation, got exit {}",
            exit.exit_code
        )),
    }
}

/// A shell on a terminal: a typed line runs (echoed, then its output), and closing stdin
/// (end of input on an empty line) ends it with 0. (`exec.pty`)
pub(super) async fn terminal(cx: &Ctx<'_>) -> Result<String, String> {
    let mut s = spec(&["sh"]);
    s.pty = Some(PtySize { cols: 80, rows: 24 });
    s.stdin = true;
    let ran = run(cx.a, &cx.at, &s, |input, mut seen| async move {
        send(
            &input,
            ProcessInput::Stdin(Bytes::from_static(b"echo conformance-pty\n")),
        )
        .await?;
        // Once as typed (the terminal's echo), once as the command's output.
        wait_for(&mut seen, "conformance-pty", 2).await?;
        send(&input, ProcessInput::CloseStdin).await
    })
    .await?;
    expect_eq("exit code after end of input", 0, ran.exit_code()?)?;
    Ok("a typed line ran, end of input ended it with 0".to_owned())
}
