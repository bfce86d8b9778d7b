//! The stream state machine every streamed exec runs through, whatever its response format.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use bytes::BytesMut;
use differently_adapters::{AdapterError, ExecEvent, ExecExit};
use differently_core::ErrorCode;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};

use super::COALESCE_LIMIT;
use crate::data_plane::Detached;
use crate::error::ApiError;

/// The adapter's task of a streamed exec. Until the stream [keeps](StreamTask::keep) it, a
/// drop aborts it: the record was refused or failed before the go-ahead (the command is
/// unsent), or its commit failed. Kept, it outlives a hang-up, so the adapter sees its
/// output channel closed and stops the command itself.
pub(super) struct StreamTask {
    handle: JoinHandle<Result<ExecExit, AdapterError>>,
    kept: bool,
}

impl StreamTask {
    pub(super) fn new(handle: JoinHandle<Result<ExecExit, AdapterError>>) -> StreamTask {
        StreamTask {
            handle,
            kept: false,
        }
    }

    /// The stream has the task: a drop no longer aborts it.
    fn keep(self: Pin<&mut Self>) {
        self.get_mut().kept = true;
    }
}

impl Future for StreamTask {
    type Output = Result<Result<ExecExit, AdapterError>, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.handle).poll(cx)
    }
}

impl Drop for StreamTask {
    fn drop(&mut self) {
        if !self.kept {
            self.handle.abort();
        }
    }
}

/// A streamed exec in progress: the adapter runs in its own task and writes output into
/// `rx`. Both response formats read it through [`Running::next`], so the run itself (audit,
/// metering, backpressure, cancellation on hang-up, the timeout's exit 124) is one code path
/// and the formats differ only in how a [`Next`] becomes body bytes. Dropping it (the client
/// hung up, so hyper dropped the body) closes the channel, which cancels the command.
pub(crate) struct Running {
    rx: mpsc::Receiver<ExecEvent>,
    task: Option<Detached<StreamTask>>,
    /// A relay's ending (a background process's output), when there is no task: `None`
    /// from it ends the stream without an exit event (the process still runs).
    relay_end: Option<tokio::sync::oneshot::Receiver<Option<Ending>>>,
    /// An event taken out of `rx` by [`Running::ready`] but not used yet; `next` returns it
    /// first, so output order is kept.
    held: Option<ExecEvent>,
    /// The task's end when [`Running::started`] saw it (a finished task is never polled
    /// again); `next` gives it once the output is drained.
    finished: Option<TaskEnd>,
}

/// What the adapter's task of a streamed exec ended with.
type TaskEnd = Result<Result<ExecExit, AdapterError>, JoinError>;

/// What [`Running::started`] saw first.
enum Start {
    Output(ExecEvent),
    OutputClosed,
    Ended(TaskEnd),
    Waited,
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
pub(crate) enum Ending {
    /// The command ran to an exit code (124 on timeout): `{exitCode, durationMs}`.
    Exit(String),
    /// The backend (or the task running it) failed: `{code, message}`.
    Error(String),
}

/// The payload of [`Ending::Exit`]: the OpenAPI document's `ExecExit`. The fields are in the
/// order the stream has always written them.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExitEvent {
    duration_ms: u64,
    exit_code: i32,
}

/// The payload of [`Ending::Error`]: the document's `StreamError`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct StreamErrorEvent {
    #[schema(value_type = String)]
    code: ErrorCode,
    message: String,
}

