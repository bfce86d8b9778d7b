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
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::fake_versions::{execd_token, BodyKind, FakeVersion};
use crate::support::http::{self, lock, pct_decode, Req};

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

async fn api(inner: &Arc<Inner>, r: Req) -> Response {
    let path = match r.path.strip_prefix("/v1") {
        Some(p) => p.to_owned(),
        None if inner.variant == Variant::Real => r.path.clone(),
        None => return json_resp(404, json!({"detail": "Not Found"})),
    };
    if path == "/health" && inner.variant == Variant::Real {
        return json_resp(200, json!({"status": "healthy"}));
    }
    // Recorded: no key needed, beside `/v1` rather than under it.
    if r.path == "/version" && inner.variant == Variant::Real {
        lock(&inner.record).version_asks += 1;
        let v = lock(&inner.knobs).version;
        return json_resp(200, json!({"version": v.answer()}));
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();

    // The server proxy: unauthenticated on the real single-tenant server.
    if segs.len() >= 4 && segs[0] == "sandboxes" && segs[2] == "proxy" {
        if inner.variant == Variant::Spec {
            if let Some(resp) = auth(inner, &r) {
                return resp;
            }
        }
        // Recorded on Docker with nothing listening: a published port (8080) is reached
        // through docker-proxy, which accepts and closes; any other goes through execd's own
        // port proxy, whose 502 is passed through.
        if segs[3] == "8080" && inner.variant == Variant::Real {
            return json_resp(
                502,
                json!({"code": "BACKEND_RESPONSE_FAILED",
                       "message": "The backend sandbox dropped the connection or sent an invalid response: Server disconnected without sending a response."}),
            );
        }
        if segs[3] != "44772" && inner.variant == Variant::Real {
            return bad_gateway();
        }
        if segs[3] != "44772" {
            return json_resp(
                502,
                json!({"code": "BACKEND_CONNECTION_FAILED", "message": "connection refused"}),
            );
        }
        let rest = format!("/{}", segs[4..].join("/"));
        let id = segs[1].to_owned();
        // 1.3: the proxy (maintenance mode) adds the sandbox's token itself.
        lock(&inner.record).execd_proxied += 1;
        return execd_entry(inner, &id, &rest, r).await;
    }

    if lock(&inner.knobs).unavailable {
        return inner.err(503, "SERVICE_UNAVAILABLE", "no healthy upstream");
    }
    if let Some(resp) = auth(inner, &r) {
        return resp;
    }
    if let Some(to) = lock(&inner.knobs).redirect_to.take() {
        return Response::builder()
            .status(307)
            .header("location", to)
            .body(Body::empty())
            .unwrap();
    }
    let delay = lock(&inner.knobs).delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    {
        let mut k = lock(&inner.knobs);
        if let Some(i) = k
            .fail_next
            .iter()
            .position(|(p, _)| path.contains(p.as_str()))
        {
            let (_, status) = k.fail_next.remove(i).unwrap();
            drop(k);
            // Echo the key, as a careless server might: the adapter must scrub it.
            let echoed = r
                .headers
                .get(KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            return inner.err(
                status,
                "INTERNAL_ERROR",
                &format!("injected failure (key {echoed})"),
            );
        }
    }

    if let Some(resp) = versioned(inner, &r, &segs) {
        return resp;
    }
    let m = &r.method;
    match (m.clone(), segs.as_slice()) {
        (Method::POST, ["sandboxes"]) => create(inner, &r),
        // The SDK's telemetry; recorded 204.
        (Method::POST, ["metrics", "events"]) => StatusCode::NO_CONTENT.into_response(),
        (Method::PATCH, ["sandboxes", id, "metadata"]) => patch_metadata(inner, id, &r),
        (Method::GET, ["sandboxes", id, "diagnostics", kind @ ("logs" | "events")]) => {
            diagnostics(inner, id, kind, &r)
        }
        (Method::GET, ["sandboxes"]) => list(inner, &r),
        (Method::GET, ["sandboxes", id]) => get(inner, id),
        (Method::DELETE, ["sandboxes", id]) => {
            let removed = lock(&inner.sandboxes).remove(*id);
            inner.ledger_line(
                "delete",
                removed.as_ref().map(|s| &s.metadata),
                id,
                if removed.is_some() {
                    "deleted"
                } else {
                    "missing"
                },
            );
            if removed.is_some() {
                StatusCode::NO_CONTENT.into_response()
            } else {
                inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found")
            }
        }
        (Method::POST, ["sandboxes", id, "pause"]) => transition(inner, id, "Running", "Paused"),
        (Method::POST, ["sandboxes", id, "resume"]) => transition(inner, id, "Paused", "Running"),
        (Method::POST, ["sandboxes", id, "renew-expiration"]) => renew(inner, id, &r),
        (Method::GET, ["sandboxes", id, "endpoints", port]) => endpoint(inner, id, port, &r),
        (Method::POST, ["sandboxes", id, "snapshots"]) => create_snapshot(inner, id, &r),
        (Method::GET, ["snapshots"]) => list_snapshots(inner, &r),
        (Method::GET, ["snapshots", sid]) => {
            advance_snapshots(inner);
            match lock(&inner.snapshots).get(*sid) {
                Some(s) => json_resp(200, snap_json(s)),
                None => snapshot_not_found(inner, sid),
            }
        }
        (Method::DELETE, ["snapshots", sid]) => delete_snapshot(inner, sid),
        _ => json_resp(404, json!({"detail": "Not Found"})),
    }
}

/// What the played version does before the route's own handler: a removed route's 404,
/// a body's unknown field (1.2+), a throttled create's 429.
fn versioned(inner: &Inner, r: &Req, segs: &[&str]) -> Option<Response> {
    let version = lock(&inner.knobs).version;
    if version.removed(segs) {
        lock(&inner.record).removed_route_hits += 1;
        return Some(json_resp(404, json!({"detail": "Not Found"})));
    }
    let kind = match (&r.method, segs) {
        (&Method::POST, ["sandboxes"]) => BodyKind::CreateSandbox,
        (&Method::POST, ["sandboxes", _, "snapshots"]) => BodyKind::CreateSnapshot,
        (&Method::POST, ["sandboxes", _, "renew-expiration"]) => BodyKind::Renew,
        _ => return None,
    };
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    if let Some(detail) = version.refuse_unknown(kind, &body) {
        lock(&inner.record).unknown_field_refusals += 1;
        return Some(json_resp(422, detail));
    }
    if kind == BodyKind::CreateSandbox {
        if let Some(wait) = lock(&inner.knobs).throttle_creates.pop_front() {
            lock(&inner.record).throttled += 1;
            let mut resp = inner.err(429, "RATE_LIMITED", "too many sandbox creates; retry later");
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_str(&wait).unwrap());
            return Some(resp);
        }
    }
    None
}

/// Recorded: `SNAPSHOT::NOT_FOUND` (a snapshot-service code, not runtime-prefixed).
fn snapshot_not_found(inner: &Inner, sid: &str) -> Response {
    match inner.variant {
        Variant::Real => json_resp(
            404,
            json!({"code": "SNAPSHOT::NOT_FOUND", "message": format!("Snapshot {sid} not found")}),
        ),
        Variant::Spec => inner.err(404, "SNAPSHOT_NOT_FOUND", "snapshot not found"),
    }
}

/// Recorded: a delete while Creating is `409 SNAPSHOT::INVALID_STATE`; while a restored
/// sandbox still uses the image it is `409 SNAPSHOT::DELETE_CONFLICT` and the snapshot is left
/// `Deleting`; otherwise 204.
fn delete_snapshot(inner: &Inner, sid: &str) -> Response {
    advance_snapshots(inner);
    let in_use = lock(&inner.sandboxes)
        .values()
        .any(|s| s.snapshot_id.as_deref() == Some(sid));
    let mut snaps = lock(&inner.snapshots);
    let Some(snap) = snaps.get_mut(sid) else {
        drop(snaps);
        return snapshot_not_found(inner, sid);
    };
    if snap.state == "Creating" {
        let code = match inner.variant {
            Variant::Real => "SNAPSHOT::INVALID_STATE",
            Variant::Spec => "SNAPSHOT::DELETE_CONFLICT",
        };
        return json_resp(
            409,
            json!({"code": code, "message": format!("Snapshot {sid} is still being created and cannot be deleted")}),
        );
    }
    if in_use && inner.variant == Variant::Real {
        snap.state = "Deleting".to_owned();
        snap.since = Utc::now();
        return json_resp(
            409,
            json!({"code": "SNAPSHOT::DELETE_CONFLICT", "message": "snapshot image cannot be deleted due to a conflict"}),
        );
    }
    snaps.remove(sid);
    StatusCode::NO_CONTENT.into_response()
}

/// Diagnostics as recorded on Docker: no `scope` is the legacy `text/plain` answer with
/// `Deprecation: true`; a supported scope a JSON descriptor with the content inline; any other
/// scope `400 DIAGNOSTICS_SCOPE_UNSUPPORTED`. The content stands in for the container's.
fn diagnostics(inner: &Inner, id: &str, kind: &str, r: &Req) -> Response {
    if !lock(&inner.sandboxes).contains_key(id) {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    }
    let content = match kind {
        "logs" => format!(
            "{} starting OpenSandbox Execd daemon (fake)\n",
            Utc::now().to_rfc3339()
        ),
        _ => format!("Container:  fake (sandbox-{id})\nStatus:     running"),
    };
    let supported: &[&str] = if kind == "logs" {
        &["container", "all"]
    } else {
        &["runtime", "all"]
    };
    match r.q("scope") {
        None => Response::builder()
            .status(200)
            .header("content-type", "text/plain; charset=utf-8")
            .header("deprecation", "true")
            .body(Body::from(content))
            .unwrap(),
        Some(scope) if supported.contains(&scope) => json_resp(
            200,
            json!({"sandboxId": id, "kind": kind, "scope": scope, "delivery": "inline",
                   "contentType": "text/plain; charset=utf-8", "contentLength": content.len(),
                   "content": content, "truncated": false}),
        ),
        Some(scope) => json_resp(
            400,
            json!({"code": "DIAGNOSTICS_SCOPE_UNSUPPORTED",
                   "message": format!("Unsupported {kind} diagnostics scope '{scope}'. Supported scopes: {}.", supported.join(", "))}),
        ),
    }
}

/// JSON merge patch of the metadata (a `null` removes the key); answers the full sandbox.
fn patch_metadata(inner: &Inner, id: &str, r: &Req) -> Response {
    let Ok(Value::Object(patch)) = serde_json::from_slice::<Value>(&r.body) else {
        return inner.invalid("body", "Input should be a valid dictionary", Value::Null);
    };
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    };
    for (k, v) in patch {
        match v.as_str() {
            Some(v) => {
                s.metadata.insert(k, v.to_owned());
            }
            None => {
                s.metadata.remove(&k);
            }
        }
    }
    json_resp(200, sandbox_json(s, true))
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

fn valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    v.len() <= 63
        && (v.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))))
}

