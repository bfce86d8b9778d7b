//! Terminal sessions this API process runs (`GET /v1/sandboxes/{id}/pty`), kept apart from the
//! WebSocket that watches them so a dropped connection does not end the program.
//!
//! A session runs the adapter's `pty` call in a task of its own and copies the terminal's
//! output into a buffer. While a socket is attached the socket drains the buffer, and a full
//! buffer ([`PTY_BUFFER_BYTES`]) slows the program down as a slow terminal would. When the
//! socket goes away the program keeps running for the grace period (`api.pty_grace_seconds`):
//! the buffer then keeps only the newest [`PTY_BUFFER_BYTES`] and a reattach
//! (`?session=<id>`, the same API key only) gets them first. A grace period that expires with
//! nobody attached hangs the terminal up (the adapter kills the program). A second attach takes
//! the session over: the older socket gets an error frame and is closed.
//!
//! Sessions live in this process's memory: a reattach must reach the same API replica (a
//! load balancer with connection affinity), and a restart of the replica ends them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use differently_adapters::{InstanceRef, PtyInput, PtyRequest, SharedAdapter};
use differently_core::{ErrorCode, SandboxId};
use tokio::sync::{mpsc, watch, Notify};

use crate::error::ApiError;
use crate::locks::lock;

/// Output a session buffers: at most this much waits for a slow socket, and this much of
/// the newest output is kept for a reattach.
pub const PTY_BUFFER_BYTES: usize = 64 * 1024;
/// Default of `api.pty_grace_seconds`.
pub const DEFAULT_PTY_GRACE: Duration = Duration::from_secs(30);
/// Input messages queued between a socket and the adapter.
const INPUT_QUEUE: usize = 16;
/// Output chunks queued between the adapter and the session's buffer.
const OUTPUT_QUEUE: usize = 8;

/// How a session's program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exit(i32),
    /// The adapter failed (the program may never have started).
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// Who may attach to a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub key_id: String,
    pub sandbox: SandboxId,
}

/// This process's sessions, by id.
#[derive(Clone, Default)]
pub struct PtySessions {
    map: Arc<Mutex<HashMap<String, Arc<Session>>>>,
}

impl PtySessions {
    /// Starts `req` on the adapter and attaches the caller; returns the session and the
    /// attachment to pass to [`Session::take`].
    pub fn start(
        &self,
        owner: Owner,
        adapter: SharedAdapter,
        at: InstanceRef,
        req: PtyRequest,
    ) -> (Arc<Session>, u64) {
        let (in_tx, in_rx) = mpsc::channel(INPUT_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(OUTPUT_QUEUE);
        let session = Arc::new(Session {
            id: format!("pty_{}", ulid::Ulid::new().to_string().to_lowercase()),
            owner,
            program: req.program().to_owned(),
            input: Mutex::new(Some(in_tx)),
            shared: Mutex::new(Shared::default()),
            changed: watch::Sender::new(0),
            drained: Notify::new(),
        });
        let attachment = session.attach();
        lock(&self.map).insert(session.id.clone(), session.clone());
        let s = session.clone();
        tokio::spawn(async move {
            let run = adapter.pty(&at, &req, in_rx, out_tx);
            let (end, ()) = tokio::join!(run, s.clone().pump(out_rx));
            let ending = match end {
                Ok(exit) => Ending::Exit(exit.exit_code),
                Err(e) => {
                    let api = ApiError::from(e);
                    Ending::Error {
                        code: api.code,
                        message: api.message,
                    }
                }
            };
            tracing::info!(session = %s.id, ending = ?ending, "pty ended");
            lock(&s.shared).ending = Some(ending);
            s.bump();
        });
        (session, attachment)
    }

    /// The session `id` if `key_id` opened it on `sandbox`.
    pub fn find(&self, id: &str, owner: &Owner) -> Option<Arc<Session>> {
        let s = lock(&self.map).get(id).cloned()?;
        (&s.owner == owner).then_some(s)
    }

    /// Forgets session `id` (its program has ended or been hung up).
    pub fn remove(&self, id: &str) {
        lock(&self.map).remove(id);
    }

    /// How many sessions this process holds.
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Whether this process holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Default)]
struct Shared {
    pending: VecDeque<Bytes>,
    pending_len: usize,
    /// The current attachment; an older one is taken over.
    attachment: u64,
    attached: bool,
    ending: Option<Ending>,
}

