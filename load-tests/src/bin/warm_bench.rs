//! P12, warm pools: create → running answered from a warm instance against the cold path,
//! through the same stack in the same run, plus the drain case and CPU per create.
//!
//! The production topology (`differently_load_tests::cluster`: api, scheduler and worker
//! processes on a fresh Postgres database and a private nats-server) with one uncapped `fake`
//! pool whose backend create takes `--latency-ms` (default 300) and one warm class of
//! `--size` (default 200) matching a create that asks for nothing. Phases:
//!
//! 1. **warm**: `--creates` creates of `{}` at `--rate` per second (default 100/s), each
//!    timed from sending the create to seeing the sandbox `running` (a warm hit is `running`
//!    in the 202 itself; anything else is waited for).
//! 2. **cold**: as many creates at the same rate asking for 2 CPUs, which no class matches,
//!    so each takes the ordinary path and a backend create, on the same pool.
//! 3. **drain**: a burst of 3 × size creates of `{}` at once from `--orgs` organizations
//!    (default 4): one heavy org sends `--heavy-share` of it (default 0.6) first, the light
//!    ones the rest in equal parts 20 ms later. Every one must be accepted and run (the ones
//!    finding no ready instance go cold), the class must be back to size within
//!    1.2 × size ÷ refill rate of the burst, and the misses are reported per org: their
//!    create → running, the mean rank (0 first, 1 last) at which each org's misses reached
//!    `running` among all misses, Jain's index over the orgs' mean miss latency (1: equal),
//!    and whether every light miss ran only after the heavy org's last one.
//! 4. **capped drain** (`--capped-size`, default 50; 0 skips it): the same burst on a fresh
//!    cluster whose pool has `max_concurrent` = burst + size (everything fits, warm rows
//!    included), so claims go through the capped-pool rule (claim only, and only while no
//!    queued sandbox may be waiting for the pool) and the misses through the leader's fair
//!    queue.
//!
//! CPU per create is every process's CPU time (api, scheduler, worker, Postgres, nats-server)
//! over a phase divided by its creates: for warm, until the class is refilled (so a claim
//! carries the backend create made to replace it), and until all run (the claim alone).
//! Sandboxes are deleted between phases, outside the measured windows.
//!
//! It prints a JSON report and enforces nothing unless `--strict` (then a failed drain check,
//! or a warm phase without hits, exits 1).
//!
//! ```sh
//! cargo build --release -p differently -p differently-load-tests
//! target/release/warm_bench --out warm-bench.json
//! ```
//! Needs Postgres and a nats-server ≥ 2.10 as the load harness does (`cluster::preflight`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use differently_load_tests::client::{Api, Tenant};
use differently_load_tests::cluster::{Cluster, ClusterOpts};
use differently_load_tests::cpu::CpuMeter;
use differently_load_tests::stats::{summarize, Summary};
use differently_load_tests::LoadError;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

/// The warm class every `{}` create matches (no template, default resources).
const CLASS: &str = "bench";
/// The bench's only pool (`cluster::Cluster`'s `fake` pool).
const POOL: &str = "fake";

/// Warm-pool benchmark (P12).
#[derive(Parser, Clone)]
#[command(name = "warm_bench")]
struct Args {
    /// Instances the warm class keeps.
    #[arg(long, default_value_t = 200)]
    size: u32,
    /// The class's refillPerSecond.
    #[arg(long, default_value_t = 20.0)]
    refill: f64,
    /// Creates per second in the warm and cold phases.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Creates per phase (warm and cold); more than `size` makes the warm phase drain.
    #[arg(long, default_value_t = 150)]
    creates: usize,
    /// The fake backend's create (and delete) latency.
    #[arg(long, default_value_t = 300)]
    latency_ms: u64,
    /// The `differently` binary (default: next to this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Log level of the control-plane processes.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// Also write the JSON report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Exit 1 when the drain check fails or the warm phase had no hit.
    #[arg(long)]
    strict: bool,
    /// Organizations the drain's burst comes from (one heavy, the others light).
    #[arg(long, default_value_t = 4)]
    orgs: usize,
    /// The heavy organization's share of the burst.
    #[arg(long, default_value_t = 0.6)]
    heavy_share: f64,
    /// Warm size of the capped drain phase (0: no such phase).
    #[arg(long, default_value_t = 50)]
    capped_size: u32,
}

