//! A fake Daytona: the main API (`/api`), the toolbox proxy (`/toolbox/{sandboxId}/…`) and a
//! preview host, written from `../shared/provider-specs/daytona/` and what live accounts
//! showed (seeds 002 POC 7):
//!
//! - resources together with a snapshot are refused (400 "Cannot specify Sandbox resources
//!   when using a snapshot");
//! - a command past its `timeout` is a 408 `PROCESS_EXECUTION_TIMEOUT` with no output;
//! - control-plane errors are NestJS bodies (`statusCode`, `error`, `message`, no code),
//!   toolbox errors carry `code` and `source`;
//! - the JSON-object `labels` filter works on `GET /sandbox`;
//! - snapshots from a sandbox are asynchronous (pending, then active after a few polls),
//!   restore by name, delete by id only;
//! - create, start, stop and delete answer while still in progress (the state moves on over
//!   later polls), and a delete during a change is a 409;
//! - signed preview URLs open without any header;
//! - 429 once the plan's sandbox limit is reached.
//!
//! `/process/execute` splits its command with shell-words rules and runs it without a shell
//! (as the daemon does, which is why clients send `sh -c …`); session commands run in a shell.
//! Commands really run on the test host, so quoting, env, cwd, exit codes and timeouts are
//! the shell's; file paths are host paths (tests stay in a temp dir).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::support::http::{self, json_resp, lock, pct_decode, Req};

/// Fault injection and behaviour switches.
#[derive(Debug)]
pub struct Knobs {
    /// The next requests whose path contains the string fail with the status.
    pub fail_next: VecDeque<(String, u16)>,
    /// Delay before answering any request.
    pub delay_ms: u64,
    /// The plan's limit of live sandboxes: a create past it is a 429.
    pub max_sandboxes: Option<usize>,
    /// Items per page of `GET /sandbox` (at most the client's `limit`).
    pub page_size: usize,
    /// Polls a new sandbox stays `creating`.
    pub creating_polls: u32,
    /// Polls a start, stop, pause or delete takes.
    pub transition_polls: u32,
    /// Polls of `/snapshots` a new snapshot stays `pending`.
    pub snapshot_polls: u32,
    /// The toolbox answers 502 this many times after a sandbox starts.
    pub toolbox_boot_502: u32,
    /// The next N log reads are cut off mid-body.
    pub truncate_logs: u32,
    /// Delay before each log read answers.
    pub logs_delay_ms: u64,
    /// The sandboxes are VM-class (pause works).
    pub vm: bool,
    /// New sandboxes end in `build_failed` instead of `started`.
    pub build_fails: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: VecDeque::new(),
            delay_ms: 0,
            max_sandboxes: None,
            page_size: 100,
            creating_polls: 2,
            transition_polls: 2,
            snapshot_polls: 3,
            toolbox_boot_502: 1,
            truncate_logs: 0,
            logs_delay_ms: 0,
            vm: false,
            build_fails: false,
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    pub requests: Vec<String>,
    pub create_bodies: Vec<Value>,
    pub execute_bodies: Vec<Value>,
    /// Requests refused for a missing or wrong key.
    pub unauthorized: u32,
    /// Requests to the preview host that carried an `Authorization` header.
    pub auth_on_preview: u32,
    /// Session commands killed by a session delete.
    pub killed: u32,
    /// `expiresInSeconds` of signed preview URLs.
    pub preview_expiries: Vec<u64>,
}

#[derive(Debug, Clone)]
pub struct Sbx {
    pub id: String,
    pub name: String,
    pub state: String,
    /// The state a transition in progress ends in, and the polls it still takes.
    pending: Option<(String, u32)>,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub snapshot: Option<String>,
    pub cpu: u64,
    pub memory: u64,
    pub disk: u64,
    pub error_reason: Option<String>,
    boot_502_left: u32,
}

#[derive(Debug, Clone)]
pub struct Snap {
    pub id: String,
    pub name: String,
    pub state: String,
    polls_left: u32,
}

struct Cmd {
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    exit_code: Arc<Mutex<Option<i32>>>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    command: String,
}

