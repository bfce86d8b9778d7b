//! The run's report: every figure as an absolute number and as a ratio to its same-run
//! baseline, the targets met or missed, the invariant check, and the raw phase details.
//! Rendered as a Markdown table for people and serialized as JSON for tools.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::client::Tenancy;
use crate::dev::DevRss;
use crate::generator::{ActivationSpan, FixedRateSummary};
use crate::invariants::InvariantReport;
use crate::plan::Plan;
use crate::stats::{StreamRate, Summary, Throughput};

/// P6's limit: 30 MB (10^6 bytes), in KiB.
pub const DEV_RSS_TARGET_KIB: f64 = 30.0 * 1_000_000.0 / 1024.0;

/// Name of the figure of streamed exec output through the API as SSE.
pub const STREAM_SSE_ROW: &str = "streamed exec via API, SSE";
/// Name of the figure of streamed exec output through the API as binary frames.
pub const STREAM_FRAMES_ROW: &str = "streamed exec via API, binary frames";

/// Keys of the figures every report carries (the smoke test checks each is present).
pub const REQUIRED_FIGURES: &[&str] = &[
    "baseline.pgInsertTps1",
    "baseline.pgInsertTps8",
    "baseline.jsPublishPerSec1",
    "baseline.jsPublishPerSec8",
    "admissionsPerSec",
    "activationsPerSec.leaderBacklog",
    "activationsPerSec.sustained",
    "createToRunning.client.p50",
    "createToRunning.client.p95",
    "createToRunning.client.p99",
    "createToRunning.server.p50",
    "createToRunning.server.p99",
    "createToRunning.server.toActivated.p50",
    "createToRunning.server.activatedToRunning.p50",
    "fixedRate.achievedPerSec",
    "exec.api.p50",
    "exec.direct.p50",
    "exec.overhead.p50",
    "exec.underLoad.p50",
    "exec.stream.throughput",
    "exec.stream.frames",
    "exec.stream.direct",
    "exec.stream.httpRaw",
    "exec.stream.ofHttpRaw",
    "exec.stream.frames.ofHttpRaw",
    "rss.api.idle",
    "rss.scheduler.idle",
    "rss.worker.idle",
    "rss.api.load",
    "rss.scheduler.load",
    "rss.worker.load",
    "rss.dev.idle",
];

/// Raw baselines of the run.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Baselines {
    /// Autocommit single-row inserts, 1 connection.
    pub pg_insert_1: Throughput,
    /// Autocommit single-row inserts, 8 connections.
    pub pg_insert_8: Throughput,
    /// Acked JetStream publishes, 1 in flight.
    pub js_publish_1: Throughput,
    /// Acked JetStream publishes, 8 in flight.
    pub js_publish_8: Throughput,
    /// In-process `FakeAdapter::exec` on the cluster's ledger.
    pub direct_fake_exec: Summary,
    /// HTTP round trip to a trivial local axum handler.
    pub trivial_http: Summary,
    /// In-process `FakeAdapter::exec_stream` of `fake-output N` on the cluster's ledger
    /// (P4s "direct"); `None` when the API does not serve streamed exec.
    pub direct_fake_exec_stream: Option<StreamRate>,
    /// N bytes in one HTTP response from a trivial local axum handler, same client;
    /// `None` when the API does not serve streamed exec.
    pub trivial_http_stream: Option<StreamRate>,
    /// The four raw throughputs measured again at the end of the run (Postgres 1, 8;
    /// JetStream 1, 8): how much the shared machine's capacity moved during the run.
    pub end_of_run: Vec<Throughput>,
}

/// One admission burst.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Burst {
    /// Accepted creates over the batch's wall time.
    pub admissions: Throughput,
    /// Refused creates.
    pub refused: usize,
    /// A few refusals.
    pub refusal_examples: Vec<String>,
    /// The leader's activations of the burst, from the audit log.
    pub activation: ActivationSpan,
    /// Seconds from the end of the batch until all were running.
    pub running_after_seconds: f64,
    /// Delete requests over their wall time.
    pub deletes: Throughput,
    /// Seconds from the end of the deletes until all were terminated.
    pub terminated_after_seconds: f64,
    /// What the control plane's Postgres backends were doing from the first create until
    /// all were running (sampled `pg_stat_activity`).
    pub postgres_activity: Vec<crate::diag::WaitShare>,
    /// Cores used per process group over the same window (`cpu`): CPU seconds ÷ wall seconds.
    #[serde(default)]
    pub cpu_cores: BTreeMap<String, f64>,
    /// That window, in seconds.
    #[serde(default)]
    pub cpu_wall_seconds: f64,
    /// `perf report` files written for this burst (with `--perf-dir`).
    pub profiles: Vec<String>,
}

