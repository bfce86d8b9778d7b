//! What one NATS node's fault costs Differently on a 3-node JetStream cluster with R3
//! streams (issue #27). For each fault a fresh production topology (api, two schedulers, a
//! worker, each its own process, all connected to node n0, on a fresh database) takes a
//! bounded stream of creates; before the fault strikes, a few seconds in, step-down requests
//! lay the leaders out so that each fault has a known cost: the work stream `DLY_WORK` and
//! its consumer on n1 (or on n0 for the `-leading` faults), everything else on n2.
//!
//! - `none`: the baseline of this run;
//! - `kill-leader`: `kill -9` n1, leader of the work stream and its consumer (NATS's raft
//!   election, the processes stay connected);
//! - `kill-leader-of-all`: `kill -9` n1 while it leads every stream and both durable consumers
//!   (admissions and events elect too);
//! - `kill-used`, `stop-used`: `kill -9` or `SIGSTOP` n0, the node every process is connected
//!   to, leading nothing (the clients' failover alone);
//! - `kill-used-leading`, `stop-used-leading`: the same while n0 leads the work stream and its
//!   consumer (both at once).
//!
//! A stopped node gets `SIGCONT` once the run's creates are all running.
//! `--scan-every-ms 0` turns the workers' store scan off, to see what the bus alone costs.
//! Per fault: create latency p50/p99/max and create → running p50/max (a create's start to
//! its `/wait?status=running` answer), and each as a ratio to the baseline. Loopback only:
//! every address it would talk to is checked, and anything else is refused.
//!
//! `cargo run --release -p differently-load-tests --bin cluster_failover -- [--rate 10]
//! [--seconds 12] [--fault-at 3]`

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use differently_bus::testing::NatsCluster;
use differently_load_tests::cluster::{free_port, generate_key, preflight};
use differently_load_tests::faults::procs::{signal, Spawned};
use differently_load_tests::faults::topology::random_hex32;
use differently_load_tests::stats::percentile;
use differently_load_tests::LoadError;
use differently_store::testing::TestDb;
use serde_json::Value;
use tokio::sync::Mutex;

/// Failover cost of single NATS node faults (see the module docs).
#[derive(Parser)]
#[command(name = "cluster_failover")]
struct Args {
    /// Creates per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Seconds of creates per fault.
    #[arg(long, default_value_t = 12)]
    seconds: u64,
    /// Seconds into the creates when the fault strikes.
    #[arg(long, default_value_t = 3)]
    fault_at: u64,
    /// Faults to run, comma-separated (`none` always runs first: it is the baseline).
    #[arg(
        long,
        default_value = "kill-leader,kill-leader-of-all,kill-used,stop-used,kill-used-leading,stop-used-leading"
    )]
    faults: String,
    /// The `differently` binary (default: next to this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Keep each run's directory (config, process logs) and print where it is.
    #[arg(long)]
    keep_logs: bool,
    /// The worker's `worker.scan_every_ms` (0: no scan, creates wait for the bus alone).
    #[arg(long, default_value_t = 500)]
    scan_every_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    KillLeader,
    KillLeaderOfAll,
    KillUsed,
    StopUsed,
    KillUsedLeading,
    StopUsedLeading,
}

impl Fault {
    const ALL: [Fault; 7] = [
        Fault::None,
        Fault::KillLeader,
        Fault::KillLeaderOfAll,
        Fault::KillUsed,
        Fault::StopUsed,
        Fault::KillUsedLeading,
        Fault::StopUsedLeading,
    ];

    fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s.trim())
    }

    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillLeader => "kill-leader",
            Fault::KillLeaderOfAll => "kill-leader-of-all",
            Fault::KillUsed => "kill-used",
            Fault::StopUsed => "stop-used",
            Fault::KillUsedLeading => "kill-used-leading",
            Fault::StopUsedLeading => "stop-used-leading",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillLeader => "kill -9 n1, leader of DLY_WORK and its consumer",
            Fault::KillLeaderOfAll => {
                "kill -9 n1, leader of every stream (DLY_WORK, DLY_ADMIT, DLY_EVENTS, DLY_PUB) and both durable consumers"
            }
            Fault::KillUsed => "kill -9 n0, every process's node, leading nothing",
            Fault::StopUsed => "SIGSTOP n0, every process's node, leading nothing",
            Fault::KillUsedLeading => {
                "kill -9 n0, every process's node, leader of DLY_WORK and its consumer"
            }
            Fault::StopUsedLeading => {
                "SIGSTOP n0, every process's node, leader of DLY_WORK and its consumer"
            }
        }
    }

    /// The member struck.
    fn target(self) -> Option<usize> {
        match self {
            Fault::None => None,
            Fault::KillLeader | Fault::KillLeaderOfAll => Some(1),
            _ => Some(0),
        }
    }

    /// Where the work stream and its consumer are led when the fault strikes (the other
    /// streams and the placement consumer are led by n2).
    fn work_on(self) -> &'static str {
        match self {
            Fault::KillUsedLeading | Fault::StopUsedLeading => "n0",
            _ => "n1",
        }
    }

    /// Where every other stream and the placement consumer are led.
    fn others_on(self) -> &'static str {
        match self {
            Fault::KillLeaderOfAll => "n1",
            _ => "n2",
        }
    }

    fn stops(self) -> bool {
        matches!(self, Fault::StopUsed | Fault::StopUsedLeading)
    }
}

/// Refuses any address that is not loopback: this binary generates traffic.
fn loopback_only(what: &str, url: &str) -> Result<(), LoadError> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    };
    if matches!(host, "127.0.0.1" | "localhost" | "::1") {
        Ok(())
    } else {
        Err(LoadError::Preflight(format!(
            "{what} is not on loopback (host {host:?}): cluster_failover only runs against \
             loopback"
        )))
    }
}

/// One run's cluster and processes.
struct Topology {
    nats: NatsCluster,
    _db: TestDb,
    dir: tempfile::TempDir,
    procs: Vec<(String, Spawned)>,
    key: String,
    base: String,
    http: reqwest::Client,
}

const SCRUB: &[&str] = &["DIFFERENTLY_DATABASE_URL", "DIFFERENTLY_NATS_URL"];

