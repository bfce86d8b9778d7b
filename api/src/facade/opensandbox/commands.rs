//! Commands started through the facade's execd, kept in this API process so the SDK's
//! `/command/status/{id}`, `/command/{id}/logs` and interrupt calls find them. Bounded: the
//! oldest finished commands are forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

/// Commands remembered per process.
const MAX_COMMANDS: usize = 1024;
/// Output kept per background command (older bytes are dropped; the cursor stays a byte
/// offset into the whole output).
const MAX_LOG_BYTES: usize = 4 << 20;

/// One command's state.
#[derive(Debug)]
pub struct Command {
    pub sandbox_id: String,
    pub content: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Background output (stdout and stderr merged, as execd does).
    pub log: Vec<u8>,
    /// Bytes dropped from the front of `log`.
    pub log_dropped: usize,
    /// Fired by an interrupt.
    pub cancel: Arc<Notify>,
}

impl Command {
    /// Appends background output within the cap.
    pub fn append(&mut self, bytes: &[u8]) {
        self.log.extend_from_slice(bytes);
        if self.log.len() > MAX_LOG_BYTES {
            let cut = self.log.len() - MAX_LOG_BYTES;
            self.log.drain(..cut);
            self.log_dropped += cut;
        }
    }
}

/// The registry.
#[derive(Default)]
pub struct Commands {
    inner: Mutex<(HashMap<String, Command>, VecDeque<String>)>,
}

impl Commands {
    /// Registers a running command; returns its cancel signal.
    pub fn start(&self, id: &str, sandbox_id: &str, content: &str) -> Arc<Notify> {
        let cancel = Arc::new(Notify::new());
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        while order.len() >= MAX_COMMANDS {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        map.insert(
            id.to_owned(),
            Command {
                sandbox_id: sandbox_id.to_owned(),
                content: content.to_owned(),
                running: true,
                exit_code: None,
                error: None,
                started_at: Utc::now(),
                finished_at: None,
                log: Vec::new(),
                log_dropped: 0,
                cancel: cancel.clone(),
            },
        );
        order.push_back(id.to_owned());
        cancel
    }

    /// Runs `f` on the command `id` of `sandbox_id`, `None` if there is none.
    pub fn with<R>(
        &self,
        id: &str,
        sandbox_id: &str,
        f: impl FnOnce(&mut Command) -> R,
    ) -> Option<R> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0.get_mut(id)
            .filter(|c| c.sandbox_id == sandbox_id)
            .map(f)
    }
}
