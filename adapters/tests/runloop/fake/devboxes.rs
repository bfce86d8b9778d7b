//! Devboxes: create (with the launch parameters' rules), read, list, the status machine,
//! suspend and resume, shutdown, the status long poll, keep-alive and tunnels.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::Response;
use serde_json::{json, Value};

use super::{error, hold, poll_timeout, statuses, Inner};
use crate::support::http::{json_resp, lock, Req};

/// Every status the spec knows.
pub const STATUSES: [&str; 10] = [
    "scheduled",
    "queued",
    "provisioning",
    "initializing",
    "running",
    "suspending",
    "suspended",
    "resuming",
    "failure",
    "shutdown",
];

/// Longest hold of a devbox status poll (`STATUS_LONG_POLL_SERVER_MAX_SECONDS`).
const STATUS_HOLD_MAX_S: u64 = 30;

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One devbox as the fake keeps it.
#[derive(Debug, Clone)]
pub struct Devbox {
    pub id: String,
    pub name: Option<String>,
    pub status: String,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub launch: Value,
    pub blueprint_id: Option<String>,
    pub blueprint_name: Option<String>,
    pub snapshot_id: Option<String>,
    pub create_time_ms: i64,
    pub end_time_ms: Option<i64>,
    pub failure_reason: Option<String>,
    pub shutdown_reason: Option<String>,
    pub tunnel: Option<Value>,
    pub home: PathBuf,
    transitions: Vec<(String, i64)>,
    /// Statuses still to come, each from its instant on.
    schedule: VecDeque<(String, Instant)>,
}

impl Devbox {
    pub fn new(
        id: String,
        home: PathBuf,
        metadata: BTreeMap<String, String>,
        create_time_ms: i64,
    ) -> Devbox {
        Devbox {
            id,
            name: None,
            status: "queued".to_owned(),
            metadata,
            env: BTreeMap::new(),
            launch: json!({}),
            blueprint_id: None,
            blueprint_name: None,
            snapshot_id: None,
            create_time_ms,
            end_time_ms: None,
            failure_reason: None,
            shutdown_reason: None,
            tunnel: None,
            home,
            transitions: vec![("queued".to_owned(), create_time_ms)],
            schedule: VecDeque::new(),
        }
    }

    fn enter(&mut self, status: &str) {
        self.status = status.to_owned();
        self.transitions.push((status.to_owned(), now_ms()));
        if matches!(status, "shutdown" | "failure") {
            self.end_time_ms = Some(now_ms());
        }
    }

    /// Applies the scheduled statuses whose time has come.
    pub fn settle(&mut self) {
        while let Some((status, at)) = self.schedule.front().cloned() {
            if at > Instant::now() {
                break;
            }
            self.schedule.pop_front();
            self.enter(&status);
        }
    }

    /// Moves through `steps`, each after `step` from the last.
    fn plan(&mut self, steps: &[&str], step: Duration) {
        self.schedule.clear();
        let mut at = Instant::now();
        for s in steps {
            at += step;
            self.schedule.push_back(((*s).to_owned(), at));
        }
    }

    /// Sets the status now, dropping anything planned.
    pub fn force(&mut self, status: &str) {
        self.schedule.clear();
        self.enter(status);
        if status == "shutdown" {
            self.shutdown_reason = Some("api_shutdown".to_owned());
        }
    }

    pub fn json(&self) -> Value {
        let transitions: Vec<Value> = self
            .transitions
            .iter()
            .map(|(s, t)| json!({"status": s, "transition_time_ms": t}))
            .collect();
        json!({
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "metadata": self.metadata,
            "capabilities": [],
            "create_time_ms": self.create_time_ms,
            "end_time_ms": self.end_time_ms,
            "launch_parameters": self.launch,
            "state_transitions": transitions,
            "blueprint_id": self.blueprint_id,
            "snapshot_id": self.snapshot_id,
            "failure_reason": self.failure_reason,
            "shutdown_reason": self.shutdown_reason,
            "initiator_type": "api",
            "tunnel": self.tunnel,
        })
    }
}

/// Applies `f` to devbox `id`, settled to now; 404 when there is none.
pub(super) fn with<T>(
    inner: &Inner,
    id: &str,
    f: impl FnOnce(&mut Devbox) -> T,
) -> Result<T, Response> {
    let mut all = lock(&inner.devboxes);
    match all.get_mut(id) {
        Some(d) => {
            d.settle();
            Ok(f(d))
        }
        None => Err(error(404, &format!("devbox {id} not found"))),
    }
}

