//! Starts clusters of `differently` processes and talks to them over HTTP.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use differently_adapters::fake::{read_ledger, LedgerEntry};
use differently_bus::testing::{NatsCluster, NatsServer};
use differently_core::{SandboxId, SandboxStatus};
use differently_store::testing::TestDb;
use serde_json::{json, Value};
use tempfile::TempDir;

/// The built binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_differently")
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Knobs of a test cluster.
#[derive(Clone)]
pub struct Opts {
    pub latency_ms: u64,
    pub ack_wait_seconds: u64,
    pub pool_max_concurrent: Option<u32>,
    /// Put at the top of the config file (before any table).
    pub extra_toml: String,
    /// Appended after the default `fake` pool: more `[[pools]]` tables (`{ledger}` is
    /// replaced by the shared ledger path).
    pub more_pools: String,
    /// More lines of the `[scheduler]` table.
    pub scheduler_toml: String,
    /// Run on a 3-node NATS cluster with R3 streams; every process is given the first
    /// member's URL only (it learns the others from it), the worst case when that node dies.
    pub nats_cluster: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            latency_ms: 0,
            ack_wait_seconds: 2,
            pool_max_concurrent: None,
            extra_toml: String::new(),
            more_pools: String::new(),
            scheduler_toml: String::new(),
            nats_cluster: false,
        }
    }
}

/// A running process of the binary, killed with SIGKILL on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Postgres database, nats-server, config, and the processes started on them.
pub struct Cluster {
    pub db: TestDb,
    /// Kept alive for the cluster's lifetime.
    pub _nats: NatsServer,
    /// The 3-node NATS cluster the processes use instead, with [`Opts::nats_cluster`].
    pub nats_cluster: Option<NatsCluster>,
    pub dir: TempDir,
    pub ledger: PathBuf,
    pub key: String,
    /// One audit key for every process of the cluster, as production requires (a process
    /// given its own `DIFFERENTLY_AUDIT_KEY` in `spawn`'s env keeps that one).
    pub audit_key: String,
    pub port: u16,
    config: PathBuf,
    procs: HashMap<String, Proc>,
    http: reqwest::Client,
}

impl Cluster {
    /// [`Cluster::new`] with an api, a scheduler and a worker process (named after their
    /// roles) running and ready: what most tests start from.
    pub async fn started(opts: Opts) -> Cluster {
        let mut c = Cluster::new(opts).await;
        c.spawn("api", "api", &[]);
        c.spawn("scheduler", "scheduler", &[]);
        c.spawn("worker", "worker", &[]);
        c.wait_ready().await;
        c
    }

    /// A database, a nats-server and a config file; no processes yet.
    pub async fn new(opts: Opts) -> Cluster {
        let db = TestDb::new().await;
        let nats = NatsServer::start();
        let nats_cluster = opts.nats_cluster.then(|| NatsCluster::start(3));
        let (nats_url, replicas) = match &nats_cluster {
            Some(c) => (c.nodes[0].url(), 3),
            None => (nats.url(), 1),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let ledger = dir.path().join("ledger.jsonl");
        let port = free_port();
        let config = dir.path().join("differently.toml");
        let cap = opts
            .pool_max_concurrent
            .map(|c| format!("max_concurrent = {c}\n"))
            .unwrap_or_default();
        let text = format!(
            r#"database_url = "{db}"
nats_url = "{nats}"
listen = "127.0.0.1:{port}"
database_max_connections = 8
{extra}

[bus]
ack_wait_seconds = {ack}
replicas = {replicas}

[scheduler]
tick_ms = 50
repair_interval_ms = 300
provisioning_timeout_seconds = 60
terminating_retry_seconds = 5
{sched}

[[pools]]
name = "fake"
kind = "fake"
cost_per_cpu_hour = 1.0
{cap}
[pools.settings]
latencyMs = {lat}
ledger = "{ledger}"

{more}
"#,
            db = db.url(),
            nats = nats_url,
            replicas = replicas,
            ack = opts.ack_wait_seconds,
            lat = opts.latency_ms,
            ledger = ledger.display(),
            extra = opts.extra_toml,
            sched = opts.scheduler_toml,
            cap = cap,
            more = opts
                .more_pools
                .replace("{ledger}", &ledger.display().to_string()),
        );
        std::fs::write(&config, text).expect("write config");
        let out = Command::new(binary())
            .args(["key", "generate"])
            .output()
            .expect("run key generate");
        let key = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let mut random = [0u8; 32];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").expect("open /dev/urandom"),
            &mut random,
        )
        .expect("read /dev/urandom");
        let audit_key: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        Cluster {
            db,
            _nats: nats,
            nats_cluster,
            dir,
            ledger,
            key,
            audit_key,
            port,
            config,
            procs: HashMap::new(),
            http,
        }
    }