/// Details of every phase.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phases {
    /// Pre-population (the live sandboxes present during every measurement).
    pub prepopulate: Burst,
    /// Burst with every process running (P1, sustained activations).
    pub burst_sustained: Burst,
    /// Burst admitted while the scheduler was stopped, then placed as a backlog (P2).
    pub burst_leader_backlog: Burst,
    /// The fixed-rate mix (P3).
    pub fixed_rate: FixedRateSummary,
    /// `startedAt − createdAt` of the fixed-rate sandboxes, from Postgres.
    pub server_side_to_running: Summary,
    /// The same split at the activation (`generator::ServerStages`).
    #[serde(default)]
    pub server_side_stages: crate::generator::ServerStages,
    /// Sequential exec through the API on a quiet system (P4).
    pub exec_via_api: Summary,
    /// What `POST …/exec/stream` answered.
    pub exec_stream_status: Option<u16>,
    /// `fake-output N` streamed through `POST …/exec/stream` as SSE on a quiet system (P4s),
    /// decoded stdout bytes counted by the client; `None` when the route is not served.
    pub exec_stream_via_api: Option<StreamRate>,
    /// The same as binary frames (`Accept: application/vnd.differently.exec-stream`),
    /// stdout payload bytes counted by the client; `None` when the route is not served.
    pub exec_stream_frames_via_api: Option<StreamRate>,
    /// RSS (KiB) of each process right after start (empty database).
    pub rss_start_kib: BTreeMap<String, u64>,
    /// RSS (KiB) after pre-population, idle.
    pub rss_idle_kib: BTreeMap<String, u64>,
    /// Peak RSS (KiB) during the bursts and the fixed-rate phase.
    pub rss_load_kib: BTreeMap<String, u64>,
    /// `differently dev` idle RSS (P6).
    pub dev: DevRss,
    /// Postgres activity during the fixed-rate phase.
    pub fixed_rate_postgres_activity: Vec<crate::diag::WaitShare>,
    /// Cores used per process group during the fixed-rate phase (is 200/s near the machine?).
    #[serde(default)]
    pub fixed_rate_cpu_cores: BTreeMap<String, f64>,
    /// That window, in seconds.
    #[serde(default)]
    pub fixed_rate_cpu_wall_seconds: f64,
    /// Shorter fixed-rate phases at other offered rates (`Plan::sweep_rates`), in run order.
    #[serde(default)]
    pub rate_sweep: Vec<SweepPoint>,
    /// Every busy backend of the server (any database, autovacuum included) while exec is
    /// measured on the "quiet" system.
    #[serde(default)]
    pub exec_postgres_activity: Vec<crate::diag::WaitShare>,
    /// `EXPLAIN (ANALYZE, BUFFERS)` of the hot queries on the final data.
    pub explain: Vec<crate::diag::Explained>,
    /// Row counts of the big tables at the end.
    pub table_rows: Vec<(String, i64)>,
    /// Round trips, commits, messages and instructions per fixed-rate session (issue #47).
    #[serde(default)]
    pub structure: crate::structure::Structure,
}

/// One offered rate of the sweep: what the sessions saw and what they cost.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepPoint {
    /// Offered sessions per second.
    pub rate: u32,
    /// The sessions (same fields as the main fixed-rate phase).
    pub sessions: FixedRateSummary,
    /// `startedAt − createdAt` of its sandboxes, from Postgres.
    pub server_side_to_running: Summary,
    /// Cores used per process group over the phase.
    pub cpu_cores: BTreeMap<String, f64>,
    /// That window, in seconds.
    pub cpu_wall_seconds: f64,
}

impl SweepPoint {
    /// CPU of every measured process per started session, in ms.
    pub fn cpu_ms_per_session(&self) -> f64 {
        let total: f64 = self.cpu_cores.values().sum();
        cpu_ms_per_op(total, self.cpu_wall_seconds, self.sessions.started as u64)
    }
}

