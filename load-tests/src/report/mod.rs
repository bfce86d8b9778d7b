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

mod figures;
mod render;
mod targets;

pub use figures::figures;
pub use targets::targets;

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
    "instructions.perSession",
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
    /// Instructions per session of each of our processes, counted under callgrind in a
    /// low-rate phase of its own; `None` when skipped (`--instruction-sessions 0`).
    #[serde(default)]
    pub instructions: Option<crate::instructions::Instructions>,
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

/// A figure for a table: fewer decimals the larger it is; a dash when absent.
fn num(v: Option<f64>) -> String {
    match v {
        None => "—".to_owned(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}