/// One running terminal; see the module docs.
pub struct Session {
    pub id: String,
    owner: Owner,
    /// The program's name (for the audit record of a reattach).
    pub program: String,
    /// Taken (dropped) when the grace period expires: the adapter then hangs up.
    input: Mutex<Option<mpsc::Sender<PtyInput>>>,
    shared: Mutex<Shared>,
    /// Bumped on every change a socket may care about (output, ending, takeover).
    changed: watch::Sender<u64>,
    /// Wakes the output pump when the buffer drained or the socket went away.
    drained: Notify,
}

/// What [`Session::take`] hands a socket.
pub struct Taken {
    /// False once another attachment took the session over.
    pub current: bool,
    pub chunks: Vec<Bytes>,
    /// Once every chunk has been taken: how the program ended.
    pub ending: Option<Ending>,
}

impl Session {
    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The sandbox the terminal runs in.
    pub fn sandbox(&self) -> &SandboxId {
        &self.owner.sandbox
    }

    /// A receiver that wakes on the next change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Attaches a new socket, taking the session over from any other; returns its attachment.
    pub fn attach(&self) -> u64 {
        let attachment = {
            let mut sh = lock(&self.shared);
            sh.attachment += 1;
            sh.attached = true;
            sh.attachment
        };
        self.bump();
        attachment
    }

    /// The output waiting for `attachment`, and the ending once nothing else waits.
    pub fn take(&self, attachment: u64) -> Taken {
        let taken = {
            let mut sh = lock(&self.shared);
            if sh.attachment != attachment {
                return Taken {
                    current: false,
                    chunks: Vec::new(),
                    ending: None,
                };
            }
            sh.pending_len = 0;
            let chunks: Vec<Bytes> = sh.pending.drain(..).collect();
            Taken {
                current: true,
                chunks,
                ending: sh.ending.clone(),
            }
        };
        self.drained.notify_one();
        taken
    }

    /// Where input goes, while the session still takes it.
    pub fn input(&self) -> Option<mpsc::Sender<PtyInput>> {
        lock(&self.input).clone()
    }

    /// The socket of `attachment` went away: keep the program for `grace`, then hang up
    /// unless someone attached again.
    pub fn detach(self: &Arc<Self>, hub: &PtySessions, attachment: u64, grace: Duration) {
        {
            let mut sh = lock(&self.shared);
            if sh.attachment != attachment || !sh.attached {
                return;
            }
            sh.attached = false;
        }
        self.drained.notify_one();
        let (s, hub) = (self.clone(), hub.clone());
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let expired = {
                let sh = lock(&s.shared);
                !sh.attached && sh.attachment == attachment
            };
            if expired {
                tracing::info!(session = %s.id, "pty grace period over; hanging up");
                lock(&s.input).take();
                hub.remove(&s.id);
            }
        });
    }

    /// Copies the adapter's output into the buffer until the adapter closes it; see the
    /// module docs for the two buffer regimes.
    async fn pump(self: Arc<Self>, mut out: mpsc::Receiver<Bytes>) {
        while let Some(chunk) = out.recv().await {
            loop {
                let drained = self.drained.notified();
                {
                    let mut sh = lock(&self.shared);
                    if !sh.attached || sh.pending_len < PTY_BUFFER_BYTES {
                        sh.pending_len += chunk.len();
                        sh.pending.push_back(chunk.clone());
                        if !sh.attached {
                            trim(&mut sh);
                        }
                        break;
                    }
                }
                // Attached and full: wait for the socket to take what waits.
                drained.await;
            }
            self.bump();
        }
    }
}

/// Drops the oldest output beyond [`PTY_BUFFER_BYTES`] (part of a chunk if need be).
fn trim(sh: &mut Shared) {
    while sh.pending_len > PTY_BUFFER_BYTES {
        let Some(front) = sh.pending.front_mut() else {
            break;
        };
        let over = sh.pending_len - PTY_BUFFER_BYTES;
        if front.len() <= over {
            sh.pending_len -= front.len();
            sh.pending.pop_front();
        } else {
            *front = front.slice(over..);
            sh.pending_len -= over;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_keeps_the_newest_bytes() {
        let mut sh = Shared::default();
        for c in [
            vec![b'a'; PTY_BUFFER_BYTES / 2],
            vec![b'b'; PTY_BUFFER_BYTES / 2],
            vec![b'c'; 10],
        ] {
            sh.pending_len += c.len();
            sh.pending.push_back(Bytes::from(c));
        }
        trim(&mut sh);
        assert_eq!(sh.pending_len, PTY_BUFFER_BYTES);
        let all: Vec<u8> = sh.pending.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(all.len(), PTY_BUFFER_BYTES);
        assert_eq!(all[0], b'a');
        assert_eq!(
            all.iter().filter(|&&b| b == b'a').count(),
            PTY_BUFFER_BYTES / 2 - 10
        );
        assert!(all.ends_with(b"cccccccccc"));
    }
}