/// Milliseconds of CPU per operation: `cores` busy for `wall` seconds over `ops` operations
/// (at least one).
fn cpu_ms_per_op(cores: f64, wall: f64, ops: u64) -> f64 {
    cores * wall * 1000.0 / ops.max(1) as f64
}

/// One reported figure.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figure {
    /// Stable key.
    pub key: String,
    /// What it is.
    pub name: String,
    /// The absolute value; `None` when it cannot be measured yet.
    pub value: Option<f64>,
    /// Unit of `value`.
    pub unit: String,
    /// What the ratio is taken against.
    pub baseline: String,
    /// The baseline's value.
    pub baseline_value: Option<f64>,
    /// `value / baseline_value`.
    pub ratio: Option<f64>,
    /// Anything a reader needs to interpret it.
    pub note: Option<String>,
}

/// A target's verdict.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetResult {
    /// `P1` … `P6`.
    pub id: String,
    /// The target as stated.
    pub target: String,
    /// `met`, `missed` or `not measurable yet`.
    pub status: String,
    /// The measured values and ratios behind the verdict.
    pub measured: String,
}

/// Where it ran.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    /// CPUs the OS reports.
    pub cpus: usize,
    /// Postgres `server_version`.
    pub postgres_version: String,
    /// Postgres `synchronous_commit`.
    pub synchronous_commit: String,
    /// nats-server version.
    pub nats_version: String,
    /// The `differently` binary used.
    pub binary: String,
    /// `quota.max_active` configured per organization.
    pub max_active_per_org: u32,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// When the run finished (RFC 3339).
    pub finished_at: String,
    /// Wall time of the whole run.
    pub wall_seconds: f64,
    /// The plan.
    pub plan: Plan,
    /// Where it ran.
    pub environment: Environment,
    /// How tenants were provisioned.
    pub tenancy: Tenancy,
    /// Raw baselines.
    pub baselines: Baselines,
    /// Figures with ratios.
    pub figures: Vec<Figure>,
    /// Target verdicts.
    pub targets: Vec<TargetResult>,
    /// The invariant check.
    pub invariants: InvariantReport,
    /// Phase details.
    pub phases: Phases,
    /// Caveats of this run.
    pub notes: Vec<String>,
}

fn ratio(v: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (v, b) {
        (Some(v), Some(b)) if b != 0.0 => Some(v / b),
        _ => None,
    }
}

struct Fig<'a>(&'a mut Vec<Figure>);

impl Fig<'_> {
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        key: &str,
        name: &str,
        value: Option<f64>,
        unit: &str,
        baseline: &str,
        baseline_value: Option<f64>,
        note: Option<String>,
    ) {
        self.0.push(Figure {
            key: key.to_owned(),
            name: name.to_owned(),
            value,
            unit: unit.to_owned(),
            baseline: baseline.to_owned(),
            baseline_value,
            ratio: ratio(value, baseline_value),
            note,
        });
    }
}

