//! A fake Runloop API (`https://api.runloop.ai`), written from the published OpenAPI
//! description as Runloop's generated SDKs carry it (`runloop-api-client` 1.29.0 for Python
//! and its TypeScript twin, both of 2026-08-20: `api.md`, `types/`, `resources/devboxes/`,
//! `lib/wait_for_status.py`, `_streaming.py`, `_constants.py`; spec hash
//! `0c3d490050a9bbaa5cb7378bf55e8f37`). What it models, and where each behaviour comes from:
//!
//! - Bearer auth on every call (`Authorization: Bearer <key>`, the SDK's `auth_headers`);
//!   401 otherwise.
//! - Devbox statuses as the spec lists them: `queued`, `provisioning`, `initializing` then
//!   `running`; `suspend` passes `suspending` to `suspended`, `resume` passes `resuming` to
//!   `running`; `shutdown` and `failure` are terminal, and shut-down devboxes stay readable
//!   and listed (`status=shutdown`, `end_time_ms`, `shutdown_reason: api_shutdown`). Each
//!   passing status lasts [`Knobs::step_ms`].
//! - `GET /v1/devboxes`: `limit` (default 20, at most 5000), `starting_after` (an id) and
//!   one `status` filter; answers `{devboxes, has_more, total_count}` newest first. There is
//!   no metadata filter in the spec, so clients filter themselves.
//! - Long polls (`POST …/wait_for_status` with `statuses` and `timeout_seconds`): the server
//!   holds at most 30 s for a devbox and 25 s for an execution (`_constants.py`), then
//!   answers 408.
//! - `launch_parameters` checked as the spec words it: `CUSTOM_SIZE` needs
//!   `custom_cpu_cores` (1 or a multiple of 2, at most 16) and `custom_gb_memory` (1 or a
//!   multiple of 2, at most 64), a cpu:memory ratio between 1:2 and 1:8, a disk of a
//!   multiple of 2 between 2 and 64 GiB; `keep_alive_time_seconds` at most 172800.
//! - Only one of `snapshot_id`, `blueprint_id`, `blueprint_name` on create.
//! - `shutdown` of a devbox with a disk snapshot in progress is a 409 unless `force=true`.
//! - Executions (`execute_async`): `queued`/`running`/`completed`, `exit_status` once
//!   completed; `stdout`/`stderr` in a view are the last `last_n` lines (default 100) with
//!   `*_truncated` flags; `kill` (optionally the whole process group); the output tails
//!   (`stream_stdout_updates`, `stream_stderr_updates`) are server-sent events of
//!   `{"output", "offset"}` from a byte `offset`, ending when the execution has completed
//!   and everything was sent; a hold that ends first is an `event: error` with `{"code":
//!   408}`, after which clients reconnect from their offset (`ReconnectingStream`). Output
//!   is carried in JSON strings, so bytes that are not UTF-8 arrive replaced.
//! - Files: `upload_file` (multipart `path` and `file`), `download_file` (`{"path"}`,
//!   bytes whole, no ranges); paths are relative to the devbox user's home unless absolute.
//! - Disk snapshots: `snapshot_disk_async` answers at once, `disk_snapshots/{id}/status`
//!   says `in_progress` for [`Knobs::snapshot_ms`], then `complete`; the list filters by
//!   `metadata[key]=value` and `devbox_id`; `…/delete`.
//! - Tunnels: `enable_tunnel` (`open` or `authenticated`), shown as the devbox's `tunnel`;
//!   URL `https://{port}-{tunnel_key}.tunnel.runloop.ai`.
//!
//! What the published spec leaves open, the fake decides strictly and says so here, so the
//! adapter is tested against the least convenient reading: error bodies are `{"code",
//! "message"}` (the shape the SDK reads from SSE error events); calls on a devbox that is
//! not `running` are 400; a download of a missing file is a 404 (the same status as a
//! missing devbox); an upload into a missing directory is a 400; a second `enable_tunnel`
//! is a 400; `shutdown` of a shut-down devbox is a 400; a create past the account's devbox
//! limit ([`Knobs::max_devboxes`]) is a 429.
//!
//! Commands really run on the test host (`bash -c`, in a home directory of the devbox's own
//! under a temporary root), so quoting, env, cwd, exit codes and timeouts are bash's; absolute
//! file paths are host paths (tests stay in `/tmp`).

// A handler's error is the answer it sends; its size does not matter in a test server.
#![allow(clippy::result_large_err)]

mod devboxes;
mod exec;
mod files;
mod snapshots;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::support::http::{self, json_resp, lock, pct_decode, Req};

pub use devboxes::Devbox;
pub use snapshots::Snapshot;

