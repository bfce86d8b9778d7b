//! A fake OpenSandbox: the lifecycle server and execd, written from the specs and NOTES.md.
//!
//! `Variant::Real` reproduces server 1.1.1 / execd 1.1 as observed: bare-JSON event frames,
//! one event per line with the newline stripped and empty lines dropped, exit codes only in
//! the `error` event, metadata upload part must be a file part, FastAPI 422 validation errors,
//! runtime-prefixed error codes, synchronous Docker create (`Running` at once, no Location),
//! immediate pause, routes with and without `/v1`, an unauthenticated server proxy.
//! `Variant::Spec` does what the published specs say: SSE `data:` frames, output chunks with
//! their line terminators, 400 ErrorResponse validation errors, unprefixed codes, `Pending`
//! and `Pausing` states that need polling, a Location header, plain metadata field accepted.
//!
//! Commands really run (`bash -c` on the test host), so quoting, env, cwd, exit codes and
//! timeouts are the shell's. File paths are host paths: tests stay inside a temp dir.
//!
//! Two listeners: the server (`api_url`) and a "host port" listener standing for execd's
//! published port (`/{sandbox}/proxy/44772/...`), which records any API key sent to it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::fake_versions::{execd_token, FakeVersion};
use crate::support::http::{self, lock, Req};

// By path: the e2e tests and the load tests include this file by path too, where a plain
// `mod` would look for these beside it.
#[path = "fake_server/execd.rs"]
mod execd;
#[path = "fake_server/files.rs"]
mod files;
#[path = "fake_server/sandboxes.rs"]
mod sandboxes;
#[path = "fake_server/snapshots.rs"]
mod snapshots;

use execd::execd_entry;
use sandboxes::api;

pub const KEY_HEADER: &str = "open-sandbox-api-key";

/// Which behaviour to reproduce where the real server and the spec differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Real,
    Spec,
}

/// The runtime the fake server pretends to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeRuntime {
    Docker,
    Kubernetes,
    Fastsandbox,
}

/// Fault injection and behaviour switches.
#[derive(Debug, Default)]
pub struct Knobs {
    /// The next N lifecycle requests whose path contains the string fail with the status.
    pub fail_next: VecDeque<(String, u16)>,
    /// Delay before answering any lifecycle request.
    pub delay_ms: u64,
    /// Close exec streams after this many frames, without an end event.
    pub truncate_after_frames: Option<usize>,
    /// Delay before each exec frame.
    pub frame_delay_ms: u64,
    /// Send nothing at all on exec streams (no pings either) for this long first.
    pub stall_ms: u64,
    /// Image URIs whose pull fails.
    pub bad_images: Vec<String>,
    /// Headers the endpoint API returns (as secure access would).
    pub endpoint_headers: BTreeMap<String, String>,
    /// Kubernetes: whether the snapshot registry is configured (default false → set true).
    pub registry: bool,
    /// Answer download requests with 200 and the whole file even when a Range was asked.
    pub ignore_range: bool,
    /// execd requires this access token (`X-EXECD-ACCESS-TOKEN`).
    pub execd_token: Option<String>,
    /// Error events carry a text `evalue` ("exit status N"); only `/command/status` has the code.
    pub evalue_text: bool,
    /// Answer the next lifecycle request with a redirect to this URL.
    pub redirect_to: Option<String>,
    /// The server is down behind its load balancer: every lifecycle request answers 503.
    pub unavailable: bool,
    /// Which release the server plays (`fake_versions.rs`); 1.1.1 unless set.
    pub version: FakeVersion,
    /// The master key version execd tokens derive from (1.3); bump it to rotate them.
    pub execd_key_version: u32,
    /// `Retry-After` values: each of the next creates answers 429 with the first one left.
    pub throttle_creates: VecDeque<String>,
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    pub requests: Vec<String>,
    /// Every request as its head arrived, before its body was read: `METHOD path` and its
    /// `Content-Length` (`None`: chunked), so a test can see a request whose body never came.
    pub heads: Vec<(String, Option<u64>)>,
    pub create_bodies: Vec<Value>,
    pub command_bodies: Vec<Value>,
    pub renewals: Vec<String>,
    /// Requests that reached the execd host port carrying the server's API key.
    pub key_seen_on_execd: u32,
    /// Commands killed because their client went away (spec variant).
    pub cancelled: u32,
    /// Commands whose client went away and that kept running, as on real execd (recorded:
    /// still running 8 s later); only an interrupt or their own end stops them.
    pub abandoned: u32,
    pub interrupts: u32,
    /// `POST /sandboxes/{id}/snapshots` bodies.
    pub snapshot_bodies: Vec<Value>,
    /// `GET /version` asked.
    pub version_asks: u32,
    /// Creates answered 429.
    pub throttled: u32,
    /// Requests to routes the played version removed (answered 404).
    pub removed_route_hits: u32,
    /// Bodies refused for an unknown field (422 `extra_forbidden`).
    pub unknown_field_refusals: u32,
    /// execd requests that came to its own port, and through the server proxy.
    pub execd_direct: u32,
    pub execd_proxied: u32,
}

