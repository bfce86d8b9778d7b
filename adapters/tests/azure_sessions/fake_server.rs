//! A fake Azure Container Apps dynamic sessions pool: the session pool management (data-plane)
//! API of a `Shell` session pool, written from
//!
//! - the data-plane spec `Microsoft.App Dynamic Sessions service`, version `2025-10-02-preview`
//!   (github.com/Azure/azure-rest-api-specs, `specification/app/data-plane/DynamicSessions/
//!   preview/2025-10-02-preview/DynamicSessions.json`, its `routes.tsp` and the examples of that
//!   version, read 2026-12-06);
//! - learn.microsoft.com/azure/container-apps: `sessions-usage` (identifiers, allocation on
//!   first use, cooldown, Entra audience `https://dynamicsessions.io`), `session-pool` (a
//!   request past `maxConcurrentSessions` is answered **404**; cooldown 300-3600 s, reset by
//!   every call), `sessions-code-interpreter` (files live in `/mnt/data`; uploads over 128 MB
//!   are a 413), `sessions-tutorial-shell` (the `Shell` container type and `shellCommand`).
//!
//! What it models, and where from:
//!
//! - every request needs `Authorization: Bearer <token>` (401 otherwise) and `api-version`
//!   (400 `MissingApiVersionParameter` / `UnsupportedApiVersion`: only `2025-10-02-preview`);
//! - session-scoped routes need `identifier` (4-128 characters of the spec's pattern, else
//!   400); **any** of them allocates a session for an unknown identifier (docs: "If a session
//!   with the identifier doesn't exist, a new session is automatically allocated"), except
//!   `GET /session` and `DELETE /session`, which answer 404 for one that does not exist (the
//!   spec documents only their 200/204; the 404 is the Azure Core convention);
//! - allocation past the pool's `max_sessions` is a 404 (session-pool doc);
//! - a session idle longer than the cooldown is destroyed; every call resets its idle time;
//!   `expireAt` is the last access plus the cooldown;
//! - `GET /listSessions?skip=` pages with `nextLink` (the spec's `SessionsListResponse`);
//! - `POST /executions` (synchronous): `shellCommand` (run by bash) XOR `execCommandAndArgs`
//!   (run directly), `stdin`, `timeoutInSeconds` (required); stdout and stderr are cut to
//!   `outputStreamsMaxLength` characters (default 4096); `status` is the command's exit code
//!   as a decimal string, as the spec's two shell examples answer (`"status": "0"`). A command
//!   past its timeout is killed and answered `status: "Failed"` with
//!   `error.error.code = "ExecutionTimeout"` (the spec does not show one; the name is that of
//!   the shell image's own error list). `code` (Python) is refused on a Shell pool (400);
//! - files (`/files`, `/files/{name}`, `/files/{name}/content`, DELETE) live under the data
//!   directory (`/mnt/data` in a real session; a temp dir here), `path` a subdirectory of it;
//!   a `path` containing `.` is a 400 (docs: "Paths can't contain `.`"); uploads past
//!   `upload_limit` are a 413; errors are `{"error": {"code", "message"}}` with
//!   `x-ms-error-code`, the spec's `Azure.Core.Foundations.ErrorResponse`.
//!
//! Commands really run on the test host (so quoting, env, cwd, exit codes and timeouts are
//! bash's); every session shares the host and the one data directory. Asynchronous
//! executions are not modelled: the adapter never asks for them.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support::http::{self, lock, Req};

/// The one API version this fake speaks.
pub const API_VERSION: &str = "2025-10-02-preview";

/// Fault injection and behaviour switches.
#[derive(Debug)]
pub struct Knobs {
    /// The next requests whose path contains the string fail with the status (and a
    /// `Retry-After` of the seconds given, if any).
    pub fail_next: VecDeque<(String, u16, Option<u64>)>,
    /// The pool's `maxConcurrentSessions`.
    pub max_sessions: usize,
    /// The pool's `cooldownPeriodInSeconds`, as a duration (tests shorten it).
    pub cooldown: Duration,
    /// Sessions per page of `/listSessions`.
    pub page_size: usize,
    /// Largest upload accepted (bytes).
    pub upload_limit: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: VecDeque::new(),
            max_sessions: 100,
            cooldown: Duration::from_secs(300),
            page_size: 100,
            upload_limit: 128 << 20,
        }
    }
}

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Record {
    /// `METHOD path?query` of every request.
    pub requests: Vec<String>,
    /// Bodies of `POST /executions`.
    pub executions: Vec<Value>,
    /// Requests refused for a missing or wrong token.
    pub unauthorized: u32,
}

