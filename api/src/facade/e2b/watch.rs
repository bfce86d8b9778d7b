//! Watching directories (`watch_dir`) without inotify: `/v1` gives none, so the facade polls
//! the directory's `/v1` listing (`depth` for a recursive watch) and diffs it with the one
//! before. A new path is `EVENT_TYPE_CREATE`; a file whose size or modification time changed
//! is `EVENT_TYPE_WRITE`; changed permission bits are `EVENT_TYPE_CHMOD`; a path gone is
//! `EVENT_TYPE_REMOVE`. A rename shows as `REMOVE` of the old name and `CREATE` of the new
//! (no `RENAME`), and what comes and goes between two polls is not seen at all. A
//! directory's own size and time change when entries come and go inside it; those are not
//! reported as writes (inotify does not report them either).
//!
//! This module holds the diff and the streaming `WatchDir` (async Python, JS); the polling
//! watchers of the sync Python SDK are in `watchers`. Each poll is one `/v1` listing under the
//! caller's key, so it is audited (`file.list`) and counts as that key's call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connect::{self, ConnectError};
use super::envd::{Ctx, EnvdError};
use super::filesystem::{entry, entry_of, listing};
use super::process::{failed_stream, stream_call, stream_response};
use super::Facade;

/// How often a watched directory is listed.
pub const POLL: Duration = Duration::from_secs(1);
/// The most entries a watch keeps (the listing of the directory, with its subdirectories
/// for a recursive watch); a larger directory ends the watch with `resource_exhausted`.
pub const MAX_ENTRIES: usize = 10_000;
/// How deep a recursive watch looks (levels below the watched directory).
pub const RECURSIVE_DEPTH: u64 = 10;
/// Keepalive interval when the request names none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
const MAX_REQUEST: usize = 64 << 10;

/// A `WatchDir` or `CreateWatcher` request.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, alias = "include_entry")]
    pub include_entry: bool,
}

/// One listing of a watched directory: each path's `/v1` item.
pub type Snapshot = BTreeMap<String, Value>;

/// What is watched, for whom.
#[derive(Debug, Clone)]
pub struct Watched {
    pub ctx: Ctx,
    /// The watched directory, resolved.
    pub dir: String,
    pub recursive: bool,
    pub include_entry: bool,
}

impl Watched {
    /// The watch `req` asks for, once its path is checked to be a directory.
    pub async fn open(f: &Facade, c: Ctx, req: &WatchRequest) -> Result<Watched, EnvdError> {
        let dir = c.resolve(&req.path);
        let e = entry_of(f, &c, &dir).await?;
        if e["type"] != "FILE_TYPE_DIRECTORY" {
            return Err(ConnectError::field("path", format!("'{dir}' is not a directory")).into());
        }
        Ok(Watched {
            ctx: c,
            dir,
            recursive: req.recursive,
            include_entry: req.include_entry,
        })
    }

    /// The directory's listing now. A directory that is gone is `not_found`.
    pub async fn snapshot(&self, f: &Facade) -> Result<Snapshot, EnvdError> {
        let depth = if self.recursive { RECURSIVE_DEPTH } else { 1 };
        let items = listing(f, &self.ctx, &self.dir, depth).await?;
        if items.len() > MAX_ENTRIES {
            return Err(ConnectError::new(
                "resource_exhausted",
                format!(
                    "'{}' holds more than {MAX_ENTRIES} entries, more than the facade watches",
                    self.dir
                ),
            )
            .into());
        }
        Ok(items
            .into_iter()
            .filter_map(|i| Some((i["path"].as_str()?.to_owned(), i)))
            .collect())
    }

    /// The events between two listings, as envd's `FilesystemEvent`s.
    pub fn diff(&self, before: &Snapshot, after: &Snapshot) -> Vec<Value> {
        let mut out = Vec::new();
        for (path, item) in after {
            let kind = match before.get(path) {
                None => "EVENT_TYPE_CREATE",
                Some(old) if changed_content(old, item) => "EVENT_TYPE_WRITE",
                Some(old) if old["mode"] != item["mode"] => "EVENT_TYPE_CHMOD",
                Some(_) => continue,
            };
            out.push(self.event(path, kind, Some(item)));
        }
        for path in before.keys().filter(|p| !after.contains_key(*p)) {
            out.push(self.event(path, "EVENT_TYPE_REMOVE", None));
        }
        out
    }

    fn event(&self, path: &str, kind: &str, item: Option<&Value>) -> Value {
        let name = path
            .strip_prefix(self.dir.trim_end_matches('/'))
            .map(|r| r.trim_start_matches('/'))
            .unwrap_or(path);
        let mut e = json!({ "name": name, "type": kind });
        if let (true, Some(item)) = (self.include_entry, item) {
            e["entry"] = entry(item);
        }
        e
    }
}

/// A file's content changed: its size or modification time. A directory's never counts.
fn changed_content(old: &Value, new: &Value) -> bool {
    new["type"] != "dir" && (old["size"] != new["size"] || old["modifiedAt"] != new["modifiedAt"])
}