/// Builds every figure from the measurements.
pub fn figures(plan: &Plan, b: &Baselines, p: &Phases) -> Vec<Figure> {
    let mut v = Vec::new();
    let mut f = Fig(&mut v);
    let pg1 = Some(b.pg_insert_1.per_second);
    let pg8 = Some(b.pg_insert_8.per_second);
    f.add(
        "baseline.pgInsertTps1",
        "raw Postgres single-row insert tx/s, 1 conn",
        pg1,
        "tx/s",
        "itself",
        pg1,
        None,
    );
    f.add(
        "baseline.pgInsertTps8",
        "raw Postgres single-row insert tx/s, 8 conns",
        pg8,
        "tx/s",
        "itself",
        pg8,
        None,
    );
    let js1 = Some(b.js_publish_1.per_second);
    let js8 = Some(b.js_publish_8.per_second);
    f.add(
        "baseline.jsPublishPerSec1",
        "raw JetStream acked publish/s, 1 in flight",
        js1,
        "msg/s",
        "itself",
        js1,
        None,
    );
    f.add(
        "baseline.jsPublishPerSec8",
        "raw JetStream acked publish/s, 8 in flight",
        js8,
        "msg/s",
        "itself",
        js8,
        None,
    );
    let again = [
        (
            "baseline.end.pgInsertTps1",
            "raw Postgres tx/s, 1 conn, again at the end",
            pg1,
        ),
        (
            "baseline.end.pgInsertTps8",
            "raw Postgres tx/s, 8 conns, again at the end",
            pg8,
        ),
        (
            "baseline.end.jsPublishPerSec1",
            "raw JetStream publish/s, 1 in flight, again at the end",
            js1,
        ),
        (
            "baseline.end.jsPublishPerSec8",
            "raw JetStream publish/s, 8 in flight, again at the end",
            js8,
        ),
    ];
    for ((key, name, start), t) in again.iter().zip(&b.end_of_run) {
        f.add(
            key,
            name,
            Some(t.per_second),
            "/s",
            "same baseline at the start",
            *start,
            Some("machine drift".to_owned()),
        );
    }
    f.add(
        "admissionsPerSec",
        "admissions/s sustained (all processes running)",
        Some(p.burst_sustained.admissions.per_second),
        "/s",
        "Postgres tx/s, 8 conns",
        pg8,
        Some(format!(
            "{} creates, {} in flight",
            plan.burst, plan.concurrency
        )),
    );
    f.add(
        "activationsPerSec.leaderBacklog",
        "activations/s by the placement leader (backlog)",
        Some(p.burst_leader_backlog.activation.per_second),
        "/s",
        "Postgres tx/s, 1 conn",
        pg1,
        Some("burst admitted with the scheduler stopped, then placed".to_owned()),
    );
    f.add(
        "activationsPerSec.sustained",
        "activations/s during the sustained burst",
        Some(p.burst_sustained.activation.per_second),
        "/s",
        "Postgres tx/s, 1 conn",
        pg1,
        None,
    );
    let hop = Some(b.pg_insert_1.latency.p50_ms + b.js_publish_1.latency.p50_ms);
    let hop_name = "1 raw Postgres tx p50 + 1 JetStream publish p50";
    let c = &p.fixed_rate.to_running;
    let rate_note = Some(format!(
        "at {} creates/s, backend latency {} ms",
        plan.rate, plan.latency_ms
    ));
    f.add(
        "createToRunning.client.p50",
        "create→running p50 (client)",
        Some(c.p50_ms),
        "ms",
        hop_name,
        hop,
        rate_note.clone(),
    );
    f.add(
        "createToRunning.client.p95",
        "create→running p95 (client)",
        Some(c.p95_ms),
        "ms",
        hop_name,
        hop,
        rate_note.clone(),
    );
    f.add(
        "createToRunning.client.p99",
        "create→running p99 (client)",
        Some(c.p99_ms),
        "ms",
        hop_name,
        hop,
        rate_note,
    );
    let s = &p.server_side_to_running;
    f.add(
        "createToRunning.server.p50",
        "create→running p50 (Postgres createdAt→startedAt)",
        Some(s.p50_ms),
        "ms",
        hop_name,
        hop,
        None,
    );
    f.add(
        "createToRunning.server.p99",
        "create→running p99 (Postgres createdAt→startedAt)",
        Some(s.p99_ms),
        "ms",
        hop_name,
        hop,
        None,
    );
    let st = &p.server_side_stages;
    for (key, name, sum) in [
        (
            "createToRunning.server.toActivated",
            "createdAt→activated",
            &st.to_activated,
        ),
        (
            "createToRunning.server.activatedToRunning",
            "activated→startedAt",
            &st.activated_to_running,
        ),
    ] {
        f.add(
            &format!("{key}.p50"),
            &format!("{name} p50 (Postgres)"),
            Some(sum.p50_ms),
            "ms",
            hop_name,
            hop,
            Some(format!("p99 {:.1} ms", sum.p99_ms)),
        );
    }
    f.add(
        "fixedRate.achievedPerSec",
        "fixed-rate sessions started/s",
        Some(p.fixed_rate.achieved_rate),
        "/s",
        "requested rate",
        Some(f64::from(plan.rate)),
        Some(format!(
            "{} planned, {} shed, {} failed, {} unfinished",
            p.fixed_rate.planned, p.fixed_rate.shed, p.fixed_rate.failed, p.fixed_rate.unfinished
        )),
    );
    let direct = Some(b.direct_fake_exec.p50_ms);
    f.add(
        "exec.api.p50",
        "exec round trip via API p50 (quiet)",
        Some(p.exec_via_api.p50_ms),
        "ms",
        "direct in-process fake exec p50",
        direct,
        None,
    );
    f.add(
        "exec.direct.p50",
        "direct in-process fake exec p50",
        direct,
        "ms",
        "itself",
        direct,
        None,
    );
    let overhead = p.exec_via_api.p50_ms - b.direct_fake_exec.p50_ms;
    f.add(
        "exec.overhead.p50",
        "exec overhead p50 (via API − direct)",
        Some(overhead),
        "ms",
        "HTTP round trip to a trivial axum handler p50",
        Some(b.trivial_http.p50_ms),
        None,
    );
    f.add(
        "exec.underLoad.p50",
        "exec round trip via API p50 (under fixed-rate load)",
        Some(p.fixed_rate.exec.p50_ms),
        "ms",
        "direct in-process fake exec p50",
        direct,
        None,
    );
    let not_served = match p.exec_stream_status {
        Some(s) => format!("not measurable yet: POST …/exec/stream answers HTTP {s}"),
        None => "not measurable yet".to_owned(),
    };
    let mib = |r: &Option<StreamRate>| r.as_ref().map(StreamRate::median_mib_per_second);
    let (api_s, frames_s, direct_s, http_s) = (
        mib(&p.exec_stream_via_api),
        mib(&p.exec_stream_frames_via_api),
        mib(&b.direct_fake_exec_stream),
        mib(&b.trivial_http_stream),
    );
    let stream_note = |v: Option<f64>, how: &str| match v {
        Some(_) => Some(format!(
            "median of {} × {} bytes of fake-output{how}",
            plan.stream_repetitions, plan.stream_bytes
        )),
        None => Some(not_served.clone()),
    };
    let (sse_how, frames_how) = (
        "; the client JSON-decodes every event",
        "; the client counts frame payloads in place",
    );
    let direct_name = "direct in-process fake exec_stream throughput";
    let http_name = "raw bytes in one HTTP response from a trivial axum handler";
    f.add(
        "exec.stream.throughput",
        STREAM_SSE_ROW,
        api_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(api_s, sse_how),
    );
    f.add(
        "exec.stream.frames",
        STREAM_FRAMES_ROW,
        frames_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(frames_s, frames_how),
    );
    f.add(
        "exec.stream.direct",
        direct_name,
        direct_s,
        "MiB/s",
        "itself",
        direct_s,
        stream_note(direct_s, ""),
    );
    f.add(
        "exec.stream.httpRaw",
        http_name,
        http_s,
        "MiB/s",
        direct_name,
        direct_s,
        stream_note(http_s, ""),
    );
    f.add(
        "exec.stream.ofHttpRaw",
        &format!("{STREAM_SSE_ROW}, against bare HTTP"),
        api_s,
        "MiB/s",
        http_name,
        http_s,
        stream_note(api_s, sse_how),
    );
    f.add(
        "exec.stream.frames.ofHttpRaw",
        &format!("{STREAM_FRAMES_ROW}, against bare HTTP"),
        frames_s,
        "MiB/s",
        http_name,
        http_s,
        stream_note(frames_s, frames_how),
    );
    for role in ["api", "scheduler", "worker"] {
        let start = p.rss_start_kib.get(role).map(|k| *k as f64 / 1024.0);
        let idle = p.rss_idle_kib.get(role).map(|k| *k as f64 / 1024.0);
        let load = p.rss_load_kib.get(role).map(|k| *k as f64 / 1024.0);
        f.add(
            &format!("rss.{role}.idle"),
            &format!("RSS {role}, idle with live sandboxes"),
            idle,
            "MiB",
            "RSS right after start (empty)",
            start,
            None,
        );
        f.add(
            &format!("rss.{role}.load"),
            &format!("RSS {role}, peak under load"),
            load,
            "MiB",
            "RSS idle",
            idle,
            None,
        );
    }
    f.add(
        "rss.dev.idle",
        "RSS `differently dev`, idle",
        Some(p.dev.rss_kib as f64 / 1024.0),
        "MiB",
        "P6 limit (30 MB)",
        Some(DEV_RSS_TARGET_KIB / 1024.0),
        Some(format!("after {} ms idle", p.dev.idle_millis)),
    );
    v
}

