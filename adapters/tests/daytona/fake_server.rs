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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::support::http::{self, json_resp, lock, Req};

// By path: the e2e tests include this file by path too, where a plain `mod` would look
// for these beside it.
#[path = "fake_server/api.rs"]
mod api;
#[path = "fake_server/toolbox.rs"]
mod toolbox;

use api::api;
use toolbox::toolbox;

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
