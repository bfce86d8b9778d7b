//! Collected exec output: what an adapter answering a plain `exec` (not streamed) keeps of a
//! command's stdout and stderr. Each stream is capped at `OUTPUT_CAP_BYTES` by
//! `core::capped::CappedOutput`, so every adapter and the API cut output the same way.

use differently_core::exec::{CappedOutput, ExecResult};
use tokio::sync::mpsc;

use crate::ExecEvent;

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
}
