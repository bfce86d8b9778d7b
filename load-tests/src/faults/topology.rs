//! The production topology on one machine, for the fault suite: a fresh database on the
//! machine's Postgres (or a private cluster, see `pg`), a private nats-server, and `api`,
//! two `scheduler`s and two `worker`s as separate processes, every one given the same
//! explicit `DIFFERENTLY_AUDIT_KEY` (production requires one shared key; I4 checks the chain
//! verifies with it). The fake backend's JSON-lines ledger is the ground truth.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use differently_bus::testing::{find_nats_server, NatsCluster};
use differently_store::testing::TestDb;
use sqlx::PgPool;
use tempfile::TempDir;

use differently_adapters::fake::{live_instances, read_ledger, LedgerEntry, LiveInstance};

use crate::cluster::{free_port, generate_key, preflight};
use crate::faults::backend::{self, OsBackend};
use crate::faults::pg::PrivatePg;
use crate::faults::procs::{Nats, Spawned};
use crate::LoadError;

/// Environment a role process must not inherit from the harness.
const SCRUB: &[&str] = &[
    "DIFFERENTLY_DATABASE_URL",
    "DIFFERENTLY_NATS_URL",
    "DIFFERENTLY_FAULT_PAUSE",
];

/// The run's database: a fresh one on the machine's Postgres, or a private cluster's.
pub enum RunDb {
    /// `TestDb` on the machine's Postgres (dropped after the run).
    Shared(Box<TestDb>),
    /// The `postgres` database of a private cluster the nemesis may stop (S11).
    Private {
        /// The cluster.
        pg: PrivatePg,
        /// A lazy pool on it (reconnects after a stop).
        pool: PgPool,
    },
}

impl RunDb {
    /// Its URL.
    pub fn url(&self) -> String {
        match self {
            RunDb::Shared(t) => t.url().to_owned(),
            RunDb::Private { pg, .. } => pg.url(),
        }
    }

    /// Its database name.
    pub fn name(&self) -> String {
        match self {
            RunDb::Shared(t) => t.name().to_owned(),
            RunDb::Private { .. } => "postgres".to_owned(),
        }
    }

    /// A pool on it (clones share connections).
    pub fn pool(&self) -> PgPool {
        match self {
            RunDb::Shared(t) => t.store().pool().clone(),
            RunDb::Private { pool, .. } => pool.clone(),
        }
    }

    /// The private cluster, if this run has one.
    pub fn private(&self) -> Option<&PrivatePg> {
        match self {
            RunDb::Private { pg, .. } => Some(pg),
            RunDb::Shared(_) => None,
        }
    }
}

/// How the cluster is configured.
#[derive(Debug, Clone)]
pub struct TopologyOpts {
    /// The `differently` binary.
    pub binary: PathBuf,
    /// Worker processes (`worker-0`, …).
    pub workers: usize,
    /// Scheduler processes (`scheduler-0`, …): two, so one can take over.
    pub schedulers: usize,
    /// Fake backend create/delete latency.
    pub latency_ms: u64,
    /// Extra `[pools.settings]` lines for the fake (fault knobs).
    pub fake_settings: String,
    /// `quota.maxActive` of every organization.
    pub max_active: u32,
    /// `[api]` per-key rate limit (requests/s, burst).
    pub key_rate: (f64, f64),
    /// `DIFFERENTLY_FAULT_PAUSE` per process name, at first start only.
    pub fault_pause: BTreeMap<String, String>,
    /// `DIFFERENTLY_LOG`.
    pub log_level: String,
    /// `[scheduler] provisioning_timeout_seconds`.
    pub provisioning_timeout_seconds: u64,
    /// Run on a private Postgres cluster (S11) instead of the machine's.
    pub private_pg: bool,
    /// Also an `opensandbox` pool (`os`, preferred) on the fake OpenSandbox server run in a
    /// network namespace of the suite's own (S14); this binary of it.
    pub opensandbox: Option<PathBuf>,
    /// A 3-node NATS cluster with R3 streams instead of one nats-server (S9).
    pub nats_cluster: bool,
}