struct Inner {
    key: Mutex<String>,
    api_addr: SocketAddr,
    toolbox_addr: SocketAddr,
    preview_addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    sandboxes: Mutex<BTreeMap<String, Sbx>>,
    snapshots: Mutex<BTreeMap<String, Snap>>,
    /// (sandbox, session) → commands by id.
    sessions: Mutex<HashMap<(String, String), HashMap<String, Cmd>>>,
    seq: Mutex<u64>,
}

/// A running fake; dropped with the test's runtime.
#[derive(Clone)]
pub struct FakeDaytona {
    inner: Arc<Inner>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Listener {
    Api,
    Toolbox,
    Preview,
}

type St = (Arc<Inner>, Listener);

impl FakeDaytona {
    pub async fn start(key: &str) -> FakeDaytona {
        let (api, toolbox, preview) = (http::bind().await, http::bind().await, http::bind().await);
        let inner = Arc::new(Inner {
            key: Mutex::new(key.to_owned()),
            api_addr: api.local_addr().unwrap(),
            toolbox_addr: toolbox.local_addr().unwrap(),
            preview_addr: preview.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            sandboxes: Mutex::new(BTreeMap::new()),
            snapshots: Mutex::new(BTreeMap::new()),
            sessions: Mutex::new(HashMap::new()),
            seq: Mutex::new(0),
        });
        for (listener, which) in [
            (api, Listener::Api),
            (toolbox, Listener::Toolbox),
            (preview, Listener::Preview),
        ] {
            let app = Router::new()
                .fallback(handle)
                .with_state((inner.clone(), which));
            http::serve(listener, app);
        }
        FakeDaytona { inner }
    }

    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.inner.api_addr)
    }

    pub fn toolbox_url(&self) -> String {
        format!("http://{}/toolbox", self.inner.toolbox_addr)
    }

    /// Makes the server accept `key` (and only it) from now on.
    pub fn set_key(&self, key: &str) {
        *lock(&self.inner.key) = key.to_owned();
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    /// Sandboxes not yet destroyed.
    pub fn sandboxes(&self) -> Vec<Sbx> {
        lock(&self.inner.sandboxes)
            .values()
            .filter(|s| s.state != "destroyed")
            .cloned()
            .collect()
    }

    pub fn sandbox(&self, id: &str) -> Option<Sbx> {
        lock(&self.inner.sandboxes).get(id).cloned()
    }

    pub fn snapshots(&self) -> Vec<Snap> {
        lock(&self.inner.snapshots).values().cloned().collect()
    }

    /// Puts a started sandbox straight into the server (an orphan, a racing create's).
    pub fn insert(&self, name: &str, labels: BTreeMap<String, String>) -> String {
        let id = next_id(&self.inner);
        lock(&self.inner.sandboxes).insert(
            id.clone(),
            Sbx {
                id: id.clone(),
                name: name.to_owned(),
                state: "started".to_owned(),
                pending: None,
                labels,
                env: BTreeMap::new(),
                snapshot: None,
                cpu: 1,
                memory: 1,
                disk: 3,
                error_reason: None,
                boot_502_left: 0,
            },
        );
        id
    }

    pub fn set_state(&self, id: &str, state: &str) {
        if let Some(s) = lock(&self.inner.sandboxes).get_mut(id) {
            s.state = state.to_owned();
            s.pending = None;
        }
    }

    /// Session commands still running.
    pub fn commands_running(&self) -> usize {
        lock(&self.inner.sessions)
            .values()
            .flat_map(|cmds| cmds.values())
            .filter(|c| lock(&c.exit_code).is_none())
            .count()
    }

    /// Sessions not deleted.
    pub fn sessions(&self) -> usize {
        lock(&self.inner.sessions).len()
    }
}

fn next_id(inner: &Inner) -> String {
    let mut n = lock(&inner.seq);
    *n += 1;
    // Real ids are UUIDs.
    format!("{:08x}-0000-4000-8000-{:012x}", *n, std::process::id())
}

/// A control-plane (NestJS) error.
fn api_error(status: u16, message: &str) -> Response {
    let error = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    json_resp(
        status,
        json!({"statusCode": status, "error": error, "message": message}),
    )
}

/// A toolbox error (with `code` and `source`).
fn toolbox_error(status: u16, code: &str, message: &str) -> Response {
    json_resp(
        status,
        json!({"statusCode": status, "code": code, "source": "daemon", "message": message,
               "timestamp": chrono::Utc::now(), "method": "", "path": ""}),
    )
}