/// One create as the client saw it.
#[derive(Debug, Clone)]
struct Outcome {
    /// Answered 202 and seen `running`.
    ran: bool,
    /// `running` in the 202 itself: answered from a warm instance.
    hit: bool,
    /// Create sent → `running` seen.
    latency: Duration,
    id: Option<String>,
    /// What went wrong, for the report.
    error: Option<String>,
    /// Which organization sent it (an index into the drain's tenants; 0 elsewhere).
    org: usize,
    /// When it was seen `running`.
    ran_at: Option<Instant>,
}

/// A phase of creates at a fixed rate (or all at once).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Phase {
    creates: usize,
    ran: usize,
    hits: usize,
    failed: usize,
    /// Up to five distinct errors.
    errors: Vec<String>,
    /// Create → running, every create that ran.
    create_to_running: Summary,
    /// Create → running of the hits only.
    hits_to_running: Summary,
    /// Create → running of the others.
    misses_to_running: Summary,
    /// Wall seconds from the first create to the last `running`.
    wall_seconds: f64,
    /// CPU seconds per group until every create ran.
    cpu_seconds: BTreeMap<String, f64>,
}

/// The drain case.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Drain {
    phase: Phase,
    /// Seconds from the burst until the class held `size` ready instances again.
    refilled_after_seconds: Option<f64>,
    /// 1.2 × size ÷ refillPerSecond.
    refill_bound_seconds: f64,
    /// Nothing failed, all ran, and the class was back to size within the bound.
    ok: bool,
    /// Per organization, the heavy one first.
    orgs: Vec<OrgDrain>,
    /// How fairly the misses were served across organizations.
    fairness: Fairness,
    /// `max_concurrent` of the pool (the capped phase), if any.
    max_concurrent: Option<u32>,
}

/// One organization's part of a drain.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct OrgDrain {
    /// `heavy` or `light-<n>`.
    org: String,
    creates: usize,
    hits: usize,
    misses: usize,
    /// Create → running of its misses.
    misses_to_running: Summary,
    /// Mean rank (0 first, 1 last) at which its misses were seen `running` among all misses.
    mean_miss_rank: f64,
}