fn sandbox_json(s: &Sbx, full: bool) -> Value {
    let mut v = json!({
        "id": s.id,
        "status": {"state": s.state, "reason": s.reason, "message": s.message,
                   "lastTransitionAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)},
        "metadata": s.metadata,
        "entrypoint": ["tail", "-f", "/dev/null"],
        "createdAt": s.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    });
    if let Some(e) = s.expires_at {
        v["expiresAt"] = json!(e.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    }
    if full {
        if let Some(i) = &s.image {
            v["image"] = json!({"uri": i});
        }
        if let Some(sn) = &s.snapshot_id {
            v["snapshotId"] = json!(sn);
        }
    }
    v
}

fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
        return inner.invalid("body", "JSON decode error", Value::Null);
    };
    lock(&inner.record).create_bodies.push(body.clone());
    let image = body["image"]["uri"].as_str().map(str::to_owned);
    let snapshot = body["snapshotId"].as_str().map(str::to_owned);
    let template = body["templateId"].as_str().map(str::to_owned);
    let sources = [image.is_some(), snapshot.is_some(), template.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if sources != 1 {
        return inner.invalid_model(
            "image",
            "Exactly one of image or snapshotId must be provided.",
            &body,
        );
    }
    if image.is_some() && body["entrypoint"].as_array().is_none_or(|a| a.is_empty()) {
        return inner.invalid_model(
            "entrypoint",
            "Entrypoint is required when image is provided.",
            &body,
        );
    }
    if let Some(t) = body["timeout"].as_u64() {
        if t < 60 {
            return inner.out_of_bounds(["body", "timeout"], "ge", 60, json!(t));
        }
    }
    if template.is_some() {
        if inner.runtime != FakeRuntime::Fastsandbox {
            return inner.err(400, "INVALID_PARAMETER", "templateId needs Fast Sandbox");
        }
        for f in ["env", "resourceLimits", "entrypoint", "secureAccess"] {
            if !body[f].is_null() {
                return inner.invalid(f, "not allowed in template mode", Value::Null);
            }
        }
        if body["timeout"].is_null() {
            return inner.invalid("timeout", "required in template mode", Value::Null);
        }
    }
    if body["resourceLimits"]["cpu"].as_str() == Some("0") {
        return match inner.variant {
            Variant::Real => json_resp(
                422,
                json!({"detail": [{"type": "value_error", "loc": ["body", "resourceLimits", "cpu"],
                                    "msg": "cpu must be positive", "input": "0"}]}),
            ),
            Variant::Spec => {
                inner.invalid("resourceLimits.cpu", "cpu must be positive", json!("0"))
            }
        };
    }
    if inner.variant == Variant::Spec && body["resourceLimits"].is_null() && template.is_none() {
        return inner.invalid("resourceLimits", "required", Value::Null);
    }
    let metadata: BTreeMap<String, String> =
        serde_json::from_value(body["metadata"].clone()).unwrap_or_default();
    for (k, v) in &metadata {
        if k.starts_with("opensandbox.io/") || !valid_label_value(v) || k.is_empty() {
            let code = match inner.variant {
                Variant::Real => "SANDBOX::INVALID_METADATA_LABEL",
                Variant::Spec => "INVALID_METADATA_LABEL",
            };
            return json_resp(
                400,
                json!({"code": code, "message": format!("invalid metadata label {k}")}),
            );
        }
    }
    let mut inherited = None;
    if let Some(sn) = &snapshot {
        let found = lock(&inner.snapshots)
            .get(sn)
            .map(|s| (s.state == "Ready", s.metadata.clone()));
        match found {
            Some((true, m)) => inherited = Some(m),
            Some((false, _)) if inner.variant == Variant::Real => {
                return json_resp(
                    409,
                    json!({"code": "SNAPSHOT::NOT_READY", "message": format!("Snapshot {sn} is not ready")}),
                )
            }
            _ => return snapshot_not_found(inner, sn),
        }
    }
    let bad_image = image
        .as_ref()
        .is_some_and(|i| lock(&inner.knobs).bad_images.contains(i));
    let sync_docker = inner.variant == Variant::Real && inner.runtime == FakeRuntime::Docker;
    if bad_image && sync_docker {
        let i = image.clone().unwrap_or_default();
        return inner.err(
            500,
            "SANDBOX_IMAGE_PULL_FAILED",
            // The shape server 1.1.1's Docker runtime answered with no registry reachable
            // (seen live on 2026-12-06): the Docker API URL, the registry it dialled and the
            // host's resolver address (here a documentation address) inside the message.
            &format!(
                "Failed to pull image {i}: 500 Server Error for \
                 http+docker://localhost/v1.41/images/create?tag=1&fromImage={i}: Internal \
                 Server Error (\"Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup \
                 registry-1.docker.io on 192.0.2.53:53: no such host\")"
            ),
        );
    }
    let fail_with = bad_image.then(|| match inner.runtime {
        FakeRuntime::Kubernetes => (
            "POD_READY_TIMEOUT".to_owned(),
            "Pod did not become ready within 60 seconds".to_owned(),
        ),
        _ => (
            "IMAGE_PULL_FAILED".to_owned(),
            format!("Failed to pull image {}", image.clone().unwrap_or_default()),
        ),
    });
    let id = next_id(inner, "");
    let (state, reason, polls) = if sync_docker {
        ("Running", "CONTAINER_RUNNING", 0)
    } else {
        ("Pending", "SANDBOX_SCHEDULED", 2)
    };
    let v_metadata = !metadata.is_empty();
    let s = Sbx {
        id: id.clone(),
        state: state.to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        created_metadata: metadata.clone(),
        // Recorded: a restored sandbox reports the source's create-time metadata.
        metadata: match (&inherited, inner.variant) {
            (Some(m), Variant::Real) if metadata.is_empty() => m.clone(),
            _ => metadata,
        },
        image,
        snapshot_id: snapshot,
        expires_at: body["timeout"]
            .as_i64()
            .map(|t| Utc::now() + chrono::Duration::seconds(t)),
        created_at: Utc::now(),
        env: serde_json::from_value(body["env"].clone()).unwrap_or_default(),
        polls_left: polls,
        fail_with,
    };
    let mut v = sandbox_json(&s, false);
    // Recorded: the create answer echoes only the metadata the request gave.
    if !v_metadata && inner.variant == Variant::Real {
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
        }
    }
    {
        // One lock for the insert and its ledger line, so the ledger's order is the map's.
        let mut all = lock(&inner.sandboxes);
        inner.ledger_line("create", Some(&s.metadata), &id, "created");
        all.insert(id.clone(), s);
    }
    let mut resp = json_resp(202, v);
    if inner.variant == Variant::Spec {
        resp.headers_mut().insert(
            "location",
            HeaderValue::from_str(&format!("/v1/sandboxes/{id}")).unwrap(),
        );
    }
    resp
}