/// The devbox's home, when it is `running` (what exec and files need); 400 otherwise.
pub(super) fn running_home(inner: &Inner, id: &str) -> Result<PathBuf, Response> {
    with(inner, id, |d| {
        if d.status == "running" {
            Ok(d.home.clone())
        } else {
            Err(error(
                400,
                &format!("devbox {} is not running (status: {})", d.id, d.status),
            ))
        }
    })?
}

fn string_map(v: Option<&Value>, field: &str) -> Result<BTreeMap<String, String>, Response> {
    match v {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v.as_str() {
                Some(s) => Ok((k.clone(), s.to_owned())),
                None => Err(error(400, &format!("{field}.{k}: must be a string"))),
            })
            .collect(),
        Some(_) => Err(error(400, &format!("{field}: must be an object"))),
    }
}

/// The launch parameters' rules (see the module docs of `fake`).
fn check_launch(lp: &Value) -> Result<(), String> {
    let int = |k: &str| lp.get(k).and_then(Value::as_i64);
    let size = lp.get("resource_size_request").and_then(Value::as_str);
    let custom = ["custom_cpu_cores", "custom_gb_memory", "custom_disk_size"];
    if let Some(s) = size {
        let known = [
            "X_SMALL",
            "SMALL",
            "MEDIUM",
            "LARGE",
            "X_LARGE",
            "XX_LARGE",
            "CUSTOM_SIZE",
        ];
        if !known.contains(&s) {
            return Err(format!("resource_size_request: unknown size `{s}`"));
        }
    }
    if size != Some("CUSTOM_SIZE") {
        if let Some(k) = custom
            .iter()
            .find(|k| lp.get(**k).is_some_and(|v| !v.is_null()))
        {
            return Err(format!("{k} requires resource_size_request CUSTOM_SIZE"));
        }
    } else {
        let (Some(cpu), Some(mem)) = (int("custom_cpu_cores"), int("custom_gb_memory")) else {
            return Err("CUSTOM_SIZE requires custom_cpu_cores and custom_gb_memory".to_owned());
        };
        if !(cpu == 1 || (cpu % 2 == 0 && (2..=16).contains(&cpu))) {
            return Err("custom_cpu_cores: must be 0.5, 1, or a multiple of 2, max 16".to_owned());
        }
        if !(mem == 1 || (mem % 2 == 0 && (2..=64).contains(&mem))) {
            return Err("custom_gb_memory: must be 1 or a multiple of 2, max 64".to_owned());
        }
        if mem < 2 * cpu || mem > 8 * cpu {
            return Err("the cpu:memory ratio must be between 1:2 and 1:8 inclusive".to_owned());
        }
        if let Some(disk) = int("custom_disk_size") {
            if disk % 2 != 0 || !(2..=64).contains(&disk) {
                return Err(
                    "custom_disk_size: must be a multiple of 2, min 2GiB, max 64GiB".to_owned(),
                );
            }
        }
    }
    if let Some(k) = int("keep_alive_time_seconds") {
        if !(1..=172_800).contains(&k) {
            return Err("keep_alive_time_seconds: maximum is 48 hours (172800 seconds)".to_owned());
        }
    }
    Ok(())
}

