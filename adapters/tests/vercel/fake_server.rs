//! A fake Vercel Sandbox API, written from `provider-specs/vercel-sandbox/API.md` (what the
//! public SDK sends and reads):
//!
//! - `Authorization: Bearer` and `teamId` on every request; a wrong token is a 401 whose
//!   message quotes the token it got (so the adapter's scrubbing is tested).
//! - Sandboxes are named: a second create of a name is a 409. Each run is a session that is
//!   `pending` for `Knobs::pending_polls` reads, then `running`. Errors are
//!   `{"error": {"code", "message"}}`; 429 with `Retry-After` past `Knobs::max_running`; a
//!   timeout past the plan's is a 400.
//! - `GET /v2/sandboxes` filters by `tags=key:value`, pages with `pagination.next`.
//! - `stop` stops the session (410 `sandbox_stopped` for commands and files after it);
//!   `GET /v2/sandboxes/{name}?resume=true` starts a new session.
//! - Commands run for real on the test host (`command` + `args`, no shell) and stream as
//!   NDJSON: the command, log lines, the command again with `exitCode`. The command is killed
//!   when the client goes away or on `…/kill`.
//! - `fs/write` takes a gzip tar (this fake inflates stored blocks only, which is what the
//!   adapter sends) extracted under `x-cwd`; `fs/read` answers 404 for a missing file and for
//!   a directory.
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
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::support::http::{self, json_resp, lock, pct_decode, Req};

pub const TEAM: &str = "team_fake123";
pub const PROJECT: &str = "prj_fake456";

/// Fault injection and behaviour switches.
#[derive(Debug)]
pub struct Knobs {
    /// The next requests whose `METHOD path` contains the string fail with the status.
    pub fail_next: VecDeque<(String, u16)>,
    pub delay_ms: u64,
    /// Reads of a new session before it runs.
    pub pending_polls: u32,
    pub max_running: usize,
    /// The plan's longest session, milliseconds.
    pub max_timeout_ms: u64,
    pub page_size: usize,
    /// Close command streams after this many lines, without the last one.
    pub truncate_after_lines: Option<usize>,
    /// Send nothing on command streams for this long first.
    pub stall_ms: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: VecDeque::new(),
            delay_ms: 0,
            pending_polls: 0,
            max_running: 100,
            max_timeout_ms: 2_700_000,
            page_size: 100,
            truncate_after_lines: None,
            stall_ms: 0,
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    pub requests: Vec<String>,
    pub create_bodies: Vec<Value>,
    pub cmd_bodies: Vec<Value>,
    pub extends: Vec<u64>,
    pub kills: u32,
    /// The command lines (`command` and `args`, space-joined) those kills reached while
    /// the command ran, in order.
    pub killed: Vec<String>,
    pub cancelled: u32,
    pub missing_team: u32,
}

#[derive(Debug, Clone)]
pub struct Sbx {
    pub name: String,
    pub status: String,
    pub persistent: bool,
    pub session: String,
    pub tags: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone)]
pub struct Sess {
    pub id: String,
    pub sandbox: String,
    pub status: String,
    pub timeout: u64,
    pub started_at: i64,
    polls_left: u32,
}

struct Inner {
    token: Mutex<String>,
    addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    sandboxes: Mutex<BTreeMap<String, Sbx>>,
    sessions: Mutex<HashMap<String, Sess>>,
    /// Running commands by id: their command line and what kills them.
    kills: Mutex<HashMap<String, (String, tokio::sync::oneshot::Sender<()>)>>,
    seq: Mutex<u64>,
}

#[derive(Clone)]
pub struct FakeServer {
    inner: Arc<Inner>,
}

