//! The mixed multi-tenant client workload of a fault run: per tenant, a few seeded clients
//! create (each with its own `Idempotency-Key`), exec and delete. Every operation is written
//! to a history (invoke, then ok / fail / info = outcome unknown), and an answer that never
//! came is retried with the *same* key until it resolves, so the checker knows exactly which
//! sandboxes were admitted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::client::Tenancy;
use crate::faults::rng::Rng;
use crate::LoadError;

/// One history line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Milliseconds since the workload started.
    pub t_ms: u64,
    /// Client task index.
    pub client: usize,
    /// Tenant index.
    pub tenant: usize,
    /// `create`, `delete`, `exec`.
    pub op: &'static str,
    /// `invoke`, `ok`, `fail`, `info` (no answer: outcome unknown).
    pub phase: &'static str,
    /// The create's idempotency key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// HTTP status, when there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// What the clients did, for the checker.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Admitted sandboxes: id → (tenant, idempotency key).
    pub accepted: BTreeMap<String, (usize, String)>,
    /// Sandboxes whose delete got 202.
    pub deleted: Vec<String>,
    /// Sandboxes whose delete got no answer even after retries (may or may not be deleted).
    pub maybe_deleted: Vec<String>,
    /// Creates whose outcome stayed unknown after every retry: (tenant, key).
    pub unresolved: Vec<(usize, String)>,
    /// The history, in order.
    pub history: Vec<Event>,
    /// Status counts per op, e.g. `create 202`.
    pub statuses: BTreeMap<String, u64>,
    /// Create latencies (ms) of 202s, per tenant.
    pub create_ms: BTreeMap<usize, Vec<f64>>,
    /// Replays of an answered create's key that returned another id (must be 0).
    pub replay_mismatches: Vec<String>,
}

/// The shared state of the clients.
#[derive(Default)]
struct Shared {
    out: Outcome,
    /// Live sandboxes per tenant (created, not yet deleted by us), with when they were.
    live: BTreeMap<usize, Vec<(String, Instant)>>,
    /// Creates waiting for an answer: (tenant, key).
    pending: Vec<(usize, String)>,
}

/// Workload knobs.
#[derive(Debug, Clone)]
pub struct WorkloadOpts {
    /// Clients per tenant.
    pub clients_per_tenant: usize,
    /// Most live sandboxes a tenant keeps (below the org's `maxActive`, so every admitted
    /// sandbox can run).
    pub live_cap: usize,
    /// Pause between a client's operations (ms, uniform).
    pub think_ms: (u64, u64),
    /// Per-request timeout: a request slower than this counts as "no answer".
    pub request_timeout: Duration,
    /// A sandbox is deleted no sooner than this after its create was answered (so a
    /// fault point's redelivery happens before the delete).
    pub min_age_before_delete: Duration,
}

impl Default for WorkloadOpts {
    fn default() -> Self {
        WorkloadOpts {
            clients_per_tenant: 2,
            live_cap: 5,
            think_ms: (40, 200),
            request_timeout: Duration::from_secs(8),
            min_age_before_delete: Duration::ZERO,
        }
    }
}

/// The answer to one request: a status, or none.
enum Answer {
    Status(u16, Value),
    None,
}

/// A loopback-only HTTP client for the workload.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client of `base`, which must be `http://127.0.0.1:…` (the suite sends nothing
    /// anywhere else).
    pub fn new(base: &str, timeout: Duration) -> Result<Client, LoadError> {
        if !base.starts_with("http://127.0.0.1:") {
            return Err(LoadError::Plan(format!(
                "the fault suite only talks to loopback, not {base}"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| LoadError::http("building the HTTP client", e))?;
        Ok(Client {
            http,
            base: base.to_owned(),
        })
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        match req.send().await {
            Ok(r) => {
                let s = r.status().as_u16();
                let v = r.json::<Value>().await.unwrap_or(Value::Null);
                Answer::Status(s, v)
            }
            Err(_) => Answer::None,
        }
    }

    async fn create(&self, key: &str, idem: &str, tenant: usize) -> Answer {
        let req = self
            .http
            .post(format!("{}/v1/sandboxes", self.base))
            .bearer_auth(key)
            .header("idempotency-key", idem)
            .json(&json!({"labels": {"fault-suite": format!("t{tenant}")}}));
        self.send(req).await
    }

    async fn delete(&self, key: &str, id: &str) -> Answer {
        let req = self
            .http
            .delete(format!("{}/v1/sandboxes/{id}", self.base))
            .bearer_auth(key);
        self.send(req).await
    }

    async fn exec(&self, key: &str, id: &str) -> Answer {
        let req = self
            .http
            .post(format!("{}/v1/sandboxes/{id}/exec", self.base))
            .bearer_auth(key)
            .json(&json!({"command": ["echo", "hi"]}));
        self.send(req).await
    }

    /// GET with `key` (admin routes, verification).
    pub async fn get(&self, key: &str, path: &str) -> Result<(u16, String), LoadError> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| LoadError::http(format!("GET {path}"), e))?;
        let s = r.status().as_u16();
        let t = r
            .text()
            .await
            .map_err(|e| LoadError::http(format!("GET {path} body"), e))?;
        Ok((s, t))
    }
}