fn verdict(met: bool) -> String {
    if met { "met" } else { "missed" }.to_owned()
}

/// Target verdicts.
pub fn targets(plan: &Plan, b: &Baselines, p: &Phases) -> Vec<TargetResult> {
    let adm = p.burst_sustained.admissions.per_second;
    let pg8 = b.pg_insert_8.per_second;
    let adm_ratio = if pg8 > 0.0 { adm / pg8 } else { 0.0 };
    let act = p.burst_leader_backlog.activation.per_second;
    let c = &p.fixed_rate.to_running;
    let lat = plan.latency_ms as f64;
    let (o50, o99) = (c.p50_ms - lat, c.p99_ms - lat);
    let p3_rate_note = if plan.rate == 200 {
        String::new()
    } else {
        format!(
            " (measured at {}/s; the target is defined at 200/s)",
            plan.rate
        )
    };
    let exec_over = p.exec_via_api.p50_ms - b.direct_fake_exec.p50_ms;
    let dev_mb = p.dev.rss_kib as f64 * 1024.0 / 1e6;
    vec![
        TargetResult {
            id: "P1".into(),
            target: "admissions ≥ 1,000/s and ≥ 0.3× raw Postgres tx/s".into(),
            status: verdict(adm >= 1000.0 && adm_ratio >= 0.3),
            measured: format!("{adm:.0}/s = {adm_ratio:.2}× Postgres 8-conn {pg8:.0} tx/s"),
        },
        TargetResult {
            id: "P2".into(),
            target: "activations ≥ 1,000/s".into(),
            status: verdict(act >= 1000.0),
            measured: format!(
                "{act:.0}/s = {:.2}× Postgres 1-conn {:.0} tx/s",
                if b.pg_insert_1.per_second > 0.0 { act / b.pg_insert_1.per_second } else { 0.0 },
                b.pg_insert_1.per_second
            ),
        },
        TargetResult {
            id: "P3".into(),
            target: "create→running overhead p50 ≤ 5 ms, p99 ≤ 25 ms at 200 creates/s".into(),
            status: verdict(o50 <= 5.0 && o99 <= 25.0 && p.fixed_rate.failed == 0 && p.fixed_rate.shed == 0),
            measured: format!(
                "p50 {o50:.1} ms ({:.1}× 5 ms), p99 {o99:.1} ms ({:.1}× 25 ms), achieved {:.0}/s{p3_rate_note}",
                o50 / 5.0,
                o99 / 25.0,
                p.fixed_rate.achieved_rate
            ),
        },
        TargetResult {
            id: "P4".into(),
            target: "exec overhead p50 ≤ 1 ms over a direct backend call".into(),
            status: verdict(exec_over <= 1.0),
            measured: format!(
                "{exec_over:.2} ms ({:.2}× 1 ms): API {:.2} ms vs direct fake {:.3} ms; a bare HTTP hop is {:.2} ms",
                exec_over,
                p.exec_via_api.p50_ms,
                b.direct_fake_exec.p50_ms,
                b.trivial_http.p50_ms
            ),
        },
        p4s(p, b),
        TargetResult {
            id: "P6".into(),
            target: "`differently dev` idle RSS ≤ 30 MB".into(),
            status: verdict(dev_mb <= 30.0),
            measured: format!("{dev_mb:.1} MB ({:.2}× 30 MB)", dev_mb / 30.0),
        },
    ]
}