impl TopologyOpts {
    /// Two schedulers, two workers, a fake with 20 ms latency.
    pub fn new(binary: PathBuf) -> TopologyOpts {
        TopologyOpts {
            binary,
            workers: 2,
            schedulers: 2,
            latency_ms: 20,
            fake_settings: String::new(),
            max_active: 8,
            key_rate: (1000.0, 2000.0),
            fault_pause: BTreeMap::new(),
            log_level: "info".to_owned(),
            provisioning_timeout_seconds: 15,
            private_pg: false,
            opensandbox: None,
            nats_cluster: false,
        }
    }
}

/// The running control plane. Drop order: role processes, the out-of-process backend,
/// nats, then the database.
pub struct Topology {
    /// Role processes by name (`api`, `scheduler-0`, `worker-1`, …).
    pub procs: BTreeMap<String, Spawned>,
    /// S14's fake OpenSandbox in its namespace, when configured.
    pub backend: Option<OsBackend>,
    /// The private nats-server (absent with [`TopologyOpts::nats_cluster`]).
    pub nats: Option<Nats>,
    /// The 3-node cluster every process uses instead (S9).
    pub nats_cluster: Option<NatsCluster>,
    /// The run's database.
    pub db: RunDb,
    /// Config, logs, ledger.
    pub dir: TempDir,
    /// The fake backend's ledger.
    pub ledger: PathBuf,
    /// The bootstrap (admin) key.
    pub key: String,
    /// The one audit key every process gets (64 hex).
    pub audit_key: String,
    /// API port.
    pub port: u16,
    /// The config file.
    pub config: PathBuf,
    /// How it was started.
    pub opts: TopologyOpts,
}