impl FakeServer {
    pub async fn start(token: &str) -> FakeServer {
        let listener = http::bind().await;
        let inner = Arc::new(Inner {
            token: Mutex::new(token.to_owned()),
            addr: listener.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            sandboxes: Mutex::new(BTreeMap::new()),
            sessions: Mutex::new(HashMap::new()),
            kills: Mutex::new(HashMap::new()),
            seq: Mutex::new(0),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        http::serve(listener, app);
        FakeServer { inner }
    }

    pub fn set_token(&self, t: &str) {
        *lock(&self.inner.token) = t.to_owned();
    }

    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.inner.addr)
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

    pub fn sandbox(&self, name: &str) -> Option<Sbx> {
        lock(&self.inner.sandboxes).get(name).cloned()
    }

    pub fn session(&self, id: &str) -> Option<Sess> {
        lock(&self.inner.sessions).get(id).cloned()
    }

    pub fn running_commands(&self) -> usize {
        lock(&self.inner.kills).len()
    }

    /// Puts a sandbox straight in (an orphan).
    pub fn insert(&self, name: &str, tags: BTreeMap<String, String>, status: &str) {
        let session = new_session(&self.inner, name, 0, 600_000);
        lock(&self.inner.sandboxes).insert(
            name.to_owned(),
            Sbx {
                name: name.to_owned(),
                status: status.to_owned(),
                persistent: true,
                session,
                tags,
                env: BTreeMap::new(),
                ports: Vec::new(),
            },
        );
    }

    /// Vercel stops a session behind the adapter's back (its own timeout).
    pub fn stop_session(&self, name: &str) {
        let mut all = lock(&self.inner.sandboxes);
        if let Some(s) = all.get_mut(name) {
            s.status = "stopped".to_owned();
            if let Some(sess) = lock(&self.inner.sessions).get_mut(&s.session) {
                sess.status = "stopped".to_owned();
            }
        }
    }

    pub fn remove(&self, name: &str) {
        lock(&self.inner.sandboxes).remove(name);
    }
}

fn next_id(inner: &Inner, prefix: &str) -> String {
    let mut n = lock(&inner.seq);
    *n += 1;
    format!("{prefix}_{:08x}{:04x}", *n, std::process::id() & 0xffff)
}

fn new_session(inner: &Inner, sandbox: &str, polls: u32, timeout: u64) -> String {
    let id = next_id(inner, "sbx");
    lock(&inner.sessions).insert(
        id.clone(),
        Sess {
            id: id.clone(),
            sandbox: sandbox.to_owned(),
            status: if polls > 0 { "pending" } else { "running" }.to_owned(),
            timeout,
            started_at: chrono::Utc::now().timestamp_millis(),
            polls_left: polls,
        },
    );
    id
}

fn err(status: u16, code: &str, message: &str) -> Response {
    json_resp(status, json!({"error": {"code": code, "message": message}}))
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let mut r = Req::read(req, 512 * 1024 * 1024).await;
    // The API is served under `/api`, as Vercel's is.
    if let Some(rest) = r.path.strip_prefix("/api") {
        r.path = rest.to_owned();
    }
    let line = format!("{} {}", r.method, r.path);
    lock(&inner.record).requests.push(line.clone());
    let delay = lock(&inner.knobs).delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let token = lock(&inner.token).clone();
    match r
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
    {
        Some(t) if t == token => {}
        Some(t) => {
            return err(
                401,
                "forbidden",
                &format!("Not authorized: invalid token {t}"),
            )
        }
        None => return err(401, "forbidden", "Missing Authorization header"),
    }
    if r.q("teamId") != Some(TEAM) {
        lock(&inner.record).missing_team += 1;
        return err(403, "forbidden", "You don't have access to this team");
    }
    let failure = {
        let mut k = lock(&inner.knobs);
        let i = k
            .fail_next
            .iter()
            .position(|(p, _)| line.contains(p.as_str()));
        i.and_then(|i| k.fail_next.remove(i))
    };
    if let Some((_, status)) = failure {
        let mut resp = err(status, "injected", "injected failure");
        if status == 429 {
            resp.headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
        return resp;
    }
    route(&inner, r).await
}

fn sandbox_json(s: &Sbx) -> Value {
    json!({
        "name": s.name, "persistent": s.persistent, "status": s.status,
        "currentSessionId": s.session, "createdAt": 1764583200000_i64,
        "updatedAt": 1764583200000_i64, "region": "iad1", "vcpus": 2, "memory": 4096,
        "tags": s.tags, "cwd": "/vercel/sandbox",
    })
}

fn session_json(s: &Sess) -> Value {
    json!({
        "id": s.id, "status": s.status, "memory": 4096, "vcpus": 2, "region": "iad1",
        "timeout": s.timeout, "cwd": "/vercel/sandbox", "requestedAt": s.started_at,
        "startedAt": s.started_at, "createdAt": s.started_at, "updatedAt": s.started_at,
    })
}

fn routes_json(s: &Sbx) -> Value {
    Value::Array(
        s.ports
            .iter()
            .map(|p| {
                let sub = format!("{}-{p}", s.session.to_lowercase().replace('_', "-"));
                json!({"url": format!("https://{sub}.vercel.run"), "subdomain": sub, "port": p})
            })
            .collect(),
    )
}

fn answer(inner: &Inner, s: &Sbx) -> Value {
    let sess = lock(&inner.sessions).get(&s.session).cloned();
    json!({
        "sandbox": sandbox_json(s),
        "session": sess.as_ref().map(session_json),
        "routes": routes_json(s),
    })
}

async fn route(inner: &Arc<Inner>, r: Req) -> Response {
    let segs: Vec<String> = r
        .path
        .trim_start_matches('/')
        .split('/')
        .map(pct_decode)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (r.method.as_str(), segs.as_slice()) {
        ("POST", ["v3", "sandboxes"]) => create(inner, &r),
        ("GET", ["v2", "sandboxes"]) => list(inner, &r),
        ("GET", ["v2", "sandboxes", "sessions", id]) => {
            let (resp, started) = {
                let mut all = lock(&inner.sessions);
                match all.get_mut(*id) {
                    Some(s) => {
                        let mut started = None;
                        if s.polls_left > 0 {
                            s.polls_left -= 1;
                            if s.polls_left == 0 {
                                s.status = "running".to_owned();
                                started = Some(s.sandbox.clone());
                            }
                        }
                        (
                            json_resp(200, json!({"session": session_json(s), "routes": []})),
                            started,
                        )
                    }
                    None => (err(404, "not_found", "Session not found"), None),
                }
            };
            if let Some(name) = started {
                if let Some(s) = lock(&inner.sandboxes).get_mut(&name) {
                    s.status = "running".to_owned();
                }
            }
            resp
        }
        ("POST", ["v2", "sandboxes", "sessions", id, "stop"]) => {
            let sbx = {
                let mut all = lock(&inner.sessions);
                match all.get_mut(*id) {
                    Some(s) if s.status == "stopped" => {
                        return err(410, "sandbox_stopped", "The sandbox session is stopped")
                    }
                    Some(s) => {
                        s.status = "stopped".to_owned();
                        s.sandbox.clone()
                    }
                    None => return err(404, "not_found", "Session not found"),
                }
            };
            if let Some(s) = lock(&inner.sandboxes).get_mut(&sbx) {
                s.status = "stopped".to_owned();
            }
            json_resp(200, json!({"session": {"id": id, "status": "stopped"}}))
        }
        ("POST", ["v2", "sandboxes", "sessions", id, "extend-timeout"]) => {
            let d = r.json()["duration"].as_u64().unwrap_or(0);
            match lock(&inner.sessions).get_mut(*id) {
                Some(s) => {
                    s.timeout += d;
                    lock(&inner.record).extends.push(d);
                    json_resp(200, json!({"session": session_json(s)}))
                }
                None => err(404, "not_found", "Session not found"),
            }
        }
        ("POST", ["v2", "sandboxes", "sessions", id, rest @ ..]) => {
            let sess = lock(&inner.sessions).get(*id).cloned();
            let Some(sess) = sess else {
                return err(404, "not_found", "Session not found");
            };
            if sess.status != "running" {
                return err(410, "sandbox_stopped", "The sandbox session is stopped");
            }
            let Some(sbx) = lock(&inner.sandboxes).get(&sess.sandbox).cloned() else {
                return err(404, "not_found", "Sandbox not found");
            };
            match rest {
                ["cmd"] => command(inner, &sbx, &r),
                ["cmd", cmd, "kill"] => {
                    lock(&inner.record).kills += 1;
                    let running = lock(&inner.kills).remove(*cmd);
                    if let Some((line, k)) = running {
                        lock(&inner.record).killed.push(line);
                        let _ = k.send(());
                    }
                    json_resp(200, json!({"command": {"id": cmd}}))
                }
                ["fs", "write"] => write(&r),
                ["fs", "read"] => {
                    let path = r.json()["path"].as_str().unwrap_or_default().to_owned();
                    match std::fs::read(&path) {
                        Ok(b) => (
                            StatusCode::OK,
                            [("content-type", "application/octet-stream")],
                            b,
                        )
                            .into_response(),
                        Err(_) => err(404, "file_not_found", &format!("File not found: {path}")),
                    }
                }
                _ => err(404, "not_found", "no such route"),
            }
        }
        ("GET", ["v2", "sandboxes", name]) => {
            if r.q("projectId") != Some(PROJECT) {
                return err(400, "bad_request", "projectId is required");
            }
            let resume = r.q("resume") == Some("true");
            let polls = lock(&inner.knobs).pending_polls;
            let mut all = lock(&inner.sandboxes);
            let Some(s) = all.get_mut(*name) else {
                return err(404, "not_found", &format!("Sandbox {name} not found"));
            };
            if resume && s.status == "stopped" {
                let timeout = lock(&inner.sessions)
                    .get(&s.session)
                    .map_or(600_000, |x| x.timeout);
                s.session = new_session(inner, name, polls, timeout);
                s.status = "running".to_owned();
            }
            let mut a = answer(inner, s);
            if resume {
                a["resumed"] = json!(true);
            }
            json_resp(200, a)
        }
        ("DELETE", ["v2", "sandboxes", name]) => match lock(&inner.sandboxes).remove(*name) {
            Some(s) => json_resp(200, json!({"sandbox": sandbox_json(&s)})),
            None => err(404, "not_found", &format!("Sandbox {name} not found")),
        },
        _ => err(404, "not_found", "no such route"),
    }
}

fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let b = r.json();
    lock(&inner.record).create_bodies.push(b.clone());
    if b["projectId"].as_str() != Some(PROJECT) {
        return err(400, "bad_request", "projectId is required");
    }
    let name = b["name"].as_str().unwrap_or_default().to_owned();
    let (max_running, max_timeout, polls) = {
        let k = lock(&inner.knobs);
        (k.max_running, k.max_timeout_ms, k.pending_polls)
    };
    let timeout = b["timeout"].as_u64().unwrap_or(300_000);
    if timeout > max_timeout {
        return err(
            400,
            "bad_request",
            &format!("timeout must be less than or equal to {max_timeout}"),
        );
    }
    let mut all = lock(&inner.sandboxes);
    if all.contains_key(&name) {
        return err(
            409,
            "sandbox_already_exists",
            &format!("A sandbox named {name} already exists"),
        );
    }
    if all.values().filter(|s| s.status == "running").count() >= max_running {
        let mut resp = err(
            429,
            "too_many_sandboxes",
            "You have reached the concurrent sandboxes limit of your plan",
        );
        resp.headers_mut()
            .insert("retry-after", "10".parse().unwrap());
        return resp;
    }
    let session = new_session(inner, &name, polls, timeout);
    let s = Sbx {
        name: name.clone(),
        status: if polls > 0 { "pending" } else { "running" }.to_owned(),
        persistent: b["persistent"].as_bool().unwrap_or(true),
        session,
        tags: serde_json::from_value(b["tags"].clone()).unwrap_or_default(),
        env: serde_json::from_value(b["env"].clone()).unwrap_or_default(),
        ports: serde_json::from_value(b["ports"].clone()).unwrap_or_default(),
    };
    let a = answer(inner, &s);
    all.insert(name, s);
    // A session that starts pending turns the sandbox running once it runs.
    json_resp(200, a)
}

fn list(inner: &Arc<Inner>, r: &Req) -> Response {
    if r.q("project") != Some(PROJECT) {
        return err(400, "bad_request", "project is required");
    }
    let page_size = lock(&inner.knobs).page_size;
    let tag = r.q("tags").and_then(|t| t.split_once(':'));
    let limit = r
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(50)
        .min(page_size);
    let start = r
        .q("cursor")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0);
    let all: Vec<Value> = lock(&inner.sandboxes)
        .values()
        .filter(|s| tag.is_none_or(|(k, v)| s.tags.get(k).map(String::as_str) == Some(v)))
        .map(sandbox_json)
        .collect();
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    let next = (start + limit < all.len()).then(|| (start + limit).to_string());
    json_resp(
        200,
        json!({"sandboxes": page, "pagination": {"count": all.len(), "next": next}}),
    )
}