/// P4s: streamed output via the API ≥ 0.8× the in-process fake's own streaming rate, judged
/// on the faster of the two response formats (a client that wants throughput picks it), and
/// naming which. Not measurable when the route is not served (older binaries), so the table
/// still says why.
fn p4s(p: &Phases, b: &Baselines) -> TargetResult {
    let target = "streamed exec output ≥ 0.8× direct throughput".to_owned();
    let formats = [
        ("SSE", &p.exec_stream_via_api),
        ("binary frames", &p.exec_stream_frames_via_api),
    ];
    let best = formats
        .iter()
        .filter_map(|(name, r)| r.as_ref().map(|r| (*name, r)))
        .max_by(|x, y| {
            x.1.median_bytes_per_second
                .total_cmp(&y.1.median_bytes_per_second)
        });
    let (Some((best_name, api)), Some(direct)) = (best, &b.direct_fake_exec_stream) else {
        return TargetResult {
            id: "P4s".into(),
            target,
            status: "not measurable yet".into(),
            measured: match p.exec_stream_status {
                Some(s) => {
                    format!("POST …/exec/stream answers HTTP {s}: streamed exec is not served yet")
                }
                None => "streamed exec is not served yet".into(),
            },
        };
    };
    let (a, d) = (api.median_mib_per_second(), direct.median_mib_per_second());
    let of_direct = |x: f64| if d > 0.0 { x / d } else { 0.0 };
    let r = of_direct(a);
    let others: String = formats
        .iter()
        .filter(|(name, _)| *name != best_name)
        .filter_map(|(name, rate)| rate.as_ref().map(|rate| (name, rate)))
        .map(|(name, rate)| {
            let m = rate.median_mib_per_second();
            format!("; {name}: {} MiB/s ({:.3}×)", num(Some(m)), of_direct(m))
        })
        .collect();
    let hop = match &b.trivial_http_stream {
        Some(h) => {
            let h = h.median_mib_per_second();
            format!(
                "; bare HTTP moves {} MiB/s ({:.3}× direct), the API via {best_name} {:.3}× that",
                num(Some(h)),
                of_direct(h),
                if h > 0.0 { a / h } else { 0.0 }
            )
        }
        None => String::new(),
    };
    TargetResult {
        id: "P4s".into(),
        target,
        status: verdict(r >= 0.8),
        measured: format!(
            "via {best_name}: {} MiB/s = {r:.3}× direct in-process fake {} MiB/s (median of {} × {:.1} MiB){others}{hop}",
            num(Some(a)),
            num(Some(d)),
            api.seconds.len(),
            api.bytes as f64 / (1024.0 * 1024.0)
        ),
    }
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "—".to_owned(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

impl Report {
    /// create→running and CPU per session by offered rate: the sweep and the main phase.
    fn sweep_table(&self) -> String {
        let p = &self.phases;
        let main = SweepPoint {
            rate: self.plan.rate,
            sessions: p.fixed_rate.clone(),
            server_side_to_running: p.server_side_to_running.clone(),
            cpu_cores: p.fixed_rate_cpu_cores.clone(),
            cpu_wall_seconds: p.fixed_rate_cpu_wall_seconds,
        };
        let mut points: Vec<&SweepPoint> = p.rate_sweep.iter().chain([&main]).collect();
        points.sort_by_key(|x| x.rate);
        let mut out = String::from(
            "\ncreate→running by offered rate (each a fixed-rate phase; the main one included):\n\n\
             | offered /s | achieved /s | sessions | failed | create p50 ms | create→running p50 ms (client) | p99 ms | p50 ms (Postgres) | cores busy | CPU ms per session |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for x in points {
            let s = &x.sessions;
            out.push_str(&format!(
                "| {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |\n",
                x.rate,
                s.achieved_rate,
                s.started,
                s.failed,
                s.admit.p50_ms,
                s.to_running.p50_ms,
                s.to_running.p99_ms,
                x.server_side_to_running.p50_ms,
                x.cpu_cores.values().sum::<f64>(),
                x.cpu_ms_per_session(),
            ));
        }
        out
    }

    /// The human-readable form: Markdown tables of figures, targets and invariants.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "Differently load run — {} orgs × {} live sandboxes, tenancy: {}, {} CPUs, wall {:.0} s{}\n\n",
            self.plan.orgs,
            self.plan.live_per_org,
            self.tenancy.mode,
            self.environment.cpus,
            self.wall_seconds,
            if self.plan.smoke { " (SMOKE: numbers are not meaningful)" } else { "" }
        ));
        out.push_str("| figure | value | unit | baseline | baseline value | ratio |\n|---|---:|---|---|---:|---:|\n");
        for f in &self.figures {
            let value = match (&f.value, &f.note) {
                (None, Some(n)) => n.clone(),
                _ => num(f.value),
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                f.name,
                value,
                f.unit,
                f.baseline,
                num(f.baseline_value),
                f.ratio.map_or("—".to_owned(), |r| format!("{r:.3}×"))
            ));
        }
        out.push_str("\n| target | goal | verdict | measured |\n|---|---|---|---|\n");
        for t in &self.targets {
            out.push_str(&format!(
                "| {} | {} | **{}** | {} |\n",
                t.id, t.target, t.status, t.measured
            ));
        }
        let i = &self.invariants;
        let line = |name: &str, c: &crate::invariants::Check| {
            format!(
                "| {name} | {} | {} | {} |\n",
                if c.ok { "ok" } else { "VIOLATED" },
                c.violations,
                c.examples.join("; ")
            )
        };
        out.push_str(&format!(
            "\nInvariants ({} sandboxes expected, {} rows, {} ledger lines, {} unsettled): **{}**\n\n| invariant | result | violations | examples |\n|---|---|---:|---|\n",
            i.sandboxes_expected,
            i.rows_in_postgres,
            i.ledger_lines,
            i.unsettled_rows,
            if i.ok { "all hold" } else { "VIOLATED" }
        ));
        out.push_str(&line("no sandbox lost", &i.no_sandbox_lost));
        out.push_str(&line(
            "no duplicate backend instance",
            &i.no_duplicate_instance,
        ));
        out.push_str(&line("no orphan backend instance", &i.no_orphan_instance));
        out.push_str(&line(
            &format!(
                "quota never exceeded (max_active {}, peak {})",
                i.max_active_limit,
                i.max_active_seen.values().max().copied().unwrap_or(0)
            ),
            &i.quota_never_exceeded,
        ));
        out.push_str(&line("every delete finished", &i.every_delete_finished));
        let acts = [
            (
                "sustained burst",
                &self.phases.burst_sustained.postgres_activity,
            ),
            (
                "leader backlog burst",
                &self.phases.burst_leader_backlog.postgres_activity,
            ),
            (
                "fixed-rate phase",
                &self.phases.fixed_rate_postgres_activity,
            ),
            (
                "quiet exec measurement (server-wide: any database, autovacuum, checkpointer)",
                &self.phases.exec_postgres_activity,
            ),
        ];
        let fr = &self.phases;
        if !fr.rate_sweep.is_empty() {
            out.push_str(&self.sweep_table());
        }
        let windows = [
            (
                "the sustained burst, first create until all ran",
                &fr.burst_sustained.cpu_cores,
                fr.burst_sustained.cpu_wall_seconds,
                fr.burst_sustained.admissions.ops,
                ("sandbox", "sandboxes"),
            ),
            (
                "the leader backlog burst, first create until all ran",
                &fr.burst_leader_backlog.cpu_cores,
                fr.burst_leader_backlog.cpu_wall_seconds,
                fr.burst_leader_backlog.admissions.ops,
                ("sandbox", "sandboxes"),
            ),
            (
                "the fixed-rate phase, first session until the last finished",
                &fr.fixed_rate_cpu_cores,
                fr.fixed_rate_cpu_wall_seconds,
                fr.fixed_rate.started as u64,
                ("session", "sessions"),
            ),
        ];
        for (name, cores_by, wall, ops, (per, plural)) in windows {
            if cores_by.is_empty() {
                continue;
            }
            let total: f64 = cores_by.values().sum();
            out.push_str(&format!(
                "\nCPU during {name} ({wall:.1} s, {ops} {plural}; `/proc/<pid>/stat`):\n\n| process | cores | CPU ms per {per} |\n|---|---:|---:|\n",
            ));
            let mut rows: Vec<(&String, &f64)> = cores_by.iter().collect();
            rows.sort_by(|x, y| y.1.total_cmp(x.1));
            for (who, cores) in rows {
                out.push_str(&format!(
                    "| {who} | {cores:.2} | {:.3} |\n",
                    cpu_ms_per_op(*cores, wall, ops)
                ));
            }
            out.push_str(&format!(
                "| all | {total:.2} | {:.3} |\n",
                cpu_ms_per_op(total, wall, ops)
            ));
        }
        out.push_str(&fr.structure.render());
        for (name, act) in acts {
            if act.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "\nPostgres backends of the control plane during the {name} (sampled every 50 ms; top 5):\n\n| backends/sample | state · wait · query |\n|---:|---|\n"
            ));
            for w in act.iter().take(5) {
                out.push_str(&format!(
                    "| {:.2} | `{}` |\n",
                    w.backends_per_sample,
                    w.what.replace('|', "·")
                ));
            }
        }
        if !self.notes.is_empty() {
            out.push_str("\nNotes:\n");
            for n in &self.notes {
                out.push_str(&format!("- {n}\n"));
            }
        }
        out
    }
}