fn get(inner: &Inner, id: &str) -> Response {
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    };
    if s.polls_left > 0 {
        s.polls_left -= 1;
    } else {
        match s.state.as_str() {
            "Pending" | "Resuming" => match s.fail_with.take() {
                Some((reason, message)) => {
                    s.state = "Failed".to_owned();
                    s.reason = reason;
                    s.message = message;
                }
                None => s.state = "Running".to_owned(),
            },
            "Pausing" => s.state = "Paused".to_owned(),
            _ => {}
        }
    }
    json_resp(200, sandbox_json(s, true))
}

fn list(inner: &Inner, r: &Req) -> Response {
    let states = r.qs("state");
    let mut filter = BTreeMap::new();
    if let Some(m) = r.q("metadata") {
        for pair in m.split('&') {
            let Some((k, v)) = pair.split_once('=') else {
                return json_resp(
                    400,
                    json!({"code": "INVALID_METADATA_FORMAT", "message": "metadata must be k=v pairs"}),
                );
            };
            filter.insert(pct_decode(k), pct_decode(v));
        }
    }
    let page: usize = r.q("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    if page == 0 {
        return inner.out_of_bounds(["query", "page"], "ge", 1, json!(r.q("page")));
    }
    let size: usize = r.q("pageSize").and_then(|p| p.parse().ok()).unwrap_or(20);
    if size == 0 {
        return inner.out_of_bounds(["query", "pageSize"], "ge", 1, json!(r.q("pageSize")));
    }
    if size > 200 {
        return inner.out_of_bounds(["query", "pageSize"], "le", 200, json!(r.q("pageSize")));
    }
    let all = lock(&inner.sandboxes);
    let mut matching: Vec<&Sbx> = all
        .values()
        .filter(|s| states.is_empty() || states.contains(&s.state.as_str()))
        .filter(|s| filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    // Recorded: newest first.
    matching.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let items: Vec<Value> = matching
        .into_iter()
        .map(|s| sandbox_json(s, true))
        .collect();
    drop(all);
    page_of(items, page, size)
}

fn page_of(items: Vec<Value>, page: usize, size: usize) -> Response {
    let total = items.len();
    let pages = total.div_ceil(size);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * size)
        .take(size)
        .collect();
    json_resp(
        200,
        json!({"items": slice, "pagination": {"page": page, "pageSize": size, "totalItems": total,
               "totalPages": pages, "hasNextPage": page < pages}}),
    )
}