#[derive(Debug, Clone)]
pub struct Sbx {
    pub id: String,
    pub state: String,
    pub reason: String,
    pub message: String,
    pub metadata: BTreeMap<String, String>,
    /// The metadata given at create: what a sandbox restored from its snapshot inherits
    /// (recorded on the real server), whatever was patched since.
    pub created_metadata: BTreeMap<String, String>,
    pub image: Option<String>,
    pub snapshot_id: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Given at create; every command sees it, as in a container.
    pub env: BTreeMap<String, String>,
    polls_left: u32,
    fail_with: Option<(String, String)>,
}

#[derive(Debug, Clone)]
struct Snap {
    id: String,
    sandbox_id: String,
    /// The source sandbox's create-time metadata, inherited by restores.
    metadata: BTreeMap<String, String>,
    /// When the state last changed (real answers carry it in `status`).
    since: DateTime<Utc>,
    name: Option<String>,
    state: String,
    polls_left: u32,
    created_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
struct Cmd {
    content: String,
    running: bool,
    exit_code: Option<i32>,
    pgid: Option<u32>,
    started_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    /// execd's `error` text: `exit status N`, `signal: terminated`, `signal: killed`.
    error: Option<String>,
    /// Merged stdout+stderr as written, for `/command/{id}/logs` (a byte cursor into it).
    output: Vec<u8>,
    /// Interrupted (`DELETE /command`): SIGTERM, so `signal: terminated`.
    interrupted: bool,
}

struct Inner {
    variant: Variant,
    runtime: FakeRuntime,
    /// The API key the server accepts; replaceable, as an operator rotates it.
    key: Mutex<String>,
    api_addr: SocketAddr,
    execd_addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    sandboxes: Mutex<BTreeMap<String, Sbx>>,
    snapshots: Mutex<BTreeMap<String, Snap>>,
    commands: Mutex<HashMap<String, Cmd>>,
    seq: Mutex<u64>,
    /// Where creates and deletes are written as fake-adapter ledger lines, when set (the
    /// fault suite's ground truth for an out-of-process OpenSandbox).
    ledger: Mutex<Option<std::fs::File>>,
}

/// A running fake; dropped with the test's runtime.
#[derive(Clone)]
pub struct FakeServer {
    inner: Arc<Inner>,
    /// execd's PTY sessions (`fake_pty`).
    pub ptys: Arc<crate::fake_pty::FakePtys>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Listener {
    Api,
    Execd,
}

impl FakeServer {
    pub async fn start(variant: Variant, runtime: FakeRuntime, key: &str) -> FakeServer {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST), variant, runtime, key).await
    }

    /// Listens on `ip` (random ports): the fault suite runs the fake inside a network
    /// namespace of its own, on the namespace's address.
    pub async fn start_on(
        ip: IpAddr,
        variant: Variant,
        runtime: FakeRuntime,
        key: &str,
    ) -> FakeServer {
        let api = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let execd = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let inner = Arc::new(Inner {
            variant,
            runtime,
            key: Mutex::new(key.to_owned()),
            api_addr: api.local_addr().unwrap(),
            execd_addr: execd.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            sandboxes: Mutex::new(BTreeMap::new()),
            snapshots: Mutex::new(BTreeMap::new()),
            commands: Mutex::new(HashMap::new()),
            seq: Mutex::new(0),
            ledger: Mutex::new(None),
        });
        let ptys = Arc::new(crate::fake_pty::FakePtys::default());
        for (listener, which) in [(api, Listener::Api), (execd, Listener::Execd)] {
            let mut app = Router::new()
                .fallback(handle)
                .with_state((inner.clone(), which));
            if which == Listener::Execd {
                app = crate::fake_pty::router(ptys.clone()).merge(app);
            }
            http::serve(listener, app);
        }
        FakeServer { inner, ptys }
    }

