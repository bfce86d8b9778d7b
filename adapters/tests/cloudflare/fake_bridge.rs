//! A fake Cloudflare Sandbox Bridge Worker, written from the bridge's published sources and
//! docs in github.com/cloudflare/sandbox-sdk (snapshot of 2026-08-14, release 0.12.7):
//! `bridge/worker/README.md` (routes, auth, limits, session notes),
//! `packages/sandbox/src/bridge/openapi.ts` (the OpenAPI 3.1 document, "Cloudflare Sandbox
//! Service API" 1.0.0), `routes.ts`, `helpers.ts` and `warm-pool.ts` (behaviour), and
//! `docs/ARCHITECTURE.md` ("Running → Sleeping (state lost)"). What it keeps of them:
//!
//! - auth: `Authorization: Bearer <SANDBOX_API_KEY>` on `/v1/sandbox*`, `/v1/pool/*` and
//!   `/v1/openapi.*`; `/health` is open. The sandbox routes take the scheme in any case, the
//!   pool and OpenAPI routes only as `Bearer ` (and `/v1/openapi.*` also `?token=`). A refusal
//!   is 401 `{"error": "Unauthorized", "code": "unauthorized"}`.
//! - every error is `{"error": "...", "code": "..."}` with the documented codes;
//! - sandbox ids are caller-chosen names matching `[a-z2-7]{1,128}`, checked before auth
//!   (400 "Invalid sandbox ID format"); `POST /v1/sandbox` only invents one (26 base32
//!   characters) and starts nothing;
//! - any request under `/v1/sandbox/{id}/…` gets the id a container from the warm pool
//!   (`getContainer`): the assigned one while it runs, else a new one, so a request for an id
//!   never seen starts an empty container, and a container that went to sleep is replaced by
//!   an empty one (its files are lost). With every instance slot in use: 503
//!   `capacity_exceeded` ("instance limit reached"). `DELETE /v1/sandbox/{id}` only looks the
//!   id up (`lookupContainer`): unknown ids answer 204 without starting anything;
//! - a container sleeps after `sleepAfter` without requests (the SDK's default is 10 min;
//!   a knob here), and sleeping loses its state;
//! - file routes take the path after `/file/` as an absolute path without its leading slash;
//!   it must resolve (after `.`/`..`) inside `/workspace` (403 otherwise); a missing file is
//!   404 `workspace_read_not_found`; a write over 32 MiB is 413 `payload_too_large`; writes
//!   create missing parent directories (the container's file service does `mkdir -p`);
//! - `/exec` (see `fake_exec`): `argv` non-empty (400), `cwd` inside `/workspace` (403),
//!   `Session-Id` matching `[a-zA-Z0-9._-]{1,128}`;
//! - tunnels: ports 1024-65535 except 3000 (400 "Invalid port"); the same port answers the
//!   tunnel it already has; `DELETE` is 204 whether or not there was one;
//! - `GET /v1/sandbox/{id}/running` always answers 200 `{"running": bool}`.
//!
//! Routes the adapter does not use (`persist`, `hydrate`, `mount`, `unmount`, `session`,
//! `pty`, `pool/prime`, `pool/shutdown-prewarmed`) answer 404 here.
//!
//! The container's `/workspace` is a temporary directory of the test host per container;
//! commands run on the host in it (so paths outside `/workspace` are host paths: tests keep
//! to temporary directories there).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::fake_exec::{self, Run};
use crate::support::http::{self, json_resp, lock, Req};