/// The drain's misses across organizations.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Fairness {
    /// Jain's index over the organizations' mean miss create → running (1: equal; 1/n: one
    /// org got everything).
    jain_mean_miss_latency: f64,
    /// Rank (0..1) of the first light organization's miss to run.
    first_light_miss_rank: f64,
    /// Every light miss ran only after the heavy organization's last one (the unfair case).
    light_misses_all_behind_heavy: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    size: u32,
    refill_per_second: f64,
    rate_per_second: f64,
    backend_create_ms: u64,
    /// Seconds the class took to fill from empty at start.
    initial_fill_seconds: f64,
    warm: Phase,
    /// CPU seconds per group from the warm phase's first create until the class was back to
    /// size (the claims and the backend creates that replaced them).
    warm_cpu_until_refilled: BTreeMap<String, f64>,
    cold: Phase,
    /// cold ÷ warm, create → running.
    ratio_p50: f64,
    ratio_p99: f64,
    /// CPU µs (every process but the load generator) per create.
    cpu_us_per_warm_claim: f64,
    cpu_us_per_warm_claim_with_refill: f64,
    cpu_us_per_cold_admission: f64,
    drain: Drain,
    /// The drain on a capped pool (`--capped-size`), on a cluster of its own.
    capped_drain: Option<Drain>,
    /// What the run could not show, if anything.
    notes: Vec<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warm_bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(a.clone())) {
        Ok(r) => {
            let text = serde_json::to_string_pretty(&r).unwrap_or_default();
            println!("{text}");
            if let Some(out) = &a.out {
                if let Err(e) = std::fs::write(out, &text) {
                    eprintln!("warm_bench: writing {}: {e}", out.display());
                    return ExitCode::FAILURE;
                }
            }
            let capped_ok = r.capped_drain.as_ref().is_none_or(|d| d.ok);
            if a.strict && (!r.drain.ok || !capped_ok || r.warm.hits == 0) {
                eprintln!(
                    "warm_bench: --strict: drain ok {}, warm hits {}",
                    r.drain.ok, r.warm.hits
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("warm_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> Result<Report, LoadError> {
    let binary = a.binary.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("differently")))
            .unwrap_or_else(|| PathBuf::from("differently"))
    });
    let cluster = start(&a, &binary, a.size, None).await?;
    let api = Api::new(cluster.url())?;
    let key = cluster.key.clone();
    let mut notes = Vec::new();
    let fill_deadline = Duration::from_secs_f64(3.0 * f64::from(a.size) / a.refill + 60.0);

    let t = Instant::now();
    wait_ready(&api, &cluster, &key, a.size, fill_deadline).await?;
    let initial_fill_seconds = t.elapsed().as_secs_f64();

    // Warm: creates that match the class.
    let meter = CpuMeter::start(cluster.pids());
    let refill_meter = CpuMeter::start(cluster.pids());
    let t0 = Instant::now();
    let outcomes = paced(&api, &key, json!({}), a.creates, Some(a.rate)).await;
    let warm = phase(&outcomes, t0, meter.finish_seconds());
    wait_ready(&api, &cluster, &key, a.size, fill_deadline).await?;
    let warm_cpu_until_refilled = refill_meter.finish_seconds();
    delete_all(&api, &key, &outcomes).await;
    wait_ready(&api, &cluster, &key, a.size, fill_deadline).await?;

    // Cold: the same pool, resources no class has.
    let cold_body = json!({"resources": {"cpu": 2, "memoryMiB": 1024, "diskGiB": 5}});
    let meter = CpuMeter::start(cluster.pids());
    let t0 = Instant::now();
    let outcomes = paced(&api, &key, cold_body, a.creates, Some(a.rate)).await;
    let cold = phase(&outcomes, t0, meter.finish_seconds());
    delete_all(&api, &key, &outcomes).await;
    wait_ready(&api, &cluster, &key, a.size, fill_deadline).await?;

    // Drain: 3 × size at once, from several organizations.
    let tenants = provision(&api, &key, a.orgs.max(2)).await?;
    let drain = run_drain(
        &api,
        &cluster,
        &key,
        &tenants,
        &a,
        a.size,
        fill_deadline,
        None,
    )
    .await?;
    drop(cluster);

    let capped_drain = if a.capped_size == 0 {
        None
    } else {
        let size = a.capped_size;
        let cap = 4 * size;
        let cluster = start(&a, &binary, size, Some(cap)).await?;
        let api = Api::new(cluster.url())?;
        let key = cluster.key.clone();
        let deadline = Duration::from_secs_f64(3.0 * f64::from(size) / a.refill + 60.0);
        wait_ready(&api, &cluster, &key, size, deadline).await?;
        let tenants = provision(&api, &key, a.orgs.max(2)).await?;
        let d = run_drain(
            &api,
            &cluster,
            &key,
            &tenants,
            &a,
            size,
            deadline,
            Some(cap),
        )
        .await?;
        if d.phase.hits == 0 {
            notes.push(
                "the capped drain had no hit: every create found a queued sandbox that may be \
                 waiting for the pool, or no ready instance"
                    .to_owned(),
            );
        }
        Some(d)
    };

    if warm.hits == 0 {
        notes.push(
            "no create was answered from a warm instance: this binary's create path does not \
             claim (DirectPlacement.warm_class unset), so the warm phase measured the cold path"
                .to_owned(),
        );
    }
    let per = |cpu: &BTreeMap<String, f64>, n: usize| -> f64 {
        let s: f64 = cpu
            .iter()
            .filter(|(k, _)| k.as_str() != "load generator")
            .map(|(_, v)| v)
            .sum();
        s * 1e6 / n.max(1) as f64
    };
    let ratio = |c: f64, w: f64| if w > 0.0 { c / w } else { 0.0 };
    Ok(Report {
        size: a.size,
        refill_per_second: a.refill,
        rate_per_second: a.rate,
        backend_create_ms: a.latency_ms,
        initial_fill_seconds,
        ratio_p50: ratio(cold.create_to_running.p50_ms, warm.create_to_running.p50_ms),
        ratio_p99: ratio(cold.create_to_running.p99_ms, warm.create_to_running.p99_ms),
        cpu_us_per_warm_claim: per(&warm.cpu_seconds, warm.ran),
        cpu_us_per_warm_claim_with_refill: per(&warm_cpu_until_refilled, warm.ran),
        cpu_us_per_cold_admission: per(&cold.cpu_seconds, cold.ran),
        warm_cpu_until_refilled,
        warm,
        cold,
        drain,
        capped_drain,
        notes,
    })
}

