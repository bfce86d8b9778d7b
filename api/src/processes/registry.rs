//! The processes this API process supervises, by pid, and its answers to [`Ask`]s about them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use differently_adapters::process::ProcessInput;
use differently_core::process::ProcessSignal;

use super::ask::{Answer, Ask};
use super::entry::Entry;

/// Running processes one sandbox may have in one API process.
pub const MAX_RUNNING_PER_SANDBOX: usize = 64;
/// Processes (running and remembered) one API process supervises.
pub const MAX_PER_PROCESS: usize = 1024;
/// How long an ended process is remembered.
pub const KEEP_ENDED: Duration = Duration::from_secs(600);
/// Bits of a pid below the slot.
pub const SLOT_SHIFT: u32 = 20;
/// Slots are 1..=4095 (12 bits), so a pid is never 0.
pub const SLOTS: u16 = 4095;
/// Longest a stdin write waits for the process to take input before it answers busy.
const STDIN_WAIT: Duration = Duration::from_secs(10);
/// Longest a read waits for output that is not there yet.
pub const MAX_READ_WAIT: Duration = Duration::from_secs(25);

/// The supervisor of `pid`.
pub fn slot_of(pid: u32) -> u16 {
    (pid >> SLOT_SHIFT) as u16
}

/// Why a process cannot be admitted now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error(
        "sandbox {0} already has {MAX_RUNNING_PER_SANDBOX} running processes in this API process"
    )]
    Sandbox(String),
    #[error("this API process already supervises {MAX_PER_PROCESS} processes")]
    Process,
}

/// This API process's processes.
pub struct Registry {
    pub slot: u16,
    next: AtomicU32,
    map: Mutex<HashMap<u32, Arc<Entry>>>,
}

impl Registry {
    /// An empty registry handing out pids of `slot`, counting from a random point: an API
    /// process that restarts and draws the same slot does not hand out the pids a client may
    /// still hold from before (a kill by an old pid must not reach a new process).
    pub fn new(slot: u16) -> Registry {
        use rand::Rng;
        Registry {
            slot,
            next: AtomicU32::new(rand::rng().random_range(1..(1u32 << SLOT_SHIFT))),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<u32, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pid for a new process of `sandbox`, if there is room: ended processes past
    /// [`KEEP_ENDED`] (then the oldest ended) are forgotten to make it.
    pub fn admit(&self, sandbox: &str) -> Result<u32, Full> {
        let mut map = self.map();
        let now = Utc::now();
        map.retain(|_, e| {
            e.ended_at()
                .is_none_or(|t| (now - t).to_std().unwrap_or_default() < KEEP_ENDED)
        });
        let running_here = map
            .values()
            .filter(|e| e.sandbox.as_str() == sandbox && e.running())
            .count();
        if running_here >= MAX_RUNNING_PER_SANDBOX {
            return Err(Full::Sandbox(sandbox.to_owned()));
        }
        if map.len() >= MAX_PER_PROCESS {
            let oldest = map
                .values()
                .filter_map(|e| e.ended_at().map(|t| (t, e.pid)))
                .min();
            match oldest {
                Some((_, pid)) => {
                    map.remove(&pid);
                }
                None => return Err(Full::Process),
            }
        }
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << SLOT_SHIFT) - 1);
            let pid = (u32::from(self.slot) << SLOT_SHIFT) | n;
            if n != 0 && !map.contains_key(&pid) {
                return Ok(pid);
            }
        }
    }

    /// Holds `entry` from now on.
    pub fn insert(&self, entry: Arc<Entry>) {
        self.map().insert(entry.pid, entry);
    }

    /// The entry of `pid` in `sandbox`.
    pub fn get(&self, sandbox: &str, pid: u32) -> Option<Arc<Entry>> {
        self.map()
            .get(&pid)
            .filter(|e| e.sandbox.as_str() == sandbox)
            .cloned()
    }

    /// The answer to `ask`, for this process's own handlers and for another API process
    /// asking over the bus.
    pub async fn answer(&self, ask: Ask) -> Answer {
        let (sandbox, pid) = match &ask {
            Ask::Ping => return Answer::Pong,
            Ask::List { sandbox } => return self.list(sandbox),
            Ask::Get { sandbox, pid }
            | Ask::Read { sandbox, pid, .. }
            | Ask::Stdin { sandbox, pid, .. }
            | Ask::CloseStdin { sandbox, pid }
            | Ask::Signal { sandbox, pid, .. }
            | Ask::Resize { sandbox, pid, .. } => (sandbox, *pid),
        };
        let Some(e) = self.get(sandbox, pid) else {
            return Answer::NotFound;
        };
        match ask {
            Ask::Ping | Ask::List { .. } => Answer::Refused {
                message: "answered above".into(),
            },
            Ask::Get { .. } => Answer::Process {
                process: Box::new(e.view()),
            },
            Ask::Read {
                from, max, wait_ms, ..
            } => read(&e, from, max, wait_ms).await,
            Ask::Stdin { bytes, .. } => stdin(&e, bytes).await,
            Ask::CloseStdin { .. } => close_stdin(&e).await,
            Ask::Signal { signal, .. } => signal_it(&e, signal).await,
            Ask::Resize { .. } if !e.view().pty => Answer::Conflict {
                message: format!("process {pid} is not on a terminal"),
            },
            Ask::Resize { size, .. } => send(&e, ProcessInput::Resize(size), "resize").await,
        }
    }

    /// The processes of `sandbox` held here, newest first.
    fn list(&self, sandbox: &str) -> Answer {
        let mut items: Vec<_> = self
            .map()
            .values()
            .filter(|e| e.sandbox.as_str() == sandbox)
            .map(|e| e.view())
            .collect();
        items.sort_by_key(|p| std::cmp::Reverse(p.started_at));
        Answer::Processes { items }
    }
}