/// Behaviour switches and fault injection.
#[derive(Debug)]
pub struct Knobs {
    /// How long each passing status (`provisioning`, `suspending`, …) lasts.
    pub step_ms: u64,
    /// How long a disk snapshot stays `in_progress`.
    pub snapshot_ms: u64,
    /// New devboxes end in `failure` with this reason instead of `running`.
    pub boot_failure: Option<String>,
    /// Live devboxes the account may have; a create past it is a 429.
    pub max_devboxes: Option<usize>,
    /// Items per page of a list, below the client's `limit` (to make clients page).
    pub page_cap: usize,
    /// The next requests whose path contains the string fail with the status (a 429
    /// carries `Retry-After: 1`).
    pub fail_next: VecDeque<(String, u16)>,
    /// Output tails end with a 408 error event after this long (a held connection's end).
    pub stream_hold_ms: Option<u64>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            step_ms: 30,
            snapshot_ms: 150,
            boot_failure: None,
            max_devboxes: None,
            page_cap: 5000,
            fail_next: VecDeque::new(),
            stream_hold_ms: None,
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    /// `METHOD /path?query` of every request.
    pub requests: Vec<String>,
    pub create_bodies: Vec<Value>,
    /// Commands given to `execute_async`, in order.
    pub commands: Vec<String>,
    /// Requests refused for a missing or wrong key.
    pub unauthorized: u32,
    /// Executions killed through the API.
    pub kills: u32,
    /// The commands of those executions (as given to `execute_async`), in order.
    pub killed: Vec<String>,
    /// Output tails ended by the hold (408 error event).
    pub stream_timeouts: u32,
    /// `POST …/keep_alive` calls.
    pub keep_alives: u32,
}

pub(crate) struct Inner {
    key: Mutex<String>,
    addr: SocketAddr,
    root: tempfile::TempDir,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    devboxes: Mutex<BTreeMap<String, Devbox>>,
    executions: Mutex<BTreeMap<String, exec::Execution>>,
    snapshots: Mutex<BTreeMap<String, Snapshot>>,
    seq: Mutex<u64>,
}

impl Inner {
    /// A fresh id with Runloop's prefix (`dbx_`, `exe_`, `snp_`, `tun_`).
    fn next_id(&self, prefix: &str) -> String {
        let mut n = lock(&self.seq);
        *n += 1;
        format!("{prefix}_{:06}x{}", *n, std::process::id())
    }

    fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.knobs)
    }

    fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.record)
    }
}

/// A running fake; it lives as long as the test's runtime.
#[derive(Clone)]
pub struct FakeRunloop {
    inner: Arc<Inner>,
}