/// One allocated session.
#[derive(Debug, Clone)]
pub struct Session {
    pub identifier: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub last_accessed_at: chrono::DateTime<chrono::Utc>,
    /// When it was last used, for the cooldown.
    touched: Instant,
    pub etag: String,
}

struct Inner {
    token: Mutex<String>,
    addr: SocketAddr,
    data_dir: PathBuf,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    sessions: Mutex<BTreeMap<String, Session>>,
    seq: Mutex<u64>,
}

/// A running fake pool; its data directory is removed when the test process ends.
#[derive(Clone)]
pub struct FakePool {
    inner: Arc<Inner>,
    _data: Arc<tempfile::TempDir>,
}

impl FakePool {
    pub async fn start(token: &str) -> FakePool {
        let listener = http::bind().await;
        let data = tempfile::tempdir().unwrap();
        let inner = Arc::new(Inner {
            token: Mutex::new(token.to_owned()),
            addr: listener.local_addr().unwrap(),
            data_dir: data.path().to_owned(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            sessions: Mutex::new(BTreeMap::new()),
            seq: Mutex::new(0),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        http::serve(listener, app);
        FakePool {
            inner,
            _data: Arc::new(data),
        }
    }

    /// The pool management endpoint, shaped as Azure's
    /// (`https://<region>.dynamicsessions.io/subscriptions/…/sessionPools/<name>`).
    pub fn endpoint(&self) -> String {
        format!(
            "http://{}/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/sessionPools/pool",
            self.inner.addr
        )
    }

    /// Where the files API keeps files (a session's `/mnt/data`).
    pub fn data_dir(&self) -> &Path {
        &self.inner.data_dir
    }

    /// Accepts `token` (and only it) from now on.
    pub fn set_token(&self, token: &str) {
        *lock(&self.inner.token) = token.to_owned();
    }

    pub fn knobs(&self) -> MutexGuard<'_, Knobs> {
        lock(&self.inner.knobs)
    }

    pub fn record(&self) -> MutexGuard<'_, Record> {
        lock(&self.inner.record)
    }

    /// Identifiers of the live sessions.
    pub fn sessions(&self) -> Vec<String> {
        expire(&self.inner);
        lock(&self.inner.sessions).keys().cloned().collect()
    }

    /// Allocates a session as a first request would (another client's, an orphan).
    pub fn allocate(&self, identifier: &str) {
        let _refused = allocate(&self.inner, identifier);
    }

    /// Makes `identifier` idle for longer than any cooldown (the platform destroys it).
    pub fn age(&self, identifier: &str) {
        if let Some(s) = lock(&self.inner.sessions).get_mut(identifier) {
            s.touched = Instant::now() - Duration::from_secs(7200);
        }
    }
}

/// An `Azure.Core.Foundations.ErrorResponse` with its `x-ms-error-code` header.
fn error(status: u16, code: &str, message: &str) -> Response {
    let mut resp = http::json_resp(status, json!({"error": {"code": code, "message": message}}));
    if let Ok(v) = code.parse() {
        resp.headers_mut().insert("x-ms-error-code", v);
    }
    resp
}

/// Whether `id` fits the spec's `identifier` pattern (4-128 of its characters).
fn valid_identifier(id: &str) -> bool {
    const SPECIAL: &str = "_|}{[]:\";'<>?/.,@#$%^&*()-+=!~`";
    (4..=128).contains(&id.chars().count())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || SPECIAL.contains(c))
}

/// Destroys sessions idle past the cooldown.
fn expire(inner: &Inner) {
    let cooldown = lock(&inner.knobs).cooldown;
    lock(&inner.sessions).retain(|_, s| s.touched.elapsed() < cooldown);
}

/// The session of `id`, allocated if needed; the refusal when the pool is full.
fn allocate(inner: &Inner, id: &str) -> Option<Response> {
    expire(inner);
    let max = lock(&inner.knobs).max_sessions;
    let mut sessions = lock(&inner.sessions);
    let now = chrono::Utc::now();
    if let Some(s) = sessions.get_mut(id) {
        s.touched = Instant::now();
        s.last_accessed_at = now;
        return None;
    }
    if sessions.len() >= max {
        return Some(error(
            404,
            "SessionNotAllocated",
            "no more sessions can be allocated in this session pool",
        ));
    }
    let n = {
        let mut seq = lock(&inner.seq);
        *seq += 1;
        *seq
    };
    sessions.insert(
        id.to_owned(),
        Session {
            identifier: id.to_owned(),
            created_at: now,
            last_accessed_at: now,
            touched: Instant::now(),
            etag: format!("{n:08x}-aafd-45a0-90bd-{:012x}", std::process::id()),
        },
    );
    None
}

