//! The polling watchers of the sync Python SDK: `CreateWatcher` starts one (a task that
//! lists the directory every [`POLL`] and buffers the diff's events), `GetWatcherEvents`
//! hands over and clears the buffer, `RemoveWatcher` stops it.
//!
//! Bounds. A watcher buffers at most [`MAX_EVENTS`] events between two reads; on overflow
//! the newer events are dropped and counted, and the next read answers `resource_exhausted`
//! saying how many were lost (the buffer is cleared, the watcher keeps going from the
//! directory as it is then: list it again to catch up). A process keeps at most
//! [`MAX_WATCHERS`] watchers, [`MAX_PER_SANDBOX`] per sandbox.
//!
//! Scope. A watcher id is random and belongs to the sandbox and the key it was created
//! with: the same id from another key (its own envd token), or for another sandbox, is
//! `not_found`, like an id that never existed.
//!
//! Life. A watcher ends when it is removed, when it has not been read for [`IDLE`], when its
//! sandbox stops running (ended or paused: the listing answers "not found"), or when its
//! listing fails otherwise (the directory removed, the key revoked): the next read then
//! answers that error once, and the id is gone after it.
//!
//! Watchers live in the API process that created them: with several API replicas, envd
//! requests must reach the replica by sandbox id (`E2b-Sandbox-Id`, or the host in DNS
//! mode) for `GetWatcherEvents` and `RemoveWatcher` to find them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngCore;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::connect::ConnectError;
use super::envd::{Ctx, EnvdError};
use super::watch::{Snapshot, WatchRequest, Watched, POLL};
use super::Facade;

/// Most events buffered between two reads.
pub const MAX_EVENTS: usize = 4096;
/// Most watchers in one API process.
pub const MAX_WATCHERS: usize = 1024;
/// Most watchers on one sandbox.
pub const MAX_PER_SANDBOX: usize = 32;
/// A watcher not read for this long is removed.
pub const IDLE: Duration = Duration::from_secs(600);

struct Buffer {
    events: Vec<Value>,
    dropped: u64,
    last_read: Instant,
    /// Why the watcher stopped polling (answered by the next read).
    ended: Option<EnvdError>,
}

impl Buffer {
    fn new() -> Buffer {
        Buffer {
            events: Vec::new(),
            dropped: 0,
            last_read: Instant::now(),
            ended: None,
        }
    }

    /// Adds a poll's events, keeping at most [`MAX_EVENTS`] and counting the rest.
    fn push(&mut self, evs: Vec<Value>) {
        let room = MAX_EVENTS.saturating_sub(self.events.len());
        if evs.len() > room {
            self.dropped += (evs.len() - room) as u64;
        }
        self.events.extend(evs.into_iter().take(room));
    }
}

struct Watcher {
    sandbox: String,
    key_id: String,
    stopped: AtomicBool,
    buffer: Mutex<Buffer>,
}

