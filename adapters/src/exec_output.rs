//! Collected exec output: what an adapter answering a plain `exec` (not streamed) keeps of a
//! command's stdout and stderr. Each stream is capped at `OUTPUT_CAP_BYTES` by
//! `core::capped::CappedOutput`, so every adapter and the API cut output the same way.

use std::future::Future;
use std::time::{Duration, Instant};

use differently_core::exec::{CappedOutput, ExecRequest, ExecResult};
use tokio::sync::mpsc;

use crate::error::Reason;
use crate::{AdapterError, ExecEvent, ExecExit};

/// The capped head of both output streams of one command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectedOutput {
    pub stdout: CappedOutput,
    pub stderr: CappedOutput,
}

impl CollectedOutput {
    /// Keeps what still fits of one piece of output.
    pub fn push(&mut self, ev: &ExecEvent) {
        match ev {
            ExecEvent::Stdout(b) => self.stdout.push(b),
            ExecEvent::Stderr(b) => self.stderr.push(b),
        }
    }

    /// Reads `rx` until every sender is gone, keeping the capped head of each stream.
    pub async fn collect(mut rx: mpsc::Receiver<ExecEvent>) -> CollectedOutput {
        let mut out = CollectedOutput::default();
        while let Some(ev) = rx.recv().await {
            out.push(&ev);
        }
        out
    }

    /// The JSON `exec` answer: output as text (invalid UTF-8 replaced) with truncation flags.
    pub fn into_result(self, exit_code: i32, duration_ms: u64) -> ExecResult {
        ExecResult {
            exit_code,
            stdout: self.stdout.to_text(),
            stderr: self.stderr.to_text(),
            stdout_truncated: self.stdout.truncated(),
            stderr_truncated: self.stderr.truncated(),
            duration_ms,
        }
    }
}

/// Reads `rx` until every sender is gone, keeping all of stdout and stderr: for helper
/// commands and checks whose output is small and wanted whole (no cap).
pub async fn whole(mut rx: mpsc::Receiver<ExecEvent>) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            ExecEvent::Stdout(b) => out.extend_from_slice(&b),
            ExecEvent::Stderr(b) => err.extend_from_slice(&b),
        }
    }
    (out, err)
}

/// Checks the command ([`check_command`]) and decodes stdin ([`stdin_of`]): the refusals
/// every runner makes before it starts anything.
pub fn checked_stdin(req: &ExecRequest) -> Result<Option<Vec<u8>>, AdapterError> {
    check_command(req)?;
    stdin_of(req)
}

/// Decoded stdin of an exec request, if it has one.
pub fn stdin_of(req: &ExecRequest) -> Result<Option<Vec<u8>>, AdapterError> {
    match (&req.stdin, &req.stdin_base64) {
        (Some(_), Some(_)) => Err(AdapterError::invalid_field(
            "stdinBase64",
            "give stdin or stdinBase64, not both",
        )),
        (Some(s), None) => Ok(Some(s.clone().into_bytes())),
        (None, Some(b)) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b)
                .map(Some)
                .map_err(|e| {
                    AdapterError::Permanent(
                        Reason::caused_by(format!("stdinBase64: {e}"), e).on_field("stdinBase64"),
                    )
                })
        }
        (None, None) => Ok(None),
    }
}

/// Refuses an empty program or a NUL in any argument, naming the `command` field (no
/// backend can run either; a NUL would cut the argument short).
pub fn check_command(req: &ExecRequest) -> Result<(), AdapterError> {
    if req.command.first().is_none_or(|p| p.is_empty()) {
        return Err(AdapterError::invalid_field("command", "command is empty"));
    }
    if req.command.iter().any(|a| a.contains('\0')) {
        return Err(AdapterError::invalid_field(
            "command",
            "arguments may not contain NUL",
        ));
    }
    Ok(())
}

/// Whole milliseconds of `d`, saturating (what `duration_ms` fields carry).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A plain `exec` over an adapter's streaming runner: `run` gets the sending end of a
/// channel and answers the exit code; what it sends is collected, capped, while it runs.
/// `run` must drop the sender when it is done (taking it by value does), or this waits.
pub async fn exec_collected<F, Fut>(run: F) -> Result<ExecResult, AdapterError>
where
    F: FnOnce(mpsc::Sender<ExecEvent>) -> Fut,
    Fut: Future<Output = Result<i32, AdapterError>>,
{
    let started = Instant::now();
    let (tx, rx) = mpsc::channel(64);
    let (code, out) = tokio::join!(run(tx), CollectedOutput::collect(rx));
    Ok(out.into_result(code?, millis(started.elapsed())))
}

/// Runs `run` (an exec's whole life, answering its exit code) and times it.
pub async fn timed_exit<Fut>(run: Fut) -> Result<ExecExit, AdapterError>
where
    Fut: Future<Output = Result<i32, AdapterError>>,
{
    let started = Instant::now();
    let exit_code = run.await?;
    Ok(ExecExit {
        exit_code,
        duration_ms: millis(started.elapsed()),
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use differently_core::exec::OUTPUT_CAP_BYTES;

    use super::*;

    #[tokio::test]
    async fn collects_both_streams_apart_and_caps_each() {
        let (tx, rx) = mpsc::channel(4);
        let send = async move {
            tx.send(ExecEvent::Stdout(Bytes::from_static(b"out")))
                .await
                .ok();
            tx.send(ExecEvent::Stderr(Bytes::from(vec![
                b'e';
                OUTPUT_CAP_BYTES + 1
            ])))
            .await
            .ok();
        };
        let (_, out) = tokio::join!(send, CollectedOutput::collect(rx));
        let r = out.into_result(3, 7);
        assert_eq!(r.stdout, "out");
        assert!(!r.stdout_truncated);
        assert_eq!(r.stderr.len(), OUTPUT_CAP_BYTES);
        assert!(r.stderr_truncated);
        assert_eq!((r.exit_code, r.duration_ms), (3, 7));
    }

    #[tokio::test]
    async fn exec_collected_keeps_what_the_runner_sent_and_its_error() {
        let r = exec_collected(|tx| async move {
            tx.send(ExecEvent::Stderr(Bytes::from_static(b"err")))
                .await
                .ok();
            Ok(5)
        })
        .await
        .unwrap();
        assert_eq!((r.exit_code, r.stderr.as_str()), (5, "err"));
        let e = exec_collected(|_tx| async { Err(AdapterError::NotFound) }).await;
        assert!(matches!(e, Err(AdapterError::NotFound)), "{e:?}");
    }
}
