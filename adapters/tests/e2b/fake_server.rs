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

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::support::http::{self, json_resp, lock, pct_decode, Req};

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

fn api(inner: &Arc<Inner>, r: Req) -> Response {
    let segs: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    match (r.method.as_str(), segs.as_slice()) {
        ("POST", ["sandboxes"]) => create(inner, &r),
        ("GET", ["v2", "sandboxes"]) => list(inner, &r),
        ("GET", ["sandboxes", id]) => match lock(&inner.sandboxes).get(*id) {
            Some(s) => json_resp(200, detail(s, true, &envd_version(inner))),
            None => err(
                404,
                &format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
            ),
        },
        ("DELETE", ["sandboxes", id]) => match lock(&inner.sandboxes).remove(*id) {
            Some(_) => StatusCode::NO_CONTENT.into_response(),
            None => err(404, &format!("sandbox \"{id}\" not found")),
        },
        ("POST", ["sandboxes", id, "pause"]) => {
            let mut all = lock(&inner.sandboxes);
            match all.get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) if s.state == "paused" => {
                    err(409, &format!("Sandbox \"{id}\" is already paused"))
                }
                Some(s) => {
                    s.state = "paused".to_owned();
                    StatusCode::NO_CONTENT.into_response()
                }
            }
        }
        ("POST", ["sandboxes", id, "connect"]) => {
            let timeout = r.json()["timeout"].as_u64().unwrap_or(0);
            let boot = lock(&inner.knobs).envd_boot_polls;
            let mut all = lock(&inner.sandboxes);
            match all.get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) => {
                    let status = if s.state == "paused" {
                        s.state = "running".to_owned();
                        s.boot_polls_left = boot;
                        201
                    } else {
                        200
                    };
                    s.timeout = s.timeout.max(timeout);
                    json_resp(status, detail(s, true, &envd_version(inner)))
                }
            }
        }
        ("POST", ["sandboxes", id, "timeout"]) => {
            let t = r.json()["timeout"].as_u64().unwrap_or(0);
            let max = lock(&inner.knobs).max_timeout;
            if t > max {
                return err(400, "Timeout cannot be greater than 1 hours");
            }
            match lock(&inner.sandboxes).get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) => {
                    s.timeout = t;
                    lock(&inner.record).timeouts.push(((*id).to_owned(), t));
                    StatusCode::NO_CONTENT.into_response()
                }
            }
        }
        ("POST", ["sandboxes", id, "snapshots"]) => {
            let name = r.json()["name"].as_str().unwrap_or_default().to_owned();
            let Some(sbx) = lock(&inner.sandboxes).get(*id).cloned() else {
                return err(404, &format!("sandbox \"{id}\" not found"));
            };
            let snap_id = format!("team-fake/{name}:default");
            lock(&inner.record).snapshot_builds += 1;
            lock(&inner.snapshots).insert(
                snap_id.clone(),
                Snap {
                    id: snap_id.clone(),
                    name: name.clone(),
                    sandbox: sbx.id,
                    env: sbx.env,
                },
            );
            json_resp(
                201,
                json!({"snapshotID": snap_id, "names": [format!("team-fake/{name}:default")]}),
            )
        }
        ("GET", ["snapshots"]) => {
            let sandbox = r.q("sandboxID");
            let name = r.q("name");
            let out: Vec<Value> = lock(&inner.snapshots)
                .values()
                .filter(|s| sandbox.is_none_or(|x| x == s.sandbox))
                .filter(|s| name.is_none_or(|n| n == s.name || n == s.id))
                .map(|s| json!({"snapshotID": s.id, "names": [s.id]}))
                .collect();
            json_resp(200, Value::Array(out))
        }
        ("DELETE", ["templates", id]) => {
            let mut snaps = lock(&inner.snapshots);
            let key = snaps
                .values()
                .find(|s| s.name == *id || s.id == *id)
                .map(|s| s.id.clone());
            match key {
                Some(k) => {
                    snaps.remove(&k);
                    StatusCode::NO_CONTENT.into_response()
                }
                None => err(404, &format!("template '{id}' not found")),
            }
        }
        _ => err(404, "not found"),
    }
}

fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let b = r.json();
    lock(&inner.record).create_bodies.push(b.clone());
    let Some(template) = b["templateID"].as_str().map(str::to_owned) else {
        return err(
            400,
            "request body has an error: doesn't match schema: templateID is required",
        );
    };
    let (max_running, max_timeout, boot) = {
        let k = lock(&inner.knobs);
        (k.max_running, k.max_timeout, k.envd_boot_polls)
    };
    let timeout = b["timeout"].as_u64().unwrap_or(15);
    if timeout > max_timeout {
        return err(400, "Timeout cannot be greater than 1 hours");
    }
    let mut env: BTreeMap<String, String> =
        serde_json::from_value(b["envVars"].clone()).unwrap_or_default();
    if template != "base" {
        match lock(&inner.snapshots).get(&template) {
            Some(snap) => {
                for (k, v) in &snap.env {
                    env.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            None => return err(404, &format!("template '{template}' not found")),
        }
    }
    let mut all = lock(&inner.sandboxes);
    if all.values().filter(|s| s.state == "running").count() >= max_running {
        return err(
            429,
            &format!("You have reached the maximum number of concurrent E2B sandboxes ({max_running}). If you need more, please contact us at 'https://e2b.dev/docs/getting-help'"),
        );
    }
    let id = next_id(inner, "i");
    let s = Sbx {
        id: id.clone(),
        template,
        state: "running".to_owned(),
        metadata: serde_json::from_value(b["metadata"].clone()).unwrap_or_default(),
        env,
        token: format!("envd-token-{id}"),
        timeout,
        allow_public_traffic: b["network"]["allowPublicTraffic"].as_bool(),
        boot_polls_left: boot,
    };
    let mut answer = json!({
        "templateID": s.template, "sandboxID": id, "clientID": "6532622b",
        "envdVersion": envd_version(inner), "domain": null,
    });
    if b["secure"].as_bool() == Some(true) {
        answer["envdAccessToken"] = json!(s.token);
    }
    all.insert(id, s);
    json_resp(201, answer)
}

fn list(inner: &Arc<Inner>, r: &Req) -> Response {
    let (page_size, ignore) = {
        let k = lock(&inner.knobs);
        (k.page_size, k.ignore_metadata_filter)
    };
    let filter: Vec<(String, String)> = r
        .q("metadata")
        .map(|m| {
            m.split('&')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (pct_decode(k), pct_decode(v)))
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<&str> = r
        .q("state")
        .map(|s| s.split(',').collect())
        .unwrap_or_default();
    let limit = r
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .min(page_size);
    let start = r
        .q("nextToken")
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(0);
    let version = envd_version(inner);
    let all: Vec<Value> = lock(&inner.sandboxes)
        .values()
        .filter(|s| states.is_empty() || states.contains(&s.state.as_str()))
        .filter(|s| ignore || filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .map(|s| detail(s, false, &version))
        .collect();
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    let mut resp = json_resp(200, Value::Array(page));
    if start + limit < all.len() {
        resp.headers_mut()
            .insert("x-next-token", (start + limit).to_string().parse().unwrap());
    }
    resp
}

fn envd_version(inner: &Inner) -> String {
    lock(&inner.knobs).envd_version.clone()
}

/// Which sandbox and port an envd request is for, as E2B's edge decides it: the routing
/// headers when present, else a `Host` of `<port>-<sandboxId>.<domain>`.
fn route(inner: &Inner, r: &Req) -> Option<(String, String)> {
    if let Some(id) = r.header("e2b-sandbox-id") {
        lock(&inner.record).header_routed += 1;
        let port = r.header("e2b-sandbox-port").unwrap_or("");
        return Some((id.to_owned(), port.to_owned()));
    }
    let host = r.header("host")?;
    let label = host.split('.').next()?;
    let (port, id) = label.split_once('-')?;
    lock(&inner.record).host_routed += 1;
    Some((id.to_owned(), port.to_owned()))
}

async fn envd(inner: &Arc<Inner>, r: Req) -> Response {
    // The key in any header at all, whatever the pool's auth header is.
    let key = lock(&inner.key).clone();
    if r.headers.contains_key("x-api-key")
        || r.headers
            .values()
            .any(|v| v.to_str().is_ok_and(|v| v.contains(key.as_str())))
    {
        lock(&inner.record).key_seen_on_envd += 1;
    }
    let Some((id, port)) = route(inner, &r) else {
        return err(400, "missing sandbox id header");
    };
    if port != "49983" {
        return err(502, "The sandbox port is not open");
    }
    let sbx = {
        let mut all = lock(&inner.sandboxes);
        match all.get_mut(&id) {
            Some(s) if s.state == "running" => {
                if r.path == "/health" && s.boot_polls_left > 0 {
                    s.boot_polls_left -= 1;
                    return err(502, "The sandbox is starting");
                }
                s.clone()
            }
            Some(_) => return err(502, "The sandbox is paused"),
            None => {
                return json_resp(
                    502,
                    json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502}),
                )
            }
        }
    };
    if r.path == "/health" {
        return StatusCode::NO_CONTENT.into_response();
    }
    if r.header("x-access-token") != Some(sbx.token.as_str()) {
        lock(&inner.record).bad_tokens += 1;
        return err(
            401,
            "unauthorized access, please provide a valid access token",
        );
    }
    if let Some(user) = r
        .header("authorization")
        .and_then(|a| a.strip_prefix("Basic "))
        .and_then(|b| B64.decode(b).ok())
    {
        let user = String::from_utf8_lossy(&user)
            .trim_end_matches(':')
            .to_owned();
        lock(&inner.record).users.push(user);
    }
    match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/process.Process/Start") => start(inner, &sbx, &r),
        ("POST", "/process.Process/SendInput") => {
            let b = r.json();
            let pid = b["process"]["pid"].as_u64().unwrap_or(0) as u32;
            let data = B64
                .decode(b["input"]["stdin"].as_str().unwrap_or_default())
                .unwrap_or_default();
            let stdin = lock(&inner.procs)
                .get_mut(&pid)
                .and_then(|p| p.stdin.take());
            match stdin {
                Some(mut w) => {
                    let _ = w.write_all(&data).await;
                    if let Some(p) = lock(&inner.procs).get_mut(&pid) {
                        p.stdin = Some(w);
                    }
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("POST", "/process.Process/CloseStdin") => {
            let pid = r.json()["process"]["pid"].as_u64().unwrap_or(0) as u32;
            match lock(&inner.procs).get_mut(&pid) {
                Some(p) => {
                    p.stdin = None;
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("POST", "/process.Process/SendSignal") => {
            lock(&inner.record).signals += 1;
            let pid = r.json()["process"]["pid"].as_u64().unwrap_or(0) as u32;
            let kill = lock(&inner.procs).get_mut(&pid).and_then(|p| p.kill.take());
            match kill {
                Some(k) => {
                    let _ = k.send(());
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("GET", "/files") => download(&r, lock(&inner.knobs).ignore_range),
        ("POST", "/files") => upload(&r),
        ("POST", "/filesystem.Filesystem/ListDir") => {
            let b = r.json();
            let path = b["path"].as_str().unwrap_or_default();
            let depth = b["depth"].as_u64().unwrap_or(1).max(1);
            let p = std::path::Path::new(path);
            if !p.exists() {
                return connect_err(404, "not_found", &format!("path not found: {path}"));
            }
            if !p.is_dir() {
                return connect_err(
                    400,
                    "invalid_argument",
                    &format!("path is not a directory: {path}"),
                );
            }
            let mut entries = Vec::new();
            walk(p, depth, &mut entries);
            json_resp(200, json!({ "entries": entries }))
        }
        ("POST", "/filesystem.Filesystem/Stat") => {
            let path = r.json()["path"].as_str().unwrap_or_default().to_owned();
            match std::fs::symlink_metadata(&path) {
                Ok(m) => json_resp(
                    200,
                    json!({"entry": entry_info(std::path::Path::new(&path), &m)}),
                ),
                Err(_) => connect_err(
                    404,
                    "not_found",
                    &format!("no such file or directory: {path}"),
                ),
            }
        }
        ("POST", "/filesystem.Filesystem/Remove") => {
            let path = r.json()["path"].as_str().unwrap_or_default().to_owned();
            let p = std::path::Path::new(&path);
            let res = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
            match res {
                Ok(()) => json_resp(200, json!({})),
                Err(_) => connect_err(
                    404,
                    "not_found",
                    &format!("no such file or directory: {path}"),
                ),
            }
        }
        _ => connect_err(404, "unimplemented", "no such procedure"),
    }
}

/// `EntryInfo` in protobuf JSON: zero values omitted, `size` an int64 string, enum names.
fn entry_info(path: &std::path::Path, m: &std::fs::Metadata) -> Value {
    use std::os::unix::fs::PermissionsExt;
    let (kind, mode_bits) = if m.file_type().is_symlink() {
        ("FILE_TYPE_SYMLINK", 1u32 << 27)
    } else if m.is_dir() {
        ("FILE_TYPE_DIRECTORY", 1u32 << 31)
    } else {
        ("FILE_TYPE_FILE", 0)
    };
    let modified: chrono::DateTime<chrono::Utc> = m
        .modified()
        .map(Into::into)
        .unwrap_or_else(|_| chrono::Utc::now());
    let mut v = json!({
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "type": kind,
        "path": path.to_string_lossy(),
        "mode": mode_bits | (m.permissions().mode() & 0o7777),
        "permissions": "-rw-r--r--",
        "owner": "user", "group": "user",
        "modifiedTime": modified.to_rfc3339(),
    });
    if m.len() > 0 && !m.is_dir() {
        v["size"] = json!(m.len().to_string());
    }
    v
}

fn walk(dir: &std::path::Path, depth: u64, out: &mut Vec<Value>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.push(entry_info(&p, &m));
        if m.is_dir() && depth > 1 {
            walk(&p, depth - 1, out);
        }
    }
}

fn download(r: &Req, ignore_range: bool) -> Response {
    let path = r.q("path").unwrap_or_default();
    let p = std::path::Path::new(path);
    if p.is_dir() {
        return err(400, &format!("path '{path}' is a directory"));
    }
    let Ok(data) = std::fs::read(p) else {
        return err(404, &format!("path '{path}' does not exist"));
    };
    let range = r
        .header("range")
        .and_then(|h| h.strip_prefix("bytes="))
        .and_then(|h| h.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().ok()));
    let total = data.len();
    match range {
        Some((start, end)) if !data.is_empty() && !ignore_range => {
            if start >= total {
                return (
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    [("content-range", format!("bytes */{total}"))],
                )
                    .into_response();
            }
            let end = end.unwrap_or(total - 1).min(total - 1);
            (
                StatusCode::PARTIAL_CONTENT,
                [
                    ("content-type", "application/octet-stream".to_owned()),
                    ("content-range", format!("bytes {start}-{end}/{total}")),
                ],
                data[start..=end].to_vec(),
            )
                .into_response()
        }
        _ => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            data,
        )
            .into_response(),
    }
}

fn upload(r: &Req) -> Response {
    let path = r.q("path").unwrap_or_default().to_owned();
    if r.header("content-type") != Some("application/octet-stream") {
        return err(400, "unsupported content type");
    }
    let p = std::path::Path::new(&path);
    if p.is_dir() {
        return err(400, &format!("path '{path}' is a directory"));
    }
    if let Some(parent) = p.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::write(p, &r.body) {
        Ok(()) => json_resp(
            200,
            json!([{"path": path, "name": p.file_name().map(|n| n.to_string_lossy().into_owned()), "type": "file"}]),
        ),
        Err(e) => err(500, &format!("error writing file '{path}': {e}")),
    }
}

/// One response envelope.
fn frame(flag: u8, v: &Value) -> Bytes {
    let body = v.to_string().into_bytes();
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(flag);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

fn start(inner: &Arc<Inner>, sbx: &Sbx, r: &Req) -> Response {
    if r.header("content-type") != Some("application/connect+json") {
        return connect_err(415, "unknown", "unsupported content type");
    }
    if r.body.len() < 5 {
        return connect_err(400, "invalid_argument", "missing envelope");
    }
    let msg: Value = serde_json::from_slice(&r.body[5..]).unwrap_or(Value::Null);
    lock(&inner.record).start_bodies.push(msg.clone());
    let deadline = r
        .header("connect-timeout-ms")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis);
    let (stall, keepalive, truncate) = {
        let k = lock(&inner.knobs);
        (k.stall_ms, k.keepalive_ms, k.truncate_after_frames)
    };
    let process = &msg["process"];
    let cmd = process["cmd"].as_str().unwrap_or_default().to_owned();
    let args: Vec<String> = serde_json::from_value(process["args"].clone()).unwrap_or_default();
    let envs: BTreeMap<String, String> =
        serde_json::from_value(process["envs"].clone()).unwrap_or_default();
    let cwd = process["cwd"].as_str().map(str::to_owned);
    let want_stdin = msg["stdin"].as_bool().unwrap_or(true);

    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let inner = inner.clone();
    let env = sbx.env.clone();
    tokio::spawn(async move {
        let end_stream = |v: Value| frame(0x02, &v);
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        if let Some(dir) = &cwd {
            if !std::path::Path::new(dir).is_dir() {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "invalid_argument", "message": format!("cwd '{dir}' does not exist")}})))
                    .await;
                return;
            }
        }
        let mut c = tokio::process::Command::new(&cmd);
        c.args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", std::env::var("HOME").unwrap_or_default())
            .envs(&env)
            .envs(&envs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(if want_stdin {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .kill_on_drop(true);
        if let Some(dir) = &cwd {
            c.current_dir(dir);
        }
        let mut child = match c.spawn() {
            Ok(ch) => ch,
            Err(e) => {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "internal", "message": format!("error starting process '{cmd}': {e}")}})))
                    .await;
                return;
            }
        };
        let pid = child.id().unwrap_or(0);
        let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel();
        lock(&inner.procs).insert(
            pid,
            Proc {
                stdin: child.stdin.take(),
                kill: Some(kill_tx),
            },
        );
        let mut sent = 0usize;
        let mut send = |b: Bytes| {
            sent += 1;
            let tx = tx.clone();
            let cut = truncate.is_some_and(|n| sent > n);
            async move {
                if cut {
                    false
                } else {
                    tx.send(b).await.is_ok()
                }
            }
        };
        let mut ok = send(frame(0, &json!({"event": {"start": {"pid": pid}}}))).await;
        let mut out = child.stdout.take().unwrap();
        let mut errp = child.stderr.take().unwrap();
        let (mut obuf, mut ebuf) = (vec![0u8; 8192], vec![0u8; 8192]);
        let (mut o_open, mut e_open) = (true, true);
        let started = tokio::time::Instant::now();
        let mut ka = tokio::time::interval(Duration::from_millis(keepalive.max(1)));
        ka.tick().await;
        let mut deadline_hit = false;
        let mut killed = false;
        while ok && (o_open || e_open) {
            let left = deadline.map(|d| d.saturating_sub(started.elapsed()));
            tokio::select! {
                n = out.read(&mut obuf), if o_open => match n {
                    Ok(0) | Err(_) => o_open = false,
                    Ok(n) => ok = send(frame(0, &json!({"event": {"data": {"stdout": B64.encode(&obuf[..n])}}}))).await,
                },
                n = errp.read(&mut ebuf), if e_open => match n {
                    Ok(0) | Err(_) => e_open = false,
                    Ok(n) => ok = send(frame(0, &json!({"event": {"data": {"stderr": B64.encode(&ebuf[..n])}}}))).await,
                },
                _ = ka.tick() => ok = send(frame(0, &json!({"event": {"keepalive": {}}}))).await,
                _ = &mut kill_rx, if !killed => {
                    killed = true;
                    let _ = child.start_kill();
                }
                _ = tokio::time::sleep(left.unwrap_or(Duration::from_secs(3600))), if left.is_some() => {
                    deadline_hit = true;
                    let _ = child.start_kill();
                    break;
                }
            }
        }
        if !ok || deadline_hit {
            // The client went away (or its deadline passed): envd's context ends the process.
            let _ = child.start_kill();
            let _ = child.wait().await;
            lock(&inner.procs).remove(&pid);
            lock(&inner.record).cancelled += 1;
            if deadline_hit {
                let _ = tx
                    .send(end_stream(json!({"error": {"code": "deadline_exceeded", "message": "context deadline exceeded"}})))
                    .await;
            }
            return;
        }
        let status = child.wait().await;
        lock(&inner.procs).remove(&pid);
        let end = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                match (s.code(), s.signal()) {
                    (Some(0), _) => json!({"exited": true, "status": "exit status 0"}),
                    (Some(c), _) => {
                        json!({"exitCode": c, "exited": true, "status": format!("exit status {c}")})
                    }
                    (None, Some(9)) => json!({"exitCode": -1, "status": "signal: killed"}),
                    (None, Some(15)) => json!({"exitCode": -1, "status": "signal: terminated"}),
                    (None, sig) => {
                        json!({"exitCode": -1, "status": format!("signal: {}", sig.unwrap_or(0))})
                    }
                }
            }
            Err(e) => json!({"exitCode": -1, "status": "error", "error": e.to_string()}),
        };
        if send(frame(0, &json!({"event": {"end": end}}))).await {
            let _ = send(end_stream(json!({}))).await;
        }
    });
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))
    });
    (
        StatusCode::OK,
        [("content-type", "application/connect+json")],
        Body::from_stream(stream),
    )
        .into_response()
}