async fn read(e: &Entry, from: u64, max: usize, wait_ms: u64) -> Answer {
    let mut changed = e.watch();
    let wait = Duration::from_millis(wait_ms).min(MAX_READ_WAIT);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (chunks, next, ending) = e.read(from, max);
        if !chunks.is_empty() || ending.is_some() || tokio::time::Instant::now() >= deadline {
            return Answer::Output {
                chunks: chunks.into_iter().map(Into::into).collect(),
                next,
                ending,
            };
        }
        // Woken by output or the end (or the deadline); then read again.
        let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
    }
}

async fn stdin(e: &Entry, bytes: Vec<u8>) -> Answer {
    let v = e.view();
    if !v.stdin_open {
        return Answer::Conflict {
            message: if v.ended_at.is_some() {
                format!("process {} has ended", e.pid)
            } else {
                format!(
                    "process {}'s stdin is closed (or was not opened: start it with stdin: true)",
                    e.pid
                )
            },
        };
    }
    send(e, ProcessInput::Stdin(Bytes::from(bytes)), "stdin").await
}

async fn close_stdin(e: &Entry) -> Answer {
    if !e.view().stdin_open {
        return Answer::Done; // closing twice is fine
    }
    e.stdin_closed();
    send(e, ProcessInput::CloseStdin, "close stdin").await
}

async fn signal_it(e: &Entry, signal: ProcessSignal) -> Answer {
    if !e.running() {
        return Answer::Done; // an ended process: nothing left to signal
    }
    if signal == ProcessSignal::Kill {
        // A KILL never waits behind input the program does not read: handed over if there
        // is room, else the call is dropped, which ends the process on the backend.
        let handed = e
            .input()
            .is_some_and(|tx| tx.try_send(ProcessInput::Signal(signal)).is_ok());
        if !handed {
            e.kill.notify_one();
        }
        return Answer::Done;
    }
    send(e, ProcessInput::Signal(signal), "signal").await
}