/// A cluster whose `fake` pool keeps a warm class of `size`, capped at `cap` if given.
async fn start(
    a: &Args,
    binary: &std::path::Path,
    size: u32,
    cap: Option<u32>,
) -> Result<Cluster, LoadError> {
    let mut pool_lines = format!(
        "warm = [{{ name = \"{CLASS}\", size = {size}, refill_per_second = {} }}]",
        a.refill
    );
    if let Some(cap) = cap {
        pool_lines.push_str(&format!("\nmax_concurrent = {cap}"));
    }
    Cluster::start(ClusterOpts {
        binary: binary.to_owned(),
        latency_ms: a.latency_ms,
        max_active: 100_000,
        database_max_connections: 16,
        log_level: a.log_level.clone(),
        extra_capabilities: vec!["warm".to_owned()],
        pool_lines,
        wrapper: Vec::new(),
    })
    .await
}

/// The tenants of the drain: `n` organizations with a key each.
async fn provision(api: &Api, key: &str, n: usize) -> Result<Vec<Tenant>, LoadError> {
    let t = differently_load_tests::client::provision(api, key, n).await?;
    if let Some(note) = t.note {
        return Err(LoadError::Process(format!(
            "the drain needs several organizations: {note}"
        )));
    }
    Ok(t.tenants)
}

