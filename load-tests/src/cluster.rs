//! A three-process control plane started the way the end-to-end tests start theirs
//! (`cli/tests/e2e/harness.rs`): a fresh migrated Postgres database (`TestDb`), a private
//! nats-server ≥ 2.10, a TOML config with one `fake` pool (capabilities `exec`,
//! `exec.stream`) whose ledger is a shared JSON-lines file, and `differently server --role api|scheduler|worker` as separate OS processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use differently_bus::testing::{find_nats_server, NatsServer};
use differently_store::testing::{TestDb, DEFAULT_TEST_DATABASE_URL};
use sqlx::Connection;
use tempfile::TempDir;

use crate::LoadError;

/// Names of the processes, in start order.
pub const ROLES: [&str; 3] = ["api", "scheduler", "worker"];

/// The second API process (`Cluster::leader_url`).
pub const LEADER_API: &str = "api-leader";

/// What the `fake` pool advertises (`[pools.settings] capabilities`). `exec.stream` makes
/// `POST …/exec/stream` servable, so P4s can be measured; it also means collected exec goes
/// through the adapter's streaming call, as it does for any pool that can stream. Every
/// binary's fake accepts the key; one whose fake cannot stream answers the route with 501,
/// which the report shows as "not measurable".
pub const FAKE_CAPABILITIES: &[&str] = &["exec", "exec.stream"];