    /// Starts a process named `name` running `roles`, with extra environment.
    /// The binary with this cluster's config file and the environment its servers get, for
    /// one-shot commands (`preflight`, `migrate`) followed by `args`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .env("DIFFERENTLY_BOOTSTRAP_KEY", &self.key)
            .env("DIFFERENTLY_AUDIT_KEY", &self.audit_key)
            .env_remove("DIFFERENTLY_DATABASE_URL")
            .env_remove("DIFFERENTLY_NATS_URL");
        cmd
    }

    pub fn spawn(&mut self, name: &str, roles: &str, env: &[(&str, &str)]) {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let err = file.try_clone().expect("log file clone");
        let mut cmd = Command::new(binary());
        cmd.args(["server", "--role", roles, "--config"])
            .arg(&self.config)
            .env("DIFFERENTLY_BOOTSTRAP_KEY", &self.key)
            .env("DIFFERENTLY_AUDIT_KEY", &self.audit_key)
            .env(
                "DIFFERENTLY_LOG",
                std::env::var("E2E_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env_remove("DIFFERENTLY_DATABASE_URL")
            .env_remove("DIFFERENTLY_NATS_URL")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn differently");
        self.procs.insert(name.to_owned(), Proc { child });
    }

    /// `kill -9` the process `name`.
    pub fn kill9(&mut self, name: &str) {
        if let Some(mut p) = self.procs.remove(name) {
            p.kill9();
        }
    }

    /// The log of process `name` so far.
    pub fn log(&self, name: &str) -> String {
        let path = self.dir.path().join(format!("{name}.log"));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// How many lines of process `name`'s JSON log have fields that satisfy `pred`.
    pub fn log_count(&self, name: &str, pred: impl Fn(&Value) -> bool) -> usize {
        self.log(name)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| pred(&l["fields"]))
            .count()
    }

    /// Lines saying that process `name` took up a change of pool `pool`
    /// (`action=pool_changed`): with `healthy`, those after which it held the pool that
    /// healthy; without, those that took up a change of its record.
    pub fn pool_changes(&self, name: &str, pool: &str, healthy: Option<bool>) -> usize {
        self.log_count(name, |f| {
            f["action"] == "pool_changed"
                && f["pool"] == pool
                && match healthy {
                    Some(h) => f["healthy"] == h,
                    None => f["record_changed"] == true,
                }
        })
    }

    /// Every process's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut names: Vec<_> = self.procs.keys().cloned().collect();
        names.sort();
        names
            .iter()
            .map(|n| format!("--- {n} ---\n{}\n", tail(&self.log(n), 40)))
            .collect()
    }

    /// Fails the test if process `name` has exited.
    pub fn assert_alive(&mut self, name: &str) {
        let logs = self.logs();
        let p = self
            .procs
            .get_mut(name)
            .unwrap_or_else(|| panic!("no process {name}"));
        if let Ok(Some(status)) = p.child.try_wait() {
            panic!("process {name} exited with {status}\n{logs}");
        }
    }

    /// Base URL of the API.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until `/readyz` answers 200 and, when a worker runs, until every pool has been
    /// probed healthy (placement sends no work to a pool no worker vouched for).
    pub async fn wait_ready(&mut self) {
        self.wait_api().await;
        if !self.procs.keys().any(|n| n.starts_with("worker")) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, pools) = self
                .call(
                    &self.key.clone(),
                    reqwest::Method::GET,
                    "/v1/admin/pools",
                    None,
                )
                .await;
            let items = pools["items"].as_array().cloned().unwrap_or_default();
            if status == 200 && !items.is_empty() && items.iter().all(|p| p["healthy"] == true) {
                return;
            }
            if Instant::now() > deadline {
                panic!("pools not healthy after 30 s: {pools}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_api(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.url())).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("api not ready after 30 s\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// An authenticated request builder (bootstrap admin key).
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.req_as(&self.key, method, path)
    }

    /// A request builder authenticated with `key`.
    pub fn req_as(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.url()))
            .bearer_auth(key)
    }

    /// Sends `method path` with `key` and an optional JSON body; returns (status, body).
    pub async fn call(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self.req_as(key, method, path);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Denies the harness's `fake` pool in the global policy, so every sandbox goes to the
    /// pool the test added (the fake interprets no shell and is no real backend).
    pub async fn deny_fake_pool(&self) {
        let (s, b) = self
            .call(
                &self.key,
                reqwest::Method::PUT,
                "/v1/admin/policies/global",
                Some(json!({"deniedPools": ["fake"]})),
            )
            .await;
        assert_eq!(s, 200, "deny the fake pool: {b}");
    }

    /// Waits up to `within` for pool `pool` to report `healthy` (`GET /v1/admin/pools/{pool}`),
    /// failing with its last answer and the logs.
    pub async fn wait_pool_health(&self, pool: &str, healthy: bool, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let (_, info) = self
                .call(
                    &self.key,
                    reqwest::Method::GET,
                    &format!("/v1/admin/pools/{pool}"),
                    None,
                )
                .await;
            if info["healthy"] == healthy {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{pool} never became healthy={healthy}: {info}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST /v1/sandboxes` with `body`; returns (status, json).
    pub async fn create(&self, body: Value) -> (u16, Value) {
        let r = self
            .req(reqwest::Method::POST, "/v1/sandboxes")
            .json(&body)
            .send()
            .await
            .expect("create");
        let status = r.status().as_u16();
        (status, r.json().await.expect("json"))
    }

    /// Creates with `{}` and returns the id, asserting 202.
    pub async fn create_ok(&self) -> SandboxId {
        let (status, body) = self.create(json!({})).await;
        assert_eq!(status, 202, "{body}\n{}", self.logs());
        SandboxId::parse(body["id"].as_str().expect("id")).expect("sandbox id")
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get(&self, id: &SandboxId) -> Value {
        let r = self
            .req(reqwest::Method::GET, &format!("/v1/sandboxes/{id}"))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200);
        r.json().await.expect("json")
    }

    /// `DELETE /v1/sandboxes/{id}` with the cluster's key; (status, json).
    pub async fn delete(&self, id: &impl std::fmt::Display) -> (u16, Value) {
        self.call(
            &self.key,
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await
    }

    /// Waits (through the API's own wait route) until `id` has `status`; panics with logs if not.
    pub async fn wait_status(
        &self,
        id: &SandboxId,
        status: SandboxStatus,
        within: Duration,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .as_secs()
                .clamp(1, 30);
            let r = self
                .req(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}/wait?status={status}&timeoutSeconds={left}"),
                )
                .send()
                .await;
            if let Ok(r) = r {
                if r.status() == 200 {
                    let body: Value = r.json().await.expect("json");
                    if body["status"] == status.as_str() {
                        return body;
                    }
                    if Instant::now() > deadline {
                        panic!(
                            "{id} is {} not {status} after {within:?}\n{}",
                            body["status"],
                            self.logs()
                        );
                    }
                    continue;
                }
            }
            if Instant::now() > deadline {
                panic!("waiting for {id} failed\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The fake backend's ledger as of now.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        read_ledger(&self.ledger).expect("read ledger")
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<_> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `check` every 50 ms until it is true or `within` passes.
/// Collects `child`'s output, waiting at most `limit`; past it `stop(pid)` is called (it must
/// make the child exit) before collecting. The output, and whether the limit passed.
pub fn output_within(
    child: Child,
    limit: Duration,
    stop: impl FnOnce(u32),
) -> (std::process::Output, bool) {
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let deadline = Instant::now() + limit;
    while !waiter.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let timed_out = !waiter.is_finished();
    if timed_out {
        stop(pid);
    }
    let out = waiter
        .join()
        .expect("waiter thread")
        .expect("wait for the child");
    (out, timed_out)
}

/// Runs `cmd` with its stdout a pipe whose reader has already gone away, as behind a `| head`
/// that took what it needed, and `stdin` written to its stdin then closed (a command that
/// reads its input first cannot write before the reader is gone). Its exit code (`None`
/// when a signal ended it) and stderr; at most a minute.
pub fn run_with_stdout_closed(mut cmd: Command, stdin: &[u8]) -> (Option<i32>, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn differently");
    drop(child.stdout.take());
    if let Some(mut input) = child.stdin.take() {
        // A command that ends without reading it all is not this helper's failure.
        let _ = std::io::Write::write_all(&mut input, stdin);
    }
    let (out, timed_out) = output_within(child, Duration::from_secs(60), |pid| {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    assert!(!timed_out, "`differently` did not exit within a minute");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

/// Waits up to `within` until the API at `base` reports `pool` healthy in `/v1/admin/pools`
/// (that process's own view of the pool), asking with admin key `key`. `Err` carries the last
/// listing, for the caller's message.
pub async fn wait_pool_healthy(
    base: &str,
    key: &str,
    pool: &str,
    within: Duration,
) -> Result<(), Value> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + within;
    loop {
        let pools: Value = http
            .get(format!("{base}/v1/admin/pools"))
            .bearer_auth(key)
            .send()
            .await
            .expect("pools")
            .json()
            .await
            .expect("pools json");
        let healthy = pools["items"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p["name"] == pool && p["healthy"] == true));
        if healthy {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(pools);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