fn session_json(s: &Session, cooldown: Duration) -> Value {
    let expire = s.last_accessed_at + chrono::Duration::from_std(cooldown).unwrap_or_default();
    json!({
        "identifier": s.identifier,
        "createdAt": s.created_at,
        "lastAccessedAt": s.last_accessed_at,
        "expireAt": expire,
        "etag": s.etag,
    })
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let raw_query = req.uri().query().unwrap_or("").to_owned();
    let r = Req::read(req, 512 << 20).await;
    lock(&inner.record)
        .requests
        .push(format!("{} {}?{raw_query}", r.method, r.path));
    let want = format!("Bearer {}", lock(&inner.token));
    if r.header("authorization") != Some(want.as_str()) {
        lock(&inner.record).unauthorized += 1;
        let mut resp = (StatusCode::UNAUTHORIZED, "").into_response();
        resp.headers_mut()
            .insert("www-authenticate", "Bearer".parse().unwrap());
        return resp;
    }
    let injected = {
        let mut k = lock(&inner.knobs);
        let at = k.fail_next.iter().position(|(p, _, _)| r.path.contains(p));
        at.and_then(|i| k.fail_next.remove(i))
    };
    if let Some((_, status, retry)) = injected {
        let mut resp = error(status, "Injected", "injected failure");
        if let Some(s) = retry {
            resp.headers_mut()
                .insert("retry-after", s.to_string().parse().unwrap());
        }
        return resp;
    }
    match r.q("api-version") {
        None => {
            return error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        }
        Some(v) if v != API_VERSION => {
            return error(
                400,
                "UnsupportedApiVersion",
                &format!("The HTTP resource does not support the API version '{v}'."),
            )
        }
        Some(_) => {}
    }
    let prefix =
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/sessionPools/pool";
    let Some(route) = r.path.strip_prefix(prefix) else {
        return error(404, "NotFound", "no such session pool");
    };
    let route = route.to_owned();
    if route == "/listSessions" && r.method == Method::GET {
        return list_sessions(&inner, &r);
    }
    let Some(id) = r.q("identifier").map(str::to_owned) else {
        return error(
            400,
            "MissingIdentifier",
            "The identifier query parameter is required.",
        );
    };
    if !valid_identifier(&id) {
        return error(400, "InvalidIdentifier", "The identifier is not valid.");
    }
    if route == "/session" {
        expire(&inner);
        let cooldown = lock(&inner.knobs).cooldown;
        let mut sessions = lock(&inner.sessions);
        return match (r.method.clone(), sessions.get(&id)) {
            (_, None) => error(404, "SessionNotFound", &format!("session {id} not found")),
            (Method::GET, Some(s)) => http::json_resp(200, session_json(s, cooldown)),
            (Method::DELETE, Some(_)) => {
                sessions.remove(&id);
                StatusCode::NO_CONTENT.into_response()
            }
            _ => error(405, "MethodNotAllowed", "method not allowed"),
        };
    }
    if let Some(full) = allocate(&inner, &id) {
        return full;
    }
    match (r.method.clone(), route.as_str()) {
        (Method::POST, "/executions") => execute(&inner, &id, &r).await,
        (Method::POST, "/files") => upload(&inner, &r),
        (Method::GET, "/files") => list_files(&inner, &r),
        (m, rest) if rest.starts_with("/files/") => file(&inner, m, &rest[7..], &r),
        _ => error(404, "NotFound", &format!("no route {route}")),
    }
}

fn list_sessions(inner: &Inner, r: &Req) -> Response {
    expire(inner);
    let (page, cooldown) = {
        let k = lock(&inner.knobs);
        (k.page_size.max(1), k.cooldown)
    };
    let skip: usize = r.q("skip").and_then(|s| s.parse().ok()).unwrap_or(0);
    let sessions = lock(&inner.sessions);
    let all: Vec<&Session> = sessions.values().collect();
    let items: Vec<Value> = all
        .iter()
        .skip(skip)
        .take(page)
        .map(|s| session_json(s, cooldown))
        .collect();
    let mut body = json!({ "sessions": items });
    if skip + page < all.len() {
        body["nextLink"] = json!(format!(
            "http://{}{}?api-version={API_VERSION}&skip={}",
            inner.addr,
            r.path,
            skip + page
        ));
    }
    http::json_resp(200, body)
}