async fn handle(State((inner, which)): State<St>, req: Request) -> Response {
    let r = Req::read(req, 64 << 20).await;
    lock(&inner.record)
        .requests
        .push(format!("{} {}", r.method, r.path));
    if which == Listener::Preview {
        if r.headers.contains_key("authorization") {
            lock(&inner.record).auth_on_preview += 1;
        }
        return (StatusCode::OK, format!("preview {}", r.path)).into_response();
    }
    let delay = lock(&inner.knobs).delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let want = format!("Bearer {}", lock(&inner.key));
    let auth = r.headers.get("authorization").and_then(|v| v.to_str().ok());
    if auth != Some(want.as_str()) {
        lock(&inner.record).unauthorized += 1;
        return match which {
            Listener::Api => api_error(401, "Unauthorized"),
            _ => toolbox_error(401, "UNAUTHORIZED", "Unauthorized"),
        };
    }
    let injected = {
        let mut k = lock(&inner.knobs);
        match k
            .fail_next
            .iter()
            .position(|(p, _)| r.path.contains(p.as_str()))
        {
            Some(i) => k.fail_next.remove(i).map(|(_, s)| s),
            None => None,
        }
    };
    if let Some(status) = injected {
        return match status {
            429 => api_error(429, "ThrottlerException: Too Many Requests"),
            s if which == Listener::Toolbox => toolbox_error(s, "INJECTED", "injected failure"),
            s => api_error(s, "injected failure"),
        };
    }
    match which {
        Listener::Api => api(&inner, &r).await,
        Listener::Toolbox => toolbox(&inner, &r).await,
        Listener::Preview => unreachable!(),
    }
}

fn sandbox_json(s: &Sbx) -> Value {
    json!({
        "id": s.id, "organizationId": "org-1", "name": s.name, "user": "daytona",
        "snapshot": s.snapshot, "env": s.env, "labels": s.labels, "public": false,
        "networkBlockAll": false, "target": "us", "cpu": s.cpu, "gpu": 0, "memory": s.memory,
        "disk": s.disk, "state": s.state, "desiredState": "started",
        "errorReason": s.error_reason, "toolboxProxyUrl": "http://toolbox.invalid/toolbox",
        "autoStopInterval": 0, "createdAt": "2026-10-29T10:00:00Z",
        // Fields a newer server adds; the adapter must not mind them.
        "sandboxClass": "container", "daemonVersion": "0.190.0",
    })
}

/// Moves a transition in progress one poll on.
fn advance(s: &mut Sbx, knobs: &Knobs) {
    if let Some((end, left)) = s.pending.take() {
        if left <= 1 {
            if end == "started" {
                s.boot_502_left = knobs.toolbox_boot_502;
            }
            s.state = end;
        } else {
            s.pending = Some((end, left - 1));
        }
    }
}

fn begin(s: &mut Sbx, during: &str, end: &str, polls: u32) {
    s.state = during.to_owned();
    s.pending = Some((end.to_owned(), polls.max(1)));
}

