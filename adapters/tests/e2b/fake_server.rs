//! A fake E2B: the control plane (`openapi.yml`) and envd (`envd.yaml`, `process.proto`,
//! `filesystem.proto`) behind an edge that routes by `E2b-Sandbox-Id`, written from the specs
//! and what E2B's SDKs rely on:
//!
//! - `X-API-Key` on the API; a wrong key is a 401 whose message quotes the key it got (so
//!   the adapter's scrubbing is tested, not assumed).
//! - `POST /sandboxes` answers 201 once the sandbox runs; envd's `/health` may still be a
//!   502 from the edge for a few polls (`Knobs::envd_boot_polls`). Past the plan's
//!   concurrency a 429 (`Knobs::max_running`); a timeout past the plan's a 400 ("Timeout
//!   cannot be greater than 1 hours").
//! - `GET /v2/sandboxes`: `metadata=k%3Dv` filter, `state=running,paused`, pages of `limit`
//!   (capped by `Knobs::page_size`) with `X-Next-Token`; listed sandboxes carry no envd token.
//! - Pause is a 409 when already paused; `/connect` answers 200 (running) or 201 (resumed).
//! - Snapshots: `POST /sandboxes/{id}/snapshots` with an existing name adds a build to the
//!   same snapshot (counted), `GET /snapshots?sandboxID=&name=`, `DELETE /templates/{id}`.
//! - envd wants the sandbox's `X-Access-Token`; commands run for real on the test host
//!   (`Command::new(cmd).args(args)`, no shell), streamed as Connect envelopes of
//!   `ProcessEvent` in protobuf JSON (zero values omitted: a clean exit has no `exitCode`;
//!   bytes base64; `size` as a string), keep-alives, `Connect-Timeout-Ms` honoured with
//!   `deadline_exceeded`, the command killed when the client goes away.
//! - `filesystem.Filesystem/Remove` removes whole trees (as Go's `os.RemoveAll`); a
//!   directory's `mode` carries Go's `ModeDir` bit.
//!
//! File paths are host paths: tests stay inside a temp dir.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use axum::Router;
use serde_json::{json, Value};

use crate::support::http::{self, json_resp, lock, Req};

// By path: the e2e tests include this file by path too, where a plain `mod` would look
// for these beside it.
#[path = "fake_server/control_plane.rs"]
mod control_plane;
#[path = "fake_server/envd.rs"]
mod envd;
#[path = "fake_server/process.rs"]
mod process;

use control_plane::api;
use envd::envd;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Fault injection and behaviour switches.
#[derive(Debug)]
pub struct Knobs {
    /// The next requests whose `METHOD path` contains the string fail with the status.
    pub fail_next: VecDeque<(String, u16)>,
    /// Delay before answering any API request.
    pub delay_ms: u64,
    /// envd's `/health` is a 502 from the edge this many times after each create or resume.
    pub envd_boot_polls: u32,
    /// The plan's concurrent sandboxes (429 past it).
    pub max_running: usize,
    /// The plan's longest timeout, seconds.
    pub max_timeout: u64,
    /// Largest page `GET /v2/sandboxes` returns.
    pub page_size: usize,
    /// Close exec streams after this many envelopes, without an end.
    pub truncate_after_frames: Option<usize>,
    /// Send nothing at all on exec streams for this long first.
    pub stall_ms: u64,
    /// Keep-alive period on exec streams.
    pub keepalive_ms: u64,
    /// Answer ranged downloads with 200 and the whole file.
    pub ignore_range: bool,
    /// Ignore the metadata filter of `GET /v2/sandboxes` (a server bug the adapter guards).
    pub ignore_metadata_filter: bool,
    /// The header the API reads its key from (lower case; E2B's is `x-api-key`).
    pub auth_header: String,
    /// The key comes as `Bearer <key>` (backends behind an `Authorization` gateway).
    pub auth_bearer: bool,
    /// The `envdVersion` create, connect, get and list answer.
    pub envd_version: String,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: VecDeque::new(),
            delay_ms: 0,
            envd_boot_polls: 0,
            max_running: 100,
            max_timeout: 3600,
            page_size: 100,
            truncate_after_frames: None,
            stall_ms: 0,
            keepalive_ms: 1000,
            ignore_range: false,
            ignore_metadata_filter: false,
            auth_header: "x-api-key".to_owned(),
            auth_bearer: false,
            envd_version: "0.6.13".to_owned(),
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    pub requests: Vec<String>,
    pub create_bodies: Vec<Value>,
    pub start_bodies: Vec<Value>,
    pub timeouts: Vec<(String, u64)>,
    /// Requests that reached envd carrying the API key.
    pub key_seen_on_envd: u32,
    /// envd requests without (or with a wrong) access token.
    pub bad_tokens: u32,
    /// envd requests routed by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers.
    pub header_routed: u32,
    /// envd requests routed by a `Host` of `<port>-<id>.<domain>`.
    pub host_routed: u32,
    /// Linux users envd was asked to act as (`Authorization: Basic`).
    pub users: Vec<String>,
    /// Commands killed because their client went away or past their deadline.
    pub cancelled: u32,
    /// `SendSignal` calls.
    pub signals: u32,
    /// The command lines (`cmd` and `args`, space-joined) those signals reached, in order.
    pub signalled: Vec<String>,
    /// Builds added to snapshots (a repeated name adds one).
    pub snapshot_builds: u32,
}

#[derive(Debug, Clone)]
pub struct Sbx {
    pub id: String,
    pub template: String,
    pub state: String,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub token: String,
    pub timeout: u64,
    pub allow_public_traffic: Option<bool>,
    boot_polls_left: u32,
}

#[derive(Debug, Clone)]
pub struct Snap {
    pub id: String,
    pub name: String,
    pub sandbox: String,
    pub env: BTreeMap<String, String>,
}