    /// Appends every create and delete to `file` as fake-adapter ledger lines
    /// (`differently_adapters::fake::LedgerEntry`), flushed per line.
    pub fn set_ledger(&self, file: std::fs::File) {
        *lock(&self.inner.ledger) = Some(file);
    }

    /// Plays server release `v` from now on (`fake_versions.rs`).
    pub fn set_version(&self, v: FakeVersion) {
        lock(&self.inner.knobs).version = v;
    }

    /// Makes the server accept `key` (and only it) from now on.
    pub fn set_key(&self, key: &str) {
        *lock(&self.inner.key) = key.to_owned();
    }

    /// `http://127.0.0.1:port/v1`
    pub fn api_url(&self) -> String {
        format!("http://{}/v1", self.inner.api_addr)
    }

    /// `http://127.0.0.1:port` of the execd host-port listener.
    pub fn execd_origin(&self) -> String {
        format!("http://{}", self.inner.execd_addr)
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    /// How many commands execd is still running.
    pub fn commands_running(&self) -> usize {
        lock(&self.inner.commands)
            .values()
            .filter(|c| c.running)
            .count()
    }

    pub fn sandboxes(&self) -> Vec<Sbx> {
        lock(&self.inner.sandboxes).values().cloned().collect()
    }

    pub fn sandbox(&self, id: &str) -> Option<Sbx> {
        lock(&self.inner.sandboxes).get(id).cloned()
    }

    pub fn snapshot_names(&self) -> Vec<(String, String)> {
        lock(&self.inner.snapshots)
            .values()
            .map(|s| (s.name.clone().unwrap_or_default(), s.state.clone()))
            .collect()
    }

    /// Puts a sandbox straight into the server (an orphan, or a second instance from a race).
    pub fn insert(&self, metadata: BTreeMap<String, String>, state: &str) -> String {
        let id = next_id(&self.inner, "sbx");
        lock(&self.inner.sandboxes).insert(
            id.clone(),
            Sbx {
                id: id.clone(),
                state: state.to_owned(),
                reason: String::new(),
                message: String::new(),
                created_metadata: metadata.clone(),
                metadata,
                image: Some("ubuntu:24.04".to_owned()),
                snapshot_id: None,
                expires_at: None,
                created_at: Utc::now(),
                env: BTreeMap::new(),
                polls_left: 0,
                fail_with: None,
            },
        );
        id
    }

    pub fn set_state(&self, id: &str, state: &str) {
        if let Some(s) = lock(&self.inner.sandboxes).get_mut(id) {
            s.state = state.to_owned();
        }
    }
}

fn next_id(inner: &Inner, prefix: &str) -> String {
    let mut n = lock(&inner.seq);
    *n += 1;
    // Real ids are hex-ish strings.
    format!("{prefix}{:08x}{:04x}", *n, std::process::id() & 0xffff)
}

type St = (Arc<Inner>, Listener);

fn json_resp(status: u16, v: Value) -> Response {
    let mut r = http::json_resp(status, v);
    r.headers_mut().insert(
        "x-request-id",
        HeaderValue::from_static("0123456789abcdef0123456789abcdef"),
    );
    r
}

impl Inner {
    fn code(&self, code: &str) -> String {
        match self.variant {
            Variant::Spec => code.to_owned(),
            Variant::Real => {
                let prefix = match self.runtime {
                    FakeRuntime::Docker => "DOCKER",
                    FakeRuntime::Kubernetes => "KUBERNETES",
                    FakeRuntime::Fastsandbox => "FSB",
                };
                format!("{prefix}::{code}")
            }
        }
    }

    /// One ledger line (when a ledger is set): `sandboxId` from Differently's metadata tag.
    fn ledger_line(
        &self,
        op: &str,
        metadata: Option<&BTreeMap<String, String>>,
        backend_ref: &str,
        outcome: &str,
    ) {
        let mut guard = lock(&self.ledger);
        let Some(f) = guard.as_mut() else { return };
        let mut line = json!({
            "at": Utc::now(), "op": op, "backendRef": backend_ref, "outcome": outcome,
            "pid": std::process::id(),
        });
        if let Some(m) = metadata {
            if let Some(sid) = m.get("differently-sandbox-id") {
                line["sandboxId"] = json!(sid);
            }
            if let Some(inst) = m.get("differently-installation-id") {
                line["installationId"] = json!(inst);
            }
        }
        let _ = writeln!(f, "{line}").and_then(|()| f.flush());
    }