/// `value` as JSON text (these payloads are plain structs: serializing them cannot fail).
fn text(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

impl Ending {
    /// The exit of a command that ran to `exit_code`.
    pub(crate) fn exit(exit_code: i32, duration_ms: u64) -> Ending {
        Ending::Exit(text(&ExitEvent {
            duration_ms,
            exit_code,
        }))
    }

    /// The error of a call that failed with `code` (a stable error code's wire name).
    pub(crate) fn error(code: &str, message: &str) -> Ending {
        Ending::Error(text(
            &serde_json::json!({ "code": code, "message": message }),
        ))
    }

    fn of(end: TaskEnd) -> Ending {
        match end {
            Ok(Ok(exit)) => Ending::Exit(text(&ExitEvent {
                duration_ms: exit.duration_ms,
                exit_code: exit.exit_code,
            })),
            Ok(Err(e)) => {
                let api = ApiError::from(e);
                Ending::Error(text(&StreamErrorEvent {
                    code: api.code,
                    message: api.message,
                }))
            }
            Err(e) => {
                tracing::error!(error = %e, "exec stream task failed");
                Ending::Error(text(&StreamErrorEvent {
                    code: ErrorCode::Internal,
                    message: "internal error".to_owned(),
                }))
            }
        }
    }
}

impl Running {
    /// The run of `task` writing into `rx`, which keeps the task from now on.
    pub(super) fn new(rx: mpsc::Receiver<ExecEvent>, mut task: Detached<StreamTask>) -> Running {
        task.call_mut().keep();
        Running {
            rx,
            task: Some(task),
            relay_end: None,
            held: None,
            finished: None,
        }
    }

    /// A relay's run: output from `rx`, then the ending `end` gives (none: the stream ends
    /// without one).
    pub(crate) fn relay(
        rx: mpsc::Receiver<ExecEvent>,
        end: tokio::sync::oneshot::Receiver<Option<Ending>>,
    ) -> Running {
        Running {
            rx,
            task: None,
            relay_end: Some(end),
            held: None,
            finished: None,
        }
    }

    /// The run of a task spawned by a test, as a stream has it.
    #[cfg(test)]
    pub(super) fn of_task(
        rx: mpsc::Receiver<ExecEvent>,
        handle: JoinHandle<Result<ExecExit, AdapterError>>,
    ) -> Running {
        Running::new(rx, Detached::new(StreamTask::new(handle)))
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
        if let Some(end) = self.relay_end.as_mut() {
            let ending = end.await.ok().flatten();
            self.relay_end = None;
            return ending.map(Next::End);
        }
        if let Some(end) = self.finished.take() {
            return Some(Next::End(Ending::of(end)));
        }
        let end = (self.task.as_mut()?).await;
        self.task = None;
        Some(Next::End(Ending::of(end)))
    }

    /// Waits, at most `window`, for the command to show that it started: its first output, or
    /// its end. A call that failed before any output (a `cwd` that does not exist, a sandbox
    /// the backend refuses) is handed back as its error, for the usual JSON answer buffered
    /// exec gives it, instead of a 200 with an `error` event; whatever else was seen stays in
    /// the run for the body, in order. Costs no backend call: it waits on the call itself, and
    /// only a command that is quiet for `window` has its answer's head wait that long.
    pub(super) async fn started(&mut self, window: std::time::Duration) -> Result<(), ApiError> {
        let Some(task) = self.task.as_mut() else {
            return Ok(());
        };
        let deadline = tokio::time::sleep(window);
        tokio::pin!(deadline);
        let mut open = true;
        let seen = loop {
            let seen = tokio::select! {
                biased;
                ev = self.rx.recv(), if open => match ev {
                    Some(ev) => Start::Output(ev),
                    None => Start::OutputClosed,
                },
                end = &mut *task => Start::Ended(end),
                () = &mut deadline => Start::Waited,
            };
            match seen {
                // The adapter sent all it will: its end follows at once.
                Start::OutputClosed => open = false,
                other => break other,
            }
        };
        match seen {
            Start::Output(ev) => self.held = Some(ev),
            Start::Ended(end) => {
                self.task = None;
                match (self.rx.try_recv(), end) {
                    (Err(_), Ok(Err(e))) => return Err(ApiError::from(e)),
                    (first, end) => {
                        self.held = first.ok();
                        self.finished = Some(end);
                    }
                }
            }
            Start::OutputClosed | Start::Waited => {}
        }
        Ok(())
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
