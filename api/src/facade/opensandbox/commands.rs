//! Commands started through the facade's execd, kept in the API process that runs them so
//! the SDK's `/command/status/{id}`, `/command/{id}/logs` and interrupt calls find them. A
//! command's id names that process (`<instance>-<ulid>`), and the other API processes ask
//! it over the bus (`remote`). Bounded: the oldest commands are forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::remote::{Answer, Ask};

/// Commands remembered per process.
const MAX_COMMANDS: usize = 1024;
/// Output kept per background command (older bytes are dropped; the cursor stays a byte
/// offset into the whole output).
const MAX_LOG_BYTES: usize = 4 << 20;
/// Output handed out per `/logs` answer: an answer crosses the bus as one NATS message
/// (1 MiB by default) when another API process asks, base64 and all. The cursor header tells
/// the SDK where the next page starts, so a longer log takes more polls, not a bigger answer.
pub const LOG_PAGE_BYTES: usize = 512 << 10;

/// A new id for a command this process (`instance`) runs: `<instance>-<ulid>`, lowercase.
pub fn new_id(instance: &str) -> String {
    format!(
        "{instance}-{}",
        ulid::Ulid::new().to_string().to_ascii_lowercase()
    )
}

/// A new instance id for one facade (one API process): a lowercase ULID, usable as a
/// subject token.
pub fn new_instance() -> String {
    ulid::Ulid::new().to_string().to_ascii_lowercase()
}

/// The instance that runs command `id`, when `id` is one this facade could have issued. The
/// instance becomes a bus subject token, so anything but 26 lowercase letters and digits
/// (a `.`, `*` or `>` above all) is refused here.
pub fn owner_of(id: &str) -> Option<&str> {
    let (owner, cmd) = id.split_once('-')?;
    let token = |t: &str| {
        t.len() == 26
            && t.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    };
    (token(owner) && token(cmd)).then_some(owner)
}

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
    /// execd's status body of this command (`id` is its id).
    pub fn status(&self, id: &str) -> Value {
        json!({
            "id": id,
            "content": self.content,
            "running": self.running,
            "exit_code": self.exit_code,
            "error": self.error,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        })
    }

    /// Output from byte offset `from` of the whole output (clamped to what is kept), at most
    /// [`LOG_PAGE_BYTES`], and the offset after it.
    pub fn logs_from(&self, from: usize) -> (Vec<u8>, usize) {
        let end = self.log_dropped + self.log.len();
        let start = from.clamp(self.log_dropped, end) - self.log_dropped;
        let stop = (start + LOG_PAGE_BYTES).min(self.log.len());
        (self.log[start..stop].to_vec(), self.log_dropped + stop)
    }

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

    /// What this process answers `ask` about one of its commands, for its own handlers and
    /// for another API process asking over the bus. A command of another sandbox is not
    /// found, whoever asks.
    pub fn answer(&self, ask: &Ask) -> Answer {
        let found = match ask {
            Ask::Status { sandbox, command } => self.with(command, sandbox, |c| Answer::Status {
                status: c.status(command),
            }),
            Ask::Logs {
                sandbox,
                command,
                cursor,
            } => self.with(command, sandbox, |c| {
                let (text, next) = c.logs_from(*cursor);
                Answer::Logs { text, next }
            }),
            Ask::Interrupt { sandbox, command } => self.with(command, sandbox, |c| {
                c.cancel.notify_one();
                Answer::Interrupted
            }),
        };
        found.unwrap_or(Answer::NotFound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_instance_and_nothing_else_passes() {
        let instance = new_instance();
        let id = new_id(&instance);
        assert_eq!(owner_of(&id), Some(instance.as_str()));
        let ulid = new_instance();
        for bad in [
            ulid.clone(),
            format!("{}-{ulid}", ulid.to_ascii_uppercase()),
            format!("{ulid}-{ulid}-x"),
            format!("a.b.c.d.e.f.g.h.i.j.k.l.m-{ulid}"),
            format!("{}>-{ulid}", &ulid[..25]),
            format!("{}*-{ulid}", &ulid[..25]),
            format!("-{ulid}"),
            String::new(),
        ] {
            assert_eq!(owner_of(&bad), None, "{bad}");
        }
    }

    #[test]
    fn logs_come_in_pages_from_the_cursor() {
        let c = Commands::default();
        c.start("c", "s", "x");
        c.with("c", "s", |cmd| {
            cmd.append(&vec![b'y'; LOG_PAGE_BYTES + 10]);
            let (page, next) = cmd.logs_from(0);
            assert_eq!((page.len(), next), (LOG_PAGE_BYTES, LOG_PAGE_BYTES));
            let (rest, end) = cmd.logs_from(next);
            assert_eq!((rest.len(), end), (10, LOG_PAGE_BYTES + 10));
            assert_eq!(cmd.logs_from(end + 5), (Vec::new(), end));
        });
        assert!(matches!(
            c.answer(&Ask::Status {
                sandbox: "other".into(),
                command: "c".into()
            }),
            Answer::NotFound
        ));
    }
}