/// Fault injection and behaviour switches.
#[derive(Debug, Default)]
pub struct Knobs {
    /// The next requests whose path contains the string answer this status and error code.
    pub fail_next: VecDeque<(String, u16, &'static str)>,
    /// Container instance slots (`max_instances`); `None` is unlimited.
    pub max_instances: Option<usize>,
    /// A container with no request for this long has gone to sleep.
    pub sleep_after: Option<Duration>,
    /// The next exec streams end after this many output events, without `exit`.
    pub cut_exec_after: VecDeque<usize>,
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    /// `METHOD path` of every request.
    pub requests: Vec<String>,
    /// Bodies of `/exec` requests.
    pub exec_bodies: Vec<Value>,
    /// Requests refused for a missing or wrong key.
    pub unauthorized: u32,
    /// Containers started.
    pub started: u32,
}

struct Container {
    root: tempfile::TempDir,
    last_request: Instant,
    running: Arc<AtomicUsize>,
    groups: Arc<Mutex<Vec<i32>>>,
    tunnels: HashMap<u16, Value>,
}

impl Container {
    fn kill_all(&self) {
        for g in lock(&self.groups).drain(..) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{g}")])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

struct Inner {
    key: Mutex<String>,
    addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    /// Sandbox id → its assigned container.
    assigned: Mutex<HashMap<String, Container>>,
    /// Commands of containers destroyed or asleep, still counted until they end.
    gone_running: Mutex<Vec<Arc<AtomicUsize>>>,
    seq: AtomicUsize,
}

/// A running fake bridge; served for the rest of the test process.
#[derive(Clone)]
pub struct FakeBridge {
    inner: Arc<Inner>,
}

impl FakeBridge {
    pub async fn start(key: &str) -> FakeBridge {
        let listener = http::bind().await;
        let inner = Arc::new(Inner {
            key: Mutex::new(key.to_owned()),
            addr: listener.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            assigned: Mutex::new(HashMap::new()),
            gone_running: Mutex::new(Vec::new()),
            seq: AtomicUsize::new(0),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        http::serve(listener, app);
        FakeBridge { inner }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    pub fn set_key(&self, key: &str) {
        *lock(&self.inner.key) = key.to_owned();
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    /// Sandbox ids with a container assigned (asleep or not).
    pub fn assigned(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.inner.assigned).keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The host directory standing for `/workspace` of `id`'s container.
    pub fn workspace(&self, id: &str) -> Option<PathBuf> {
        lock(&self.inner.assigned)
            .get(id)
            .map(|c| c.root.path().to_owned())
    }

    /// Puts `id`'s container to sleep now, as `sleepAfter` would.
    pub fn sleep(&self, id: &str) {
        if let Some(c) = lock(&self.inner.assigned).get_mut(id) {
            c.last_request = Instant::now() - Duration::from_secs(86_400);
        }
        lock(&self.inner.knobs)
            .sleep_after
            .get_or_insert(Duration::from_secs(3600));
    }

    /// Commands still running in any container, destroyed ones included.
    pub fn commands_running(&self) -> usize {
        let live: usize = lock(&self.inner.assigned)
            .values()
            .map(|c| c.running.load(Ordering::SeqCst))
            .sum();
        let gone: usize = lock(&self.inner.gone_running)
            .iter()
            .map(|r| r.load(Ordering::SeqCst))
            .sum();
        live + gone
    }
}

fn err(status: u16, message: &str, code: &str) -> Response {
    json_resp(status, json!({"error": message, "code": code}))
}

fn valid_sandbox_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
}

fn valid_session_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !id.contains("..")
}

/// Percent-decoding of a URL path (no `+` rule: that is for forms).
fn path_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The bridge's `resolveWorkspacePath`: normalised, and inside `/workspace`, or `None`.
fn resolve_workspace(p: &str) -> Option<String> {
    let abs = if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("/workspace/{p}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for seg in abs.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let resolved = format!("/{}", parts.join("/"));
    (resolved == "/workspace" || resolved.starts_with("/workspace/")).then_some(resolved)
}

/// The host path of container path `resolved` (inside `/workspace`).
fn host_path(root: &Path, resolved: &str) -> PathBuf {
    let rest = resolved.strip_prefix("/workspace").unwrap_or("");
    root.join(rest.trim_start_matches('/'))
}

fn bearer_ok(inner: &Inner, r: &Req, any_case: bool) -> bool {
    let key = lock(&inner.key).clone();
    let auth = r.header("authorization").unwrap_or("");
    let provided = if any_case {
        auth.get(..7)
            .filter(|p| p.eq_ignore_ascii_case("bearer "))
            .map(|_| &auth[7..])
    } else {
        auth.strip_prefix("Bearer ")
    };
    provided == Some(key.as_str())
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let r = Req::read(req, 64 << 20).await;
    lock(&inner.record)
        .requests
        .push(format!("{} {}", r.method, r.path));
    let injected = {
        let mut k = lock(&inner.knobs);
        let at = k
            .fail_next
            .iter()
            .position(|(p, _, _)| r.path.contains(p.as_str()));
        at.and_then(|i| k.fail_next.remove(i))
    };
    if let Some((_, status, code)) = injected {
        return err(status, "injected failure", code);
    }
    let segs: Vec<&str> = r.path.split('/').collect();
    match (r.method.clone(), segs.as_slice()) {
        (Method::GET, ["", "health"]) => json_resp(200, json!({"ok": true})),
        (Method::GET, ["", "v1", "openapi.json"]) => {
            let token_ok = r.q("token") == Some(lock(&inner.key).as_str());
            if !bearer_ok(&inner, &r, false) && !token_ok {
                return unauthorized(&inner);
            }
            json_resp(
                200,
                json!({"openapi": "3.1.0",
                       "info": {"title": "Cloudflare Sandbox Service API", "version": "1.0.0"},
                       "paths": {}}),
            )
        }
        (method, ["", "v1", "pool", rest @ ..]) => {
            if !bearer_ok(&inner, &r, false) {
                return unauthorized(&inner);
            }
            if method != Method::GET || rest != ["stats"] {
                return (axum::http::StatusCode::NOT_FOUND, "404 Not Found").into_response();
            }
            let assigned = lock(&inner.assigned).len();
            json_resp(
                200,
                json!({"warm": 0, "assigned": assigned, "total": assigned,
                       "config": {"warmTarget": 0, "refreshInterval": 10000},
                       "maxInstances": lock(&inner.knobs).max_instances}),
            )
        }
        (Method::POST, ["", "v1", "sandbox"]) => {
            if !bearer_ok(&inner, &r, true) {
                return unauthorized(&inner);
            }
            let n = inner.seq.fetch_add(1, Ordering::SeqCst);
            let id: String = format!("{n:026}")
                .bytes()
                .map(|b| (b'a' + (b - b'0')) as char)
                .collect();
            json_resp(200, json!({ "id": id }))
        }
        (_, ["", "v1", "sandbox", id, rest @ ..]) => {
            if !valid_sandbox_id(id) {
                return err(400, "Invalid sandbox ID format", "invalid_request");
            }
            if !bearer_ok(&inner, &r, true) {
                return unauthorized(&inner);
            }
            sandbox_route(&inner, &r, id, rest).await
        }
        _ => (axum::http::StatusCode::NOT_FOUND, "404 Not Found").into_response(),
    }
}

fn unauthorized(inner: &Inner) -> Response {
    lock(&inner.record).unauthorized += 1;
    err(401, "Unauthorized", "unauthorized")
}

/// `getContainer`: the assigned container while it runs, else a new one; the refusal, if
/// none can start.
fn assign(inner: &Inner, id: &str) -> Option<Response> {
    let sleep_after = lock(&inner.knobs).sleep_after;
    let max = lock(&inner.knobs).max_instances;
    let mut assigned = lock(&inner.assigned);
    let asleep = assigned
        .get(id)
        .is_some_and(|c| sleep_after.is_some_and(|s| c.last_request.elapsed() >= s));
    if asleep {
        if let Some(c) = assigned.remove(id) {
            c.kill_all();
            lock(&inner.gone_running).push(c.running.clone());
        }
    }
    if let Some(c) = assigned.get_mut(id) {
        c.last_request = Instant::now();
        return None;
    }
    let in_use = assigned.len();
    if max.is_some_and(|m| in_use >= m) {
        return Some(err(
            503,
            &format!(
                "Cannot start container: instance limit reached ({in_use}/{}). All container slots are in use. Wait for existing containers to stop.",
                max.unwrap_or_default()
            ),
            "capacity_exceeded",
        ));
    }
    let root = match tempfile::tempdir() {
        Ok(r) => r,
        Err(e) => return Some(err(502, &format!("pool error: {e}"), "pool_error")),
    };
    assigned.insert(
        id.to_owned(),
        Container {
            root,
            last_request: Instant::now(),
            running: Arc::new(AtomicUsize::new(0)),
            groups: Arc::new(Mutex::new(Vec::new())),
            tunnels: HashMap::new(),
        },
    );
    lock(&inner.record).started += 1;
    None
}

async fn sandbox_route(inner: &Arc<Inner>, r: &Req, id: &str, rest: &[&str]) -> Response {
    if rest.is_empty() {
        if r.method != Method::DELETE {
            return (axum::http::StatusCode::NOT_FOUND, "404 Not Found").into_response();
        }
        // lookupContainer only: an unknown id starts nothing.
        if let Some(c) = lock(&inner.assigned).remove(id) {
            c.kill_all();
            lock(&inner.gone_running).push(c.running.clone());
        }
        return axum::http::StatusCode::NO_CONTENT.into_response();
    }
    if let Some(refused) = assign(inner, id) {
        return refused;
    }
    let Some(root) = lock(&inner.assigned)
        .get(id)
        .map(|c| c.root.path().to_owned())
    else {
        return err(502, "pool error: container vanished", "pool_error");
    };
    if let Some(s) = r.header("session-id") {
        if !valid_session_id(s) {
            return err(400, "Invalid session ID format", "invalid_request");
        }
    }
    match (r.method.clone(), rest) {
        (Method::POST, ["exec"]) => exec(inner, r, id, &root),
        (Method::GET, ["file", path @ ..]) => read_file(&root, &path.join("/")),
        (Method::PUT, ["file", path @ ..]) => write_file(&root, &path.join("/"), &r.body),
        (Method::GET, ["running"]) => json_resp(200, json!({"running": true})),
        (Method::POST, ["tunnel", port]) => tunnel(inner, r, id, port),
        (Method::DELETE, ["tunnel", port]) => match port.parse::<u16>() {
            Ok(p) if valid_port(p) => {
                if let Some(c) = lock(&inner.assigned).get_mut(id) {
                    c.tunnels.remove(&p);
                }
                axum::http::StatusCode::NO_CONTENT.into_response()
            }
            _ => err(400, "Invalid port", "invalid_request"),
        },
        _ => (axum::http::StatusCode::NOT_FOUND, "404 Not Found").into_response(),
    }
}

fn exec(inner: &Inner, r: &Req, id: &str, root: &Path) -> Response {
    let body: Value = match serde_json::from_slice(&r.body) {
        Ok(v) => v,
        Err(_) => return err(400, "Invalid JSON body", "invalid_request"),
    };
    lock(&inner.record).exec_bodies.push(body.clone());
    let argv: Option<Vec<String>> = body["argv"].as_array().and_then(|a| {
        a.iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
    });
    let Some(argv) = argv.filter(|a| !a.is_empty()) else {
        return err(400, "argv must be a non-empty array", "invalid_request");
    };
    let dir = match body["cwd"].as_str() {
        None => root.to_owned(),
        Some(cwd) => match resolve_workspace(cwd) {
            Some(resolved) => host_path(root, &resolved),
            None => {
                return err(
                    403,
                    "cwd must resolve to a location within /workspace",
                    "invalid_request",
                )
            }
        },
    };
    let Some((running, groups)) = lock(&inner.assigned)
        .get(id)
        .map(|c| (c.running.clone(), c.groups.clone()))
    else {
        return err(502, "exec failed: container gone", "exec_transport_error");
    };
    let cut_after = lock(&inner.knobs).cut_exec_after.pop_front();
    fake_exec::stream(Run {
        argv,
        dir,
        running,
        groups,
        cut_after,
    })
}

fn read_file(root: &Path, raw: &str) -> Response {
    let rel = path_decode(raw);
    if rel.is_empty() {
        return err(400, "file path must not be empty", "invalid_request");
    }
    let Some(resolved) = resolve_workspace(&format!("/{rel}")) else {
        return err(
            403,
            "path must resolve to a location within /workspace",
            "invalid_request",
        );
    };
    match std::fs::read(host_path(root, &resolved)) {
        Ok(bytes) => ([("content-type", "application/octet-stream")], bytes).into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => err(
            404,
            &format!("File not found: {resolved}"),
            "workspace_read_not_found",
        ),
        Err(e) => err(502, &format!("read failed: {e}"), "exec_transport_error"),
    }
}

fn write_file(root: &Path, raw: &str, body: &[u8]) -> Response {
    let rel = path_decode(raw);
    if rel.is_empty() {
        return err(400, "file path must not be empty", "invalid_request");
    }
    let Some(resolved) = resolve_workspace(&format!("/{rel}")) else {
        return err(
            403,
            "path must resolve to a location within /workspace",
            "invalid_request",
        );
    };
    const MAX_WRITE_BYTES: usize = 32 * 1024 * 1024;
    if body.len() > MAX_WRITE_BYTES {
        return err(
            413,
            &format!(
                "payload too large: {} bytes exceeds the {MAX_WRITE_BYTES}-byte limit",
                body.len()
            ),
            "payload_too_large",
        );
    }
    let target = host_path(root, &resolved);
    let written = target
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&target, body));
    match written {
        Ok(()) => json_resp(200, json!({"ok": true})),
        Err(e) => err(
            502,
            &format!("write failed: {e}"),
            "workspace_archive_write_error",
        ),
    }
}

fn valid_port(p: u16) -> bool {
    p >= 1024 && p != 3000
}

fn tunnel(inner: &Inner, r: &Req, id: &str, port: &str) -> Response {
    let Some(port) = port.parse::<u16>().ok().filter(|p| valid_port(*p)) else {
        return err(400, "Invalid port", "invalid_request");
    };
    let name = if r.body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match serde_json::from_slice::<Value>(&r.body) {
            Err(_) => return err(400, "Invalid JSON body", "invalid_request"),
            Ok(v) => match &v["name"] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                _ => {
                    return err(
                        400,
                        "name must be a string when provided",
                        "invalid_request",
                    )
                }
            },
        }
    };
    let n = inner.seq.fetch_add(1, Ordering::SeqCst);
    let mut assigned = lock(&inner.assigned);
    let Some(c) = assigned.get_mut(id) else {
        return err(502, "tunnel failed: container gone", "tunnel_error");
    };
    let t = c.tunnels.entry(port).or_insert_with(|| {
        let host = match &name {
            Some(n) => format!("{n}.example.com"),
            None => format!("quick-{n}-tunnel.trycloudflare.com"),
        };
        let mut t = json!({"id": format!("00000000-0000-4000-8000-{n:012}"), "port": port,
                           "url": format!("https://{host}"), "hostname": host,
                           "createdAt": chrono::Utc::now().to_rfc3339()});
        if let Some(n) = &name {
            t["name"] = json!(n);
        }
        t
    });
    json_resp(200, t.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_resolve_as_the_bridge_resolves_them() {
        assert_eq!(
            resolve_workspace("/workspace/a/../b").as_deref(),
            Some("/workspace/b")
        );
        assert_eq!(resolve_workspace("x").as_deref(), Some("/workspace/x"));
        assert_eq!(resolve_workspace("/workspace/../etc/passwd"), None);
        assert_eq!(resolve_workspace("/workspacex"), None);
        assert!(valid_sandbox_id("abc27"));
        assert!(!valid_sandbox_id("abc18"));
        assert!(!valid_sandbox_id("ABC"));
        assert_eq!(path_decode("a%20b+c"), "a b+c");
    }
}