/// The running workload.
pub struct Workload {
    shared: Arc<Mutex<Shared>>,
    tasks: tokio::task::JoinSet<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    client: Client,
    keys: Vec<String>,
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Who is recording: one client of one tenant.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    shared: &'a Mutex<Shared>,
    started: Instant,
    client: usize,
    tenant: usize,
}

impl Ctx<'_> {
    /// Appends one history line (and counts its status).
    fn rec(
        &self,
        op: &'static str,
        phase: &'static str,
        key: Option<&str>,
        id: Option<&str>,
        status: Option<u16>,
    ) {
        let mut s = lock(self.shared);
        s.out.history.push(Event {
            t_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            client: self.client,
            tenant: self.tenant,
            op,
            phase,
            key: key.map(str::to_owned),
            id: id.map(str::to_owned),
            status,
        });
        if let Some(st) = status {
            *s.out.statuses.entry(format!("{op} {st}")).or_default() += 1;
        } else if phase == "info" {
            *s.out.statuses.entry(format!("{op} no-answer")).or_default() += 1;
        }
    }
}

impl Workload {
    /// Starts the clients (seeded from `seed`).
    pub fn start(client: Client, tenancy: &Tenancy, seed: u64, opts: WorkloadOpts) -> Workload {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let started = Instant::now();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let keys: Vec<String> = tenancy.tenants.iter().map(|t| t.key.clone()).collect();
        let mut tasks = tokio::task::JoinSet::new();
        let n = keys.len() * opts.clients_per_tenant;
        for c in 0..n {
            let tenant = c % keys.len();
            let mut rng = Rng::fork(seed, 1000 + c as u64);
            let (shared, stop, client, key, opts) = (
                shared.clone(),
                stop.clone(),
                client.clone(),
                keys[tenant].clone(),
                opts.clone(),
            );
            tasks.spawn(async move {
                let mut n = 0u64;
                let cx = Ctx {
                    shared: &shared,
                    started,
                    client: c,
                    tenant,
                };
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let all: Vec<(String, Instant)> =
                        lock(&shared).live.get(&tenant).cloned().unwrap_or_default();
                    let live: Vec<String> = all.iter().map(|(id, _)| id.clone()).collect();
                    let old: Vec<String> = all
                        .iter()
                        .filter(|(_, at)| at.elapsed() >= opts.min_age_before_delete)
                        .map(|(id, _)| id.clone())
                        .collect();
                    let roll = rng.below(100);
                    if live.len() >= opts.live_cap || (roll < 25 && !old.is_empty()) {
                        let i = usize::try_from(rng.below(old.len() as u64)).unwrap_or(0);
                        if let Some(id) = old.get(i) {
                            delete_one(cx, &client, &key, id).await;
                        }
                    } else if roll < 45 && !live.is_empty() {
                        let i = usize::try_from(rng.below(live.len() as u64)).unwrap_or(0);
                        if let Some(id) = live.get(i) {
                            cx.rec("exec", "invoke", None, Some(id), None);
                            match client.exec(&key, id).await {
                                Answer::Status(s, _) => {
                                    let ph = if s == 200 { "ok" } else { "fail" };
                                    cx.rec("exec", ph, None, Some(id), Some(s));
                                }
                                Answer::None => cx.rec("exec", "info", None, Some(id), None),
                            }
                        }
                    } else {
                        n += 1;
                        let idem = format!("s{seed:x}-c{c}-{n}");
                        create_one(cx, &client, &key, &idem, &stop).await;
                    }
                    let think = rng.between(opts.think_ms.0, opts.think_ms.1);
                    tokio::time::sleep(Duration::from_millis(think)).await;
                }
            });
        }
        Workload {
            shared,
            tasks,
            stop,
            client,
            keys,
        }
    }

    /// Stops the clients (each finishes its current operation, retries included, within
    /// `within`), then retries every create still without an answer with its key, and every
    /// delete without one, until each resolves or `within` runs out. Returns the outcome.
    pub async fn finish(mut self, within: Duration) -> Outcome {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let deadline = Instant::now() + within;
        while !self.tasks.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.tasks.join_next()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        // Whatever is still pending (aborted mid-retry): resolve with the same key.
        let pending: Vec<(usize, String)> = std::mem::take(&mut lock(&self.shared).pending);
        for (tenant, idem) in pending {
            let key = self.keys[tenant].clone();
            let mut resolved = false;
            while Instant::now() < deadline {
                match self.client.create(&key, &idem, tenant).await {
                    Answer::Status(202, v) => {
                        if let Some(id) = v["id"].as_str() {
                            let mut s = lock(&self.shared);
                            s.out.accepted.insert(id.to_owned(), (tenant, idem.clone()));
                            s.live
                                .entry(tenant)
                                .or_default()
                                .push((id.to_owned(), Instant::now()));
                        }
                        resolved = true;
                        break;
                    }
                    Answer::Status(s, _) if s < 500 && s != 429 => {
                        resolved = true;
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            if !resolved {
                lock(&self.shared).out.unresolved.push((tenant, idem));
            }
        }
        // Every delete that got no answer: ask again (a 202 or 404 settles it; anything else
        // leaves it "maybe deleted").
        let maybe: Vec<String> = std::mem::take(&mut lock(&self.shared).out.maybe_deleted);
        let tenant_of: BTreeMap<String, usize> = lock(&self.shared)
            .out
            .accepted
            .iter()
            .map(|(id, (t, _))| (id.clone(), *t))
            .collect();
        for id in maybe {
            let Some(t) = tenant_of.get(&id) else {
                continue;
            };
            let mut settled = false;
            while Instant::now() < deadline {
                match self.client.delete(&self.keys[*t], &id).await {
                    Answer::Status(202, _) => {
                        lock(&self.shared).out.deleted.push(id.clone());
                        settled = true;
                        break;
                    }
                    // Refused now (e.g. it is already terminating or gone): the first,
                    // unanswered delete may well have taken effect, so either end is right.
                    Answer::Status(s, _) if s < 500 && s != 429 => break,
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            if !settled {
                lock(&self.shared).out.maybe_deleted.push(id);
            }
        }
        // Replay a few answered creates' keys: each must return the same sandbox.
        let sample: Vec<(String, usize, String)> = lock(&self.shared)
            .out
            .accepted
            .iter()
            .take(10)
            .map(|(id, (t, k))| (id.clone(), *t, k.clone()))
            .collect();
        for (id, t, idem) in sample {
            if let Answer::Status(s, v) = self.client.create(&self.keys[t], &idem, t).await {
                if s != 202 || v["id"].as_str() != Some(id.as_str()) {
                    lock(&self.shared)
                        .out
                        .replay_mismatches
                        .push(format!("key {idem}: HTTP {s}, id {} (first {id})", v["id"]));
                }
            }
        }
        let mut s = lock(&self.shared);
        std::mem::take(&mut s.out)
    }
}

async fn create_one(
    cx: Ctx<'_>,
    client: &Client,
    key: &str,
    idem: &str,
    stop: &std::sync::atomic::AtomicBool,
) {
    let (shared, tenant) = (cx.shared, cx.tenant);
    lock(shared).pending.push((tenant, idem.to_owned()));
    let mut backoff = 200u64;
    loop {
        cx.rec("create", "invoke", Some(idem), None, None);
        let t = Instant::now();
        match client.create(key, idem, tenant).await {
            Answer::Status(202, v) => {
                let id = v["id"].as_str().unwrap_or_default().to_owned();
                cx.rec("create", "ok", Some(idem), Some(&id), Some(202));
                let mut s = lock(shared);
                s.pending.retain(|(_, k)| k != idem);
                if !id.is_empty() {
                    s.out.accepted.insert(id.clone(), (tenant, idem.to_owned()));
                    s.out
                        .create_ms
                        .entry(tenant)
                        .or_default()
                        .push(t.elapsed().as_secs_f64() * 1e3);
                    s.live.entry(tenant).or_default().push((id, Instant::now()));
                }
                return;
            }
            Answer::Status(st, _) if st < 500 => {
                // Refused (quota, rate limit, validation): definitely not admitted.
                cx.rec("create", "fail", Some(idem), None, Some(st));
                lock(shared).pending.retain(|(_, k)| k != idem);
                return;
            }
            Answer::Status(st, _) => {
                cx.rec("create", "info", Some(idem), None, Some(st));
            }
            Answer::None => {
                cx.rec("create", "info", Some(idem), None, None);
            }
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return; // left pending: `finish` resolves it
        }
        tokio::time::sleep(Duration::from_millis(backoff)).await;
        backoff = (backoff * 2).min(2000);
    }
}

async fn delete_one(cx: Ctx<'_>, client: &Client, key: &str, id: &str) {
    let (shared, tenant) = (cx.shared, cx.tenant);
    lock(shared)
        .live
        .entry(tenant)
        .or_default()
        .retain(|(x, _)| x != id);
    cx.rec("delete", "invoke", None, Some(id), None);
    match client.delete(key, id).await {
        Answer::Status(202, _) => {
            cx.rec("delete", "ok", None, Some(id), Some(202));
            lock(shared).out.deleted.push(id.to_owned());
        }
        Answer::Status(st, _) if st < 500 => {
            cx.rec("delete", "fail", None, Some(id), Some(st));
            lock(shared).out.maybe_deleted.push(id.to_owned());
        }
        Answer::Status(st, _) => {
            cx.rec("delete", "info", None, Some(id), Some(st));
            lock(shared).out.maybe_deleted.push(id.to_owned());
        }
        Answer::None => {
            cx.rec("delete", "info", None, Some(id), None);
            lock(shared).out.maybe_deleted.push(id.to_owned());
        }
    }
}
