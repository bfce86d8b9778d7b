//! The fake's scripted terminal (`exec.pty`): a tiny line-oriented shell that behaves like a
//! terminal from the outside, without running anything.
//!
//! Typed bytes are echoed as a terminal's line discipline would (a newline as `\r\n`); each
//! complete line is then a command: `stty size` prints `<rows> <cols>` of the current size,
//! `echo words…` prints them, `sleep S` waits S seconds (an `INT` signal interrupts it and
//! prints `^C`), `exit [N]` ends with N (default 0); anything else prints
//! `fake: command not found: <program>`. A `$ ` prompt follows each command. `TERM`, `HUP`
//! and `KILL` end it with 128+n; a closed input or output hangs it up (128+1). ^D (end of
//! input) on an empty line ends it with 0, as a shell's end of input does.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::{PtyInput, PtySignal, PtySize};

const PROMPT: &str = "$ ";
/// ^D: end of input when typed on an empty line.
const EOT: u8 = 0x04;

/// What ended the terminal.
enum Stop {
    Exit(i32),
}

/// Runs the scripted terminal until it ends; returns the exit code.
pub(super) async fn run(
    mut size: PtySize,
    mut input: mpsc::Receiver<PtyInput>,
    out: mpsc::Sender<Bytes>,
) -> i32 {
    let hung_up = 128 + PtySignal::Hup.number();
    let mut line: Vec<u8> = Vec::new();
    if out
        .send(Bytes::from_static(PROMPT.as_bytes()))
        .await
        .is_err()
    {
        return hung_up;
    }
    loop {
        let Some(msg) = input.recv().await else {
            return hung_up;
        };
        let bytes = match msg {
            PtyInput::Resize(s) => {
                size = s;
                continue;
            }
            PtyInput::Signal(PtySignal::Int) => {
                line.clear();
                if out.send(Bytes::from_static(b"^C\r\n$ ")).await.is_err() {
                    return hung_up;
                }
                continue;
            }
            PtyInput::Signal(sig) => return 128 + sig.number(),
            PtyInput::Stdin(b) => b,
        };
        for &byte in bytes.iter() {
            if byte == EOT {
                if line.is_empty() {
                    return 0;
                }
                // Mid-line a terminal would hand the line over unfinished; the script waits.
                continue;
            }
            let echo: &[u8] = if byte == b'\n' || byte == b'\r' {
                b"\r\n"
            } else {
                std::slice::from_ref(&byte)
            };
            if out.send(Bytes::copy_from_slice(echo)).await.is_err() {
                return hung_up;
            }
            if byte != b'\n' && byte != b'\r' {
                line.push(byte);
                continue;
            }
            let cmd = String::from_utf8_lossy(&line).into_owned();
            line.clear();
            match command(&cmd, &mut size, &mut input, &out).await {
                Ok(Some(Stop::Exit(code))) => return code,
                Ok(None) => {}
                Err(code) => return code,
            }
            if out
                .send(Bytes::from_static(PROMPT.as_bytes()))
                .await
                .is_err()
            {
                return hung_up;
            }
        }
    }
}

/// Runs one command line. `Err(code)` when the terminal ended while it ran.
async fn command(
    cmd: &str,
    size: &mut PtySize,
    input: &mut mpsc::Receiver<PtyInput>,
    out: &mpsc::Sender<Bytes>,
) -> Result<Option<Stop>, i32> {
    let hung_up = 128 + PtySignal::Hup.number();
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let say = |text: String| async move {
        out.send(Bytes::from(text))
            .await
            .map_err(|_| 128 + PtySignal::Hup.number())
    };
    match words.as_slice() {
        [] => Ok(None),
        ["stty", "size"] => {
            say(format!("{} {}\r\n", size.rows, size.cols)).await?;
            Ok(None)
        }
        ["echo", rest @ ..] => {
            say(format!("{}\r\n", rest.join(" "))).await?;
            Ok(None)
        }
        ["exit"] => Ok(Some(Stop::Exit(0))),
        ["exit", n] => match n.parse::<i32>() {
            Ok(code) => Ok(Some(Stop::Exit(code & 0xff))),
            Err(_) => {
                say(format!("fake: exit: {n}: numeric argument required\r\n")).await?;
                Ok(Some(Stop::Exit(2)))
            }
        },
        ["sleep", secs] => {
            let secs = secs.parse::<f64>().unwrap_or(0.0).clamp(0.0, 86_400.0);
            let wait = tokio::time::sleep(Duration::from_secs_f64(secs));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => return Ok(None),
                    msg = input.recv() => match msg {
                        None => return Err(hung_up),
                        Some(PtyInput::Signal(PtySignal::Int)) => {
                            say("^C\r\n".to_owned()).await?;
                            return Ok(None);
                        }
                        Some(PtyInput::Signal(sig)) => return Err(128 + sig.number()),
                        Some(PtyInput::Resize(s)) => *size = s,
                        // Typed ahead while sleeping: a real terminal would queue the keys;
                        // the script drops them.
                        Some(PtyInput::Stdin(_)) => {}
                    },
                }
            }
        }
        [program, ..] => {
            say(format!("fake: command not found: {program}\r\n")).await?;
            Ok(None)
        }
    }
}
