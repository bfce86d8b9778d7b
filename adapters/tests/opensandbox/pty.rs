//! The adapter's `exec.pty` against the fake execd PTY (`fake_pty`): the session is made with
//! the argv and env in its command, the size is sent after `connected`, keystrokes, resize and
//! signals arrive, the exit code comes back, and the session is deleted at the end.

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::{
    Adapter, AdapterError, ExecExit, PtyInput, PtyRequest, PtySignal, PtySize,
};
use serde_json::json;
use tokio::sync::mpsc;

use crate::fake_server::{FakeRuntime, Variant};
use crate::{running, setup};

fn req() -> PtyRequest {
    PtyRequest {
        command: vec!["sh".into(), "-l".into()],
        env: [("GREETING".to_owned(), "it's me".to_owned())]
            .into_iter()
            .collect(),
        cwd: Some("/tmp".into()),
        size: PtySize {
            cols: 100,
            rows: 30,
        },
    }
}

/// Reads terminal output until it contains `want` (10 s at most); later reads start after it.
pub(crate) async fn read_until(rx: &mut mpsc::Receiver<Bytes>, seen: &mut String, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains(want) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(None) => {
                panic!("output ended before {want:?}: {seen:?} (the call's result says why)")
            }
            Err(_) => panic!("no {want:?} within 10 s: {seen:?}"),
        }
    }
    let at = seen.find(want).unwrap_or(0);
    seen.drain(..at + want.len());
}

#[tokio::test]
async fn pty_drives_execd_terminal_and_deletes_the_session() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    assert!(s.adapter.capabilities().iter().any(|c| c == "exec.pty"));
    let r = running(&s).await;
    let (in_tx, in_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel(8);
    let crate::Setup {
        fake,
        adapter,
        key: _key,
    } = s;
    let adapter = std::sync::Arc::new(adapter);
    let a = adapter.clone();
    let at = r.clone();
    let run = tokio::spawn(async move { a.pty(&at, &req(), in_rx, out_tx).await });
    let mut seen = String::new();
    // The size asked for reached execd (it starts at 80×24).
    in_tx
        .send(PtyInput::Stdin(Bytes::from_static(b"stty size\n")))
        .await
        .unwrap();
    read_until(&mut out_rx, &mut seen, "30 100").await;
    let views = fake.ptys.views();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].cwd, "/tmp");
    assert_eq!(
        views[0].command,
        r#"export GREETING='it'\''s me'; exec sh -l"#
    );
    assert!(views[0].running);
    in_tx
        .send(PtyInput::Resize(PtySize {
            cols: 132,
            rows: 43,
        }))
        .await
        .unwrap();
    in_tx
        .send(PtyInput::Stdin(Bytes::from_static(
            b"stty size\nsleep 100\n",
        )))
        .await
        .unwrap();
    read_until(&mut out_rx, &mut seen, "43 132").await;
    in_tx.send(PtyInput::Signal(PtySignal::Int)).await.unwrap();
    read_until(&mut out_rx, &mut seen, "^C").await;
    in_tx
        .send(PtyInput::Stdin(Bytes::from_static(b"exit 3\n")))
        .await
        .unwrap();
    let drain = tokio::spawn(async move { while out_rx.recv().await.is_some() {} });
    let exit = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("ends")
        .unwrap()
        .expect("pty");
    drain.abort();
    assert_eq!(exit.exit_code, 3);
    assert!(fake.ptys.views().is_empty(), "the session was deleted");
}

/// A terminal on the fake that has echoed `up`: its input, its end, and the fake behind it.
struct Shell {
    fake: crate::fake_server::FakeServer,
    input: mpsc::Sender<PtyInput>,
    /// Output after the `up` line (a few lines at most: the channel holds 8 chunks).
    output: mpsc::Receiver<Bytes>,
    run: tokio::task::JoinHandle<Result<ExecExit, AdapterError>>,
    _key: tempfile::NamedTempFile,
}

async fn shell_that_echoed() -> Shell {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    let r = running(&s).await;
    let (input, in_rx) = mpsc::channel(8);
    let (out_tx, mut out_rx) = mpsc::channel(8);
    let crate::Setup { fake, adapter, key } = s;
    let run = tokio::spawn(async move { adapter.pty(&r, &req(), in_rx, out_tx).await });
    let mut seen = String::new();
    input
        .send(PtyInput::Stdin(Bytes::from_static(b"echo up\n")))
        .await
        .unwrap();
    read_until(&mut out_rx, &mut seen, "up\r\n").await;
    Shell {
        fake,
        input,
        output: out_rx,
        run,
        _key: key,
    }
}

/// The exit code the terminal ended with (10 s at most).
async fn exit_code(run: tokio::task::JoinHandle<Result<ExecExit, AdapterError>>) -> i32 {
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("ends")
        .unwrap()
        .expect("pty")
        .exit_code
}

#[tokio::test]
async fn pty_hang_up_deletes_the_session_and_a_missing_one_is_an_error() {
    let Shell {
        fake, input, run, ..
    } = shell_that_echoed().await;
    drop(input);
    assert_eq!(exit_code(run).await, 129);
    assert!(fake.ptys.views().is_empty(), "the session was deleted");

    // Through the server proxy the terminal is not offered.
    let proxied = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    assert!(!proxied
        .adapter
        .capabilities()
        .iter()
        .any(|c| c == "exec.pty"));
    let (_in_tx, in_rx) = mpsc::channel(1);
    let (out_tx, _out_rx) = mpsc::channel(1);
    let r = running(&proxied).await;
    assert!(matches!(
        proxied.adapter.pty(&r, &req(), in_rx, out_tx).await,
        Err(AdapterError::Unsupported(_))
    ));
}

/// execd says -1 for a shell a signal killed (Go's `ExitCode()`); the adapter reports 128+n of
/// the signal it sent, as every other terminal does. `TERM` does not end an interactive
/// shell (it ignores it, as on the real execd); `KILL` does.
#[tokio::test]
async fn a_signal_that_kills_the_shell_is_reported_as_128_plus_n() {
    let mut shell = shell_that_echoed().await;
    shell
        .input
        .send(PtyInput::Signal(PtySignal::Term))
        .await
        .unwrap();
    shell
        .input
        .send(PtyInput::Stdin(Bytes::from_static(b"echo still here\n")))
        .await
        .unwrap();
    read_until(&mut shell.output, &mut String::new(), "still here\r\n").await;
    shell
        .input
        .send(PtyInput::Signal(PtySignal::Kill))
        .await
        .unwrap();
    assert_eq!(exit_code(shell.run).await, 128 + 9);
}