/// Hands `input` to the running call, waiting at most [`STDIN_WAIT`] for room.
async fn send(e: &Entry, input: ProcessInput, what: &str) -> Answer {
    let Some(tx) = e.input() else {
        return Answer::Conflict {
            message: format!("process {} has ended", e.pid),
        };
    };
    match tokio::time::timeout(STDIN_WAIT, tx.send(input)).await {
        Ok(Ok(())) => Answer::Done,
        Ok(Err(_)) => Answer::Conflict {
            message: format!("process {} has ended", e.pid),
        },
        Err(_) => Answer::Busy {
            message: format!(
                "process {} did not take its {what} within {} s (it is not reading); retry",
                e.pid,
                STDIN_WAIT.as_secs()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::entry::{running_entry, Ending};
    use super::*;

    const SBX: &str = "sbx_01jd0000000000000000000000";

    fn running(pid: u32, sandbox: &str) -> Arc<Entry> {
        running_entry(pid, sandbox, "sleep", false)
    }

    #[test]
    fn pids_carry_the_slot_and_are_never_zero() {
        let r = Registry::new(SLOTS);
        let pid = r.admit(SBX).expect("room");
        assert_eq!(slot_of(pid), SLOTS);
        assert_ne!(pid & ((1 << SLOT_SHIFT) - 1), 0);
        let r = Registry::new(1);
        assert_eq!(slot_of(r.admit(SBX).expect("room")), 1);
    }

    #[test]
    fn a_sandbox_runs_at_most_its_share_and_ended_ones_make_room() {
        let r = Registry::new(7);
        let mut first = None;
        for _ in 0..MAX_RUNNING_PER_SANDBOX {
            let pid = r.admit(SBX).expect("room");
            first.get_or_insert(pid);
            r.insert(running(pid, SBX));
        }
        assert_eq!(r.admit(SBX), Err(Full::Sandbox(SBX.into())));
        // Another sandbox is not held back by this one.
        assert!(r.admit("sbx_01jd0000000000000000000001").is_ok());
        let first = first.expect("one was started");
        r.get(SBX, first).expect("held").end(Ending::Exit {
            exit_code: 0,
            duration_ms: 1,
        });
        assert!(r.admit(SBX).is_ok(), "an ended process frees its place");
    }

    #[tokio::test]
    async fn answers_are_only_about_the_sandbox_asked_for() {
        let r = Registry::new(3);
        let pid = r.admit(SBX).expect("room");
        r.insert(running(pid, SBX));
        let other = "sbx_01jd0000000000000000000009".to_owned();
        let ask = Ask::Get {
            sandbox: other.clone(),
            pid,
        };
        assert_eq!(r.answer(ask).await, Answer::NotFound);
        let ask = Ask::Signal {
            sandbox: other,
            pid,
            signal: ProcessSignal::Kill,
        };
        assert_eq!(r.answer(ask).await, Answer::NotFound);
        // Stdin to a process started without it is a conflict, never delivered.
        let ask = Ask::Stdin {
            sandbox: SBX.into(),
            pid,
            bytes: b"x".to_vec(),
        };
        assert!(matches!(r.answer(ask).await, Answer::Conflict { .. }));
        let listed = r
            .answer(Ask::List {
                sandbox: SBX.into(),
            })
            .await;
        assert!(matches!(listed, Answer::Processes { items } if items.len() == 1));
    }

    #[tokio::test]
    async fn a_kill_behind_a_full_input_queue_drops_the_call_instead_of_waiting() {
        let r = Registry::new(4);
        let pid = r.admit(SBX).expect("room");
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        tx.try_send(ProcessInput::Stdin(Bytes::from_static(b"unread")))
            .expect("room for one");
        let view = running(pid, SBX).view();
        let e = Entry::new(
            differently_core::SandboxId::parse(SBX).expect("id"),
            view,
            Some(tx),
        );
        r.insert(e.clone());
        let killed = e.kill.notified();
        let ask = Ask::Signal {
            sandbox: SBX.into(),
            pid,
            signal: ProcessSignal::Kill,
        };
        let answered = tokio::time::timeout(Duration::from_secs(1), r.answer(ask)).await;
        assert_eq!(answered.ok(), Some(Answer::Done), "answered at once");
        tokio::time::timeout(Duration::from_secs(1), killed)
            .await
            .expect("the call is told to drop");
    }
}