/// The watchers of this process, by id.
#[derive(Default)]
pub struct Watchers {
    by_id: Mutex<HashMap<String, Arc<Watcher>>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdRequest {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

fn parse<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, EnvdError> {
    serde_json::from_value(v.clone()).map_err(|e| ConnectError::field("body", e).into())
}

fn key_of(c: &Ctx) -> &str {
    match &c.caller {
        crate::facade::opensandbox::inner::Caller::Delegated(k) => k,
        _ => "",
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchers {
    /// The watcher `id` if `c` may see it: same sandbox, same key.
    fn find(&self, c: &Ctx, id: &str) -> Result<Arc<Watcher>, EnvdError> {
        lock(&self.by_id)
            .get(id)
            .filter(|w| w.sandbox == c.sandbox && w.key_id == key_of(c))
            .cloned()
            .ok_or_else(|| {
                ConnectError::new("not_found", format!("watcher with id {id} not found")).into()
            })
    }

    /// The events of watcher `id` since the last read (and why it ended, once).
    fn take(&self, c: &Ctx, id: &str) -> Result<Value, EnvdError> {
        let w = self.find(c, id)?;
        let mut b = lock(&w.buffer);
        b.last_read = Instant::now();
        let events = std::mem::take(&mut b.events);
        if let Some(e) = b.ended.take() {
            drop(b);
            self.drop_id(id);
            return Err(e);
        }
        if b.dropped > 0 {
            let lost = std::mem::take(&mut b.dropped);
            return Err(ConnectError::new(
                "resource_exhausted",
                format!(
                    "watcher {id} buffered more than {MAX_EVENTS} events since the last read: \
                     {} were kept and {lost} dropped, and all are discarded; it keeps \
                     watching from now (list the directory to catch up)",
                    events.len()
                ),
            )
            .into());
        }
        Ok(json!({ "events": events }))
    }

    fn drop_id(&self, id: &str) {
        if let Some(w) = lock(&self.by_id).remove(id) {
            w.stopped.store(true, Ordering::Relaxed);
        }
    }
}

/// `CreateWatcher {path, recursive}`: `{"watcherId"}`.
pub async fn create(f: &Arc<Facade>, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: WatchRequest = parse(req)?;
    let watched = Watched::open(f, c.clone(), &r).await?;
    let baseline = watched.snapshot(f).await?;
    let mut raw = [0u8; 16];
    rand::rng().fill_bytes(&mut raw);
    let id = hex::encode(raw);
    let w = Arc::new(Watcher {
        sandbox: c.sandbox.clone(),
        key_id: key_of(c).to_owned(),
        stopped: AtomicBool::new(false),
        buffer: Mutex::new(Buffer::new()),
    });
    {
        let mut all = lock(&f.watchers.by_id);
        if all.len() >= MAX_WATCHERS {
            return Err(ConnectError::new(
                "resource_exhausted",
                format!("this API process already runs {MAX_WATCHERS} watchers"),
            )
            .into());
        }
        if all.values().filter(|o| o.sandbox == c.sandbox).count() >= MAX_PER_SANDBOX {
            return Err(ConnectError::new(
                "resource_exhausted",
                format!("the sandbox already has {MAX_PER_SANDBOX} watchers: remove some"),
            )
            .into());
        }
        all.insert(id.clone(), w.clone());
    }
    tokio::spawn(poll(f.clone(), id.clone(), w, watched, baseline));
    Ok(json!({ "watcherId": id }))
}

/// `GetWatcherEvents {watcherId}`: `{"events": [...]}` since the last read.
pub fn events(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: IdRequest = parse(req)?;
    f.watchers.take(c, &r.watcher_id)
}

/// `RemoveWatcher {watcherId}`: `{}`.
pub fn remove(f: &Facade, c: &Ctx, req: &Value) -> Result<Value, EnvdError> {
    let r: IdRequest = parse(req)?;
    f.watchers.find(c, &r.watcher_id)?;
    f.watchers.drop_id(&r.watcher_id);
    Ok(json!({}))
}

/// A watcher's polling, until it is stopped, idle, or its listing fails.
async fn poll(f: Arc<Facade>, id: String, w: Arc<Watcher>, watched: Watched, mut last: Snapshot) {
    loop {
        tokio::time::sleep(POLL).await;
        if w.stopped.load(Ordering::Relaxed) {
            return;
        }
        if lock(&w.buffer).last_read.elapsed() > IDLE {
            tracing::debug!(watcher = %id, "e2b facade: idle watcher removed");
            f.watchers.drop_id(&id);
            return;
        }
        match watched.snapshot(&f).await {
            Ok(snap) => {
                lock(&w.buffer).push(watched.diff(&last, &snap));
                last = snap;
            }
            Err(EnvdError::SandboxGone(_)) => {
                f.watchers.drop_id(&id);
                return;
            }
            Err(e) => {
                lock(&w.buffer).ended = Some(e);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facade::opensandbox::inner::Caller;

    fn ctx(sandbox: &str, key: &str) -> Ctx {
        Ctx {
            caller: Caller::Delegated(key.into()),
            sandbox: sandbox.into(),
            user: "user".into(),
            home: "/home/user".into(),
        }
    }

    fn watcher(ws: &Watchers, id: &str) -> Arc<Watcher> {
        let w = Arc::new(Watcher {
            sandbox: "sbx_a".into(),
            key_id: "key_a".into(),
            stopped: AtomicBool::new(false),
            buffer: Mutex::new(Buffer::new()),
        });
        lock(&ws.by_id).insert(id.into(), w.clone());
        w
    }

    #[test]
    fn a_watcher_is_found_only_by_its_sandbox_and_key() {
        let ws = Watchers::default();
        let w = watcher(&ws, "w1");
        assert!(ws.find(&ctx("sbx_a", "key_a"), "w1").is_ok());
        for (s, k, id) in [
            ("sbx_a", "key_b", "w1"),
            ("sbx_b", "key_a", "w1"),
            ("sbx_a", "key_a", "w2"),
        ] {
            let Err(EnvdError::Rpc(e)) = ws.take(&ctx(s, k), id) else {
                panic!("{s} {k} {id} found");
            };
            assert_eq!(e.code, "not_found");
            assert_eq!(e.message, format!("watcher with id {id} not found"));
        }
        ws.drop_id("w1");
        assert!(w.stopped.load(Ordering::Relaxed), "its polling stops");
        assert!(ws.find(&ctx("sbx_a", "key_a"), "w1").is_err());
    }

    #[test]
    fn an_overflow_is_said_once_and_the_watcher_goes_on() {
        let ws = Watchers::default();
        let w = watcher(&ws, "w1");
        let a = ctx("sbx_a", "key_a");
        let ev = |i: usize| json!({ "name": format!("f{i}"), "type": "EVENT_TYPE_CREATE" });
        lock(&w.buffer).push((0..3).map(ev).collect());
        assert_eq!(
            ws.take(&a, "w1").unwrap()["events"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
        assert_eq!(ws.take(&a, "w1").unwrap(), json!({ "events": [] }));
        lock(&w.buffer).push((0..MAX_EVENTS - 1).map(ev).collect());
        lock(&w.buffer).push((0..6).map(ev).collect());
        let Err(EnvdError::Rpc(e)) = ws.take(&a, "w1") else {
            panic!("an overflow answered events");
        };
        assert_eq!(e.code, "resource_exhausted");
        assert!(
            e.message
                .contains(&format!("{MAX_EVENTS} were kept and 5 dropped")),
            "{}",
            e.message
        );
        lock(&w.buffer).push(vec![ev(9)]);
        assert_eq!(ws.take(&a, "w1").unwrap()["events"][0]["name"], "f9");
    }

    #[test]
    fn a_watcher_that_ended_says_why_once_then_is_gone() {
        let ws = Watchers::default();
        let w = watcher(&ws, "w1");
        let a = ctx("sbx_a", "key_a");
        lock(&w.buffer).ended =
            Some(ConnectError::new("not_found", "path '/w' does not exist").into());
        let Err(EnvdError::Rpc(e)) = ws.take(&a, "w1") else {
            panic!("an ended watcher answered events");
        };
        assert_eq!(e.message, "path '/w' does not exist");
        let Err(EnvdError::Rpc(e)) = ws.take(&a, "w1") else {
            panic!("an ended watcher stayed");
        };
        assert_eq!(e.message, "watcher with id w1 not found");
    }
}
