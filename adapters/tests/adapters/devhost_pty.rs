//! devhost's `exec.pty` on a real terminal: line discipline, size, signals, exit code, hang-up.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use differently_adapters::devhost::{DevhostAdapter, DevhostConfig, IsolationMode};
use differently_adapters::{
    Adapter, ExecExit, InstanceRef, PtyInput, PtyRequest, PtySignal, PtySize,
};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::create_req;

/// A terminal running `sh` in a fresh sandbox: what it wrote so far, and its input.
struct Term {
    _root: tempfile::TempDir,
    input: Option<mpsc::Sender<PtyInput>>,
    out: mpsc::Receiver<Bytes>,
    seen: String,
    run: JoinHandle<Result<ExecExit, differently_adapters::AdapterError>>,
}

impl Term {
    async fn open(cols: u16, rows: u16) -> Term {
        let root = tempfile::tempdir().expect("tempdir");
        let a = DevhostAdapter::new(DevhostConfig {
            root: root.path().to_path_buf(),
            isolation: IsolationMode::None,
        });
        assert!(
            a.capabilities().iter().any(|c| c == "exec.pty"),
            "devhost needs setsid(1) (util-linux) for exec.pty"
        );
        let sbx = SandboxId::new();
        let i = a
            .create(&create_req(&sbx, &InstallationId::new()))
            .await
            .expect("create");
        let at = InstanceRef {
            sandbox_id: sbx,
            backend_ref: i.backend_ref,
        };
        let req = PtyRequest {
            command: vec!["sh".into()],
            env: BTreeMap::from([("PS1".to_owned(), "$ ".to_owned())]),
            cwd: None,
            size: PtySize { cols, rows },
        };
        let (in_tx, in_rx) = mpsc::channel(8);
        let (out_tx, out_rx) = mpsc::channel(8);
        let run = tokio::spawn(async move { a.pty(&at, &req, in_rx, out_tx).await });
        Term {
            _root: root,
            input: Some(in_tx),
            out: out_rx,
            seen: String::new(),
            run,
        }
    }

    async fn send(&self, msg: PtyInput) {
        self.input
            .as_ref()
            .expect("input open")
            .send(msg)
            .await
            .expect("terminal takes input");
    }

    async fn line(&self, text: &str) {
        self.send(PtyInput::Stdin(Bytes::from(format!("{text}\n"))))
            .await;
    }

    /// Reads until the output seen so far contains `want`; panics with what it saw after 10 s.
    /// The terminal echoes input as soon as it is written, before the shell reads it: a `want`
    /// must be text only the command's output holds (`echo rea""dy` for `ready`), or a match on
    /// the echo lets the test act before the shell runs.
    async fn expect(&mut self, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !self.seen.contains(want) {
            match tokio::time::timeout_at(deadline, self.out.recv()).await {
                Ok(Some(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Ok(None) => panic!("terminal closed before {want:?}; saw {:?}", self.seen),
                Err(_) => panic!("no {want:?} within 10 s; saw {:?}", self.seen),
            }
        }
        // The next expectation reads only what follows.
        if let Some(at) = self.seen.find(want) {
            self.seen.drain(..at + want.len());
        }
    }

    /// Whether `want` shows within `within` (consumed as [`Term::expect`] does); false, not a
    /// panic, when it does not.
    async fn shows_within(&mut self, want: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while !self.seen.contains(want) {
            match tokio::time::timeout_at(deadline, self.out.recv()).await {
                Ok(Some(b)) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Ok(None) => panic!("terminal closed before {want:?}; saw {:?}", self.seen),
                Err(_) => return false,
            }
        }
        if let Some(at) = self.seen.find(want) {
            self.seen.drain(..at + want.len());
        }
        true
    }

    async fn exit(mut self) -> ExecExit {
        // Drain so a full output channel never blocks the program's last writes.
        let drain = tokio::spawn(async move { while self.out.recv().await.is_some() {} });
        let exit = tokio::time::timeout(Duration::from_secs(10), self.run)
            .await
            .expect("terminal ends")
            .expect("join")
            .expect("pty");
        drain.abort();
        exit
    }
}

/// Whether this process ignores SIGINT (`SigIgn` in /proc/self/status, bit 1). Commands
/// devhost starts inherit an ignored SIGINT, so no interrupt can end them then.
fn sigint_ignored_here() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << 1) != 0)
}

#[tokio::test]
async fn pty_reads_a_line_resizes_interrupts_and_exits_with_the_code() {
    // As the `differently` binary does (it handles SIGINT to shut down): a handled signal is
    // reset to its default in the programs it starts, so a test process that was started
    // with SIGINT ignored (a background job) does not pass that on to the terminal's shell.
    let _handled = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .expect("handle SIGINT");
    let mut t = Term::open(80, 24).await;
    // The terminal echoes what is typed, and the program reads a whole line.
    t.line("read x; echo got:$x").await;
    t.line("hello").await;
    t.expect("got:hello").await;
    t.line("stty size").await;
    t.expect("24 80").await;
    t.send(PtyInput::Resize(PtySize {
        cols: 132,
        rows: 40,
    }))
    .await;
    t.line("stty size").await;
    t.expect("40 132").await;
    // A tty is what the program sees on all three descriptors.
    t.line("test -t 0 && test -t 1 && test -t 2 && echo all\"\"-ttys")
        .await;
    t.expect("all-ttys").await;
    // SIGINT interrupts the foreground command (and, as sh does, the rest of its line); the
    // shell lives on. The command says it runs (then becomes the sleep), so the signal never
    // races the shell starting it, as a fixed pause could on a busy machine.
    t.line("sh -c 'echo sle\"\"eping; exec sleep 100'; echo after-sl\"\"eep:$?")
        .await;
    t.expect("sleeping").await;
    t.send(PtyInput::Signal(PtySignal::Int)).await;
    t.line("echo ali\"\"ve").await;
    assert!(
        t.shows_within("alive", Duration::from_secs(10)).await,
        "SIGINT did not end the sleep; saw {:?}.{}",
        t.seen,
        if sigint_ignored_here() {
            " This test process ignores SIGINT (as a test command started in the background \
             does), which the commands devhost starts may inherit: run it in the \
             foreground."
        } else {
            ""
        }
    );
    t.line("exit 3").await;
    let exit = t.exit().await;
    assert_eq!(exit.exit_code, 3);
}

#[tokio::test]
async fn pty_hang_up_kills_the_program() {
    let mut t = Term::open(80, 24).await;
    t.line("echo $$; echo star\"\"ted").await;
    t.expect("started").await;
    // Closing the input is the client going away for good.
    t.input = None;
    let exit = t.exit().await;
    assert!(
        exit.exit_code == 128 + 1 || exit.exit_code == 128 + 9,
        "killed by HUP or KILL, got {}",
        exit.exit_code
    );
}

#[tokio::test]
async fn pty_kill_signal_ends_the_program() {
    let mut t = Term::open(80, 24).await;
    t.line("echo rea\"\"dy").await;
    t.expect("ready").await;
    t.send(PtyInput::Signal(PtySignal::Kill)).await;
    let exit = t.exit().await;
    assert_eq!(exit.exit_code, 128 + 9);
}