/// 32 random bytes as hex, from the OS.
pub fn random_hex32() -> Result<String, LoadError> {
    let mut b = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(|e| LoadError::io("/dev/urandom", e))?,
        &mut b,
    )
    .map_err(|e| LoadError::io("reading /dev/urandom", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Topology {
    /// Creates the database, starts nats-server and every role, waits for `/readyz`.
    pub async fn start(opts: TopologyOpts) -> Result<Topology, LoadError> {
        preflight().await?;
        let nats_bin = find_nats_server().map_err(LoadError::Preflight)?;
        let db = if opts.private_pg {
            let pg = PrivatePg::start()?;
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy(&pg.url())
                .map_err(|e| LoadError::db("a pool on the private cluster", e))?;
            RunDb::Private { pg, pool }
        } else {
            RunDb::Shared(Box::new(TestDb::new().await))
        };
        let dir = tempfile::Builder::new()
            .prefix("differently-faults-")
            .tempdir()
            .map_err(|e| LoadError::io("creating a temporary directory", e))?;
        let (nats, nats_cluster) = if opts.nats_cluster {
            (None, Some(start_cluster().await?))
        } else {
            (Some(Nats::start(&nats_bin, dir.path())?), None)
        };
        let (nats_url, replicas) = match (&nats, &nats_cluster) {
            (Some(n), _) => (n.url(), 1),
            (None, Some(c)) => (c.urls(), 3),
            (None, None) => return Err(LoadError::Plan("no nats".into())),
        };
        let ledger = dir.path().join("ledger.jsonl");
        let backend = match &opts.opensandbox {
            Some(bin) => Some(OsBackend::start(bin, dir.path()).await?),
            None => None,
        };
        // The preferred pool first; the in-process fake then costs something, so the
        // ranking prefers `os` while it is healthy.
        let (os_pool, fake_cost) = match &backend {
            Some(b) => (b.pool_toml(), "cost_per_cpu_hour = 5.0\n"),
            None => (String::new(), ""),
        };
        let port = free_port()?;
        let config = dir.path().join("differently.toml");
        let text = format!(
            r#"database_url = "{db}"
nats_url = "{nats}"
listen = "127.0.0.1:{port}"
database_max_connections = 6

[bus]
ack_wait_seconds = 3
replicas = {replicas}

[scheduler]
tick_ms = 100
repair_interval_ms = 500
provisioning_timeout_seconds = {prov}
terminating_retry_seconds = 3
reconcile_interval_seconds = 2

[quota]
maxActive = {max_active}

[api]
key_requests_per_second = {rps}
key_burst = {burst}

{os_pool}[[pools]]
name = "fake"
kind = "fake"
{fake_cost}
[pools.settings]
latencyMs = {lat}
ledger = "{ledger}"
capabilities = ["exec"]
{extra}
"#,
            db = db.url(),
            nats = nats_url,
            max_active = opts.max_active,
            rps = opts.key_rate.0,
            burst = opts.key_rate.1,
            lat = opts.latency_ms,
            ledger = ledger.display(),
            extra = opts.fake_settings,
            prov = opts.provisioning_timeout_seconds,
        );
        std::fs::write(&config, text).map_err(|e| LoadError::io("writing the config", e))?;
        let key = generate_key(&opts.binary)?;
        let audit_key = random_hex32()?;
        let mut t = Topology {
            procs: BTreeMap::new(),
            backend,
            nats,
            nats_cluster,
            db,
            dir,
            ledger,
            key,
            audit_key,
            port,
            config,
            opts,
        };
        t.spawn("api", "api")?;
        for i in 0..t.opts.schedulers {
            t.spawn(&format!("scheduler-{i}"), "scheduler")?;
        }
        for i in 0..t.opts.workers {
            t.spawn(&format!("worker-{i}"), "worker")?;
        }
        t.wait_ready(Duration::from_secs(60)).await?;
        Ok(t)
    }

    /// Starts process `name` with `role`, with its fault pause if one is configured.
    fn spawn(&mut self, name: &str, role: &str) -> Result<(), LoadError> {
        let mut env = vec![
            ("DIFFERENTLY_BOOTSTRAP_KEY".to_owned(), self.key.clone()),
            ("DIFFERENTLY_AUDIT_KEY".to_owned(), self.audit_key.clone()),
            ("DIFFERENTLY_LOG".to_owned(), self.opts.log_level.clone()),
        ];
        if let Some(b) = &self.backend {
            env.push((backend::KEY_ENV.to_owned(), b.key.clone()));
        }
        if let Some(f) = self.opts.fault_pause.get(name) {
            env.push(("DIFFERENTLY_FAULT_PAUSE".to_owned(), f.clone()));
        }
        let args = vec![
            "server".to_owned(),
            "--role".to_owned(),
            role.to_owned(),
            "--config".to_owned(),
            self.config.display().to_string(),
        ];
        let log = self.dir.path().join(format!("{name}.log"));
        let p = Spawned::start(&self.opts.binary, args, env, log, SCRUB)?;
        self.procs.insert(name.to_owned(), p);
        Ok(())
    }

    /// API base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process `name`.
    pub fn proc(&mut self, name: &str) -> Result<&mut Spawned, LoadError> {
        self.procs
            .get_mut(name)
            .ok_or_else(|| LoadError::Process(format!("no process {name}")))
    }

    /// Restarts a killed process without its fault pause (as an operator's restart would).
    pub fn restart(&mut self, name: &str) -> Result<(), LoadError> {
        let p = self.proc(name)?;
        p.kill9();
        p.env.retain(|(k, _)| k != "DIFFERENTLY_FAULT_PAUSE");
        p.launch(SCRUB)
    }

    /// Heals everything: the backend's link, `SIGCONT` every stopped process (nats
    /// included), restarts every role process that is not running, and nats if it is down.
    pub fn heal(&mut self) -> Result<Vec<String>, LoadError> {
        let mut done = Vec::new();
        if let Some(b) = self.backend.as_mut() {
            if b.net.is_cut() {
                b.net.heal()?;
                done.push("link to the OpenSandbox namespace restored".to_owned());
            }
        }
        if let Some(nats) = self.nats.as_mut() {
            if nats.proc.stopped {
                nats.proc.resume()?;
                done.push("SIGCONT nats".to_owned());
            }
            if nats.proc.child.is_none() || nats.proc.exited().is_some() {
                nats.restart()?;
                done.push("restart nats".to_owned());
            }
        }
        if let Some(c) = self.nats_cluster.as_mut() {
            for (i, node) in c.nodes.iter_mut().enumerate() {
                if node.pid().is_none() {
                    restart_node(node)?;
                    done.push(format!("restart nats node n{i}"));
                }
            }
            cluster_healthy(c, Duration::from_secs(30))?;
        }
        let names: Vec<String> = self.procs.keys().cloned().collect();
        for n in names {
            let p = self.proc(&n)?;
            if p.stopped {
                p.resume()?;
                done.push(format!("SIGCONT {n}"));
            }
            let exited = p.exited();
            if p.child.is_none() || exited.is_some() {
                self.restart(&n)?;
                done.push(format!("restart {n}"));
            }
        }
        Ok(done)
    }

    /// The one nats-server (every scenario but S9).
    pub fn nats(&mut self) -> Result<&mut Nats, LoadError> {
        self.nats
            .as_mut()
            .ok_or_else(|| LoadError::Plan("this run uses a 3-node NATS cluster".into()))
    }

    /// The scheduler currently leading, from the logs' last `leading`/`stepping down` line.
    pub fn leader(&self) -> Option<String> {
        let mut best: Option<(usize, String)> = None;
        for name in self.procs.keys().filter(|n| n.starts_with("scheduler")) {
            let log = self.log(name);
            let lead = log.rfind("scheduler: leading");
            let lost = log.rfind("stepping down").max(log.rfind("lost leadership"));
            if let Some(pos) = lead {
                if lost.is_none_or(|l| l < pos) {
                    let p = self.procs.get(name).and_then(Spawned::pid).is_some();
                    if p && best.as_ref().is_none_or(|(b, _)| pos > *b) {
                        best = Some((pos, name.clone()));
                    }
                }
            }
        }
        best.map(|(_, n)| n)
    }

    /// Every backend's ledger (the in-process fake's, then the OpenSandbox fake's, if any),
    /// with the pool each line came from.
    pub fn ledgers(&self) -> std::io::Result<Vec<(&'static str, Vec<LedgerEntry>)>> {
        let mut out = vec![("fake", read_ledger(&self.ledger)?)];
        if let Some(b) = &self.backend {
            out.push((backend::POOL, read_ledger(&b.ledger)?));
        }
        Ok(out)
    }

    /// Every ledger line of every backend: each ledger in its own file order (the order its
    /// backend applied the calls; the fake's lines are not strictly in `at` order across
    /// processes, and a sort by time reordered a create ahead of an earlier delete and
    /// inflated I3's high-water mark), merged across ledgers by time.
    pub fn ledger(&self) -> std::io::Result<Vec<LedgerEntry>> {
        let mut lists: Vec<std::collections::VecDeque<LedgerEntry>> =
            self.ledgers()?.into_iter().map(|(_, l)| l.into()).collect();
        let mut all = Vec::new();
        while let Some((_, i)) = lists
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.front().map(|e| (e.at, i)))
            .min()
        {
            match lists
                .get_mut(i)
                .and_then(std::collections::VecDeque::pop_front)
            {
                Some(e) => all.push(e),
                None => break,
            }
        }
        Ok(all)
    }

    /// The live instances of every backend, each with its pool (one sandbox may show twice
    /// if two backends hold an instance of it: an orphan).
    pub fn live_instances(&self) -> std::io::Result<Vec<(&'static str, LiveInstance)>> {
        Ok(self
            .ledgers()?
            .into_iter()
            .flat_map(|(pool, l)| live_instances(&l).into_iter().map(move |i| (pool, i)))
            .collect())
    }

    /// Process `name`'s whole log.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The last `n` lines of every log, for failure messages.
    pub fn log_tails(&self, n: usize) -> String {
        let mut out = String::new();
        for name in self.procs.keys() {
            let text = self.log(name);
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name} ---\n{}\n",
                lines[lines.len().saturating_sub(n)..].join("\n")
            ));
        }
        out
    }

    /// Waits until the API answers `/readyz` 200.
    pub async fn wait_ready(&mut self, within: Duration) -> Result<(), LoadError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| LoadError::http("client", e))?;
        let deadline = Instant::now() + within;
        loop {
            let mut dead = None;
            for (n, p) in &mut self.procs {
                if let Some(s) = p.exited() {
                    dead = Some((n.clone(), s));
                    break;
                }
            }
            if let Some((n, s)) = dead {
                return Err(LoadError::Process(format!(
                    "{n} exited with {s} during start-up\n{}",
                    self.log_tails_of(&n)
                )));
            }
            if let Ok(r) = http.get(format!("{}/readyz", self.url())).send().await {
                if r.status() == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(LoadError::Timeout(format!(
                    "api not ready after {within:?}\n{}",
                    self.log_tails(20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tails_of(&self, name: &str) -> String {
        let text = self.log(name);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Terminates every Postgres session of the run's database except the caller's
    /// (`pg_terminate_backend`); returns how many were ended.
    pub async fn terminate_db_sessions(&self) -> Result<u64, LoadError> {
        let pool = self.db.pool();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(self.db.name())
        .fetch_one(&pool)
        .await
        .map_err(|e| LoadError::db("pg_terminate_backend", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The config file path.
    pub fn config_path(&self) -> &Path {
        &self.config
    }
}

/// `dly_ldr`, the scheduler leader's session advisory lock, as `pg_locks` shows a bigint key:
/// (classid, objid) = (high 32 bits, low 32 bits), objsubid 1.
const LEADER_LOCK_PARTS: (i64, i64) = (0x0064_6c79, 0x5f6c_6472);

impl Topology {
    /// Ends only the leader's lock session (what a partition between the leader and
    /// Postgres does to it), so a standby can take the lock; returns how many ended.
    pub async fn terminate_leader_lease(&self) -> Result<u64, LoadError> {
        let pool = self.db.pool();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(l.pid) FROM pg_locks l
             JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.classid::bigint = $2 AND l.objid::bigint = $3
               AND l.objsubid = 1 AND l.granted AND a.datname = $1) t",
        )
        .bind(self.db.name())
        .bind(LEADER_LOCK_PARTS.0)
        .bind(LEADER_LOCK_PARTS.1)
        .fetch_one(&pool)
        .await
        .map_err(|e| LoadError::db("terminating the leader's lock session", e))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// The message of a panic caught from the bus's test helpers (they panic with what the
/// servers said).
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panicked".to_owned())
}

/// Starts a 3-node JetStream cluster on loopback (`bus::testing::NatsCluster`), off the
/// runtime's threads.
async fn start_cluster() -> Result<NatsCluster, LoadError> {
    tokio::task::spawn_blocking(|| std::panic::catch_unwind(|| NatsCluster::start(3)))
        .await
        .map_err(|e| LoadError::Process(format!("starting the nats cluster: {e}")))?
        .map_err(|p| {
            LoadError::Process(format!("the nats cluster did not form: {}", panic_text(p)))
        })
}

/// Starts a cluster member again on its port and store.
pub fn restart_node(node: &mut differently_bus::testing::NatsServer) -> Result<(), LoadError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.restart()))
        .map_err(|p| LoadError::Process(format!("nats node restart: {}", panic_text(p))))
}

/// Waits until every running member reports JetStream healthy.
pub fn cluster_healthy(c: &NatsCluster, within: Duration) -> Result<(), LoadError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.wait_healthy(within)))
        .map_err(|p| LoadError::Process(format!("nats cluster: {}", panic_text(p))))
}