impl FakeRunloop {
    pub async fn start(key: &str) -> FakeRunloop {
        let listener = http::bind().await;
        let inner = Arc::new(Inner {
            key: Mutex::new(key.to_owned()),
            addr: listener.local_addr().unwrap(),
            root: tempfile::tempdir().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            devboxes: Mutex::new(BTreeMap::new()),
            executions: Mutex::new(BTreeMap::new()),
            snapshots: Mutex::new(BTreeMap::new()),
            seq: Mutex::new(0),
        });
        http::serve(
            listener,
            Router::new().fallback(handle).with_state(inner.clone()),
        );
        FakeRunloop { inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// Accepts `key` (and only it) from now on.
    pub fn set_key(&self, key: &str) {
        *lock(&self.inner.key) = key.to_owned();
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        self.inner.knobs()
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        self.inner.record()
    }

    /// Every devbox ever made (shut-down ones too), its status settled to now.
    pub fn devboxes(&self) -> Vec<Devbox> {
        let mut all = lock(&self.inner.devboxes);
        all.values_mut()
            .map(|d| {
                d.settle();
                d.clone()
            })
            .collect()
    }

    pub fn devbox(&self, id: &str) -> Option<Devbox> {
        lock(&self.inner.devboxes).get_mut(id).map(|d| {
            d.settle();
            d.clone()
        })
    }

    /// Devboxes that are not shut down.
    pub fn live(&self) -> Vec<Devbox> {
        self.devboxes()
            .into_iter()
            .filter(|d| d.status != "shutdown")
            .collect()
    }

    /// Puts a running devbox with `metadata` straight into the server (an orphan, a racing
    /// create's), created `age_ms` ago.
    pub fn insert(&self, metadata: BTreeMap<String, String>, age_ms: i64) -> String {
        let id = self.inner.next_id("dbx");
        let home = self.inner.root.path().join(&id);
        std::fs::create_dir_all(&home).unwrap();
        let mut d = Devbox::new(id.clone(), home, metadata, devboxes::now_ms() - age_ms);
        d.force("running");
        lock(&self.inner.devboxes).insert(id.clone(), d);
        id
    }

    /// Sets a devbox's status at once (a failure, a shutdown by the idle policy).
    pub fn set_status(&self, id: &str, status: &str) {
        if let Some(d) = lock(&self.inner.devboxes).get_mut(id) {
            d.force(status);
        }
    }

    pub fn snapshots(&self) -> Vec<Snapshot> {
        lock(&self.inner.snapshots).values().cloned().collect()
    }

    /// Executions not completed yet.
    pub fn executions_running(&self) -> usize {
        lock(&self.inner.executions)
            .values()
            .filter(|e| !e.completed())
            .count()
    }

    /// The home directory of devbox `id` (where relative paths land).
    pub fn home(&self, id: &str) -> PathBuf {
        self.inner.root.path().join(id)
    }
}

/// An error answer: `{"code", "message"}`.
pub(crate) fn error(status: u16, message: &str) -> Response {
    json_resp(status, json!({"code": status, "message": message}))
}

/// The path split into decoded segments after `/v1`.
fn segments(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix("/v1")?;
    Some(
        rest.split('/')
            .filter(|s| !s.is_empty())
            .map(pct_decode)
            .collect(),
    )
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let r = Req::read(req, 256 << 20).await;
    let query: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    inner
        .record()
        .requests
        .push(format!("{} {}?{}", r.method, r.path, query.join("&")));
    let want = format!("Bearer {}", lock(&inner.key));
    if r.header("authorization") != Some(want.as_str()) {
        inner.record().unauthorized += 1;
        return error(401, "Unauthorized: invalid or missing API key");
    }
    let injected = {
        let mut k = inner.knobs();
        let at = k
            .fail_next
            .iter()
            .position(|(p, _)| r.path.contains(p.as_str()));
        at.and_then(|i| k.fail_next.remove(i)).map(|(_, s)| s)
    };
    if let Some(status) = injected {
        let mut resp = error(status, "injected failure");
        if status == 429 {
            resp.headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
        return resp;
    }
    let Some(seg) = segments(&r.path) else {
        return error(404, "Not Found");
    };
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    route(&inner, &r, &seg).await
}

async fn route(inner: &Arc<Inner>, r: &Req, seg: &[&str]) -> Response {
    use Method as M;
    match (r.method.clone(), seg) {
        (M::GET, ["devboxes", "disk_snapshots"]) => snapshots::list(inner, r),
        (M::GET, ["devboxes", "disk_snapshots", id, "status"]) => snapshots::status(inner, id),
        (M::POST, ["devboxes", "disk_snapshots", id, "delete"]) => snapshots::delete(inner, id),
        (M::POST, ["devboxes"]) => devboxes::create(inner, r),
        (M::GET, ["devboxes"]) => devboxes::list(inner, r),
        (M::GET, ["devboxes", id]) => devboxes::get(inner, id),
        (M::POST, ["devboxes", id, "wait_for_status"]) => {
            devboxes::wait_for_status(inner, id, r).await
        }
        (M::POST, ["devboxes", id, "shutdown"]) => devboxes::shutdown(inner, id, r),
        (M::POST, ["devboxes", id, "suspend"]) => devboxes::suspend(inner, id),
        (M::POST, ["devboxes", id, "resume"]) => devboxes::resume(inner, id),
        (M::POST, ["devboxes", id, "keep_alive"]) => devboxes::keep_alive(inner, id),
        (M::POST, ["devboxes", id, "enable_tunnel"]) => devboxes::enable_tunnel(inner, id, r),
        (M::POST, ["devboxes", id, "snapshot_disk_async"]) => snapshots::take(inner, id, r),
        (M::POST, ["devboxes", id, "execute_async"]) => exec::start(inner, id, r),
        (M::GET, ["devboxes", id, "executions", eid]) => exec::get(inner, id, eid, r),
        (M::POST, ["devboxes", id, "executions", eid, "wait_for_status"]) => {
            exec::wait_for_status(inner, id, eid, r).await
        }
        (M::POST, ["devboxes", id, "executions", eid, "kill"]) => exec::kill(inner, id, eid, r),
        (M::GET, ["devboxes", id, "executions", eid, "stream_stdout_updates"]) => {
            exec::tail(inner, id, eid, r, exec::Which::Stdout)
        }
        (M::GET, ["devboxes", id, "executions", eid, "stream_stderr_updates"]) => {
            exec::tail(inner, id, eid, r, exec::Which::Stderr)
        }
        (M::POST, ["devboxes", id, "upload_file"]) => files::upload(inner, id, r).await,
        (M::POST, ["devboxes", id, "download_file"]) => files::download(inner, id, r).await,
        _ => error(404, &format!("no route for {} {}", r.method, r.path)),
    }
}

/// A long poll's hold: `timeout_seconds` of the body, at most `cap` seconds.
fn hold(body: &Value, cap: u64) -> Duration {
    let secs = body
        .get("timeout_seconds")
        .and_then(Value::as_f64)
        .unwrap_or(cap as f64)
        .clamp(0.0, cap as f64);
    Duration::from_secs_f64(secs)
}

/// `statuses` of a wait body: present, non-empty, each one of `known`.
fn statuses(body: &Value, known: &[&str]) -> Result<Vec<String>, Response> {
    let list: Vec<String> = body
        .get("statuses")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if list.is_empty() {
        return Err(error(400, "statuses: at least one status is required"));
    }
    if let Some(bad) = list.iter().find(|s| !known.contains(&s.as_str())) {
        return Err(error(400, &format!("statuses: unknown status `{bad}`")));
    }
    Ok(list)
}

/// The answer to a long poll that saw nothing: 408.
fn poll_timeout() -> Response {
    error(408, "timed out waiting for the requested status").into_response()
}