/// Inflates a gzip member made of stored deflate blocks.
fn gunzip_stored(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 18 || data[..3] != [0x1f, 0x8b, 8] || data[3] != 0 {
        return None;
    }
    let mut i = 10;
    let mut out = Vec::new();
    loop {
        let header = *data.get(i)?;
        if header & 0b110 != 0 {
            return None; // compressed blocks: not what the adapter sends
        }
        let len = u16::from_le_bytes([*data.get(i + 1)?, *data.get(i + 2)?]) as usize;
        let nlen = u16::from_le_bytes([*data.get(i + 3)?, *data.get(i + 4)?]);
        if nlen != !(len as u16) {
            return None;
        }
        out.extend_from_slice(data.get(i + 5..i + 5 + len)?);
        i += 5 + len;
        if header & 1 == 1 {
            break;
        }
    }
    let crc = u32::from_le_bytes(data.get(i..i + 4)?.try_into().ok()?);
    (crc == differently_adapters::vercel::tar::crc32(&out)).then_some(out)
}

fn write(r: &Req) -> Response {
    if r.header("content-type") != Some("application/gzip") {
        return err(400, "bad_request", "Expected application/gzip");
    }
    let cwd = r.header("x-cwd").unwrap_or("/vercel/sandbox").to_owned();
    let Some(tar) = gunzip_stored(&r.body) else {
        return err(400, "bad_request", "Invalid gzip stream");
    };
    let mut i = 0;
    while i + 512 <= tar.len() {
        let h = &tar[i..i + 512];
        if h.iter().all(|b| *b == 0) {
            break;
        }
        let sum: u32 = h
            .iter()
            .enumerate()
            .map(|(j, b)| {
                if (148..156).contains(&j) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        let field = |a: usize, b: usize| {
            String::from_utf8_lossy(&h[a..b])
                .trim_matches(|c: char| c == '\0' || c == ' ')
                .to_owned()
        };
        if u32::from_str_radix(&field(148, 156), 8).ok() != Some(sum) {
            return err(400, "bad_request", "Invalid tar header checksum");
        }
        let (name, prefix) = (field(0, 100), field(345, 500));
        let name = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let size = usize::from_str_radix(&field(124, 136), 8).unwrap_or(0);
        let mode = u32::from_str_radix(&field(100, 108), 8).unwrap_or(0o644);
        let Some(data) = tar.get(i + 512..i + 512 + size) else {
            return err(400, "bad_request", "Truncated tar");
        };
        let path = std::path::Path::new(&cwd).join(&name);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = std::fs::write(&path, data) {
            return err(500, "internal", &format!("write failed: {e}"));
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        i += 512 + size.div_ceil(512) * 512;
    }
    json_resp(200, json!({}))
}

fn command(inner: &Arc<Inner>, sbx: &Sbx, r: &Req) -> Response {
    let b = r.json();
    lock(&inner.record).cmd_bodies.push(b.clone());
    let program = b["command"].as_str().unwrap_or_default().to_owned();
    let args: Vec<String> = serde_json::from_value(b["args"].clone()).unwrap_or_default();
    let env: BTreeMap<String, String> =
        serde_json::from_value(b["env"].clone()).unwrap_or_default();
    let cwd = b["cwd"].as_str().map(str::to_owned);
    if let Some(dir) = &cwd {
        if !std::path::Path::new(dir).is_dir() {
            return err(400, "bad_request", "Failed to start command");
        }
    }
    if b["wait"].as_bool() != Some(true) {
        return err(
            400,
            "bad_request",
            "this fake only runs commands with wait: true",
        );
    }
    let id = next_id(inner, "cmd");
    let (stall, truncate) = {
        let k = lock(&inner.knobs);
        (k.stall_ms, k.truncate_after_lines)
    };
    let mut c = tokio::process::Command::new(&program);
    c.args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .envs(&sbx.env)
        .envs(&env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(dir) = &cwd {
        c.current_dir(dir);
    }
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return err(400, "bad_request", &format!("Failed to start command: {e}")),
    };
    let (kill_tx, mut kill_rx) = tokio::sync::oneshot::channel();
    let line = std::iter::once(program.as_str())
        .chain(args.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    lock(&inner.kills).insert(id.clone(), (line, kill_tx));
    let cmd_json = json!({"id": id, "name": program, "args": args, "cwd": cwd.clone().unwrap_or_else(|| "/vercel/sandbox".into()), "sessionId": sbx.session, "exitCode": null, "startedAt": chrono::Utc::now().timestamp_millis()});
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let inner = inner.clone();
    tokio::spawn(async move {
        let line = |v: Value| Bytes::from(format!("{v}\n"));
        let mut sent = 0usize;
        let mut send = |b: Bytes| {
            sent += 1;
            let cut = truncate.is_some_and(|n| sent > n);
            let tx = tx.clone();
            async move {
                if cut {
                    false
                } else {
                    tx.send(b).await.is_ok()
                }
            }
        };
        if stall > 0 {
            tokio::time::sleep(Duration::from_millis(stall)).await;
        }
        let mut ok = send(line(json!({"command": cmd_json.clone()}))).await;
        let mut out = child.stdout.take().unwrap();
        let mut errp = child.stderr.take().unwrap();
        let (mut ob, mut eb) = (vec![0u8; 8192], vec![0u8; 8192]);
        let (mut o_open, mut e_open) = (true, true);
        let mut killed = false;
        while ok && (o_open || e_open) {
            tokio::select! {
                n = out.read(&mut ob), if o_open => match n {
                    Ok(0) | Err(_) => o_open = false,
                    Ok(n) => ok = send(line(json!({"stream": "stdout", "data": String::from_utf8_lossy(&ob[..n])}))).await,
                },
                n = errp.read(&mut eb), if e_open => match n {
                    Ok(0) | Err(_) => e_open = false,
                    Ok(n) => ok = send(line(json!({"stream": "stderr", "data": String::from_utf8_lossy(&eb[..n])}))).await,
                },
                _ = &mut kill_rx, if !killed => {
                    killed = true;
                    let _ = child.start_kill();
                }
            }
        }
        if !ok {
            let _ = child.start_kill();
            let _ = child.wait().await;
            lock(&inner.kills).remove(&id);
            lock(&inner.record).cancelled += 1;
            return;
        }
        let status = child.wait().await;
        lock(&inner.kills).remove(&id);
        let code = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
            }
            Err(_) => 255,
        };
        let mut done = cmd_json;
        done["exitCode"] = json!(code);
        let _ = send(line(json!({"command": done}))).await;
    });
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>))
    });
    (
        StatusCode::OK,
        [("content-type", "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}
