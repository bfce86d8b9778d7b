//! The default `process` (`by_stream_or_pty`) over an adapter that has only `exec_stream` and
//! `pty`: output forwarded, a signal ending a quiet command by cancelling its stream (128+n),
//! also when the adapter never notices the cancel (dropped after the grace), stdin refused
//! without `exec.stdin`, and a terminal process: stdin typed, end of input as ^D, its timeout
//! hanging it up with 124.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::process::{by_stream_or_pty, ProcessInput, ProcessSpec};
use differently_adapters::{
    Adapter, AdapterError, Capability, CreateInstance, ExecEvent, ExecExit, Instance, InstanceRef,
    PtyInput, PtyRequest, PtySize,
};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::process::ProcessSignal;
use differently_core::SandboxId;
use tokio::sync::mpsc;

/// Streams and terminals only, as most HTTP adapters are. Programs: `echo args…`; `quiet`
/// (prints nothing until its stream is cancelled, then ends 137); `deaf` (never ends, not
/// even on cancel); any other program waits for the request's timeout (124) or a cancel.
/// Its terminal echoes what is typed and ends 0 on ^D, 128+n on a signal, 129 on hang-up;
/// `deaf` on a terminal never ends.
#[derive(Default)]
struct StreamOnly {
    /// Set when a stream saw its output closed.
    cancelled: Arc<AtomicBool>,
}

#[async_trait]
impl Adapter for StreamOnly {
    fn kind(&self) -> &'static str {
        "stream-only"
    }
    fn capabilities(&self) -> Vec<Capability> {
        vec![
            Capability::Exec,
            Capability::ExecStream,
            Capability::ExecPty,
        ]
    }
    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        Ok(req.running("x"))
    }
    async fn delete(&self, _: &SandboxId) -> Result<(), AdapterError> {
        Ok(())
    }
    async fn find(&self, _: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(None)
    }
    async fn list(&self, _: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        Ok(Vec::new())
    }
    async fn health(&self) -> Result<(), AdapterError> {
        Ok(())
    }

    async fn exec_stream(
        &self,
        _at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        let exit = |exit_code| {
            Ok(ExecExit {
                exit_code,
                duration_ms: 0,
            })
        };
        match req.program() {
            "echo" => {
                let line = format!("{}\n", req.command[1..].join(" "));
                let _ = out.send(ExecEvent::Stdout(Bytes::from(line))).await;
                exit(0)
            }
            "deaf" => std::future::pending().await,
            "quiet" => {
                out.closed().await;
                self.cancelled.store(true, Ordering::SeqCst);
                exit(137)
            }
            _ => {
                tokio::select! {
                    () = tokio::time::sleep(req.timeout()) => exit(124),
                    () = out.closed() => {
                        self.cancelled.store(true, Ordering::SeqCst);
                        exit(137)
                    }
                }
            }
        }
    }

    async fn pty(
        &self,
        _at: &InstanceRef,
        req: &PtyRequest,
        mut input: mpsc::Receiver<PtyInput>,
        out: mpsc::Sender<Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        if req.program() == "deaf" {
            return std::future::pending().await;
        }
        let code = loop {
            match input.recv().await {
                Some(PtyInput::Stdin(b)) if b.contains(&0x04) => break 0,
                Some(PtyInput::Stdin(b)) => {
                    let _ = out.send(b).await;
                }
                Some(PtyInput::Signal(s)) => break 128 + s.number(),
                Some(PtyInput::Resize(_)) => {}
                None => break 129,
            }
        };
        Ok(ExecExit {
            exit_code: code,
            duration_ms: 0,
        })
    }
}

fn at() -> InstanceRef {
    InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "x".into(),
    }
}

fn spec(command: &[&str]) -> ProcessSpec {
    ProcessSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        env: Default::default(),
        cwd: None,
        timeout: None,
        pty: None,
        stdin: false,
    }
}

/// Runs `spec` on the default path, sending `inputs` in order once it started; answers its
/// end and all it wrote.
async fn run(
    a: &StreamOnly,
    spec: &ProcessSpec,
    inputs: Vec<ProcessInput>,
) -> (Result<ExecExit, AdapterError>, Vec<u8>) {
    let (input, input_rx) = mpsc::channel(8);
    let (out, mut out_rx) = mpsc::channel(8);
    let at = at();
    let call = by_stream_or_pty(a, &at, spec, input_rx, out, GoAhead::now());
    let feed = async move {
        for i in inputs {
            let _ = input.send(i).await;
        }
        // Input stays open until the process ends, as the supervisor holds it.
        input.closed().await;
    };
    let collect = async {
        let mut all = Vec::new();
        while let Some(ev) = out_rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => all.extend_from_slice(&b),
            }
        }
        all
    };
    let deadline = Duration::from_secs(30);
    let (exit, (), all) =
        tokio::time::timeout(deadline, async { tokio::join!(call, feed, collect) })
            .await
            .expect("the process ends");
    (exit, all)
}