fn transition(inner: &Inner, id: &str, from: &str, to: &str) -> Response {
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    };
    if s.state != from {
        let code = if from == "Running" {
            "SANDBOX_NOT_RUNNING"
        } else {
            "SANDBOX_NOT_PAUSED"
        };
        return inner.err(409, code, &format!("sandbox is {}", s.state));
    }
    let immediate = inner.variant == Variant::Real && inner.runtime == FakeRuntime::Docker;
    if immediate {
        s.state = to.to_owned();
    } else {
        s.state = if to == "Paused" {
            "Pausing"
        } else {
            "Resuming"
        }
        .to_owned();
        s.polls_left = 1;
    }
    // Recorded: 202 with an empty body and no content-type.
    StatusCode::ACCEPTED.into_response()
}

fn renew(inner: &Inner, id: &str, r: &Req) -> Response {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let Some(at) = v["expiresAt"]
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.with_timezone(&Utc))
    else {
        return inner.invalid("expiresAt", "invalid datetime", Value::Null);
    };
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    };
    let too_early = at <= Utc::now()
        || (inner.variant == Variant::Spec && s.expires_at.is_some_and(|cur| at <= cur));
    if too_early {
        return inner.err(400, "INVALID_EXPIRATION", "expiresAt must be in the future");
    }
    s.expires_at = Some(at);
    lock(&inner.record).renewals.push(at.to_rfc3339());
    json_resp(200, json!({"expiresAt": at.to_rfc3339()}))
}

fn endpoint(inner: &Inner, id: &str, port: &str, r: &Req) -> Response {
    if !lock(&inner.sandboxes).contains_key(id) {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return inner.err(400, "INVALID_PORT", "Port must be between 1 and 65535.");
    }
    let proxy = r.q("use_server_proxy") == Some("true");
    let expires = r.q("expires");
    if proxy && expires.is_some() {
        return json_resp(
            400,
            json!({"code": "SANDBOX::INVALID_PARAMETER", "message": "expires cannot be combined with use_server_proxy"}),
        );
    }
    let (mut headers, version, key_version) = {
        let k = lock(&inner.knobs);
        (k.endpoint_headers.clone(), k.version, k.execd_key_version)
    };
    if version.execd_tokens() && port == "44772" && !proxy && expires.is_none() {
        headers.insert(
            "X-EXECD-ACCESS-TOKEN".to_owned(),
            execd_token(key_version, id),
        );
    }
    let endpoint = if let Some(exp) = expires {
        if inner.runtime == FakeRuntime::Docker {
            return match inner.variant {
                Variant::Real => json_resp(
                    400,
                    json!({"code": "SANDBOX::API_NOT_SUPPORTED",
                           "message": "Signed routes (expires parameter) are not supported when runtime.type='docker'."}),
                ),
                Variant::Spec => inner.err(
                    400,
                    "INVALID_PARAMETER",
                    "signed endpoints need the gateway",
                ),
            };
        }
        format!("gateway.example.test/{id}/{port}/{exp}/c2lnbmF0dXJl")
    } else if proxy {
        format!("{}/v1/sandboxes/{id}/proxy/{port}", inner.api_addr)
    } else if port == "44772" {
        format!("{}/{id}/proxy/44772", inner.execd_addr)
    } else if inner.runtime == FakeRuntime::Fastsandbox {
        format!("gateway.example.test/scope-{id}-{port}")
    } else {
        format!("172.17.0.2:{port}")
    };
    let mut v = json!({ "endpoint": endpoint });
    if !headers.is_empty() {
        v["headers"] = json!(headers);
    }
    json_resp(200, v)
}

fn snap_json(s: &Snap) -> Value {
    let (reason, message) = match s.state.as_str() {
        "Creating" => ("snapshot_accepted", "Snapshot creation accepted."),
        "Ready" => (
            "snapshot_runtime_ready",
            "Docker snapshot image created successfully.",
        ),
        _ => ("snapshot_deleting", "Snapshot deletion in progress."),
    };
    let mut v = json!({"id": s.id, "sandboxId": s.sandbox_id,
                       "status": {"state": s.state, "reason": reason, "message": message,
                                  "lastTransitionAt": s.since.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)},
                       "createdAt": s.created_at.to_rfc3339()});
    if let Some(n) = &s.name {
        v["name"] = json!(n);
    }
    v
}

