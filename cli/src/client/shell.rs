//! `differently sandbox exec -t`/`-it`: the command on a terminal inside the sandbox
//! (`GET …/pty`), our terminal's keys forwarded raw with `-i`, its size followed on
//! SIGWINCH, and the remote exit code as ours.
//!
//! `-it` with a stdin that is not a terminal (a pipe, a file) still opens the remote terminal
//! and types what stdin holds into it, then ^D at its end, as a keyboard would; there is no
//! local terminal to put in raw mode then. `-t` alone forwards no input; ^C (which then
//! reaches us as SIGINT) is sent to the remote program as `INT`.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use differently_client::pty::{PtyEvent, PtyRequest, PtySignal};
use differently_client::Client;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::terminal::{self, RawMode};
use super::CliError;

/// What `exec -t` was asked.
pub struct TtyExec {
    pub command: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// `-i`: forward our stdin.
    pub interactive: bool,
}

/// The end of input (^D), typed when a piped stdin ends.
const EOT: &[u8] = b"\x04";

/// Runs `exec` on a terminal in sandbox `id`; the remote exit code.
pub async fn run(c: &Client, id: &str, exec: TtyExec) -> Result<ExitCode, CliError> {
    let mut req = PtyRequest::new().command(exec.command);
    for (k, v) in exec.env {
        req = req.env(k, v);
    }
    if let Some(cwd) = exec.cwd {
        req = req.cwd(cwd);
    }
    if let Some((cols, rows)) = terminal::size() {
        req = req.size(cols, rows);
    }
    // Opened before raw mode, so a refusal prints on a terminal as it was, and before our
    // handlers, so ^C while connecting still ends us.
    let pty = c.pty(id, &req).await?;
    let mut signals = Signals::install()?;
    let stdin_tty = std::io::stdin().is_terminal();
    let _raw = if exec.interactive && stdin_tty {
        Some(RawMode::enable().map_err(|e| CliError::io("raw mode on stdin", e))?)
    } else {
        None
    };
    let mut input = exec.interactive.then(stdin_reader);
    let (mut writer, mut output) = pty.split();
    let mut out = std::io::stdout();
    loop {
        tokio::select! {
            ev = futures::StreamExt::next(&mut output) => match ev {
                Some(Ok(PtyEvent::Output(b))) => {
                    // A closed stdout (a pager quit) ends nothing: the program runs on.
                    let _ = out.write_all(&b).and_then(|()| out.flush());
                }
                Some(Ok(PtyEvent::Exit(code))) => return Ok(super::sandbox::exit_code(code)),
                Some(Ok(PtyEvent::Error(f))) => {
                    return Err(CliError::Outcome(format!(
                        "the terminal failed: {}: {}",
                        f.code, f.message
                    )))
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(CliError::Outcome(
                        "the terminal ended without the program's exit".into(),
                    ))
                }
            },
            chunk = recv(&mut input) => match chunk {
                Some(bytes) => writer.send(&bytes).await?,
                None => {
                    input = None;
                    if !stdin_tty {
                        writer.send(EOT).await?;
                    }
                }
            },
            _ = signals.winch.recv() => {
                if let Some((cols, rows)) = terminal::size() {
                    writer.resize(cols, rows).await?;
                }
            }
            _ = signals.int.recv() => writer.signal(PtySignal::Int).await?,
            _ = signals.term.recv() => return Ok(ExitCode::from(128 + 15)),
            _ = signals.hup.recv() => return Ok(ExitCode::from(128 + 1)),
        }
    }
}

/// The next chunk of stdin; pending forever once stdin is done (`None` channel).
async fn recv(input: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match input {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads stdin on a thread of its own (a blocking read; a plain thread, so it never holds
/// the process open at exit as a runtime's blocking task would), chunk by chunk.
pub(super) fn stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = vec![0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// The signals handled while the terminal is open: a resize, ^C outside raw mode, and the
/// two that end us (the terminal is restored on the way out).
struct Signals {
    winch: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, CliError> {
        let one =
            |k: SignalKind| signal(k).map_err(|e| CliError::io("installing a signal handler", e));
        Ok(Signals {
            winch: one(SignalKind::window_change())?,
            int: one(SignalKind::interrupt())?,
            term: one(SignalKind::terminate())?,
            hup: one(SignalKind::hangup())?,
        })
    }
}