async fn api(inner: &Arc<Inner>, r: &Req) -> Response {
    let Some(rest) = r.path.strip_prefix("/api") else {
        return api_error(404, &format!("Cannot {} {}", r.method, r.path));
    };
    let seg: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(pct_decode)
        .collect();
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    let knobs = lock(&inner.knobs);
    let mut sbxs = lock(&inner.sandboxes);
    let find = |sbxs: &BTreeMap<String, Sbx>, key: &str| -> Option<String> {
        sbxs.values()
            .find(|s| (s.id == key || s.name == key) && s.state != "destroyed")
            .map(|s| s.id.clone())
    };
    match (r.method.clone(), seg.as_slice()) {
        (Method::GET, ["sandbox"]) => {
            for s in sbxs.values_mut() {
                advance(s, &knobs);
            }
            let filter: BTreeMap<String, String> = match r.q("labels") {
                Some(l) => match serde_json::from_str(l) {
                    Ok(f) => f,
                    Err(_) => return api_error(400, "labels must be a JSON object"),
                },
                None => BTreeMap::new(),
            };
            let limit: usize = r.q("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
            if !(1..=200).contains(&limit) {
                return api_error(400, "limit must not be greater than 200");
            }
            let page = limit.min(knobs.page_size);
            let matching: Vec<&Sbx> = sbxs
                .values()
                .filter(|s| s.state != "destroyed")
                .filter(|s| filter.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
                .collect();
            let start: usize = r.q("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
            let items: Vec<Value> = matching
                .iter()
                .skip(start)
                .take(page)
                .map(|s| sandbox_json(s))
                .collect();
            let next = (start + page < matching.len()).then(|| (start + page).to_string());
            json_resp(200, json!({"items": items, "nextCursor": next}))
        }
        (Method::POST, ["sandbox"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return api_error(400, "invalid JSON");
            };
            lock(&inner.record).create_bodies.push(b.clone());
            let snapshot = b["snapshot"].as_str().map(str::to_owned);
            let sized = ["cpu", "memory", "disk"].iter().any(|k| !b[*k].is_null());
            if snapshot.is_some() && sized {
                return api_error(
                    400,
                    "Cannot specify Sandbox resources when using a snapshot",
                );
            }
            if let Some(name) = snapshot
                .as_deref()
                .filter(|n| n.starts_with("differently-"))
            {
                let snaps = lock(&inner.snapshots);
                match snaps.values().find(|s| s.name == name) {
                    Some(s) if s.state == "active" => {}
                    Some(_) => return api_error(400, &format!("Snapshot {name} is not active")),
                    None => return api_error(404, &format!("Snapshot {name} not found")),
                }
            }
            let live = sbxs.values().filter(|s| s.state != "destroyed").count();
            if knobs.max_sandboxes.is_some_and(|m| live >= m) {
                return api_error(
                    429,
                    "Sandbox limit exceeded for your plan. Maximum allowed: 1",
                );
            }
            let name = b["name"].as_str().unwrap_or_default().to_owned();
            if !name.is_empty() && find(&sbxs, &name).is_some() {
                return api_error(409, &format!("Sandbox with name {name} already exists"));
            }
            let id = next_id(inner);
            let labels: BTreeMap<String, String> =
                serde_json::from_value(b["labels"].clone()).unwrap_or_default();
            let env: BTreeMap<String, String> =
                serde_json::from_value(b["env"].clone()).unwrap_or_default();
            let mut s = Sbx {
                id: id.clone(),
                name: if name.is_empty() { id.clone() } else { name },
                state: String::new(),
                pending: None,
                labels,
                env,
                snapshot,
                cpu: b["cpu"].as_u64().unwrap_or(1),
                memory: b["memory"].as_u64().unwrap_or(1),
                disk: b["disk"].as_u64().unwrap_or(3),
                error_reason: None,
                boot_502_left: 0,
            };
            let end = if knobs.build_fails {
                s.error_reason = Some("failed to pull image".to_owned());
                "build_failed"
            } else {
                "started"
            };
            begin(&mut s, "creating", end, knobs.creating_polls);
            let out = sandbox_json(&s);
            sbxs.insert(id, s);
            json_resp(200, out)
        }
        (method, ["sandbox", key, rest @ ..]) => {
            let Some(id) = find(&sbxs, key) else {
                return api_error(404, &format!("Sandbox with ID or name {key} not found"));
            };
            let polls = knobs.transition_polls;
            let s = sbxs.get_mut(&id).unwrap();
            match (method, rest) {
                (Method::GET, []) => {
                    advance(s, &knobs);
                    json_resp(200, sandbox_json(s))
                }
                (Method::DELETE, []) => {
                    if s.pending.is_some() && s.state != "destroying" {
                        return api_error(409, "Sandbox state change in progress");
                    }
                    begin(s, "destroying", "destroyed", polls);
                    json_resp(200, sandbox_json(s))
                }
                (Method::POST, ["start"]) => match s.state.as_str() {
                    "stopped" | "archived" => {
                        begin(s, "starting", "started", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    "paused" => {
                        begin(s, "resuming", "started", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    st => api_error(400, &format!("Sandbox is not stopped (state: {st})")),
                },
                (Method::POST, ["stop"]) => match s.state.as_str() {
                    "started" | "paused" => {
                        begin(s, "stopping", "stopped", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    st => api_error(400, &format!("Sandbox is not started (state: {st})")),
                },
                (Method::POST, ["pause"]) => {
                    if !knobs.vm {
                        return api_error(400, "Pause is only supported for linux-vm sandboxes");
                    }
                    match s.state.as_str() {
                        "started" => {
                            begin(s, "pausing", "paused", polls);
                            json_resp(200, sandbox_json(s))
                        }
                        st => api_error(400, &format!("Sandbox is not started (state: {st})")),
                    }
                }
                (Method::POST, ["snapshot"]) => {
                    let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                        return api_error(400, "invalid JSON");
                    };
                    let Some(name) = b["name"].as_str().filter(|n| !n.is_empty()) else {
                        return api_error(400, "name should not be empty");
                    };
                    if s.state != "started" {
                        return api_error(
                            409,
                            &format!("Sandbox is not started (state: {})", s.state),
                        );
                    }
                    let mut snaps = lock(&inner.snapshots);
                    if snaps.values().any(|x| x.name == name) {
                        return api_error(409, &format!("Snapshot {name} already exists"));
                    }
                    let sid = next_id(inner);
                    snaps.insert(
                        sid.clone(),
                        Snap {
                            id: sid,
                            name: name.to_owned(),
                            state: "pending".to_owned(),
                            polls_left: knobs.snapshot_polls,
                        },
                    );
                    begin(s, "snapshotting", "started", 1);
                    s.pending = Some(("started".to_owned(), 1));
                    json_resp(200, sandbox_json(s))
                }
                (Method::GET, ["ports", port, "signed-preview-url"]) => {
                    let Ok(port) = port.parse::<u16>() else {
                        return api_error(400, "port must be a number");
                    };
                    let secs = r
                        .q("expiresInSeconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(60);
                    lock(&inner.record).preview_expiries.push(secs);
                    let token = format!("tok{}", next_id(inner).replace('-', ""));
                    json_resp(
                        200,
                        json!({"sandboxId": s.id, "port": port, "token": token,
                               "url": format!("http://{}/{port}-{token}/", inner.preview_addr)}),
                    )
                }
                _ => api_error(404, &format!("Cannot {} {}", r.method, r.path)),
            }
        }
        (Method::GET, ["snapshots"]) => {
            let mut snaps = lock(&inner.snapshots);
            for s in snaps.values_mut() {
                if s.state == "pending" {
                    s.polls_left = s.polls_left.saturating_sub(1);
                    if s.polls_left == 0 {
                        s.state = "active".to_owned();
                    }
                }
            }
            // The name filter matches part of a name, not only whole names.
            let needle = r.q("name").unwrap_or("");
            let items: Vec<Value> = snaps
                .values()
                .filter(|s| s.name.contains(needle))
                .map(|s| {
                    json!({"id": s.id, "name": s.name, "state": s.state, "general": false,
                           "size": null, "entrypoint": null, "cpu": 1, "gpu": 0, "mem": 1,
                           "disk": 3, "errorReason": null, "createdAt": "2026-10-29T10:00:00Z",
                           "updatedAt": "2026-10-29T10:00:00Z", "lastUsedAt": null})
                })
                .collect();
            let total = items.len();
            json_resp(
                200,
                json!({"items": items, "total": total, "page": 1, "totalPages": 1}),
            )
        }
        (Method::DELETE, ["snapshots", id]) => {
            // By id only: a name is not found (seen live).
            match lock(&inner.snapshots).remove(*id) {
                Some(_) => json_resp(200, json!({})),
                None => api_error(404, &format!("Snapshot {id} not found")),
            }
        }
        _ => api_error(404, &format!("Cannot {} {}", r.method, r.path)),
    }
}

/// Kills a command's whole process group (`kill(1)`: the workspace forbids `unsafe`).
async fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status()
            .await;
    }
}

/// Shell-words splitting, as the daemon's execute does (no shell runs the command).
fn split_words(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        ch => cur.push(ch),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => cur.push(chars.next()?),
                        ch => cur.push(ch),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.push(chars.next()?);
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Some(out)
}

fn file_info(path: &std::path::Path) -> Option<Value> {
    let md = std::fs::symlink_metadata(path).ok()?;
    let ft = md.file_type();
    let perm = md.permissions().mode() & 0o777;
    let kind = if ft.is_symlink() {
        'L'
    } else if ft.is_dir() {
        'd'
    } else {
        '-'
    };
    let rwx: String = (0..9)
        .map(|i| {
            if perm & (1 << (8 - i)) == 0 {
                '-'
            } else {
                ['r', 'w', 'x'][i % 3]
            }
        })
        .collect();
    let modified: chrono::DateTime<chrono::Utc> = md.modified().ok()?.into();
    Some(json!({
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "isDir": ft.is_dir(), "size": md.len(), "mode": format!("{kind}{rwx}"),
        "permissions": format!("{perm:04o}"), "modifiedAt": modified.to_rfc3339(),
        "modTime": modified.to_string(), "owner": "daytona", "group": "daytona",
    }))
}

/// The part named `file` of a multipart body.
fn multipart_file(headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
    let ct = headers.get("content-type")?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"');
    let delim = format!("--{boundary}");
    let text = body;
    let find = |hay: &[u8], needle: &[u8], from: usize| {
        hay[from..]
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    };
    let mut pos = find(text, delim.as_bytes(), 0)?;
    loop {
        let start = pos + delim.len();
        let next = find(text, delim.as_bytes(), start)?;
        let part = &text[start..next];
        let head_end = find(part, b"\r\n\r\n", 0)?;
        let head = String::from_utf8_lossy(&part[..head_end]);
        if head.contains("name=\"file\"") {
            let content = &part[head_end + 4..];
            return Some(content.strip_suffix(b"\r\n").unwrap_or(content).to_vec());
        }
        pos = next;
    }
}

async fn toolbox(inner: &Arc<Inner>, r: &Req) -> Response {
    let Some(rest) = r.path.strip_prefix("/toolbox/") else {
        return toolbox_error(404, "NOT_FOUND", "no such route");
    };
    let (sbx_id, route) = rest.split_once('/').unwrap_or((rest, ""));
    let route = format!("/{route}");
    let env = {
        let mut sbxs = lock(&inner.sandboxes);
        let Some(s) = sbxs.get_mut(sbx_id).filter(|s| s.state != "destroyed") else {
            return json_resp(
                404,
                json!({"statusCode": 404, "code": "NOT_FOUND", "source": "proxy",
                       "message": format!("sandbox {sbx_id} not found")}),
            );
        };
        if !matches!(s.state.as_str(), "started" | "snapshotting") {
            return json_resp(
                400,
                json!({"statusCode": 400, "code": "BAD_REQUEST", "source": "proxy",
                       "message": format!("sandbox is not running (state: {})", s.state)}),
            );
        }
        if s.boot_502_left > 0 {
            s.boot_502_left -= 1;
            return (StatusCode::BAD_GATEWAY, "Bad Gateway").into_response();
        }
        s.env.clone()
    };
    let seg: Vec<&str> = route.split('/').filter(|s| !s.is_empty()).collect();
    let path = r.q("path").map(std::path::PathBuf::from);
    let not_found = || toolbox_error(404, "NOT_FOUND", "file or directory not found");
    match (r.method.clone(), seg.as_slice()) {
        (Method::GET, ["version"]) => json_resp(200, json!({"version": "0.190.0"})),
        (Method::POST, ["process", "execute"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            lock(&inner.record).execute_bodies.push(b.clone());
            let Some(argv) = b["command"].as_str().and_then(split_words) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid command");
            };
            if argv.is_empty() {
                return toolbox_error(400, "BAD_REQUEST", "empty command");
            }
            let timeout = b["timeout"].as_u64().filter(|t| *t > 0).unwrap_or(10);
            let mut cmd = tokio::process::Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .envs(&env)
                .stdin(Stdio::null())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(envs) = b["envs"].as_object() {
                for (k, v) in envs {
                    cmd.env(k, v.as_str().unwrap_or_default());
                }
            }
            if let Some(cwd) = b["cwd"].as_str() {
                if !std::path::Path::new(cwd).is_dir() {
                    return toolbox_error(
                        400,
                        "BAD_REQUEST",
                        &format!("chdir {cwd}: no such file or directory"),
                    );
                }
                cmd.current_dir(cwd);
            }
            // Output combined, as the toolbox answers it.
            let (reader, writer) = match std::io::pipe() {
                Ok(p) => p,
                Err(e) => return toolbox_error(500, "INTERNAL", &e.to_string()),
            };
            let Ok(w2) = writer.try_clone() else {
                return toolbox_error(500, "INTERNAL", "pipe");
            };
            cmd.stdout(writer).stderr(w2);
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return json_resp(200, json!({"exitCode": 127, "result": e.to_string()})),
            };
            drop(cmd);
            let read = tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                let mut reader = reader;
                let _ = std::io::Read::read_to_end(&mut reader, &mut out);
                out
            });
            match tokio::time::timeout(Duration::from_secs(timeout), child.wait()).await {
                Ok(status) => {
                    let code = status.ok().and_then(|s| {
                        use std::os::unix::process::ExitStatusExt;
                        s.code().or(s.signal().map(|n| 128 + n))
                    });
                    let out = read.await.unwrap_or_default();
                    json_resp(
                        200,
                        json!({"exitCode": code, "result": String::from_utf8_lossy(&out)}),
                    )
                }
                Err(_) => {
                    kill_group(child.id()).await;
                    let _ = child.kill().await;
                    toolbox_error(
                        408,
                        "PROCESS_EXECUTION_TIMEOUT",
                        "command execution timeout",
                    )
                }
            }
        }
        (Method::POST, ["process", "session"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            let sid = b["sessionId"].as_str().unwrap_or_default().to_owned();
            let mut sessions = lock(&inner.sessions);
            let key = (sbx_id.to_owned(), sid.clone());
            if sid.is_empty() || sessions.contains_key(&key) {
                return toolbox_error(409, "CONFLICT", "session already exists");
            }
            sessions.insert(key, HashMap::new());
            StatusCode::CREATED.into_response()
        }
        (Method::DELETE, ["process", "session", sid]) => {
            match lock(&inner.sessions).remove(&(sbx_id.to_owned(), (*sid).to_owned())) {
                Some(cmds) => {
                    for (_, mut c) in cmds {
                        if let Some(k) = c.kill.take() {
                            if lock(&c.exit_code).is_none() && k.send(()).is_ok() {
                                lock(&inner.record).killed += 1;
                            }
                        }
                    }
                    StatusCode::NO_CONTENT.into_response()
                }
                None => toolbox_error(404, "NOT_FOUND", "session not found"),
            }
        }
        (Method::POST, ["process", "session", sid, "exec"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "invalid JSON");
            };
            let command = b["command"].as_str().unwrap_or_default().to_owned();
            let key = (sbx_id.to_owned(), (*sid).to_owned());
            if !lock(&inner.sessions).contains_key(&key) {
                return toolbox_error(404, "NOT_FOUND", "session not found");
            }
            let mut child = match tokio::process::Command::new("bash")
                .arg("-c")
                .arg(&command)
                .envs(&env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
            {
                Ok(c) => c,
                Err(e) => return toolbox_error(500, "INTERNAL", &e.to_string()),
            };
            let cmd_id = next_id(inner);
            let (kill_tx, kill_rx) = tokio::sync::oneshot::channel::<()>();
            let stdout = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(Vec::new()));
            let exit_code = Arc::new(Mutex::new(None));
            for (pipe, buf) in [
                (
                    child
                        .stdout
                        .take()
                        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                    stdout.clone(),
                ),
                (
                    child
                        .stderr
                        .take()
                        .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                    stderr.clone(),
                ),
            ] {
                if let Some(mut pipe) = pipe {
                    tokio::spawn(async move {
                        let mut chunk = [0u8; 4096];
                        while let Ok(n) = pipe.read(&mut chunk).await {
                            if n == 0 {
                                break;
                            }
                            lock(&buf).extend_from_slice(&chunk[..n]);
                        }
                    });
                }
            }
            let code = exit_code.clone();
            tokio::spawn(async move {
                let status = tokio::select! {
                    s = child.wait() => s.ok(),
                    _ = kill_rx => {
                        kill_group(child.id()).await;
                        let _ = child.kill().await;
                        child.wait().await.ok()
                    }
                };
                // Let the pipe readers drain.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let c = status.and_then(|s| {
                    use std::os::unix::process::ExitStatusExt;
                    s.code().or(s.signal().map(|n| 128 + n))
                });
                *lock(&code) = Some(c.unwrap_or(-1));
            });
            if let Some(cmds) = lock(&inner.sessions).get_mut(&key) {
                cmds.insert(
                    cmd_id.clone(),
                    Cmd {
                        stdout,
                        stderr,
                        exit_code,
                        kill: Some(kill_tx),
                        command,
                    },
                );
            }
            json_resp(202, json!({"cmdId": cmd_id}))
        }
        (Method::GET, ["process", "session", sid, "command", cmd, tail @ ..]) => {
            let logs = matches!(tail, ["logs"]);
            if logs {
                let delay = lock(&inner.knobs).logs_delay_ms;
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
            }
            let key = (sbx_id.to_owned(), (*sid).to_owned());
            let sessions = lock(&inner.sessions);
            let Some(c) = sessions.get(&key).and_then(|cmds| cmds.get(*cmd)) else {
                return toolbox_error(404, "NOT_FOUND", "command not found");
            };
            if !logs {
                return json_resp(
                    200,
                    json!({"id": cmd, "command": c.command, "exitCode": *lock(&c.exit_code)}),
                );
            }
            let out = String::from_utf8_lossy(&lock(&c.stdout)).into_owned();
            let err = String::from_utf8_lossy(&lock(&c.stderr)).into_owned();
            let body =
                json!({"stdout": out, "stderr": err, "output": format!("{out}{err}")}).to_string();
            let truncate = {
                let mut k = lock(&inner.knobs);
                let t = k.truncate_logs > 0;
                k.truncate_logs = k.truncate_logs.saturating_sub(1);
                t
            };
            if truncate {
                // Half the body, then the connection breaks (no chunked terminator).
                let half = Bytes::from(body.as_bytes()[..body.len() / 2].to_vec());
                let chunks: Vec<Result<Bytes, std::io::Error>> =
                    vec![Ok(half), Err(std::io::Error::other("cut"))];
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Body::from_stream(futures::stream::iter(chunks)))
                    .unwrap();
            }
            json_resp(200, serde_json::from_str(&body).unwrap())
        }
        (Method::GET, ["files"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Ok(rd) = std::fs::read_dir(&p) else {
                return not_found();
            };
            let mut items: Vec<Value> = rd
                .filter_map(Result::ok)
                .filter_map(|e| file_info(&e.path()))
                .collect();
            items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            json_resp(200, Value::Array(items))
        }
        (Method::GET, ["files", "info"]) => match path.as_deref().and_then(file_info) {
            Some(v) => json_resp(200, v),
            None => not_found(),
        },
        (Method::GET, ["files", "download"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            if p.is_dir() {
                return toolbox_error(400, "BAD_REQUEST", "path is a directory");
            }
            match std::fs::read(&p) {
                Ok(bytes) => (
                    StatusCode::OK,
                    [("content-type", "application/octet-stream")],
                    bytes,
                )
                    .into_response(),
                Err(_) => not_found(),
            }
        }
        (Method::POST, ["files", "upload"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Some(content) = multipart_file(&r.headers, &r.body) else {
                return toolbox_error(400, "BAD_REQUEST", "no file part");
            };
            if let Some(parent) = p.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            match std::fs::write(&p, content) {
                Ok(()) => json_resp(200, json!({})),
                Err(e) => toolbox_error(400, "BAD_REQUEST", &e.to_string()),
            }
        }
        (Method::POST, ["files", "permissions"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            if !p.exists() {
                return not_found();
            }
            if let Some(mode) = r.q("mode") {
                // Octal, as Daytona's daemon parses it.
                let Ok(bits) = u32::from_str_radix(mode, 8) else {
                    return toolbox_error(400, "BAD_REQUEST", "invalid mode");
                };
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(bits));
            }
            json_resp(200, json!({}))
        }
        (Method::DELETE, ["files"]) => {
            let Some(p) = path else {
                return toolbox_error(400, "BAD_REQUEST", "path is required");
            };
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                return not_found();
            };
            let res = if md.is_dir() {
                std::fs::remove_dir(&p)
            } else {
                std::fs::remove_file(&p)
            };
            match res {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(e) => toolbox_error(400, "BAD_REQUEST", &e.to_string()),
            }
        }
        _ => toolbox_error(404, "NOT_FOUND", &format!("no route {} {route}", r.method)),
    }
}
