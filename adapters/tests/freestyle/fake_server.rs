//! A fake Freestyle v5 VM API, written from `../shared/provider-specs/freestyle/API.md` and
//! what live accounts showed (seeds 002 POC 7):
//!
//! - `firewall` is required at create; create answers carry extra fields (`firewallRules`,
//!   `tlsRules`) and the VM is `starting` for a few polls;
//! - a slug is unique (409 when taken); VMs are addressed by id or slug;
//! - `poweroff` needs root, and with `automaticRestart` on a powered-off VM boots again a
//!   few polls later;
//! - an exec boots a stopped VM;
//! - `fs/write`'s `mode` is read as a decimal number, and a written file is root-owned;
//! - `fs/read` honours `Range` (206), unless told to ignore it;
//! - `exec-await` answers `statusCode: null` for a command its timeout killed;
//! - 429 once the plan's VM limit is reached.
//!
//! Commands run on the test host through `bash -c`; file paths are host paths.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support::http::{self, lock, pct_decode, Req};

#[derive(Debug)]
pub struct Knobs {
    pub fail_next: VecDeque<(String, u16)>,
    /// The plan's limit of VMs: a create past it is a 429.
    pub max_vms: Option<usize>,
    /// Polls a new or starting VM stays `starting`.
    pub starting_polls: u32,
    /// Polls after a poweroff before a VM with `automaticRestart` boots again.
    pub restart_polls: u32,
    /// Answer reads with the whole file even when a Range was asked.
    pub ignore_range: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            fail_next: VecDeque::new(),
            max_vms: None,
            starting_polls: 2,
            restart_polls: 2,
            ignore_range: false,
        }
    }
}

#[derive(Debug, Default)]
pub struct Record {
    pub create_bodies: Vec<Value>,
    pub exec_bodies: Vec<Value>,
    /// `mode` parameters of writes, as sent.
    pub write_modes: Vec<String>,
    pub unauthorized: u32,
}

#[derive(Debug, Clone)]
pub struct Vm {
    pub id: String,
    pub slug: String,
    pub state: String,
    pub metadata: BTreeMap<String, String>,
    pub snapshot_id: String,
    pub automatic_restart: bool,
    polls_left: u32,
    /// Polls until an automatic restart boots a powered-off VM.
    restart_in: Option<u32>,
}

struct Inner {
    key: Mutex<String>,
    addr: SocketAddr,
    knobs: Mutex<Knobs>,
    record: Mutex<Record>,
    vms: Mutex<BTreeMap<String, Vm>>,
    seq: Mutex<u64>,
}

#[derive(Clone)]
pub struct FakeFreestyle {
    inner: Arc<Inner>,
}

impl FakeFreestyle {
    pub async fn start(key: &str) -> FakeFreestyle {
        let listener = http::bind().await;
        let inner = Arc::new(Inner {
            key: Mutex::new(key.to_owned()),
            addr: listener.local_addr().unwrap(),
            knobs: Mutex::new(Knobs::default()),
            record: Mutex::new(Record::default()),
            vms: Mutex::new(BTreeMap::new()),
            seq: Mutex::new(0),
        });
        let app = Router::new().fallback(handle).with_state(inner.clone());
        http::serve(listener, app);
        FakeFreestyle { inner }
    }