fn advance_snapshots(inner: &Inner) {
    for s in lock(&inner.snapshots).values_mut() {
        if s.state == "Creating" {
            if s.polls_left > 0 {
                s.polls_left -= 1;
            } else {
                s.state = "Ready".to_owned();
                s.since = Utc::now();
            }
        }
    }
}

fn create_snapshot(inner: &Inner, id: &str, r: &Req) -> Response {
    let found = lock(&inner.sandboxes)
        .get(id)
        .map(|s| (s.state.clone(), s.created_metadata.clone()));
    let metadata = found.as_ref().map(|f| f.1.clone()).unwrap_or_default();
    match found.map(|f| f.0) {
        None => return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found"),
        Some(s) if s != "Running" => {
            return inner.err(409, "SANDBOX_NOT_RUNNING", &format!("sandbox is {s}"))
        }
        _ => {}
    }
    if inner.runtime == FakeRuntime::Kubernetes && !lock(&inner.knobs).registry {
        return inner.err(
            400,
            "REGISTRY_NOT_CONFIGURED",
            "RegistryNotConfigured: no snapshot registry",
        );
    }
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(json!({}));
    lock(&inner.record).snapshot_bodies.push(v.clone());
    if let Some(mode) = v
        .get("mode")
        .filter(|_| lock(&inner.knobs).version.snapshot_modes())
    {
        if mode != "rootfsOnly" {
            return inner.invalid("mode", "Input should be 'rootfsOnly'", mode.clone());
        }
        if inner.runtime != FakeRuntime::Fastsandbox {
            return inner.err(
                400,
                "INVALID_PARAMETER",
                "rootfsOnly snapshots need a Fast Sandbox runtime",
            );
        }
    }
    let sid = next_id(inner, "snap");
    let s = Snap {
        id: sid.clone(),
        sandbox_id: id.to_owned(),
        metadata,
        since: Utc::now(),
        name: v["name"].as_str().map(str::to_owned),
        state: "Creating".to_owned(),
        polls_left: 1,
        created_at: Utc::now(),
    };
    let body = snap_json(&s);
    lock(&inner.snapshots).insert(sid.clone(), s);
    let mut resp = json_resp(202, body);
    resp.headers_mut().insert(
        "location",
        HeaderValue::from_str(&format!("/v1/snapshots/{sid}")).unwrap(),
    );
    resp
}

fn list_snapshots(inner: &Inner, r: &Req) -> Response {
    advance_snapshots(inner);
    let sandbox = r.q("sandboxId");
    let page: usize = r.q("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
    let size: usize = r
        .q("pageSize")
        .and_then(|p| p.parse().ok())
        .unwrap_or(20)
        .clamp(1, 200);
    let items: Vec<Value> = lock(&inner.snapshots)
        .values()
        .filter(|s| sandbox.is_none_or(|id| s.sandbox_id == id))
        .map(snap_json)
        .collect();
    page_of(items, page, size)
}

// ---------------------------------------------------------------------------------------
// execd

async fn execd_entry(inner: &Arc<Inner>, id: &str, rest: &str, r: Req) -> Response {
    let state = lock(&inner.sandboxes).get(id).map(|s| s.state.clone());
    if state.is_none() {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    }
    if state.as_deref() != Some("Running") {
        return json_resp(
            502,
            json!({"code": "BACKEND_CONNECTION_FAILED", "message": "sandbox not reachable"}),
        );
    }
    let token = lock(&inner.knobs).execd_token.clone();
    if let Some(t) = token {
        let got = r
            .headers
            .get("x-execd-access-token")
            .and_then(|v| v.to_str().ok());
        if got != Some(t.as_str()) {
            return json_resp(
                401,
                json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}),
            );
        }
    }
    match (r.method.clone(), rest) {
        (Method::GET, "/ping") => StatusCode::OK.into_response(),
        (Method::POST, "/command") => command(inner, id, &r).await,
        (Method::DELETE, "/command") => {
            lock(&inner.record).interrupts += 1;
            let found = r.q("id").and_then(|i| {
                lock(&inner.commands).get_mut(i).map(|c| {
                    c.interrupted = c.running;
                    c.pgid.filter(|_| c.running)
                })
            });
            match found {
                Some(pgid) => {
                    if let Some(p) = pgid {
                        signal_group(p, "-TERM");
                    }
                    StatusCode::OK.into_response()
                }
                // Recorded (sic).
                None if inner.variant == Variant::Real => json_resp(
                    500,
                    json!({"code": "RUNTIME_ERROR", "message": "error interruptting code context. no such session"}),
                ),
                None => StatusCode::OK.into_response(),
            }
        }
        (Method::GET, p) if p.starts_with("/command/status/") => {
            let cid = &p["/command/status/".len()..];
            match lock(&inner.commands).get(cid) {
                Some(c) => {
                    // Recorded: `exit_code`, `error` and `finished_at` are omitted, not null,
                    // while it runs (and `error` on success).
                    let mut v = json!({"id": cid, "content": c.content, "running": c.running,
                                       "started_at": c.started_at.to_rfc3339()});
                    if let Some(code) = c.exit_code {
                        v["exit_code"] = json!(code);
                    }
                    if let Some(e) = &c.error {
                        v["error"] = json!(e);
                    }
                    if let Some(f) = c.finished_at {
                        v["finished_at"] = json!(f.to_rfc3339());
                    }
                    json_resp(200, v)
                }
                None => json_resp(
                    404,
                    json!({"code": "INVALID_REQUEST_BODY", "message": "command not found"}),
                ),
            }
        }
        (Method::GET, p) if p.starts_with("/command/") && p.ends_with("/logs") => {
            let cid = &p["/command/".len()..p.len() - "/logs".len()];
            command_logs(inner, cid, &r)
        }
        // execd's own reverse proxy to another port of the sandbox, where nothing listens.
        (_, p) if p.starts_with("/proxy/") && inner.variant == Variant::Real => bad_gateway(),
        (Method::GET, "/metrics") => json_resp(
            200,
            json!({"cpu_count": 2, "cpu_used_pct": 1.5, "mem_total_mib": 2048.0,
                   "mem_used_mib": 100.0, "timestamp": now_ms()}),
        ),
        (Method::POST, "/files/upload") => upload(inner, &r).await,
        (Method::GET, "/files/download") => download(inner, &r).await,
        (Method::GET, "/directories/list") => list_dir(&r),
        (Method::GET, "/files/info") => {
            let mut out = serde_json::Map::new();
            for p in r.qs("path") {
                match file_info(Path::new(p)) {
                    Some(i) => {
                        out.insert(p.to_owned(), i);
                    }
                    None => return file_not_found(p),
                }
            }
            json_resp(200, Value::Object(out))
        }
        (Method::DELETE, "/files") => {
            let p = r.q("path").unwrap_or("");
            match std::fs::symlink_metadata(p) {
                // Recorded on the real execd: deleting a missing path answers 200.
                Err(_) => StatusCode::OK.into_response(),
                Ok(m) if m.is_dir() => json_resp(
                    400,
                    json!({"code": "INVALID_FILE", "message": "is a directory"}),
                ),
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                    StatusCode::OK.into_response()
                }
            }
        }
        (Method::DELETE, "/directories") => {
            let p = r.q("path").unwrap_or("");
            let _ = std::fs::remove_dir_all(p);
            StatusCode::OK.into_response()
        }
        // Recorded: gin's own 404.
        _ if inner.variant == Variant::Real => (
            StatusCode::NOT_FOUND,
            [("content-type", "text/plain")],
            "404 page not found",
        )
            .into_response(),
        _ => json_resp(
            404,
            json!({"code": "NOT_FOUND", "message": "no such route"}),
        ),
    }
}