    fn err(&self, status: u16, code: &str, message: &str) -> Response {
        json_resp(status, json!({"code": self.code(code), "message": message}))
    }

    /// A request validation error: FastAPI 422 on the real server, 400 per the spec.
    fn invalid(&self, loc: &str, msg: &str, input: Value) -> Response {
        match self.variant {
            Variant::Real => json_resp(
                422,
                json!({"detail": [{"type": "value_error", "loc": ["body", loc], "msg": msg, "input": input}]}),
            ),
            Variant::Spec => json_resp(
                400,
                json!({"code": "INVALID_PARAMETER", "message": format!("{loc}: {msg}")}),
            ),
        }
    }

    /// A bound check (`ge`/`le`), as FastAPI words it on the real server.
    fn out_of_bounds(&self, loc: [&str; 2], bound: &str, limit: u64, input: Value) -> Response {
        let (ty, words) = match bound {
            "ge" => ("greater_than_equal", "greater than or equal to"),
            _ => ("less_than_equal", "less than or equal to"),
        };
        let msg = format!("Input should be {words} {limit}");
        match self.variant {
            Variant::Real => json_resp(
                422,
                json!({"detail": [{"type": ty, "loc": loc, "msg": msg, "input": input,
                                    "ctx": {bound: limit}}]}),
            ),
            Variant::Spec => self.invalid(loc[1], &msg, input),
        }
    }

    /// A model-level validator's failure: on the real server it is located at the whole body.
    fn invalid_model(&self, loc: &str, msg: &str, body: &Value) -> Response {
        match self.variant {
            Variant::Real => json_resp(
                422,
                json!({"detail": [{"type": "value_error", "loc": ["body"],
                                    "msg": format!("Value error, {msg}"), "input": body,
                                    "ctx": {"error": {}}}]}),
            ),
            Variant::Spec => self.invalid(loc, msg, Value::Null),
        }
    }
}

async fn handle(State((inner, which)): State<St>, req: Request) -> Response {
    let length = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    lock(&inner.record)
        .heads
        .push((format!("{} {}", req.method(), req.uri().path()), length));
    let r = Req::read(req, 512 * 1024 * 1024).await;
    lock(&inner.record)
        .requests
        .push(format!("{} {}", r.method, r.path));
    match which {
        Listener::Execd => {
            if r.headers.contains_key(KEY_HEADER) {
                lock(&inner.record).key_seen_on_execd += 1;
            }
            let mut segs = r.path.trim_start_matches('/').splitn(4, '/');
            let (Some(id), Some("proxy"), Some("44772")) = (segs.next(), segs.next(), segs.next())
            else {
                return json_resp(404, json!({"detail": "Not Found"}));
            };
            let rest = format!("/{}", segs.next().unwrap_or(""));
            let id = id.to_owned();
            lock(&inner.record).execd_direct += 1;
            let (version, key_version) = {
                let k = lock(&inner.knobs);
                (k.version, k.execd_key_version)
            };
            if version.execd_tokens() {
                let got = r
                    .headers
                    .get("x-execd-access-token")
                    .and_then(|v| v.to_str().ok());
                if got != Some(execd_token(key_version, &id).as_str()) {
                    return json_resp(
                        401,
                        json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}),
                    );
                }
            }
            execd_entry(&inner, &id, &rest, r).await
        }
        Listener::Api => api(&inner, r).await,
    }
}

fn auth(inner: &Inner, r: &Req) -> Option<Response> {
    match r.headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) {
        None => Some(json_resp(
            401,
            json!({"code": "MISSING_API_KEY", "message": "Authentication credentials were not provided"}),
        )),
        Some(k) if k != *lock(&inner.key) => Some(json_resp(
            401,
            json!({"code": "INVALID_API_KEY", "message": "Invalid API key"}),
        )),
        Some(_) => None,
    }
}

// ---------------------------------------------------------------------------------------
// execd

/// Go's `httputil.ReverseProxy` answer when the target refuses (recorded).
fn bad_gateway() -> Response {
    (
        StatusCode::BAD_GATEWAY,
        [("content-type", "text/plain; charset=utf-8")],
        "Bad Gateway\n",
    )
        .into_response()
}