/// A burst of 3 × `size` creates of `{}` from `tenants` (the first heavy, sending
/// `heavy_share` of it first; the others the rest, 20 ms later), timed until the class is
/// back to `size`.
#[allow(clippy::too_many_arguments)]
async fn run_drain(
    api: &Api,
    cluster: &Cluster,
    admin: &str,
    tenants: &[Tenant],
    a: &Args,
    size: u32,
    fill_deadline: Duration,
    cap: Option<u32>,
) -> Result<Drain, LoadError> {
    let burst = 3 * size as usize;
    let heavy = ((burst as f64 * a.heavy_share.clamp(0.0, 1.0)).round() as usize).min(burst);
    let lights = tenants.len().saturating_sub(1).max(1);
    let mut plan: Vec<(usize, Duration)> = vec![(0, Duration::ZERO); heavy];
    for i in 0..burst - heavy {
        plan.push((1 + i % lights, Duration::from_millis(20)));
    }
    let meter = CpuMeter::start(cluster.pids());
    let t0 = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    let ((outcomes, wall, cpu), refilled_after) = {
        let creates = async {
            let o = from_orgs(api, tenants, &plan).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (o, t0.elapsed(), meter.finish_seconds())
        };
        let watch = async {
            // The class is drained by the burst's claims, then refilled: watch for the
            // moment it holds `size` again after having dropped below. Never dropped by
            // the time every create ran: nothing was claimed, nothing to time.
            let mut dropped = false;
            let limit = fill_deadline * 2;
            while t0.elapsed() < limit {
                if let Ok(ready) = ready_count(api, cluster, admin).await {
                    if ready < size {
                        dropped = true;
                    } else if dropped {
                        return Some(t0.elapsed().as_secs_f64());
                    }
                }
                if !dropped && done.load(std::sync::atomic::Ordering::SeqCst) {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None
        };
        tokio::join!(creates, watch)
    };
    let mut drained = phase(&outcomes, t0, cpu);
    drained.wall_seconds = wall.as_secs_f64();
    let (orgs, fairness) = fairness(&outcomes, tenants.len());
    for (org, tenant) in tenants.iter().enumerate() {
        let mine: Vec<Outcome> = outcomes.iter().filter(|o| o.org == org).cloned().collect();
        delete_all(api, &tenant.key, &mine).await;
    }
    let bound = 1.2 * f64::from(size) / a.refill;
    let ok =
        drained.failed == 0 && drained.ran == burst && refilled_after.is_some_and(|s| s <= bound);
    Ok(Drain {
        phase: drained,
        refilled_after_seconds: refilled_after,
        refill_bound_seconds: bound,
        ok,
        orgs,
        fairness,
        max_concurrent: cap,
    })
}

/// Per-organization figures of a drain's misses, and how fair their order was.
fn fairness(outcomes: &[Outcome], orgs: usize) -> (Vec<OrgDrain>, Fairness) {
    let mut misses: Vec<&Outcome> = outcomes.iter().filter(|o| o.ran && !o.hit).collect();
    misses.sort_by_key(|o| o.ran_at);
    let last = misses.len().saturating_sub(1).max(1) as f64;
    let rank_of = |i: usize| i as f64 / last;
    let mut per = Vec::with_capacity(orgs);
    let mut means = Vec::new();
    for org in 0..orgs {
        let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.org == org).collect();
        let ranks: Vec<f64> = misses
            .iter()
            .enumerate()
            .filter(|(_, o)| o.org == org)
            .map(|(i, _)| rank_of(i))
            .collect();
        let lat: Vec<Duration> = mine
            .iter()
            .filter(|o| o.ran && !o.hit)
            .map(|o| o.latency)
            .collect();
        let summary = summarize(&lat);
        if !lat.is_empty() {
            means.push(summary.mean_ms);
        }
        per.push(OrgDrain {
            org: if org == 0 {
                "heavy".to_owned()
            } else {
                format!("light-{org}")
            },
            creates: mine.len(),
            hits: mine.iter().filter(|o| o.hit).count(),
            misses: lat.len(),
            misses_to_running: summary,
            mean_miss_rank: if ranks.is_empty() {
                0.0
            } else {
                ranks.iter().sum::<f64>() / ranks.len() as f64
            },
        });
    }
    let sum: f64 = means.iter().sum();
    let squares: f64 = means.iter().map(|m| m * m).sum();
    let jain = if squares > 0.0 {
        sum * sum / (means.len() as f64 * squares)
    } else {
        1.0
    };
    let first_light = misses.iter().position(|o| o.org != 0);
    let last_heavy = misses.iter().rposition(|o| o.org == 0);
    let fairness = Fairness {
        jain_mean_miss_latency: jain,
        first_light_miss_rank: first_light.map_or(0.0, rank_of),
        light_misses_all_behind_heavy: matches!((first_light, last_heavy), (Some(f), Some(l)) if f > l),
    };
    (per, fairness)
}

/// The burst's creates: `plan` gives each one's organization and delay from now.
async fn from_orgs(api: &Api, tenants: &[Tenant], plan: &[(usize, Duration)]) -> Vec<Outcome> {
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = plan
        .iter()
        .map(|&(org, delay)| {
            let api = api.clone();
            let key = tenants[org].key.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start + delay).await;
                let mut o = one(&api, &key, &json!({})).await;
                o.org = org;
                o
            })
        })
        .collect();
    let mut out = Vec::with_capacity(plan.len());
    for (t, &(org, _)) in tasks.into_iter().zip(plan) {
        out.push(t.await.unwrap_or_else(|e| Outcome {
            ran: false,
            hit: false,
            latency: Duration::ZERO,
            id: None,
            error: Some(format!("task: {e}")),
            org,
            ran_at: None,
        }));
    }
    out
}

/// Ready instances of the bench's class, from `GET /v1/admin/pools/{pool}/warm`.
async fn ready_count(api: &Api, cluster: &Cluster, key: &str) -> Result<u32, LoadError> {
    let path = format!("/v1/admin/pools/{POOL}/warm");
    let r = api
        .http()
        .get(format!("{}{path}", cluster.url()))
        .bearer_auth(key)
        .send()
        .await
        .map_err(|e| LoadError::http(format!("GET {path}"), e))?;
    let status = r.status().as_u16();
    let body: Value = r
        .json()
        .await
        .map_err(|e| LoadError::http(format!("GET {path} body"), e))?;
    let ready = body["classes"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == CLASS))
        .and_then(|c| c["ready"].as_u64());
    match (status, ready) {
        (200, Some(n)) => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
        _ => Err(LoadError::Api {
            context: format!("GET {path}"),
            status,
            body: body.to_string().chars().take(400).collect(),
        }),
    }
}