impl Topology {
    async fn start(binary: &std::path::Path, scan_every_ms: u64) -> Result<Topology, LoadError> {
        preflight().await?;
        let db = TestDb::new().await;
        loopback_only("the database", db.url())?;
        let nats = NatsCluster::start(3);
        let n0 = nats.nodes[0].url();
        for n in &nats.nodes {
            loopback_only("a NATS node", &n.url())?;
        }
        let dir = tempfile::Builder::new()
            .prefix("differently-failover-")
            .tempdir()
            .map_err(|e| LoadError::io("creating a temporary directory", e))?;
        let port = free_port()?;
        let ledger = dir.path().join("ledger.jsonl");
        let config = dir.path().join("differently.toml");
        // One node for every process, so "the node the processes use" is one node; they
        // learn the others from it and move there when it fails.
        let text = format!(
            r#"database_url = "{db}"
nats_url = "{n0}"
listen = "127.0.0.1:{port}"
database_max_connections = 6

[bus]
replicas = 3
ack_wait_seconds = 3

[scheduler]
tick_ms = 100
repair_interval_ms = 500
provisioning_timeout_seconds = 60
terminating_retry_seconds = 3

[worker]
scan_every_ms = {scan_every_ms}

[quota]
maxActive = 100000

[api]
key_requests_per_second = 1000
key_burst = 1000

[[pools]]
name = "fake"
kind = "fake"

[pools.settings]
latencyMs = 20
ledger = "{ledger}"
"#,
            db = db.url(),
            ledger = ledger.display(),
        );
        std::fs::write(&config, text).map_err(|e| LoadError::io("writing the config", e))?;
        let key = generate_key(binary)?;
        let audit_key = random_hex32()?;
        let mut procs = Vec::new();
        for (name, role) in [
            ("api", "api"),
            ("scheduler-0", "scheduler"),
            ("scheduler-1", "scheduler"),
            ("worker-0", "worker"),
        ] {
            let env = vec![
                ("DIFFERENTLY_BOOTSTRAP_KEY".to_owned(), key.clone()),
                ("DIFFERENTLY_AUDIT_KEY".to_owned(), audit_key.clone()),
                ("DIFFERENTLY_LOG".to_owned(), "info".to_owned()),
            ];
            let args = ["server", "--role", role, "--config"]
                .iter()
                .map(|s| s.to_string())
                .chain([config.display().to_string()])
                .collect();
            let log = dir.path().join(format!("{name}.log"));
            procs.push((
                name.to_owned(),
                Spawned::start(binary, args, env, log, SCRUB)?,
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| LoadError::Preflight(format!("http client: {e}")))?;
        let t = Topology {
            nats,
            _db: db,
            dir,
            procs,
            key,
            base: format!("http://127.0.0.1:{port}"),
            http,
        };
        t.wait_ready().await?;
        Ok(t)
    }

    /// Until the pools are healthy (a worker vouched for them) and one create runs.
    async fn wait_ready(&self) -> Result<(), LoadError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let pools = self.get("/v1/admin/pools").await.unwrap_or(Value::Null);
            let items = pools["items"].as_array().cloned().unwrap_or_default();
            if !items.is_empty() && items.iter().all(|p| p["healthy"] == true) {
                let one = create_and_wait(self).await;
                if one.running.is_some() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(LoadError::Process(format!(
            "the topology was not ready within 60 s; logs in {}",
            self.dir.path().display()
        )))
    }

    async fn get(&self, path: &str) -> Result<Value, reqwest::Error> {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .send()
            .await?
            .json()
            .await
    }

    /// Who leads each replicated stream and durable consumer, as (`DLY_WORK` or
    /// `DLY_WORK/<durable>`, server name `n0`…), from the first member's `/jsz` that answers.
    async fn leaders(&self) -> Vec<(String, String)> {
        for i in 0..self.nats.nodes.len() {
            let Some(port) = self.nats.monitor_port(i) else {
                continue;
            };
            let url = format!("http://127.0.0.1:{port}/jsz?streams=true&consumers=true");
            let Ok(r) = self.http.get(&url).send().await else {
                continue;
            };
            let Ok(jsz) = r.json::<Value>().await else {
                continue;
            };
            let mut out = Vec::new();
            for account in jsz["account_details"].as_array().into_iter().flatten() {
                for s in account["stream_detail"].as_array().into_iter().flatten() {
                    let name = s["name"].as_str().unwrap_or("?");
                    if let Some(l) = s["cluster"]["leader"].as_str() {
                        out.push((name.to_owned(), l.to_owned()));
                    }
                    for c in s["consumer_detail"].as_array().into_iter().flatten() {
                        // The durables (`placement`, `work-<pool>`); readers' are ephemeral.
                        let durable = c["name"]
                            .as_str()
                            .filter(|n| *n == "placement" || n.starts_with("work-"));
                        if let (Some(d), Some(l)) = (durable, c["cluster"]["leader"].as_str()) {
                            out.push((format!("{name}/{d}"), l.to_owned()));
                        }
                    }
                }
            }
            if !out.is_empty() {
                return out;
            }
        }
        Vec::new()
    }

    /// Moves the leadership of `asset` (`DLY_WORK` or `DLY_WORK/work-fake`) to member `on`
    /// with step-down requests naming it as preferred, so each fault strikes a known layout.
    async fn place(
        &self,
        client: &async_nats::Client,
        asset: &str,
        on: &str,
    ) -> Result<(), LoadError> {
        let subject = match asset.split_once('/') {
            Some((stream, consumer)) => {
                format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}")
            }
            None => format!("$JS.API.STREAM.LEADER.STEPDOWN.{asset}"),
        };
        let body = serde_json::json!({"placement": {"preferred": on}}).to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let now = self.leaders().await;
            match now.iter().find(|(what, _)| what == asset) {
                Some((_, l)) if l == on => return Ok(()),
                Some(_) => {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        client.request(subject.clone(), bytes::Bytes::from(body.clone())),
                    )
                    .await;
                }
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Err(LoadError::Process(format!(
            "{asset}'s leadership did not move to {on} within 30 s"
        )))
    }

    /// Lays out the leaders for `fault`.
    async fn lay_out(&self, fault: Fault) -> Result<(), LoadError> {
        let client = async_nats::connect(self.nats.nodes[2].url())
            .await
            .map_err(|e| LoadError::Process(format!("connecting to n2: {e}")))?;
        for (asset, on) in [
            ("DLY_WORK", fault.work_on()),
            ("DLY_WORK/work-fake", fault.work_on()),
            ("DLY_ADMIT", fault.others_on()),
            ("DLY_ADMIT/placement", fault.others_on()),
            ("DLY_EVENTS", fault.others_on()),
            ("DLY_PUB", fault.others_on()),
        ] {
            // Not fatal: the row says what the struck node actually led.
            if let Err(e) = self.place(&client, asset, on).await {
                eprintln!("  layout: {e}");
            }
        }
        Ok(())
    }
}

/// One create as the client saw it.
#[derive(Debug, Clone, Default)]
struct Sample {
    answer: Option<Duration>,
    running: Option<Duration>,
}

async fn create_and_wait(t: &Topology) -> Sample {
    let started = Instant::now();
    let r = t
        .http
        .post(format!("{}/v1/sandboxes", t.base))
        .bearer_auth(&t.key)
        .json(&serde_json::json!({}))
        .send()
        .await;
    let Ok(r) = r else {
        return Sample::default();
    };
    if r.status().as_u16() != 202 {
        return Sample::default();
    }
    let answer = started.elapsed();
    let Ok(body) = r.json::<Value>().await else {
        return Sample::default();
    };
    let Some(id) = body["id"].as_str().map(str::to_owned) else {
        return Sample::default();
    };
    let mut sample = Sample {
        answer: Some(answer),
        running: None,
    };
    let deadline = started + Duration::from_secs(90);
    while Instant::now() < deadline {
        let path = format!("/v1/sandboxes/{id}/wait?status=running&timeoutSeconds=30");
        if let Ok(s) = t.get(&path).await {
            if s["status"] == "running" {
                sample.running = Some(started.elapsed());
                break;
            }
            if s["status"] == "failed" {
                break;
            }
        }
    }
    sample
}

/// Figures of one fault, in seconds.
#[derive(Debug, Clone, Default)]
struct Figures {
    creates: usize,
    answered: usize,
    ran: usize,
    answer_p50: f64,
    answer_p99: f64,
    answer_max: f64,
    running_p50: f64,
    running_max: f64,
    note: String,
}

fn figures(samples: &[Sample], note: String) -> Figures {
    let mut answers: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.answer.map(|d| d.as_secs_f64()))
        .collect();
    let mut running: Vec<f64> = samples
        .iter()
        .filter_map(|s| s.running.map(|d| d.as_secs_f64()))
        .collect();
    answers.sort_by(f64::total_cmp);
    running.sort_by(f64::total_cmp);
    Figures {
        creates: samples.len(),
        answered: answers.len(),
        ran: running.len(),
        answer_p50: percentile(&answers, 0.50),
        answer_p99: percentile(&answers, 0.99),
        answer_max: answers.last().copied().unwrap_or(0.0),
        running_p50: percentile(&running, 0.50),
        running_max: running.last().copied().unwrap_or(0.0),
        note,
    }
}