struct Proc {
    stdin: Option<tokio::process::ChildStdin>,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    /// `cmd` and `args`, space-joined.
    line: String,
}

struct Inner {
    key: Mutex<String>,
    api_addr: SocketAddr,
    envd_addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    sandboxes: Mutex<BTreeMap<String, Sbx>>,
    snapshots: Mutex<BTreeMap<String, Snap>>,
    procs: Mutex<HashMap<u32, Proc>>,
    seq: Mutex<u64>,
}

/// A running fake.
#[derive(Clone)]
pub struct FakeServer {
    inner: Arc<Inner>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Listener {
    Api,
    Envd,
}

impl FakeServer {
    pub async fn start(key: &str) -> FakeServer {
        let api = http::bind().await;
        let envd = http::bind().await;
        let inner = Arc::new(Inner {
            key: Mutex::new(key.to_owned()),
            api_addr: api.local_addr().unwrap(),
            envd_addr: envd.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            sandboxes: Mutex::new(BTreeMap::new()),
            snapshots: Mutex::new(BTreeMap::new()),
            procs: Mutex::new(HashMap::new()),
            seq: Mutex::new(0),
        });
        for (listener, which) in [(api, Listener::Api), (envd, Listener::Envd)] {
            let app = Router::new()
                .fallback(handle)
                .with_state((inner.clone(), which));
            http::serve(listener, app);
        }
        FakeServer { inner }
    }

    pub fn set_key(&self, key: &str) {
        *lock(&self.inner.key) = key.to_owned();
    }

    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.api_addr)
    }

    pub fn envd_url(&self) -> String {
        format!("http://{}", self.inner.envd_addr)
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    pub fn sandboxes(&self) -> Vec<Sbx> {
        lock(&self.inner.sandboxes).values().cloned().collect()
    }

    pub fn sandbox(&self, id: &str) -> Option<Sbx> {
        lock(&self.inner.sandboxes).get(id).cloned()
    }

    pub fn snapshots(&self) -> Vec<Snap> {
        lock(&self.inner.snapshots).values().cloned().collect()
    }

    /// How many commands envd still runs.
    pub fn running_commands(&self) -> usize {
        lock(&self.inner.procs).len()
    }

    /// Puts a sandbox straight into the server (an orphan, or a twin from a race).
    pub fn insert(&self, metadata: BTreeMap<String, String>, state: &str) -> String {
        let id = next_id(&self.inner, "i");
        lock(&self.inner.sandboxes).insert(
            id.clone(),
            Sbx {
                id: id.clone(),
                template: "base".to_owned(),
                state: state.to_owned(),
                metadata,
                env: BTreeMap::new(),
                token: format!("tok-{id}"),
                timeout: 300,
                allow_public_traffic: None,
                boot_polls_left: 0,
            },
        );
        id
    }

    pub fn set_state(&self, id: &str, state: &str) {
        if let Some(s) = lock(&self.inner.sandboxes).get_mut(id) {
            s.state = state.to_owned();
        }
    }

    /// Removes a sandbox behind the adapter's back (it timed out on E2B).
    pub fn remove(&self, id: &str) {
        lock(&self.inner.sandboxes).remove(id);
    }
}

fn next_id(inner: &Inner, prefix: &str) -> String {
    let mut n = lock(&inner.seq);
    *n += 1;
    format!("{prefix}{:06x}{:04x}q", *n, std::process::id() & 0xffff)
}

type St = (Arc<Inner>, Listener);

/// E2B's `Error` body.
fn err(status: u16, message: &str) -> Response {
    json_resp(status, json!({"code": status, "message": message}))
}

/// A Connect unary error.
fn connect_err(status: u16, code: &str, message: &str) -> Response {
    json_resp(status, json!({"code": code, "message": message}))
}

async fn handle(State((inner, which)): State<St>, req: Request) -> Response {
    let r = Req::read(req, 512 * 1024 * 1024).await;
    let line = format!("{} {}", r.method, r.path);
    lock(&inner.record).requests.push(line.clone());
    let failure = {
        let mut k = lock(&inner.knobs);
        let i = k
            .fail_next
            .iter()
            .position(|(p, _)| line.contains(p.as_str()));
        i.and_then(|i| k.fail_next.remove(i))
    };
    if let Some((_, status)) = failure {
        return match status {
            429 => err(429, "Rate limit exceeded, please try again later."),
            502 => err(502, "The sandbox was not found"),
            s => err(s, "injected failure"),
        };
    }
    match which {
        Listener::Api => {
            let delay = lock(&inner.knobs).delay_ms;
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let key = lock(&inner.key).clone();
            let (header, bearer) = {
                let k = lock(&inner.knobs);
                (k.auth_header.clone(), k.auth_bearer)
            };
            let got = r.header(&header).map(|v| {
                if bearer {
                    v.strip_prefix("Bearer ").unwrap_or("")
                } else {
                    v
                }
            });
            match got {
                Some(k) if k == key => api(&inner, r),
                Some(k) => err(401, &format!("Invalid API key: {k}")),
                None => err(401, "Authorization header is missing"),
            }
        }
        Listener::Envd => envd(&inner, r).await,
    }
}

fn detail(s: &Sbx, with_token: bool, envd_version: &str) -> Value {
    let mut v = json!({
        "templateID": s.template, "sandboxID": s.id, "clientID": "6532622b",
        "startedAt": "2026-12-01T10:00:00Z", "endAt": "2026-12-01T11:00:00Z",
        "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "envdVersion": envd_version,
        "state": s.state, "metadata": s.metadata, "domain": null,
    });
    if with_token {
        v["envdAccessToken"] = json!(s.token);
    }
    v
}