/// Waits until the class holds `size` ready instances.
async fn wait_ready(
    api: &Api,
    cluster: &Cluster,
    key: &str,
    size: u32,
    deadline: Duration,
) -> Result<(), LoadError> {
    let t = Instant::now();
    let mut last = None;
    while t.elapsed() < deadline {
        match ready_count(api, cluster, key).await {
            Ok(n) if n >= size => return Ok(()),
            Ok(n) => last = Some(n),
            Err(e) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(LoadError::Timeout(format!(
        "warm class {CLASS} of pool {POOL} held {last:?} ready instances, not {size}, after \
         {deadline:?}\n{}",
        cluster.log_tail("scheduler", 20)
    )))
}

/// `n` creates with `body`, `rate` per second (`None`: all at once); each is followed to
/// `running`.
async fn paced(api: &Api, key: &str, body: Value, n: usize, rate: Option<f64>) -> Vec<Outcome> {
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let api = api.clone();
            let key = key.to_owned();
            let body = body.clone();
            let at = rate.map_or(start, |r| start + Duration::from_secs_f64(i as f64 / r));
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                one(&api, &key, &body).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Outcome {
            ran: false,
            hit: false,
            latency: Duration::ZERO,
            id: None,
            error: Some(format!("task: {e}")),
            org: 0,
            ran_at: None,
        }));
    }
    out
}

async fn one(api: &Api, key: &str, body: &Value) -> Outcome {
    let t = Instant::now();
    let fail = |id: Option<String>, e: String| Outcome {
        ran: false,
        hit: false,
        latency: t.elapsed(),
        id,
        error: Some(e),
        org: 0,
        ran_at: None,
    };
    let (status, answer) = match api.post(key, "/v1/sandboxes", body).await {
        Ok(x) => x,
        Err(e) => return fail(None, e.to_string()),
    };
    let Some(id) = answer["id"].as_str().map(str::to_owned) else {
        return fail(None, format!("create answered {status}: {answer}"));
    };
    if status != 202 {
        return fail(Some(id), format!("create answered {status}"));
    }
    if answer["status"] == "running" {
        return Outcome {
            ran: true,
            hit: true,
            latency: t.elapsed(),
            id: Some(id),
            error: None,
            org: 0,
            ran_at: Some(Instant::now()),
        };
    }
    match api.wait(key, &id, "running", 120).await {
        Ok(s) if s == "running" => Outcome {
            ran: true,
            hit: false,
            latency: t.elapsed(),
            id: Some(id),
            error: None,
            org: 0,
            ran_at: Some(Instant::now()),
        },
        Ok(s) => fail(Some(id), format!("ended {s}, not running")),
        Err(e) => fail(Some(id), e.to_string()),
    }
}

fn phase(outcomes: &[Outcome], t0: Instant, cpu_seconds: BTreeMap<String, f64>) -> Phase {
    let lat = |f: &dyn Fn(&Outcome) -> bool| -> Vec<Duration> {
        outcomes
            .iter()
            .filter(|o| o.ran && f(o))
            .map(|o| o.latency)
            .collect()
    };
    let mut errors: Vec<String> = outcomes.iter().filter_map(|o| o.error.clone()).collect();
    errors.sort();
    errors.dedup();
    errors.truncate(5);
    Phase {
        creates: outcomes.len(),
        ran: outcomes.iter().filter(|o| o.ran).count(),
        hits: outcomes.iter().filter(|o| o.hit).count(),
        failed: outcomes.iter().filter(|o| !o.ran).count(),
        errors,
        create_to_running: summarize(&lat(&|_| true)),
        hits_to_running: summarize(&lat(&|o| o.hit)),
        misses_to_running: summarize(&lat(&|o| !o.hit)),
        wall_seconds: t0.elapsed().as_secs_f64(),
        cpu_seconds,
    }
}

/// Deletes every sandbox the phase created (32 at a time); failures only cost the next
/// phase some room, so they are not fatal.
async fn delete_all(api: &Api, key: &str, outcomes: &[Outcome]) {
    let ids: Vec<String> = outcomes.iter().filter_map(|o| o.id.clone()).collect();
    futures::stream::iter(ids)
        .map(|id| {
            let api = api.clone();
            let key = key.to_owned();
            async move {
                let _ = api.delete(&key, &id).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}