/// `POST /v1/devboxes`.
pub(super) fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let body = r.json();
    if !body.is_object() {
        return error(400, "the body must be a JSON object");
    }
    inner.record().create_bodies.push(body.clone());
    let sources = ["snapshot_id", "blueprint_id", "blueprint_name"];
    let given: Vec<&str> = sources
        .iter()
        .copied()
        .filter(|k| body.get(*k).is_some_and(|v| !v.is_null()))
        .collect();
    if given.len() > 1 {
        return error(
            400,
            "Only one of (Snapshot ID, Blueprint ID, Blueprint name) should be specified",
        );
    }
    let metadata = match string_map(body.get("metadata"), "metadata") {
        Ok(m) => m,
        Err(e) => return e,
    };
    let env = match string_map(body.get("environment_variables"), "environment_variables") {
        Ok(m) => m,
        Err(e) => return e,
    };
    let launch = body.get("launch_parameters").cloned().unwrap_or(json!({}));
    if let Err(why) = check_launch(&launch) {
        return error(400, &format!("launch_parameters.{why}"));
    }
    let snapshot_id = body
        .get("snapshot_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(s) = &snapshot_id {
        let ok = lock(&inner.snapshots)
            .get(s)
            .is_some_and(|s| s.state() == "complete");
        if !ok {
            return error(400, &format!("snapshot {s} not found or not complete"));
        }
    }
    let (step, failure, max) = {
        let k = inner.knobs();
        (
            Duration::from_millis(k.step_ms),
            k.boot_failure.clone(),
            k.max_devboxes,
        )
    };
    let mut all = lock(&inner.devboxes);
    if let Some(max) = max {
        for d in all.values_mut() {
            d.settle();
        }
        let live = all
            .values()
            .filter(|d| !matches!(d.status.as_str(), "shutdown" | "failure"))
            .count();
        if live >= max {
            return error(429, &format!("maximum of {max} running devboxes reached"));
        }
    }
    let id = inner.next_id("dbx");
    let home = inner.root.path().join(&id);
    if let Err(e) = std::fs::create_dir_all(&home) {
        return error(500, &format!("home: {e}"));
    }
    let mut d = Devbox::new(id.clone(), home, metadata, now_ms());
    d.name = body.get("name").and_then(Value::as_str).map(str::to_owned);
    d.env = env;
    d.launch = launch;
    d.snapshot_id = snapshot_id;
    d.blueprint_id = body
        .get("blueprint_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    d.blueprint_name = body
        .get("blueprint_name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match failure {
        Some(reason) => {
            d.plan(&["provisioning", "failure"], step);
            d.failure_reason = Some(reason);
        }
        None => d.plan(&["provisioning", "initializing", "running"], step),
    }
    let answer = d.json();
    all.insert(id, d);
    json_resp(200, answer)
}

/// `GET /v1/devboxes/{id}`.
pub(super) fn get(inner: &Inner, id: &str) -> Response {
    match with(inner, id, |d| d.json()) {
        Ok(v) => json_resp(200, v),
        Err(e) => e,
    }
}

/// `GET /v1/devboxes`.
pub(super) fn list(inner: &Inner, r: &Req) -> Response {
    let limit: usize = match r.q("limit").map(str::parse) {
        None => 20,
        Some(Ok(n)) if (1..=5000).contains(&n) => n,
        Some(_) => return error(400, "limit: must be between 1 and 5000"),
    };
    let status = r.q("status");
    if let Some(s) = status {
        if !STATUSES.contains(&s) {
            return error(400, &format!("status: unknown status `{s}`"));
        }
    }
    let cap = inner.knobs().page_cap;
    let mut all = lock(&inner.devboxes);
    for d in all.values_mut() {
        d.settle();
    }
    let mut matching: Vec<&Devbox> = all
        .values()
        .filter(|d| status.is_none_or(|s| d.status == s))
        .collect();
    // Newest first; the sequence in the id breaks ties of the same millisecond.
    matching.sort_by(|a, b| (b.create_time_ms, &b.id).cmp(&(a.create_time_ms, &a.id)));
    let start = match r.q("starting_after") {
        None => 0,
        Some(after) => match matching.iter().position(|d| d.id == after) {
            Some(i) => i + 1,
            None => return error(400, &format!("starting_after: unknown devbox {after}")),
        },
    };
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit.min(cap))
        .map(|d| d.json())
        .collect();
    let has_more = start + page.len() < matching.len();
    let mut answer = json!({"devboxes": page, "has_more": has_more});
    if r.q("include_total_count") != Some("false") {
        answer["total_count"] = json!(matching.len());
    }
    json_resp(200, answer)
}

