//! Disk snapshots: taken asynchronously from a running devbox, their status, a list filtered
//! by metadata and devbox, and delete.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use serde_json::{json, Value};

use super::devboxes::{now_ms, running_home};
use super::{error, Inner};
use crate::support::http::{json_resp, lock, Req};

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub id: String,
    pub name: Option<String>,
    pub source_devbox_id: String,
    pub metadata: BTreeMap<String, String>,
    pub create_time_ms: i64,
    /// When it is complete.
    ready_at: Instant,
    pub deleted: bool,
}

impl Snapshot {
    /// `in_progress`, `complete` or `deleted`.
    pub fn state(&self) -> &'static str {
        if self.deleted {
            "deleted"
        } else if Instant::now() < self.ready_at {
            "in_progress"
        } else {
            "complete"
        }
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "source_devbox_id": self.source_devbox_id,
            "metadata": self.metadata,
            "create_time_ms": self.create_time_ms,
            "commit_message": null,
            "size_bytes": null,
        })
    }
}

/// `POST /v1/devboxes/{id}/snapshot_disk_async {name, metadata, commit_message}`.
pub(super) fn take(inner: &Arc<Inner>, id: &str, r: &Req) -> Response {
    if let Err(e) = running_home(inner, id) {
        return e;
    }
    let body = r.json();
    let metadata: BTreeMap<String, String> = match body.get("metadata") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(m) => match serde_json::from_value(m.clone()) {
            Ok(m) => m,
            Err(_) => return error(400, "metadata: must map strings to strings"),
        },
    };
    if body
        .get("commit_message")
        .and_then(Value::as_str)
        .is_some_and(|m| m.len() > 1000)
    {
        return error(400, "commit_message: at most 1000 characters");
    }
    let wait = Duration::from_millis(inner.knobs().snapshot_ms);
    let s = Snapshot {
        id: inner.next_id("snp"),
        name: body.get("name").and_then(Value::as_str).map(str::to_owned),
        source_devbox_id: id.to_owned(),
        metadata,
        create_time_ms: now_ms(),
        ready_at: Instant::now() + wait,
        deleted: false,
    };
    let v = s.json();
    lock(&inner.snapshots).insert(s.id.clone(), s);
    json_resp(200, v)
}

/// `GET /v1/devboxes/disk_snapshots/{id}/status`.
pub(super) fn status(inner: &Inner, id: &str) -> Response {
    match lock(&inner.snapshots).get(id) {
        Some(s) => {
            let state = s.state();
            let mut v = json!({"status": state});
            if state == "complete" {
                v["snapshot"] = s.json();
            }
            json_resp(200, v)
        }
        None => error(404, &format!("snapshot {id} not found")),
    }
}

/// `GET /v1/devboxes/disk_snapshots?metadata[k]=v&devbox_id=&limit=&starting_after=`.
pub(super) fn list(inner: &Inner, r: &Req) -> Response {
    let limit: usize = match r.q("limit").map(str::parse) {
        None => 20,
        Some(Ok(n)) if (1..=5000).contains(&n) => n,
        Some(_) => return error(400, "limit: must be between 1 and 5000"),
    };
    let filters: Vec<(String, String)> = r
        .query
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key.to_owned(), v.clone()))
        })
        .collect();
    let devbox = r.q("devbox_id");
    let cap = inner.knobs().page_cap;
    let all = lock(&inner.snapshots);
    let mut matching: Vec<&Snapshot> = all
        .values()
        .filter(|s| !s.deleted)
        .filter(|s| devbox.is_none_or(|d| s.source_devbox_id == d))
        .filter(|s| {
            filters
                .iter()
                .all(|(k, v)| s.metadata.get(k).is_some_and(|m| m == v))
        })
        .collect();
    matching.sort_by(|a, b| (b.create_time_ms, &b.id).cmp(&(a.create_time_ms, &a.id)));
    let start = match r.q("starting_after") {
        None => 0,
        Some(after) => match matching.iter().position(|s| s.id == after) {
            Some(i) => i + 1,
            None => return error(400, &format!("starting_after: unknown snapshot {after}")),
        },
    };
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit.min(cap))
        .map(|s| s.json())
        .collect();
    let has_more = start + page.len() < matching.len();
    json_resp(
        200,
        json!({"snapshots": page, "has_more": has_more, "total_count": matching.len()}),
    )
}

/// `POST /v1/devboxes/disk_snapshots/{id}/delete`: 404 for an unknown or deleted one.
pub(super) fn delete(inner: &Inner, id: &str) -> Response {
    match lock(&inner.snapshots).get_mut(id) {
        Some(s) if !s.deleted => {
            s.deleted = true;
            json_resp(200, json!({}))
        }
        _ => error(404, &format!("snapshot {id} not found")),
    }
}