    pub fn api_url(&self) -> String {
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

    pub fn vms(&self) -> Vec<Vm> {
        lock(&self.inner.vms).values().cloned().collect()
    }

    pub fn vm(&self, id: &str) -> Option<Vm> {
        lock(&self.inner.vms).get(id).cloned()
    }

    /// Puts a running VM straight into the account (someone else's, an orphan).
    pub fn insert(&self, slug: &str, metadata: BTreeMap<String, String>) -> String {
        let id = next_id(&self.inner);
        lock(&self.inner.vms).insert(
            id.clone(),
            Vm {
                id: id.clone(),
                slug: slug.to_owned(),
                state: "running".to_owned(),
                metadata,
                snapshot_id: "freestyle/ubuntu".to_owned(),
                automatic_restart: true,
                polls_left: 0,
                restart_in: None,
            },
        );
        id
    }
}

/// 20 lowercase alphanumeric characters, like real VM ids.
fn next_id(inner: &Inner) -> String {
    let mut n = lock(&inner.seq);
    *n += 1;
    format!("{:010}{:010}", *n, std::process::id())
        .chars()
        .map(|c| char::from(b'a' + (c as u8 - b'0')))
        .collect()
}

fn json_resp(status: u16, v: Value) -> Response {
    let mut r = http::json_resp(status, v);
    r.headers_mut()
        .insert("x-freestyle-trace-id", "trace-0123".parse().unwrap());
    r
}

fn err(status: u16, code: &str, message: &str) -> Response {
    json_resp(status, json!({"code": code, "message": message}))
}

fn vm_json(v: &Vm) -> Value {
    json!({
        "id": v.id, "slug": v.slug, "state": v.state, "metadata": v.metadata,
        "snapshotId": v.snapshot_id, "resources": {"cpu": 2, "memory": 4096, "storage": 16384},
        "createdAt": "2026-10-29T10:00:00Z", "updatedAt": "2026-10-29T10:00:00Z",
        // Seen live, not in the SDK types.
        "firewallRules": [], "tlsRules": [], "domains": [],
    })
}

fn advance(v: &mut Vm, knobs: &Knobs) {
    if v.polls_left > 0 {
        v.polls_left -= 1;
        if v.polls_left == 0 {
            v.state = match v.state.as_str() {
                "starting" => "running",
                "pausing" => "paused",
                other => other,
            }
            .to_owned();
        }
    }
    if let Some(n) = v.restart_in {
        if n <= 1 {
            v.restart_in = None;
            v.state = "running".to_owned();
        } else {
            v.restart_in = Some(n - 1);
        }
    }
    let _ = knobs;
}

fn q<'a>(query: &'a [(String, String)], k: &str) -> Option<&'a str> {
    query.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

fn entry(path: &std::path::Path) -> Option<Value> {
    let md = std::fs::symlink_metadata(path).ok()?;
    let kind = if md.file_type().is_symlink() {
        "symlink"
    } else if md.is_dir() {
        "directory"
    } else {
        "file"
    };
    let modified: chrono::DateTime<chrono::Utc> = md.modified().ok()?.into();
    Some(json!({
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "kind": kind, "size": md.len(), "mode": md.permissions().mode() & 0o7777,
        "modifiedAt": modified, "owner": "root",
    }))
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let Req {
        method,
        path,
        query,
        headers,
        body,
    } = Req::read(req, 64 << 20).await;
    let want = format!("Bearer {}", lock(&inner.key));
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
        lock(&inner.record).unauthorized += 1;
        return err(401, "UNAUTHORIZED", "Invalid API key");
    }
    let injected = {
        let mut k = lock(&inner.knobs);
        match k
            .fail_next
            .iter()
            .position(|(p, _)| path.contains(p.as_str()))
        {
            Some(i) => k.fail_next.remove(i).map(|(_, s)| s),
            None => None,
        }
    };
    if let Some(status) = injected {
        return match status {
            429 => err(429, "RATE_LIMITED", "Too many requests"),
            s => err(s, "INTERNAL_ERROR", "injected failure"),
        };
    }
    route(&inner, &method, &path, &query, &headers, body).await
}

async fn route(
    inner: &Arc<Inner>,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let seg: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(pct_decode)
        .collect();
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    match (method.clone(), seg.as_slice()) {
        (Method::GET, ["v5", "vms"]) => {
            let knobs = lock(&inner.knobs);
            let mut vms = lock(&inner.vms);
            for v in vms.values_mut() {
                advance(v, &knobs);
            }
            let items: Vec<Value> = vms.values().map(vm_json).collect();
            json_resp(200, json!({"vms": items, "totalCount": items.len()}))
        }
        (Method::POST, ["v5", "vms"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&body) else {
                return err(400, "INVALID_REQUEST", "invalid JSON");
            };
            lock(&inner.record).create_bodies.push(b.clone());
            if !b["firewall"].is_object() {
                return err(400, "INVALID_REQUEST", "firewall is required");
            }
            let knobs = lock(&inner.knobs);
            let mut vms = lock(&inner.vms);
            if knobs.max_vms.is_some_and(|m| vms.len() >= m) {
                return err(429, "VM_LIMIT_EXCEEDED", "Your plan allows no more VMs");
            }
            let slug = b["slug"].as_str().unwrap_or_default().to_owned();
            if !slug.is_empty() && vms.values().any(|v| v.slug == slug) {
                return err(409, "SLUG_TAKEN", &format!("slug {slug} is taken"));
            }
            let id = next_id(inner);
            let v = Vm {
                id: id.clone(),
                slug,
                state: "starting".to_owned(),
                metadata: serde_json::from_value(b["metadata"].clone()).unwrap_or_default(),
                snapshot_id: b["snapshotId"]
                    .as_str()
                    .unwrap_or("freestyle/ubuntu")
                    .to_owned(),
                automatic_restart: b["automaticRestart"].as_bool().unwrap_or(true),
                polls_left: knobs.starting_polls.max(1),
                restart_in: None,
            };
            let out = vm_json(&v);
            vms.insert(id, v);
            json_resp(200, out)
        }
        (method, ["v5", "vms", key, rest @ ..]) => {
            let id = {
                let vms = lock(&inner.vms);
                vms.values()
                    .find(|v| v.id == *key || v.slug == *key)
                    .map(|v| v.id.clone())
            };
            let Some(id) = id else {
                return err(404, "VM_NOT_FOUND", &format!("VM {key} not found"));
            };
            vm_route(inner, &id, &method, rest, query, headers, body).await
        }
        _ => err(404, "NOT_FOUND", &format!("no route {method} {path}")),
    }
}