/// The first `max` characters of `s`.
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

async fn execute(inner: &Inner, id: &str, r: &Req) -> Response {
    let body = r.json();
    lock(&inner.record).executions.push(body.clone());
    if body.get("code").is_some_and(|c| !c.is_null()) {
        return error(
            400,
            "InvalidCodeExecutionRequest",
            "`code` is not supported by a Shell session pool; use shellCommand or execCommandAndArgs",
        );
    }
    let Some(timeout) = body.get("timeoutInSeconds").and_then(Value::as_u64) else {
        return error(
            400,
            "InvalidCodeExecutionRequest",
            "timeoutInSeconds is required",
        );
    };
    let max_len = body
        .get("outputStreamsMaxLength")
        .and_then(Value::as_u64)
        .unwrap_or(4096) as usize;
    let shell = body.get("shellCommand").and_then(Value::as_str);
    let argv: Option<Vec<String>> = body
        .get("execCommandAndArgs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        });
    let mut cmd = match (shell, argv) {
        (Some(_), Some(_)) => {
            return error(
                400,
                "InvalidCodeExecutionRequest",
                "shellCommand cannot coexist with execCommandAndArgs",
            )
        }
        (None, None) => {
            return error(
                400,
                "InvalidCodeExecutionRequest",
                "at least one of shellCommand or execCommandAndArgs must be provided",
            )
        }
        (Some(s), None) => {
            let mut c = tokio::process::Command::new("bash");
            c.arg("-c").arg(s);
            c
        }
        (None, Some(a)) if a.is_empty() => {
            return error(
                400,
                "InvalidCodeExecutionRequest",
                "execCommandAndArgs is empty",
            )
        }
        (None, Some(a)) => {
            let mut c = tokio::process::Command::new(&a[0]);
            c.args(&a[1..]);
            c
        }
    };
    let stdin = body.get("stdin").and_then(Value::as_str).map(str::to_owned);
    cmd.current_dir(&inner.data_dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return error(400, "CommandStartError", &format!("failed to start: {e}"));
        }
    };
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        tokio::spawn(async move {
            let _ = pipe.write_all(text.as_bytes()).await;
        });
    }
    let waited = tokio::time::timeout(Duration::from_secs(timeout), child.wait_with_output()).await;
    let ms = started.elapsed().as_millis() as u64;
    let Ok(done) = waited else {
        return http::json_resp(
            200,
            json!({
                "id": format!("exec-{ms}"),
                "identifier": id,
                "executionType": "Synchronous",
                "status": "Failed",
                "error": {"error": {"code": "ExecutionTimeout", "message": "Command execution timed out"}},
                "result": {"stdout": "", "stderr": "", "executionTimeInMilliseconds": ms},
            }),
        );
    };
    let Ok(out) = done else {
        return error(
            500,
            "InternalServerError",
            "the command could not be waited for",
        );
    };
    let code = out.status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + out.status.signal().unwrap_or(0)
    });
    http::json_resp(
        200,
        json!({
            "id": format!("exec-{ms}"),
            "identifier": id,
            "executionType": "Synchronous",
            "status": code.to_string(),
            "result": {
                "stdout": cut(&String::from_utf8_lossy(&out.stdout), max_len),
                "stderr": cut(&String::from_utf8_lossy(&out.stderr), max_len),
                "executionTimeInMilliseconds": ms,
            },
        }),
    )
}

/// The directory `path` names under the data directory; `Err` for a refused one.
fn subdir(inner: &Inner, r: &Req) -> Result<PathBuf, Box<Response>> {
    match r.q("path").filter(|p| !p.is_empty()) {
        None => Ok(inner.data_dir.clone()),
        Some(p) if p.contains('.') => Err(Box::new(error(
            400,
            "InvalidPath",
            "The path contains characters that are not supported.",
        ))),
        Some(p) => Ok(inner.data_dir.join(p.trim_start_matches('/'))),
    }
}

/// A file name from the URL: decoded, one path segment.
fn file_name(raw: &str) -> Option<String> {
    let name = http::pct_decode(raw);
    (!name.is_empty() && !name.contains('/') && name != "..").then_some(name)
}

fn file_json(dir: &Path, name: &str, meta: &std::fs::Metadata, data_dir: &Path) -> Value {
    let modified: chrono::DateTime<chrono::Utc> = meta
        .modified()
        .map(Into::into)
        .unwrap_or_else(|_| chrono::Utc::now());
    let rel = dir.strip_prefix(data_dir).unwrap_or(dir);
    json!({
        "name": name,
        "type": if meta.is_dir() { "directory" } else { "file" },
        "contentType": "application/octet-stream",
        "sizeInBytes": meta.len(),
        "lastModifiedAt": modified,
        "directory": format!("/mnt/data/{}", rel.display()).trim_end_matches('/'),
    })
}