/// `GET /command/{id}/logs?cursor=N`: the merged output from byte N, and the byte offset
/// reached in `EXECD-COMMANDS-TAIL-CURSOR` (recorded: a byte offset, echoed unclamped).
fn command_logs(inner: &Inner, cid: &str, r: &Req) -> Response {
    let cmds = lock(&inner.commands);
    let Some(c) = cmds.get(cid) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": format!("command not found: {cid}")}),
        );
    };
    let cursor: usize = r.q("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
    let rest = c.output.get(cursor..).unwrap_or(&[]).to_vec();
    let next = cursor.max(c.output.len());
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; charset=utf-8")
        .header("execd-commands-tail-cursor", next.to_string())
        .body(Body::from(rest))
        .unwrap()
}

/// Go's `httputil.ReverseProxy` answer when the target refuses (recorded).
fn bad_gateway() -> Response {
    (
        StatusCode::BAD_GATEWAY,
        [("content-type", "text/plain; charset=utf-8")],
        "Bad Gateway\n",
    )
        .into_response()
}

fn file_not_found(p: &str) -> Response {
    json_resp(
        404,
        json!({"code": "FILE_NOT_FOUND", "message": format!("file not found: {p}")}),
    )
}

fn kill_group(pgid: u32) {
    signal_group(pgid, "-KILL");
}

fn signal_group(pgid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stderr(std::process::Stdio::null())
        .status();
}