/// `POST /v1/devboxes/{id}/wait_for_status`: held until the devbox is in one of `statuses`.
pub(super) async fn wait_for_status(inner: &Arc<Inner>, id: &str, r: &Req) -> Response {
    let body = r.json();
    let want = match statuses(&body, &STATUSES) {
        Ok(w) => w,
        Err(e) => return e,
    };
    let deadline = Instant::now() + hold(&body, STATUS_HOLD_MAX_S);
    loop {
        match with(inner, id, |d| want.contains(&d.status).then(|| d.json())) {
            Err(e) => return e,
            Ok(Some(v)) => return json_resp(200, v),
            Ok(None) if Instant::now() >= deadline => return poll_timeout(),
            Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// `POST /v1/devboxes/{id}/shutdown[?force=true]`.
pub(super) fn shutdown(inner: &Inner, id: &str, r: &Req) -> Response {
    let force = r.q("force") == Some("true");
    let busy = lock(&inner.snapshots)
        .values()
        .any(|s| s.source_devbox_id == id && s.state() == "in_progress");
    let out = with(inner, id, |d| {
        if d.status == "shutdown" {
            return Err(error(400, &format!("devbox {id} is already shut down")));
        }
        if busy && !force {
            return Err(error(
                409,
                &format!("devbox {id} has snapshots in progress; use force=true"),
            ));
        }
        d.force("shutdown");
        Ok(d.json())
    });
    match out {
        Ok(Ok(v)) => {
            inner.kill_all_of(id);
            json_resp(200, v)
        }
        Ok(Err(e)) | Err(e) => e,
    }
}

/// A move allowed from one status only: `from`, through `during`, to `to`.
struct Move {
    verb: &'static str,
    from: &'static str,
    during: &'static str,
    to: &'static str,
}

fn change(inner: &Inner, id: &str, m: &Move) -> Result<Value, Response> {
    let step = Duration::from_millis(inner.knobs().step_ms);
    with(inner, id, |d| {
        if d.status != m.from {
            return Err(error(
                400,
                &format!("devbox {id} cannot be {} from status {}", m.verb, d.status),
            ));
        }
        d.enter(m.during);
        d.plan(&[m.to], step);
        Ok(d.json())
    })?
}

/// `POST /v1/devboxes/{id}/suspend`: only from `running`.
pub(super) fn suspend(inner: &Inner, id: &str) -> Response {
    let m = Move {
        verb: "suspended",
        from: "running",
        during: "suspending",
        to: "suspended",
    };
    match change(inner, id, &m) {
        Ok(v) => {
            // Suspension keeps the disk, not the processes.
            inner.kill_all_of(id);
            json_resp(200, v)
        }
        Err(e) => e,
    }
}

/// `POST /v1/devboxes/{id}/resume`: only from `suspended`.
pub(super) fn resume(inner: &Inner, id: &str) -> Response {
    let m = Move {
        verb: "resumed",
        from: "suspended",
        during: "resuming",
        to: "running",
    };
    match change(inner, id, &m) {
        Ok(v) => json_resp(200, v),
        Err(e) => e,
    }
}

/// `POST /v1/devboxes/{id}/keep_alive`.
pub(super) fn keep_alive(inner: &Inner, id: &str) -> Response {
    match running_home(inner, id) {
        Ok(_) => {
            inner.record().keep_alives += 1;
            json_resp(200, json!({}))
        }
        Err(e) => e,
    }
}

/// `POST /v1/devboxes/{id}/enable_tunnel {auth_mode}`.
pub(super) fn enable_tunnel(inner: &Inner, id: &str, r: &Req) -> Response {
    let body = r.json();
    let mode = body
        .get("auth_mode")
        .and_then(Value::as_str)
        .unwrap_or("open")
        .to_owned();
    if !matches!(mode.as_str(), "open" | "authenticated") {
        return error(400, "auth_mode: must be open or authenticated");
    }
    let key = inner.next_id("tun").replace('_', "");
    let out = with(inner, id, |d| {
        if matches!(d.status.as_str(), "shutdown" | "failure") {
            return Err(error(400, &format!("devbox {id} is {}", d.status)));
        }
        if d.tunnel.is_some() {
            return Err(error(400, &format!("devbox {id} already has a tunnel")));
        }
        let mut t = json!({
            "auth_mode": mode,
            "create_time_ms": now_ms(),
            "http_keep_alive": body.get("http_keep_alive").and_then(Value::as_bool).unwrap_or(true),
            "wake_on_http": body.get("wake_on_http").and_then(Value::as_bool).unwrap_or(false),
            "tunnel_key": key,
        });
        if mode == "authenticated" {
            t["auth_token"] = json!(format!("tok-{key}"));
        }
        d.tunnel = Some(t.clone());
        Ok(t)
    });
    match out {
        Ok(Ok(v)) => json_resp(200, v),
        Ok(Err(e)) | Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_rules_follow_the_spec() {
        let ok = |v: Value| check_launch(&v).is_ok();
        assert!(ok(json!({"resource_size_request": "SMALL"})));
        assert!(ok(json!({"resource_size_request": "CUSTOM_SIZE",
            "custom_cpu_cores": 2, "custom_gb_memory": 4, "custom_disk_size": 10})));
        assert!(!ok(json!({"resource_size_request": "CUSTOM_SIZE",
            "custom_cpu_cores": 3, "custom_gb_memory": 8})));
        assert!(!ok(json!({"resource_size_request": "CUSTOM_SIZE",
            "custom_cpu_cores": 2, "custom_gb_memory": 32})));
        assert!(!ok(json!({"custom_cpu_cores": 2})));
        assert!(!ok(json!({"keep_alive_time_seconds": 172_801})));
    }
}