/// The `file` part of a multipart body: its file name and bytes.
fn multipart_file(headers: &HeaderMap, body: &[u8]) -> Option<(String, Vec<u8>)> {
    let ct = headers.get("content-type")?.to_str().ok()?;
    let boundary = ct.split("boundary=").nth(1)?.trim_matches('"');
    let marker = format!("--{boundary}").into_bytes();
    let find = |hay: &[u8], from: usize| {
        hay[from..]
            .windows(marker.len())
            .position(|w| w == marker.as_slice())
            .map(|i| i + from)
    };
    let mut at = find(body, 0)?;
    loop {
        let start = at + marker.len();
        let next = find(body, start)?;
        let part = &body[start..next];
        let part = part.strip_prefix(b"\r\n").unwrap_or(part);
        let split = part.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&part[..split]).to_ascii_lowercase();
        let head_raw = String::from_utf8_lossy(&part[..split]).into_owned();
        let content = &part[split + 4..];
        let content = content.strip_suffix(b"\r\n").unwrap_or(content);
        if head.contains("name=\"file\"") {
            let i = head.find("filename=\"")? + 10;
            let name: String = head_raw[i..].chars().take_while(|c| *c != '"').collect();
            return Some((name, content.to_vec()));
        }
        at = next;
    }
}

fn upload(inner: &Inner, r: &Req) -> Response {
    let dir = match subdir(inner, r) {
        Ok(d) => d,
        Err(e) => return *e,
    };
    if r.body.len() > lock(&inner.knobs).upload_limit {
        return error(
            413,
            "RequestEntityTooLarge",
            "The file exceeds the upload limit.",
        );
    }
    let Some((name, bytes)) = multipart_file(&r.headers, &r.body) else {
        return error(
            400,
            "InvalidMultipartBody",
            "a multipart part `file` with a file name is required",
        );
    };
    let Some(name) = file_name(&name) else {
        return error(400, "InvalidFileName", "The file name is not valid.");
    };
    if std::fs::create_dir_all(&dir).is_err() || std::fs::write(dir.join(&name), &bytes).is_err() {
        return error(500, "InternalServerError", "the file could not be written");
    }
    match std::fs::metadata(dir.join(&name)) {
        Ok(m) => http::json_resp(200, file_json(&dir, &name, &m, &inner.data_dir)),
        Err(_) => error(
            500,
            "InternalServerError",
            "the file could not be read back",
        ),
    }
}

fn list_files(inner: &Inner, r: &Req) -> Response {
    let dir = match subdir(inner, r) {
        Ok(d) => d,
        Err(e) => return *e,
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return error(404, "DirectoryNotFound", "The directory was not found.");
    };
    let value: Vec<Value> = entries
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some(file_json(
                &dir,
                &e.file_name().to_string_lossy(),
                &meta,
                &inner.data_dir,
            ))
        })
        .collect();
    http::json_resp(200, json!({ "value": value }))
}

fn file(inner: &Inner, method: Method, rest: &str, r: &Req) -> Response {
    let dir = match subdir(inner, r) {
        Ok(d) => d,
        Err(e) => return *e,
    };
    let (raw, content) = match rest.strip_suffix("/content") {
        Some(n) => (n, true),
        None => (rest, false),
    };
    let Some(name) = file_name(raw) else {
        return error(400, "InvalidFileName", "The file name is not valid.");
    };
    let path = dir.join(&name);
    let Ok(meta) = std::fs::metadata(&path) else {
        return error(
            404,
            "FileNotFound",
            &format!("The file {name} was not found."),
        );
    };
    match (method, content) {
        (Method::GET, true) => match std::fs::read(&path) {
            Ok(bytes) => (
                StatusCode::OK,
                [("content-type", "application/octet-stream")],
                bytes,
            )
                .into_response(),
            Err(_) => error(500, "InternalServerError", "the file could not be read"),
        },
        (Method::GET, false) => {
            http::json_resp(200, file_json(&dir, &name, &meta, &inner.data_dir))
        }
        (Method::DELETE, false) => {
            let removed = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => StatusCode::NO_CONTENT.into_response(),
                Err(_) => error(500, "InternalServerError", "the file could not be deleted"),
            }
        }
        _ => error(405, "MethodNotAllowed", "method not allowed"),
    }
}