fn header_u64(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// `POST /filesystem.Filesystem/WatchDir`: `{"start":{}}` once the first listing is taken,
/// then the events of each poll, keepalives after `Keepalive-Ping-Interval` seconds without
/// events, and the end envelope at `Connect-Timeout-Ms` (`deadline_exceeded`) or when the
/// directory or the sandbox goes. The client hanging up ends the watch.
pub async fn watch_dir(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (c, req): (_, WatchRequest) = match stream_call(
        &f,
        &headers,
        body,
        (MAX_REQUEST, "request over 64 KiB"),
        "body",
    )
    .await
    {
        Ok(x) => x,
        Err(answer) => return answer,
    };
    let started = Instant::now();
    let opened = match Watched::open(&f, c, &req).await {
        Ok(w) => w.snapshot(&f).await.map(|s| (w, s)),
        Err(e) => Err(e),
    };
    let (watched, baseline) = match opened {
        Ok(x) => x,
        Err(EnvdError::Rpc(e)) => return failed_stream(&e),
        Err(gone) => return gone.into_response(),
    };
    let deadline = header_u64(&headers, "connect-timeout-ms")
        .filter(|ms| *ms > 0)
        .map(|ms| started + Duration::from_millis(ms));
    let keepalive = header_u64(&headers, "keepalive-ping-interval")
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let _ = tx.try_send(connect::message(&json!({ "start": {} })));
    tokio::spawn(pump(f, watched, baseline, tx, keepalive, deadline));
    stream_response(rx)
}

/// Polls until the deadline, an error, or the client going (then it just stops: a watch the
/// client left is no failure).
async fn pump(
    f: Arc<Facade>,
    w: Watched,
    mut last: Snapshot,
    tx: mpsc::Sender<Bytes>,
    keepalive: Duration,
    deadline: Option<Instant>,
) {
    let far = Instant::now() + Duration::from_secs(10 * 365 * 86_400);
    let mut next_poll = Instant::now() + POLL;
    let mut next_keepalive = Instant::now() + keepalive;
    let ending = loop {
        let wake = next_poll.min(next_keepalive).min(deadline.unwrap_or(far));
        tokio::select! {
            _ = tx.closed() => {
                tracing::debug!(sandbox = %w.ctx.sandbox, "e2b facade: watch client left");
                return;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break ConnectError::new(
                "deadline_exceeded",
                "the watch reached its deadline (Connect-Timeout-Ms)",
            );
        }
        if now >= next_poll {
            let snap = match w.snapshot(&f).await {
                Ok(s) => s,
                Err(EnvdError::Rpc(e)) => break e,
                Err(EnvdError::SandboxGone(id)) => {
                    break ConnectError::new(
                        "unavailable",
                        format!("The sandbox {id} was not found"),
                    )
                }
            };
            for ev in w.diff(&last, &snap) {
                if tx
                    .send(connect::message(&json!({ "filesystem": ev })))
                    .await
                    .is_err()
                {
                    return;
                }
                next_keepalive = Instant::now() + keepalive;
            }
            last = snap;
            next_poll = Instant::now() + POLL;
        }
        if Instant::now() >= next_keepalive {
            if tx
                .send(connect::message(&json!({ "keepalive": {} })))
                .await
                .is_err()
            {
                return;
            }
            next_keepalive = Instant::now() + keepalive;
        }
    };
    let _ = tx.send(connect::end(Some(&ending))).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facade::opensandbox::inner::Caller;

    fn watched(recursive: bool, include_entry: bool) -> Watched {
        Watched {
            ctx: Ctx {
                caller: Caller::Anonymous,
                sandbox: "sbx".into(),
                user: "user".into(),
                home: "/home/user".into(),
            },
            dir: "/w".into(),
            recursive,
            include_entry,
        }
    }

    fn snap(items: &[Value]) -> Snapshot {
        items
            .iter()
            .map(|i| (i["path"].as_str().unwrap().to_owned(), i.clone()))
            .collect()
    }

    #[test]
    fn a_diff_names_creates_writes_chmods_and_removes_relative_to_the_dir() {
        let w = watched(true, false);
        let before = snap(&[
            json!({"path": "/w/a", "type": "file", "size": 1, "mode": 420, "modifiedAt": "t1"}),
            json!({"path": "/w/b", "type": "file", "size": 1, "mode": 420, "modifiedAt": "t1"}),
            json!({"path": "/w/c", "type": "file", "size": 1, "mode": 420, "modifiedAt": "t1"}),
            json!({"path": "/w/d", "type": "dir", "size": 4096, "mode": 493, "modifiedAt": "t1"}),
        ]);
        let after = snap(&[
            json!({"path": "/w/a", "type": "file", "size": 1, "mode": 420, "modifiedAt": "t2"}),
            json!({"path": "/w/c", "type": "file", "size": 1, "mode": 384, "modifiedAt": "t1"}),
            json!({"path": "/w/d", "type": "dir", "size": 8192, "mode": 493, "modifiedAt": "t2"}),
            json!({"path": "/w/d/e", "type": "file", "size": 0, "mode": 420, "modifiedAt": "t2"}),
        ]);
        let evs = w.diff(&before, &after);
        let got: Vec<(&str, &str)> = evs
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "EVENT_TYPE_WRITE"),
                ("c", "EVENT_TYPE_CHMOD"),
                ("d/e", "EVENT_TYPE_CREATE"),
                ("b", "EVENT_TYPE_REMOVE"),
            ]
        );
        assert!(evs.iter().all(|e| e.get("entry").is_none()));
        assert!(w.diff(&after, &after).is_empty());
    }

    #[test]
    fn entries_come_with_events_when_asked_and_never_for_a_remove() {
        let w = watched(false, true);
        let a = json!({"path": "/w/a", "type": "file", "size": 3, "mode": 420});
        let evs = w.diff(&Snapshot::new(), &snap(std::slice::from_ref(&a)));
        assert_eq!(evs[0]["entry"]["path"], "/w/a");
        assert_eq!(evs[0]["entry"]["size"], "3");
        let evs = w.diff(&snap(&[a]), &Snapshot::new());
        assert_eq!(evs[0]["type"], "EVENT_TYPE_REMOVE");
        assert!(evs[0].get("entry").is_none());
    }
}
