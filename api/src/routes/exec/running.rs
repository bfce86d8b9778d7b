//! The stream state machine every streamed exec runs through, whatever its response format.

use axum::body::Bytes;
use bytes::BytesMut;
use differently_adapters::{AdapterError, ExecEvent, ExecExit};
use differently_core::ErrorCode;
use serde_json::json;
use tokio::sync::mpsc;

use super::COALESCE_LIMIT;
use crate::error::ApiError;

/// A streamed exec in progress: the adapter runs in its own task and writes output into
/// `rx`. Both response formats read it through [`Running::next`], so the run itself (audit,
/// metering, backpressure, cancellation on hang-up, the timeout's exit 124) is one code path
/// and the formats differ only in how a [`Next`] becomes body bytes. Dropping it (the client
/// hung up, so hyper dropped the body) closes the channel, which cancels the command.
pub(super) struct Running {
    rx: mpsc::Receiver<ExecEvent>,
    task: Option<tokio::task::JoinHandle<Result<ExecExit, AdapterError>>>,
    /// An event taken out of `rx` by [`Running::ready`] but not used yet; `next` returns it
    /// first, so output order is kept.
    held: Option<ExecEvent>,
}

/// What a streamed exec produces next.
pub(super) enum Next {
    /// A chunk of output (≤ 64 KiB, as the adapter wrote it).
    Output(ExecEvent),
    /// The end; nothing follows.
    End(Ending),
}

/// How a streamed exec ended, with the JSON both formats carry: SSE as the `exit`/`error`
/// event's data, frames as the exit/error frame's payload.
pub(super) enum Ending {
    /// The command ran to an exit code (124 on timeout): `{exitCode, durationMs}`.
    Exit(String),
    /// The backend (or the task running it) failed: `{code, message}`.
    Error(String),
}

impl Ending {
    fn of(end: Result<Result<ExecExit, AdapterError>, tokio::task::JoinError>) -> Ending {
        match end {
            Ok(Ok(exit)) => Ending::Exit(
                json!({ "exitCode": exit.exit_code, "durationMs": exit.duration_ms }).to_string(),
            ),
            Ok(Err(e)) => {
                let api = ApiError::from(e);
                Ending::Error(json!({ "code": api.code, "message": api.message }).to_string())
            }
            Err(e) => {
                tracing::error!(error = %e, "exec stream task failed");
                Ending::Error(
                    json!({ "code": ErrorCode::Internal, "message": "internal error" }).to_string(),
                )
            }
        }
    }
}

impl Running {
    pub(super) fn new(
        rx: mpsc::Receiver<ExecEvent>,
        task: tokio::task::JoinHandle<Result<ExecExit, AdapterError>>,
    ) -> Running {
        Running {
            rx,
            task: Some(task),
            held: None,
        }
    }

    /// The next output chunk, then the ending once, then `None`. Cancel-safe (the binary
    /// body races it against the heartbeat timer): the task handle is kept until it resolves.
    pub(super) async fn next(&mut self) -> Option<Next> {
        if let Some(ev) = self.held.take() {
            return Some(Next::Output(ev));
        }
        if let Some(ev) = self.rx.recv().await {
            return Some(Next::Output(ev));
        }
        // The adapter dropped its sender: it has finished.
        let end = (self.task.as_mut()?).await;
        self.task = None;
        Some(Next::End(Ending::of(end)))
    }

    /// An output event that is already queued, never waiting for one: what a body chunk
    /// merges into itself after the event that woke it.
    pub(super) fn ready(&mut self) -> Option<ExecEvent> {
        self.held.take().or_else(|| self.rx.try_recv().ok())
    }

    /// Gives back an event [`Running::ready`] returned, to come out of the next `next`.
    fn hold(&mut self, ev: ExecEvent) {
        self.held = Some(ev);
    }

    /// `first` followed by the queued output of the same stream, as one buffer of about
    /// `COALESCE_LIMIT` bytes at most; the first event of the other stream is held back.
    pub(super) fn merge_same_stream(&mut self, first: Bytes, stdout: bool) -> Bytes {
        let mut merged: Option<BytesMut> = None;
        while merged.as_ref().map_or(first.len(), BytesMut::len) < COALESCE_LIMIT {
            let more = match self.ready() {
                Some(ExecEvent::Stdout(b)) if stdout => b,
                Some(ExecEvent::Stderr(b)) if !stdout => b,
                Some(other) => {
                    self.hold(other);
                    break;
                }
                None => break,
            };
            merged
                .get_or_insert_with(|| BytesMut::from(&first[..]))
                .extend_from_slice(&more);
        }
        merged.map_or(first, BytesMut::freeze)
    }
}