async fn run_fault(binary: &std::path::Path, fault: Fault, a: &Args) -> Result<Figures, LoadError> {
    let t = Arc::new(Topology::start(binary, a.scan_every_ms).await?);
    let mut note = String::new();
    // Fresh leaders settle in the first seconds after the streams are made.
    tokio::time::sleep(Duration::from_secs(2)).await;
    t.lay_out(fault).await?;
    let target = fault.target();
    let pid = target.and_then(|i| t.nats.nodes.get(i).and_then(|n| n.pid()));
    let leaders_before = t.leaders().await;
    if let Some(i) = target {
        let node = format!("n{i}");
        let led: Vec<String> = leaders_before
            .iter()
            .filter(|(_, l)| *l == node)
            .map(|(what, _)| what.clone())
            .collect();
        let led = if led.is_empty() {
            "nothing".to_owned()
        } else {
            led.join(", ")
        };
        note = format!("{node} led {led}");
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    let total = (a.rate * a.seconds as f64).round().max(1.0) as usize;
    let began = Instant::now();
    let mut tasks = Vec::with_capacity(total);
    let mut struck = false;
    for i in 0..total {
        let at = began + Duration::from_secs_f64(i as f64 / a.rate);
        tokio::time::sleep_until(at.into()).await;
        if !struck && began.elapsed() >= Duration::from_secs(a.fault_at) {
            struck = true;
            if let Some(pid) = pid {
                let sig = if fault == Fault::StopUsed {
                    "-STOP"
                } else {
                    "-9"
                };
                signal(pid, sig)?;
            }
        }
        let t = t.clone();
        let samples = samples.clone();
        tasks.push(tokio::spawn(async move {
            let s = create_and_wait(&t).await;
            samples.lock().await.push(s);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    if fault.stops() {
        if let Some(pid) = pid {
            signal(pid, "-CONT")?;
        }
    }
    let samples = samples.lock().await.clone();
    let t = Arc::try_unwrap(t)
        .map_err(|_| LoadError::Process("a create task outlived its run".into()))?;
    for (_, mut p) in t.procs {
        p.kill9();
    }
    if a.keep_logs {
        eprintln!("  leaders before the fault: {:?}", leaders_before);
        eprintln!("  logs kept in {}", t.dir.keep().display());
    }
    Ok(figures(&samples, note))
}

fn ratio(v: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.1}×", v / base)
    } else {
        "–".to_owned()
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let binary = a.binary.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("differently")))
            .unwrap_or_else(|| PathBuf::from("differently"))
    });
    let mut faults = vec![Fault::None];
    for f in a.faults.split(',').filter(|f| !f.trim().is_empty()) {
        match Fault::parse(f) {
            Some(Fault::None) => {}
            Some(f) => faults.push(f),
            None => {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                eprintln!("unknown fault {f:?}: one of {}", names.join(", "));
                return ExitCode::from(2);
            }
        }
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rows = Vec::new();
    for fault in faults {
        eprintln!("fault: {} …", fault.label());
        match rt.block_on(run_fault(&binary, fault, &a)) {
            Ok(f) => {
                eprintln!(
                    "  {}: create p99 {:.3} s, max {:.3} s; create → running p50 {:.2} s, max {:.2} s ({})",
                    fault.name(),
                    f.answer_p99,
                    f.answer_max,
                    f.running_p50,
                    f.running_max,
                    f.note
                );
                rows.push((fault, f))
            }
            Err(e) => {
                eprintln!("fault {}: {e}", fault.label());
                return ExitCode::FAILURE;
            }
        }
    }
    let base = rows[0].1.clone();
    println!(
        "{} creates/s for {} s per fault, fault at {} s; times in seconds, ratios to `none`",
        a.rate, a.seconds, a.fault_at
    );
    println!(
        "| fault | creates (answered/running) | create p50 | create p99 | create max | create → running p50 | create → running max |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (fault, f) in &rows {
        let label = if f.note.is_empty() {
            fault.label().to_owned()
        } else {
            format!("{} ({})", fault.label(), f.note)
        };
        println!(
            "| {label} | {}/{}/{} | {:.3} ({}) | {:.3} ({}) | {:.3} ({}) | {:.2} ({}) | {:.2} ({}) |",
            f.creates,
            f.answered,
            f.ran,
            f.answer_p50,
            ratio(f.answer_p50, base.answer_p50),
            f.answer_p99,
            ratio(f.answer_p99, base.answer_p99),
            f.answer_max,
            ratio(f.answer_max, base.answer_max),
            f.running_p50,
            ratio(f.running_p50, base.running_p50),
            f.running_max,
            ratio(f.running_max, base.running_max),
        );
    }
    let lost = rows.iter().any(|(_, f)| f.ran < f.creates);
    if lost {
        eprintln!("some creates never ran (see the table)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::loopback_only;

    #[test]
    fn only_loopback_addresses_pass() {
        assert!(loopback_only("x", "nats://127.0.0.1:4222").is_ok());
        assert!(loopback_only("x", "postgres://postgres@127.0.0.1:5432/db").is_ok());
        assert!(loopback_only("x", "postgres://u:p@localhost/db").is_ok());
        assert!(loopback_only("x", "http://[::1]:8080/v1").is_ok());
        assert!(loopback_only("x", "nats://10.0.0.5:4222").is_err());
        assert!(loopback_only("x", "postgres://u@db.example.com:5432/db").is_err());
        assert!(loopback_only("x", "nats://127.0.0.1.evil.com:4222").is_err());
    }
}
