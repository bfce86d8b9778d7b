//! One supervised process: what `/v1` shows of it, the output it keeps, and the sender of
//! its input while it runs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use differently_adapters::process::ProcessInput;
use differently_core::process::{Process, ProcessStatus};
use differently_core::SandboxId;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

/// Output kept per process (stdout and stderr together); older bytes are dropped.
pub const OUTPUT_CAP: u64 = 4 << 20;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A piece of output at byte offset `at` of the whole output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub at: u64,
    pub stream: Stream,
    pub bytes: Bytes,
}

/// How a process ended, as its output stream's last event says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Ending {
    /// `{exitCode, durationMs}`.
    Exit { exit_code: i32, duration_ms: u64 },
    /// The stable error code and message of a failed call.
    Error { code: String, message: String },
}

/// What changes while a process runs.
struct Live {
    view: Process,
    chunks: VecDeque<Chunk>,
    ending: Option<Ending>,
    input: Option<mpsc::Sender<ProcessInput>>,
}

/// One process this API process supervises.
pub struct Entry {
    pub pid: u32,
    pub sandbox: SandboxId,
    live: Mutex<Live>,
    /// Bumped on every output chunk and on the end, for attached readers to wake on.
    changed: watch::Sender<u64>,
    /// Fired to end the process by dropping its call, when a `KILL` cannot be handed to it
    /// (its input queue is full behind stdin it does not read).
    pub kill: tokio::sync::Notify,
}

fn lock(m: &Mutex<Live>) -> MutexGuard<'_, Live> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Entry {
    /// A running process of `sandbox` shown as `view`, taking input through `input`.
    pub fn new(
        sandbox: SandboxId,
        view: Process,
        input: Option<mpsc::Sender<ProcessInput>>,
    ) -> Arc<Entry> {
        Arc::new(Entry {
            pid: view.pid,
            sandbox,
            live: Mutex::new(Live {
                view,
                chunks: VecDeque::new(),
                ending: None,
                input,
            }),
            changed: watch::Sender::new(0),
            kill: tokio::sync::Notify::new(),
        })
    }

    /// What `/v1` shows now.
    pub fn view(&self) -> Process {
        lock(&self.live).view.clone()
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        lock(&self.live).ending.is_none()
    }

    /// Appends output, dropping the oldest kept bytes beyond [`OUTPUT_CAP`].
    pub fn append(&self, stream: Stream, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        {
            let mut l = lock(&self.live);
            let at = l.view.output_bytes;
            l.view.output_bytes += bytes.len() as u64;
            l.chunks.push_back(Chunk { at, stream, bytes });
            while l.view.output_bytes - l.view.output_dropped > OUTPUT_CAP {
                let Some(old) = l.chunks.pop_front() else {
                    break;
                };
                l.view.output_dropped = old.at + old.bytes.len() as u64;
            }
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// Records the end; the input closes with it.
    pub fn end(&self, ending: Ending) {
        {
            let mut l = lock(&self.live);
            if l.ending.is_some() {
                return;
            }
            match &ending {
                Ending::Exit { exit_code, .. } => {
                    l.view.status = ProcessStatus::Exited;
                    l.view.exit_code = Some(*exit_code);
                }
                Ending::Error { message, .. } => {
                    l.view.status = ProcessStatus::Failed;
                    l.view.error = Some(message.clone());
                }
            }
            l.view.ended_at = Some(Utc::now());
            l.view.stdin_open = false;
            l.input = None;
            l.ending = Some(ending);
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// When it ended, if it has.
    pub fn ended_at(&self) -> Option<DateTime<Utc>> {
        lock(&self.live).view.ended_at
    }

    /// The sender of its input, while it runs.
    pub fn input(&self) -> Option<mpsc::Sender<ProcessInput>> {
        lock(&self.live).input.clone()
    }

    /// Marks stdin closed in the view (the close itself goes through [`Entry::input`]).
    pub fn stdin_closed(&self) {
        lock(&self.live).view.stdin_open = false;
    }

    /// A receiver that sees every later change.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Output from byte offset `from` (clamped to what is kept), at most about `max` bytes
    /// (whole chunks, at least one), the offset after it, and the ending once everything
    /// before it has been read.
    pub fn read(&self, from: u64, max: usize) -> (Vec<Chunk>, u64, Option<Ending>) {
        let l = lock(&self.live);
        let mut at = from.clamp(l.view.output_dropped, l.view.output_bytes);
        let mut out = Vec::new();
        let mut size = 0usize;
        for c in &l.chunks {
            let end = c.at + c.bytes.len() as u64;
            if end <= at {
                continue;
            }
            if size >= max && !out.is_empty() {
                break;
            }
            let skip = usize::try_from(at - c.at).unwrap_or(0);
            let bytes = c.bytes.slice(skip.min(c.bytes.len())..);
            size += bytes.len();
            out.push(Chunk {
                at,
                stream: c.stream,
                bytes,
            });
            at = end;
        }
        let ending = (at >= l.view.output_bytes)
            .then(|| l.ending.clone())
            .flatten();
        (out, at, ending)
    }
}

/// A running process's entry with no output yet, for the supervisor's unit tests.
#[cfg(test)]
pub(super) fn running_entry(
    pid: u32,
    sandbox: &str,
    program: &str,
    stdin_open: bool,
) -> Arc<Entry> {
    let req = differently_core::process::StartProcess {
        command: vec![program.to_owned()],
        stdin: stdin_open,
        ..Default::default()
    };
    let view = Process::running(pid, sandbox, &req, Utc::now());
    Entry::new(SandboxId::parse(sandbox).expect("a valid id"), view, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Arc<Entry> {
        running_entry(7, "sbx_01jd0000000000000000000000", "cat", true)
    }

    #[test]
    fn reads_resume_mid_chunk_and_the_ending_comes_after_the_output() {
        let e = entry();
        e.append(Stream::Stdout, Bytes::from_static(b"hello "));
        e.append(Stream::Stderr, Bytes::from_static(b"oops "));
        e.end(Ending::Exit {
            exit_code: 3,
            duration_ms: 1,
        });
        let (chunks, next, ending) = e.read(3, 1 << 20);
        assert_eq!(chunks.len(), 2);
        assert_eq!((chunks[0].at, &chunks[0].bytes[..]), (3, &b"lo "[..]));
        assert_eq!(chunks[1].stream, Stream::Stderr);
        assert_eq!(next, 11);
        assert!(matches!(ending, Some(Ending::Exit { exit_code: 3, .. })));
        let (chunks, _, ending) = e.read(0, 1);
        assert_eq!(
            chunks.len(),
            1,
            "one whole chunk at least, then the page ends"
        );
        assert_eq!(ending, None, "the ending waits for the output before it");
        assert_eq!(e.view().exit_code, Some(3));
    }

    #[test]
    fn output_beyond_the_cap_drops_the_oldest_and_reads_start_at_what_is_kept() {
        let e = entry();
        let piece = Bytes::from(vec![b'x'; 1 << 20]);
        for _ in 0..6 {
            e.append(Stream::Stdout, piece.clone());
        }
        let v = e.view();
        assert_eq!(v.output_bytes, 6 << 20);
        assert_eq!(v.output_dropped, 2 << 20);
        let (chunks, _, _) = e.read(0, 1);
        assert_eq!(
            chunks[0].at,
            2 << 20,
            "an old offset starts at the oldest kept byte"
        );
    }
}