async fn vm_route(
    inner: &Arc<Inner>,
    id: &str,
    method: &Method,
    rest: &[&str],
    query: &[(String, String)],
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let path = q(query, "path").map(std::path::PathBuf::from);
    let not_found = || err(404, "FILE_NOT_FOUND", "no such file or directory");
    match (method.clone(), rest) {
        (Method::GET, []) => {
            let knobs = lock(&inner.knobs);
            let mut vms = lock(&inner.vms);
            let v = vms.get_mut(id).unwrap();
            advance(v, &knobs);
            json_resp(200, vm_json(v))
        }
        (Method::DELETE, []) => {
            lock(&inner.vms).remove(id);
            json_resp(200, json!({"id": id}))
        }
        (Method::POST, ["start"]) => {
            let knobs = lock(&inner.knobs);
            let mut vms = lock(&inner.vms);
            let v = vms.get_mut(id).unwrap();
            if matches!(v.state.as_str(), "stopped" | "paused") {
                v.state = "starting".to_owned();
                v.polls_left = knobs.starting_polls.max(1);
                v.restart_in = None;
            }
            json_resp(200, json!({"id": id}))
        }
        (Method::POST, ["pause"]) => {
            let mut vms = lock(&inner.vms);
            let v = vms.get_mut(id).unwrap();
            match v.state.as_str() {
                "running" => {
                    // About 0.5 s live: one poll here.
                    v.state = "pausing".to_owned();
                    v.polls_left = 1;
                    json_resp(200, json!({"id": id}))
                }
                st => err(409, "INVALID_STATE", &format!("VM is {st}")),
            }
        }
        (Method::POST, ["exec-await"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&body) else {
                return err(400, "INVALID_REQUEST", "invalid JSON");
            };
            lock(&inner.record).exec_bodies.push(b.clone());
            let command = b["command"].as_str().unwrap_or_default().to_owned();
            let root = b["linuxUser"].as_str() == Some("root");
            {
                let knobs = lock(&inner.knobs);
                let mut vms = lock(&inner.vms);
                let v = vms.get_mut(id).unwrap();
                match v.state.as_str() {
                    // An exec boots a stopped VM (seen live).
                    "stopped" | "starting" => {
                        v.state = "running".to_owned();
                        v.polls_left = 0;
                        v.restart_in = None;
                    }
                    "paused" | "pausing" => {
                        return err(409, "VM_PAUSED", "VM is paused");
                    }
                    _ => {}
                }
                if command.contains("poweroff") {
                    if !root {
                        return json_resp(
                            200,
                            json!({"stdout": "", "stderr": "poweroff: must be superuser.\n", "statusCode": 1}),
                        );
                    }
                    v.state = "stopped".to_owned();
                    if v.automatic_restart {
                        v.restart_in = Some(knobs.restart_polls.max(1));
                    }
                    // The VM goes down under the call: the connection breaks.
                    return err(502, "VM_UNREACHABLE", "VM went away");
                }
            }
            let timeout = b["timeoutMs"].as_u64().unwrap_or(30_000);
            let mut cmd = tokio::process::Command::new("bash");
            cmd.arg("-c")
                .arg(&command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(env) = b["env"].as_object() {
                for (k, v) in env {
                    cmd.env(k, v.as_str().unwrap_or_default());
                }
            }
            let stdin = match b["stdin"].as_str() {
                Some(s) => match base64::engine::general_purpose::STANDARD.decode(s) {
                    Ok(v) if v.len() <= 1 << 20 => v,
                    Ok(_) => return err(400, "INVALID_REQUEST", "stdin over 1 MiB"),
                    Err(_) => return err(400, "INVALID_REQUEST", "stdin is not base64"),
                },
                None => Vec::new(),
            };
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => return err(500, "INTERNAL_ERROR", &e.to_string()),
            };
            if let Some(mut w) = child.stdin.take() {
                tokio::spawn(async move {
                    let _ = w.write_all(&stdin).await;
                });
            }
            let pid = child.id();
            match tokio::time::timeout(Duration::from_millis(timeout), child.wait_with_output())
                .await
            {
                Ok(Ok(out)) => {
                    use std::os::unix::process::ExitStatusExt;
                    let code = out.status.code().or(out.status.signal().map(|n| 128 + n));
                    json_resp(
                        200,
                        json!({"stdout": String::from_utf8_lossy(&out.stdout),
                               "stderr": String::from_utf8_lossy(&out.stderr), "statusCode": code}),
                    )
                }
                Ok(Err(e)) => err(500, "INTERNAL_ERROR", &e.to_string()),
                Err(_) => {
                    if let Some(pid) = pid {
                        let _ = tokio::process::Command::new("kill")
                            .args(["-KILL", "--", &format!("-{pid}")])
                            .status()
                            .await;
                    }
                    json_resp(200, json!({"stdout": "", "stderr": "", "statusCode": null}))
                }
            }
        }
        (Method::PUT, ["fs", "write"]) => {
            let Some(p) = path else {
                return err(400, "INVALID_REQUEST", "path is required");
            };
            if let Some(parent) = p.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            if let Err(e) = std::fs::write(&p, &body) {
                return err(400, "WRITE_FAILED", &e.to_string());
            }
            if let Some(mode) = q(query, "mode") {
                lock(&inner.record).write_modes.push(mode.to_owned());
                // Read as a decimal number (seen live).
                let Ok(bits) = mode.parse::<u32>() else {
                    return err(400, "INVALID_REQUEST", "mode must be a number");
                };
                let _ =
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(bits & 0o7777));
            }
            json_resp(200, json!({}))
        }
        (Method::GET, ["fs", "read"]) => {
            let Some(p) = path else {
                return err(400, "INVALID_REQUEST", "path is required");
            };
            if p.is_dir() {
                return err(400, "IS_A_DIRECTORY", "path is a directory");
            }
            let Ok(bytes) = std::fs::read(&p) else {
                return not_found();
            };
            let range = headers
                .get("range")
                .and_then(|v| v.to_str().ok())
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| {
                    let start: usize = a.parse().ok()?;
                    let end: usize = if b.is_empty() {
                        bytes.len().saturating_sub(1)
                    } else {
                        b.parse::<usize>().ok()?.min(bytes.len().saturating_sub(1))
                    };
                    Some((start, end))
                });
            match range {
                Some((start, end)) if !lock(&inner.knobs).ignore_range && start <= end => {
                    let total = bytes.len();
                    (
                        StatusCode::PARTIAL_CONTENT,
                        [("content-range", format!("bytes {start}-{end}/{total}"))],
                        bytes[start..=end].to_vec(),
                    )
                        .into_response()
                }
                _ => (StatusCode::OK, bytes).into_response(),
            }
        }
        (Method::GET, ["fs", "dir"]) => {
            let Some(p) = path else {
                return err(400, "INVALID_REQUEST", "path is required");
            };
            let Ok(rd) = std::fs::read_dir(&p) else {
                return not_found();
            };
            let mut entries: Vec<Value> = rd
                .filter_map(Result::ok)
                .filter_map(|e| entry(&e.path()))
                .collect();
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            json_resp(200, json!({"entries": entries}))
        }
        (Method::GET, ["fs", "stat"]) => match path.as_deref().and_then(entry) {
            Some(v) => json_resp(200, v),
            None => not_found(),
        },
        (Method::DELETE, ["fs", "remove"]) => {
            let Some(p) = path else {
                return err(400, "INVALID_REQUEST", "path is required");
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
                Ok(()) => json_resp(200, json!({})),
                Err(e) => err(400, "DIRECTORY_NOT_EMPTY", &e.to_string()),
            }
        }
        _ => err(404, "NOT_FOUND", &format!("no route {method} {rest:?}")),
    }
}