/// A TOML array of basic strings.
fn toml_strings(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// What the cluster is configured with.
#[derive(Debug, Clone)]
pub struct ClusterOpts {
    /// The `differently` binary.
    pub binary: PathBuf,
    /// Fake backend create/delete latency.
    pub latency_ms: u64,
    /// `quota.max_active` for every organization.
    pub max_active: u32,
    /// `database_max_connections` per process.
    pub database_max_connections: u32,
    /// `DIFFERENTLY_LOG`.
    pub log_level: String,
    /// Capabilities the `fake` pool advertises on top of [`FAKE_CAPABILITIES`] (e.g. `warm`).
    pub extra_capabilities: Vec<String>,
    /// Lines put into the `fake` pool's `[[pools]]` table (e.g. its `warm = [...]` classes).
    pub pool_lines: String,
    /// A command each control-plane process runs under (`valgrind --tool=callgrind …`, see
    /// `instructions`); empty: none.
    pub wrapper: Vec<String>,
}

/// Checks Postgres and a nats-server ≥ 2.10 are at hand, with instructions when not, so a
/// run fails with a message instead of a panic deep inside the test-support code.
pub async fn preflight() -> Result<(), LoadError> {
    let url = std::env::var("DIFFERENTLY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| DEFAULT_TEST_DATABASE_URL.to_owned());
    match sqlx::PgConnection::connect(&url).await {
        Ok(c) => {
            let _ = c.close().await;
        }
        Err(e) => {
            return Err(LoadError::Preflight(format!(
                "Postgres is not reachable at {url} ({e}): start it with `pg_ctlcluster \
                 --skip-systemctl-redirect $(ls /etc/postgresql) main start` or set \
                 DIFFERENTLY_TEST_DATABASE_URL"
            )))
        }
    }
    find_nats_server().map_err(LoadError::Preflight)?;
    Ok(())
}

/// A started process, killed on drop.
struct Proc {
    name: String,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The running control plane. Dropping it kills the processes, then the nats-server, then
/// drops the database.
pub struct Cluster {
    // Field order is drop order: processes before the services they use.
    procs: Vec<Proc>,
    /// The private nats-server.
    pub nats: NatsServer,
    /// nats-server's monitoring port on 127.0.0.1 (`/varz`).
    pub nats_monitor_port: u16,
    /// The test database (dropped last).
    pub db: TestDb,
    /// Holds config, logs and the ledger.
    pub dir: TempDir,
    /// The fake backend's JSON-lines ledger.
    pub ledger: PathBuf,
    /// The bootstrap admin key.
    pub key: String,
    /// One audit key for every process, as production roles require.
    audit_key: String,
    /// API port on 127.0.0.1.
    pub port: u16,
    /// Port of the `LEADER_API` process.
    pub leader_port: u16,
    /// The options it was started with.
    pub opts: ClusterOpts,
    /// Which config spelling the binary understands.
    pub dialect: Dialect,
}

/// The config file's spelling of quotas and limits, which changed while tenancy landed:
/// `quota.max_active` (legacy) became `quota.maxActive`, and `[api]` rate limits appeared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `[quota] maxActive`, `[api] key_requests_per_second`.
    Current,
    /// `[quota] max_active`, no `[api]` section.
    Legacy,
}

impl Dialect {
    /// The quota section (and, when the binary has them, per-key rate limits raised far
    /// above anything the generator sends: a load test measures capacity, not the limiter).
    pub fn quota_and_limits(self, max_active: u32) -> String {
        match self {
            Dialect::Current => format!(
                "\n[quota]\nmaxActive = {max_active}\n\n[api]\nkey_requests_per_second = 1000000.0\nkey_burst = 1000000.0\n"
            ),
            Dialect::Legacy => format!("\n[quota]\nmax_active = {max_active}\n"),
        }
    }
}

/// Asks the binary which spelling it accepts: `differently migrate` parses and validates the
/// config before anything else, and the run's database is already migrated, so this is
/// harmless; an "unknown field" answer means the legacy spelling.
fn probe_dialect(binary: &Path, common: &str, dir: &Path) -> Result<Dialect, LoadError> {
    let probe = dir.join("probe.toml");
    let text = format!("{common}{}", Dialect::Current.quota_and_limits(1));
    std::fs::write(&probe, text).map_err(|e| LoadError::io("writing the probe config", e))?;
    let out = Command::new(binary)
        .args(["migrate", "--config"])
        .arg(&probe)
        .env("DIFFERENTLY_LOG", "error")
        .env_remove("DIFFERENTLY_DATABASE_URL")
        .output()
        .map_err(|e| LoadError::io("running differently migrate (config probe)", e))?;
    if out.status.success() {
        return Ok(Dialect::Current);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("unknown field") {
        Ok(Dialect::Legacy)
    } else {
        Err(LoadError::Process(format!("config probe failed: {err}")))
    }
}

/// A free TCP port on loopback (bound, then released).
pub fn free_port() -> Result<u16, LoadError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| LoadError::io("binding an ephemeral port", e))?;
    let port = l
        .local_addr()
        .map_err(|e| LoadError::io("reading an ephemeral port", e))?
        .port();
    Ok(port)
}

/// `n` random bytes from `/dev/urandom` as hex.
fn random_hex(n: usize) -> Result<String, LoadError> {
    let mut bytes = vec![0u8; n];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom")
            .map_err(|e| LoadError::io("opening /dev/urandom", e))?,
        &mut bytes,
    )
    .map_err(|e| LoadError::io("reading /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Runs `differently key generate`.
pub fn generate_key(binary: &Path) -> Result<String, LoadError> {
    let out = Command::new(binary)
        .args(["key", "generate"])
        .output()
        .map_err(|e| LoadError::io(format!("running {} key generate", binary.display()), e))?;
    if !out.status.success() {
        return Err(LoadError::Process(format!(
            "key generate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Cluster {
    /// Creates the database, starts nats-server, writes the config and starts the three
    /// processes; returns once `/readyz` answers 200.
    pub async fn start(opts: ClusterOpts) -> Result<Cluster, LoadError> {
        preflight().await?;
        let db = TestDb::new().await;
        // With its monitoring endpoint, whose `/varz` counts the messages of a phase.
        let nats_monitor_port = free_port()?;
        let nats = NatsServer::start_with_args(&["-m", &nats_monitor_port.to_string()]);
        let dir = tempfile::Builder::new()
            .prefix("differently-load-")
            .tempdir()
            .map_err(|e| LoadError::io("creating a temporary directory", e))?;
        let ledger = dir.path().join("ledger.jsonl");
        let port = free_port()?;
        let config = dir.path().join("differently.toml");
        let common = format!(
            r#"database_url = "{db}"
nats_url = "{nats}"
listen = "127.0.0.1:{port}"
database_max_connections = {conns}
"#,
            db = db.url(),
            nats = nats.url(),
            conns = opts.database_max_connections,
        );
        let pools = format!(
            r#"
[[pools]]
name = "fake"
kind = "fake"
{pool_lines}

[pools.settings]
latencyMs = {lat}
ledger = "{ledger}"
capabilities = {caps}
"#,
            lat = opts.latency_ms,
            ledger = ledger.display(),
            caps = toml_strings(
                &FAKE_CAPABILITIES
                    .iter()
                    .copied()
                    .chain(opts.extra_capabilities.iter().map(String::as_str))
                    .collect::<Vec<_>>()
            ),
            pool_lines = opts.pool_lines,
        );
        let dialect = probe_dialect(&opts.binary, &common, dir.path())?;
        let text = format!(
            "{common}{}{pools}",
            dialect.quota_and_limits(opts.max_active)
        );
        std::fs::write(&config, text).map_err(|e| LoadError::io("writing the config", e))?;
        let key = generate_key(&opts.binary)?;
        let audit_key = random_hex(32)?;
        let mut cluster = Cluster {
            procs: Vec::new(),
            nats,
            nats_monitor_port,
            db,
            dir,
            ledger,
            key,
            audit_key,
            port,
            leader_port: 0,
            opts,
            dialect,
        };
        for role in ROLES {
            cluster.spawn(role, &config)?;
        }
        // A second API that places nothing itself, for the leader backlog burst (P2): the
        // default API places a create in its admission when its org has nothing queued, so a
        // stopped leader would not build up a backlog through it. (A binary that predates
        // the setting ignores the variable; its one API path is the leader's anyway.)
        cluster.leader_port = free_port()?;
        cluster.spawn_as(
            LEADER_API,
            "api",
            &config,
            &[
                ("DIFFERENTLY_DIRECT_PLACEMENT", "false"),
                (
                    "DIFFERENTLY_LISTEN",
                    &format!("127.0.0.1:{}", cluster.leader_port),
                ),
            ],
        )?;
        // Under a wrapper (callgrind: 30–50× slower) start-up takes minutes, not seconds.
        let ready_within = if cluster.opts.wrapper.is_empty() {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(300)
        };
        cluster.wait_ready(ready_within).await?;
        Ok(cluster)
    }

    fn spawn(&mut self, role: &str, config: &Path) -> Result<(), LoadError> {
        self.spawn_as(role, role, config, &[])
    }

    /// Spawns `server --role <role>` as the process `name` (its log is `<name>.log`), with
    /// `env` on top.
    fn spawn_as(
        &mut self,
        name: &str,
        role: &str,
        config: &Path,
        env: &[(&str, &str)],
    ) -> Result<(), LoadError> {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).map_err(|e| LoadError::io("log file", e))?;
        let err = file.try_clone().map_err(|e| LoadError::io("log file", e))?;
        let mut command = match self.opts.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.opts.binary);
                c
            }
            None => Command::new(&self.opts.binary),
        };
        let child = command
            .args(["server", "--role", role, "--config"])
            .arg(config)
            .env("DIFFERENTLY_AUDIT_KEY", &self.audit_key)
            .envs(env.iter().copied())
            .env("DIFFERENTLY_BOOTSTRAP_KEY", &self.key)
            .env("DIFFERENTLY_LOG", &self.opts.log_level)
            .env_remove("DIFFERENTLY_DATABASE_URL")
            .env_remove("DIFFERENTLY_NATS_URL")
            .env_remove("DIFFERENTLY_FAULT_PAUSE")
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| LoadError::io(format!("spawning {name}"), e))?;
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
        });
        Ok(())
    }

    /// Base URL of the API.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Base URL of the API that leaves every placement to the leader (`LEADER_API`).
    pub fn leader_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.leader_port)
    }

    /// (name, pid) of every process.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .map(|p| (p.name.clone(), p.child.id()))
            .collect()
    }

    /// The pid of process `name`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.child.id())
    }

    /// The last `n` lines of process `name`'s log.
    pub fn log_tail(&self, name: &str, n: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Every process's log tail, for error messages.
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("--- {} ---\n{}\n", p.name, self.log_tail(&p.name, 30)))
            .collect()
    }

    /// Fails with the log tails if any process has exited.
    pub fn check_alive(&mut self) -> Result<(), LoadError> {
        let mut dead = Vec::new();
        for p in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                dead.push(format!("{} exited with {status}", p.name));
            }
        }
        if dead.is_empty() {
            Ok(())
        } else {
            Err(LoadError::Process(format!(
                "{}\n{}",
                dead.join("; "),
                self.logs()
            )))
        }
    }

    /// Sends `SIGSTOP` (`pause = true`) or `SIGCONT` to process `name`: used to hold the
    /// placement leader while a backlog is admitted, so its own rate can be measured.
    pub fn signal_pause(&self, name: &str, pause: bool) -> Result<(), LoadError> {
        let pid = self
            .pid(name)
            .ok_or_else(|| LoadError::Process(format!("no process {name}")))?;
        let sig = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map_err(|e| LoadError::io(format!("kill {sig} {pid}"), e))?;
        if status.success() {
            Ok(())
        } else {
            Err(LoadError::Process(format!("kill {sig} {pid}: {status}")))
        }
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<(), LoadError> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + within;
        loop {
            self.check_alive()?;
            let mut ready = 0;
            for url in [self.url(), self.leader_url()] {
                if let Ok(r) = http.get(format!("{url}/readyz")).send().await {
                    ready += usize::from(r.status() == 200);
                }
            }
            if ready == 2 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LoadError::Timeout(format!(
                    "api not ready after {within:?}\n{}",
                    self.logs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