fn frame(variant: Variant, v: &Value) -> Bytes {
    match variant {
        Variant::Real => Bytes::from(format!("{v}\n\n")),
        Variant::Spec => Bytes::from(format!("data: {v}\n\n")),
    }
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

async fn command(inner: &Arc<Inner>, sandbox: &str, r: &Req) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": "bad json"}),
        );
    };
    lock(&inner.record).command_bodies.push(body.clone());
    let Some(cmdline) = body["command"].as_str().map(str::to_owned) else {
        return json_resp(
            400,
            json!({"code": "INVALID_REQUEST_BODY", "message": "command is required"}),
        );
    };
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c")
        .arg(&cmdline)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = body["cwd"].as_str() {
        if !Path::new(cwd).is_dir() {
            return json_resp(
                400,
                json!({"code": "INVALID_REQUEST_BODY", "message": format!(
                    "invalid request, validation error working directory does not exist: \
                     {cwd}: stat {cwd}: no such file or directory"
                )}),
            );
        }
        cmd.current_dir(cwd);
    }
    let sandbox_env = lock(&inner.sandboxes)
        .get(sandbox)
        .map(|s| s.env.clone())
        .unwrap_or_default();
    cmd.envs(sandbox_env);
    if let Some(envs) = body["envs"].as_object() {
        for (k, v) in envs {
            cmd.env(k, v.as_str().unwrap_or(""));
        }
    }
    let timeout = body["timeout"].as_u64().filter(|t| *t > 0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return json_resp(
                500,
                json!({"code": "RUNTIME_ERROR", "message": e.to_string()}),
            )
        }
    };
    let cid = next_id(inner, "cmd-");
    let pgid = child.id();
    lock(&inner.commands).insert(
        cid.clone(),
        Cmd {
            content: cmdline,
            running: true,
            exit_code: None,
            pgid,
            started_at: Utc::now(),
            finished_at: None,
            error: None,
            output: Vec::new(),
            interrupted: false,
        },
    );
    if body["background"].as_bool() == Some(true) {
        return background(inner, cid, child);
    }
    let variant = inner.variant;
    let (truncate, frame_delay, stall, evalue_text) = {
        let k = lock(&inner.knobs);
        (
            k.truncate_after_frames,
            k.frame_delay_ms,
            k.stall_ms,
            k.evalue_text,
        )
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let (ev_tx, mut ev_rx) = tokio::sync::mpsc::channel::<(&'static str, String)>(64);
    for (kind, pipe) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let ev_tx = ev_tx.clone();
        let inner3 = inner.clone();
        let cid3 = cid.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(pipe);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Some(c) = lock(&inner3.commands).get_mut(&cid3) {
                    c.output.extend_from_slice(&line);
                }
                let text = match variant {
                    Variant::Real => {
                        // execd 1.1 tails line-wise: the terminator is stripped, and a blank
                        // line arrives as the text "\n" (recorded).
                        if line.last() == Some(&b'\n') {
                            line.pop();
                        }
                        if line.is_empty() {
                            "\n".to_owned()
                        } else {
                            String::from_utf8_lossy(&line).into_owned()
                        }
                    }
                    Variant::Spec => String::from_utf8_lossy(&line).into_owned(),
                };
                if ev_tx.send((kind, text)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(ev_tx);
    let inner2 = inner.clone();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut sent = 0usize;
        let grace = if variant == Variant::Real { 1000 } else { 0 };
        // Sends one frame; false when the client is gone or the stream is to be cut.
        let send = |v: Value, sent: &mut usize| {
            let tx = tx.clone();
            let cut = truncate.is_some_and(|n| *sent >= n);
            *sent += 1;
            async move {
                if cut {
                    return Err(true);
                }
                if frame_delay > 0 {
                    tokio::time::sleep(Duration::from_millis(frame_delay)).await;
                }
                tx.send(Ok(frame(variant, &v))).await.map_err(|_| false)
            }
        };
        let fail = |inner: &Arc<Inner>, cut: bool| {
            if let Some(p) = pgid {
                kill_group(p);
            }
            if !cut {
                lock(&inner.record).cancelled += 1;
            }
        };
        let mut detached = false;
        // Sends a frame unless the client is gone. Real execd keeps a foreground command
        // running when its client goes away; the spec variant (and a deliberate cut) ends it.
        macro_rules! emit {
            ($v:expr) => {
                if !detached {
                    if let Err(cut) = send($v, &mut sent).await {
                        if cut || variant != Variant::Real {
                            return fail(&inner2, cut);
                        }
                        detached = true;
                        lock(&inner2.record).abandoned += 1;
                    }
                }
            };
        }
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        let ts = now_ms();
        emit!(json!({"type": "init", "text": cid, "timestamp": ts}));
        emit!(json!({"type": "ping", "text": "pong", "timestamp": ts}));
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
        let mut ping = tokio::time::interval(Duration::from_secs(3));
        ping.tick().await;
        let mut timed_out = false;
        loop {
            let sleep = async {
                match deadline {
                    Some(d) if !timed_out => tokio::time::sleep_until(d).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = ev_rx.recv() => match ev {
                    Some((kind, text)) => {
                        emit!(json!({"type": kind, "text": text, "timestamp": now_ms()}));
                    }
                    None => break,
                },
                _ = ping.tick() => {
                    emit!(json!({"type": "ping", "text": "pong", "timestamp": now_ms()}));
                }
                _ = sleep => {
                    timed_out = true;
                    if let Some(p) = pgid { kill_group(p); }
                }
            }
        }
        let status = child.wait().await.ok();
        let code = status.and_then(|s| s.code());
        let elapsed = started.elapsed().as_millis() as i64;
        let end = match code {
            Some(0) if !timed_out => {
                json!({"type": "execution_complete", "execution_time": elapsed, "timestamp": now_ms()})
            }
            Some(n) if !timed_out => {
                let evalue = if evalue_text {
                    format!("exit status {n}")
                } else {
                    n.to_string()
                };
                json!({"type": "error", "error": {"ename": "CommandExecError", "evalue": evalue, "traceback": [format!("exit status {n}")]}, "timestamp": now_ms()})
            }
            _ => {
                let interrupted = lock(&inner2.commands)
                    .get(&cid)
                    .is_some_and(|c| c.interrupted);
                let signal = if interrupted && !timed_out {
                    "signal: terminated"
                } else {
                    "signal: killed"
                };
                json!({"type": "error", "error": {"ename": "CommandExecError", "evalue": "-1", "traceback": [signal]}, "timestamp": now_ms()})
            }
        };
        finish(&inner2, &cid, code.filter(|_| !timed_out));
        emit!(end);
        if !detached {
            tokio::time::sleep(Duration::from_millis(grace)).await;
        }
        drop(tx);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Marks a command finished: `exit_code`, `finished_at`, and execd's `error` text.
fn finish(inner: &Inner, cid: &str, code: Option<i32>) {
    if let Some(c) = lock(&inner.commands).get_mut(cid) {
        c.running = false;
        c.finished_at = Some(Utc::now());
        c.exit_code = Some(code.unwrap_or(-1));
        c.error = match code {
            Some(0) => None,
            Some(n) => Some(format!("exit status {n}")),
            None if c.interrupted => Some("signal: terminated".to_owned()),
            None => Some("signal: killed".to_owned()),
        };
    }
}

/// `background: true`: the stream is init, ping, execution_complete at once (recorded); the
/// command runs on, its merged output kept for `/command/{id}/logs`.
fn background(inner: &Arc<Inner>, cid: String, mut child: tokio::process::Child) -> Response {
    let pipes = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
    ];
    let mut readers = Vec::new();
    for pipe in pipes.into_iter().flatten() {
        let inner = inner.clone();
        let cid = cid.clone();
        readers.push(tokio::spawn(async move {
            let mut reader = BufReader::new(pipe);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Some(c) = lock(&inner.commands).get_mut(&cid) {
                    c.output.extend_from_slice(&line);
                }
            }
        }));
    }
    let inner2 = inner.clone();
    let cid2 = cid.clone();
    tokio::spawn(async move {
        let status = child.wait().await.ok();
        for r in readers {
            let _ = r.await;
        }
        finish(&inner2, &cid2, status.and_then(|s| s.code()));
    });
    let ts = now_ms();
    let variant = inner.variant;
    let body: Vec<u8> = [
        json!({"type": "init", "text": cid, "timestamp": ts}),
        json!({"type": "ping", "text": "pong", "timestamp": ts}),
        json!({"type": "execution_complete", "execution_time": 1, "timestamp": now_ms()}),
    ]
    .iter()
    .flat_map(|v| frame(variant, v).to_vec())
    .collect();
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from(body))
        .unwrap()
}

/// Minimal multipart/form-data parser: (name, filename, content) per part.
/// (name, filename, content)
type Part = (String, Option<String>, Vec<u8>);

fn multipart(content_type: &str, body: &[u8]) -> Option<Vec<Part>> {
    let boundary = content_type.split("boundary=").nth(1)?.trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
    let mut parts = Vec::new();
    let mut pos = find(body, &delim, 0)? + delim.len();
    loop {
        if body[pos..].starts_with(b"--") {
            break;
        }
        pos += 2; // CRLF
        let head_end = find(body, b"\r\n\r\n", pos)?;
        let head = String::from_utf8_lossy(&body[pos..head_end]).into_owned();
        let start = head_end + 4;
        let next = find(body, &delim, start)?;
        let content = body[start..next - 2].to_vec();
        let disp = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))?
            .to_owned();
        let attr = |name: &str| {
            disp.split(';')
                .map(str::trim)
                .find_map(|p| p.strip_prefix(&format!("{name}=")))
                .map(|v| v.trim_matches('"').to_owned())
        };
        parts.push((attr("name")?, attr("filename"), content));
        pos = next + delim.len();
    }
    Some(parts)
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