#[tokio::test]
async fn output_is_forwarded_with_the_exit_code() {
    let a = StreamOnly::default();
    let (exit, out) = run(&a, &spec(&["echo", "hi", "there"]), vec![]).await;
    assert_eq!(exit.expect("exit").exit_code, 0);
    assert_eq!(out, b"hi there\n");
}

#[tokio::test]
async fn a_signal_cancels_a_quiet_stream_with_128_plus_n() {
    let a = StreamOnly::default();
    let signal = ProcessInput::Signal(ProcessSignal::Term);
    let (exit, _) = run(&a, &spec(&["quiet"]), vec![signal]).await;
    assert_eq!(exit.expect("exit").exit_code, 143, "TERM is 15");
    assert!(
        a.cancelled.load(Ordering::SeqCst),
        "the stream saw its cancel"
    );
}

#[tokio::test]
async fn a_stream_that_never_notices_the_cancel_is_dropped_after_the_grace() {
    let a = StreamOnly::default();
    let started = Instant::now();
    let signal = ProcessInput::Signal(ProcessSignal::Int);
    let (exit, _) = run(&a, &spec(&["deaf"]), vec![signal]).await;
    assert_eq!(exit.expect("exit").exit_code, 130, "INT is 2");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "ended by the grace, not at once: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn stdin_without_a_terminal_is_refused_as_exec_stdin() {
    let a = StreamOnly::default();
    let mut s = spec(&["cat"]);
    s.stdin = true;
    let (exit, _) = run(&a, &s, vec![]).await;
    match exit {
        Err(AdapterError::Unsupported(what)) => assert_eq!(what, "exec.stdin"),
        other => panic!("expected Unsupported(exec.stdin), got {other:?}"),
    }
}

#[tokio::test]
async fn the_stream_timeout_is_the_process_timeout() {
    let a = StreamOnly::default();
    let mut s = spec(&["sleep"]);
    s.timeout = Some(Duration::from_secs(1));
    let (exit, _) = run(&a, &s, vec![]).await;
    assert_eq!(exit.expect("exit").exit_code, 124);
}

#[tokio::test]
async fn a_terminal_process_takes_stdin_and_ends_on_its_close() {
    let a = StreamOnly::default();
    let mut s = spec(&["sh"]);
    s.pty = Some(PtySize { cols: 80, rows: 24 });
    s.stdin = true;
    let inputs = vec![
        ProcessInput::Stdin(Bytes::from_static(b"typed")),
        ProcessInput::CloseStdin,
    ];
    let (exit, out) = run(&a, &s, inputs).await;
    assert_eq!(exit.expect("exit").exit_code, 0, "^D ended it");
    assert_eq!(out, b"typed");
}

#[tokio::test]
async fn a_terminal_process_signalled_ends_with_128_plus_n() {
    let a = StreamOnly::default();
    let mut s = spec(&["sh"]);
    s.pty = Some(PtySize { cols: 80, rows: 24 });
    let (exit, _) = run(&a, &s, vec![ProcessInput::Signal(ProcessSignal::Hup)]).await;
    assert_eq!(exit.expect("exit").exit_code, 129);
}

#[tokio::test]
async fn a_terminal_process_past_its_timeout_ends_with_124() {
    let a = StreamOnly::default();
    let mut s = spec(&["sh"]);
    s.pty = Some(PtySize { cols: 80, rows: 24 });
    s.timeout = Some(Duration::from_secs(1));
    let (exit, _) = run(&a, &s, vec![]).await;
    assert_eq!(exit.expect("exit").exit_code, 124);
}

#[tokio::test]
async fn a_terminal_that_never_notices_its_hang_up_is_dropped_after_the_grace() {
    let a = StreamOnly::default();
    let mut s = spec(&["deaf"]);
    s.pty = Some(PtySize { cols: 80, rows: 24 });
    s.timeout = Some(Duration::from_secs(1));
    let started = Instant::now();
    let (exit, _) = run(&a, &s, vec![]).await;
    assert_eq!(exit.expect("exit").exit_code, 124, "its timeout hung it up");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "dropped after the grace, not at once: {:?}",
        started.elapsed()
    );
}
