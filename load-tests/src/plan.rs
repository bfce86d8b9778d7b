//! What a run does: sizes, rates and bounds. `Plan::smoke` is the few-second variant the
//! test suite runs so the harness cannot rot; `Plan::full` is the benchmark.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// Every knob of one run. All loops are bounded by these counts and by `phase_timeout`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Smoke mode (small numbers, a few seconds).
    pub smoke: bool,
    /// The `differently` binary to start as api, scheduler and worker.
    pub binary: PathBuf,
    /// Organizations to provision (one tenant each).
    pub orgs: usize,
    /// Live (running) sandboxes per organization, created before any measurement.
    pub live_per_org: usize,
    /// Creates in each admission burst (P1 sustained, P2 with the leader paused).
    pub burst: usize,
    /// Requests in flight during bursts and pre-population.
    pub concurrency: usize,
    /// Sessions per second in the fixed-rate phase (P3): create → wait running → exec → delete.
    pub rate: u32,
    /// Length of the fixed-rate phase.
    pub duration_seconds: u64,
    /// Further fixed-rate phases at these rates, shorter, after the main one: latency and
    /// CPU per session against offered load, so a missed P3 shows whether the path or the
    /// machine's saturation sets the latency. Empty: none.
    pub sweep_rates: Vec<u32>,
    /// Length of each sweep phase.
    pub sweep_seconds: u64,
    /// The fake backend's create/delete latency.
    pub latency_ms: u64,
    /// Sequential samples per exec variant (P4).
    pub exec_samples: usize,
    /// Payload bytes of each streamed-exec transfer (P4s): large enough that per-request
    /// costs vanish and the figure is a throughput.
    pub stream_bytes: u64,
    /// Transfers per streamed variant (API, in-process fake, bare HTTP); the median counts.
    pub stream_repetitions: usize,
    /// Length of each raw baseline measurement.
    pub baseline_millis: u64,
    /// Idle time before reading `differently dev`'s RSS (P6).
    pub dev_idle_millis: u64,
    /// Upper bound for any single waiting step (pre-population, settling, deletes).
    pub phase_timeout_seconds: u64,
    /// Connections per control-plane process.
    pub database_max_connections: u32,
    /// `DIFFERENTLY_LOG` for the control-plane processes.
    pub log_level: String,
    /// When set, `perf record` each process during the bursts and keep the reports here.
    pub perf_dir: Option<PathBuf>,
    /// Sessions of the instruction phase (`instructions`: a cluster of its own under
    /// callgrind, which needs valgrind); 0 skips it.
    pub instruction_sessions: usize,
    /// Their offered rate per second: low, since callgrind slows every process 30–50×.
    pub instruction_rate: u32,
    /// The quiet window after them that measures the idle work taken out.
    pub instruction_idle_seconds: u64,
    /// When set, each process's callgrind profile of the counted window is copied here.
    pub callgrind_dir: Option<PathBuf>,
}

impl Plan {
    /// The benchmark as the issue states it: 10 orgs × 1,000 live sandboxes, 200 creates/s.
    pub fn full(binary: PathBuf) -> Plan {
        Plan {
            smoke: false,
            binary,
            orgs: 10,
            live_per_org: 1000,
            burst: 3000,
            concurrency: 64,
            rate: 200,
            duration_seconds: 20,
            sweep_rates: vec![25, 50, 100],
            sweep_seconds: 10,
            latency_ms: 0,
            exec_samples: 500,
            stream_bytes: 64 * 1024 * 1024,
            stream_repetitions: 5,
            baseline_millis: 3000,
            dev_idle_millis: 3000,
            phase_timeout_seconds: 300,
            database_max_connections: 16,
            log_level: "warn".to_owned(),
            perf_dir: None,
            instruction_sessions: 40,
            instruction_rate: 2,
            instruction_idle_seconds: 15,
            callgrind_dir: None,
        }
    }

    /// A few seconds with small numbers: exercises every phase and every figure.
    pub fn smoke(binary: PathBuf) -> Plan {
        Plan {
            smoke: true,
            orgs: 2,
            live_per_org: 5,
            burst: 20,
            concurrency: 8,
            rate: 10,
            duration_seconds: 2,
            sweep_rates: vec![5],
            sweep_seconds: 1,
            exec_samples: 20,
            stream_bytes: 1024 * 1024,
            stream_repetitions: 3,
            baseline_millis: 300,
            dev_idle_millis: 1000,
            phase_timeout_seconds: 60,
            instruction_sessions: 4,
            instruction_rate: 1,
            // Two of the scheduler's 5 s reconcile periods: a shorter quiet window caught one
            // more or one fewer than the session window and over- or under-stated the idle rate.
            instruction_idle_seconds: 10,
            ..Plan::full(binary)
        }
    }

    /// Bound for one waiting step.
    pub fn phase_timeout(&self) -> Duration {
        Duration::from_secs(self.phase_timeout_seconds)
    }

    /// Checks the plan can run.
    pub fn validate(&self) -> Result<(), crate::LoadError> {
        let bad = |m: &str| Err(crate::LoadError::Plan(m.to_owned()));
        if self.orgs == 0 {
            return bad("--orgs must be at least 1");
        }
        if self.concurrency == 0 {
            return bad("--concurrency must be at least 1");
        }
        if self.rate == 0 || self.duration_seconds == 0 {
            return bad("--rate and --duration-seconds must be at least 1");
        }
        if self.sweep_rates.contains(&0)
            || (!self.sweep_rates.is_empty() && self.sweep_seconds == 0)
        {
            return bad("--sweep-rates must be at least 1 each, and --sweep-seconds at least 1");
        }
        if self.instruction_sessions > 0 && self.instruction_rate == 0 {
            return bad("--instruction-rate must be at least 1");
        }
        if self.exec_samples == 0 {
            return bad("--exec-samples must be at least 1");
        }
        if self.stream_bytes == 0 || self.stream_repetitions == 0 {
            return bad("--stream-bytes and --stream-repetitions must be at least 1");
        }
        if self.instruction_sessions > 0 {
            if let Some(why) = crate::instructions::unavailable_reason() {
                return Err(crate::LoadError::Preflight(why));
            }
        }
        if !self.binary.is_file() {
            return Err(crate::LoadError::Preflight(format!(
                "the differently binary {} does not exist: build it with \
                 `cargo build --release -p differently` (or pass --binary)",
                self.binary.display()
            )));
        }
        Ok(())
    }

    /// Per-organization `quota.max_active`: room for everything the plan creates, so the
    /// quota never delays the measurement, yet a real ceiling the invariant check holds to.
    pub fn max_active_per_org(&self, tenants: usize) -> u32 {
        let tenants = tenants.max(1);
        let live = self.orgs * self.live_per_org / tenants + 1;
        let burst = self.burst.div_ceil(tenants);
        let swept: usize = self.sweep_rates.iter().map(|r| *r as usize).sum();
        let fixed = (self.rate as usize * self.duration_seconds as usize
            + swept * self.sweep_seconds as usize)
            .div_ceil(tenants);
        u32::try_from(live + 2 * burst + fixed + 100).unwrap_or(u32::MAX)
    }
}