async fn upload(inner: &Inner, r: &Req) -> Response {
    let ct = r
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(parts) = multipart(ct, &r.body) else {
        return json_resp(
            400,
            json!({"code": "INVALID_FILE", "message": "bad multipart body"}),
        );
    };
    let metas: Vec<_> = parts.iter().filter(|p| p.0 == "metadata").collect();
    let files: Vec<_> = parts.iter().filter(|p| p.0 == "file").collect();
    if metas.is_empty() || metas.len() != files.len() {
        return json_resp(
            400,
            json!({"code": "INVALID_FILE_METADATA", "message": "metadata file is missing"}),
        );
    }
    for (meta, file) in metas.iter().zip(files) {
        if inner.variant == Variant::Real && meta.1.is_none() {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "metadata file is missing"}),
            );
        }
        let Ok(m) = serde_json::from_slice::<Value>(&meta.2) else {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "bad json"}),
            );
        };
        let Some(path) = m["path"].as_str() else {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "path required"}),
            );
        };
        let mode = m["mode"].as_u64().unwrap_or(755);
        let mode = u32::from_str_radix(&mode.to_string(), 8).unwrap_or(0o755);
        if let Some(parent) = Path::new(path).parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = std::fs::write(path, &file.2) {
            return json_resp(
                500,
                json!({"code": "RUNTIME_ERROR", "message": e.to_string()}),
            );
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    }
    StatusCode::OK.into_response()
}

async fn download(inner: &Inner, r: &Req) -> Response {
    let p = r.q("path").unwrap_or("");
    let Ok(data) = std::fs::read(p) else {
        return file_not_found(p);
    };
    let total = data.len() as u64;
    let range = r.headers.get("range").and_then(|v| v.to_str().ok());
    if r.q("offset").is_some() || r.q("limit").is_some() {
        if range.is_some() {
            return json_resp(
                400,
                json!({"code": "INVALID_REQUEST_BODY",
                       "message": "line-based reading (offset/limit) and byte range (Range header) are mutually exclusive"}),
            );
        }
        return download_lines(&data, r);
    }
    // Recorded: byte reads name the file's basename (line reads do not).
    let name = Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let disposition = format!("attachment; filename=\"{name}\"");
    let ignore = lock(&inner.knobs).ignore_range;
    if let (Some(range), false) = (range, ignore) {
        let spec = range.strip_prefix("bytes=").unwrap_or("");
        let (a, b) = spec.split_once('-').unwrap_or(("", ""));
        let start: u64 = a.parse().unwrap_or(u64::MAX);
        let end: u64 = if b.is_empty() {
            total.saturating_sub(1)
        } else {
            b.parse::<u64>().unwrap_or(0).min(total.saturating_sub(1))
        };
        if start >= total || start > end {
            // Recorded: Go's http.ServeContent wording, as text.
            return Response::builder()
                .status(416)
                .header("content-type", "text/plain; charset=utf-8")
                .header("content-range", format!("bytes */{total}"))
                .header("content-disposition", &disposition)
                .body(Body::from("invalid range: failed to overlap\n"))
                .unwrap();
        }
        return Response::builder()
            .status(206)
            .header("content-type", "application/octet-stream")
            .header("content-range", format!("bytes {start}-{end}/{total}"))
            .header("content-disposition", &disposition)
            .body(Body::from(data[start as usize..=end as usize].to_vec()))
            .unwrap();
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/octet-stream")
        .header("accept-ranges", "bytes")
        .header("content-disposition", disposition)
        .header("content-length", total)
        .body(Body::from(data))
        .unwrap()
}

/// `offset`/`limit` (1-based lines): the lines joined by `\n`, no trailing newline (recorded).
fn download_lines(data: &[u8], r: &Req) -> Response {
    let offset: usize = r
        .q("offset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(1)
        .max(1);
    let limit: Option<usize> = r.q("limit").and_then(|l| l.parse().ok());
    let text = String::from_utf8_lossy(data);
    let lines = text
        .split('\n')
        .skip(offset - 1)
        .take(limit.unwrap_or(usize::MAX));
    let out = lines.collect::<Vec<_>>().join("\n");
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from(out))
        .unwrap()
}

fn file_info(p: &Path) -> Option<Value> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::symlink_metadata(p).ok()?;
    let kind = if m.file_type().is_symlink() {
        "symlink"
    } else if m.is_dir() {
        "directory"
    } else if m.is_file() {
        "file"
    } else {
        "other"
    };
    let modified: DateTime<Utc> = m
        .modified()
        .ok()
        .map(DateTime::from)
        .unwrap_or_else(Utc::now);
    let mode: u64 = format!("{:o}", m.permissions().mode() & 0o7777)
        .parse()
        .unwrap_or(0);
    Some(json!({
        "path": p.to_string_lossy(), "type": kind, "size": if m.is_dir() { 0 } else { m.len() },
        "modified_at": modified.to_rfc3339(), "created_at": modified.to_rfc3339(),
        "owner": "root", "group": "root", "mode": mode,
    }))
}

fn list_dir(r: &Req) -> Response {
    let p = r.q("path").unwrap_or("");
    let depth: u32 = r.q("depth").and_then(|d| d.parse().ok()).unwrap_or(1);
    match std::fs::symlink_metadata(p) {
        Err(_) => return file_not_found(p),
        Ok(m) if m.file_type().is_symlink() => {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE", "message": "path is a symlink"}),
            )
        }
        Ok(m) if !m.is_dir() => {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE", "message": "not a directory"}),
            )
        }
        _ => {}
    }
    fn walk(dir: &Path, depth: u32, out: &mut Vec<Value>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for e in entries {
            if let Some(i) = file_info(&e) {
                let is_dir = i["type"] == "directory";
                out.push(i);
                if is_dir && depth > 1 {
                    walk(&e, depth - 1, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(p), depth.max(1), &mut out);
    json_resp(200, Value::Array(out))
}
