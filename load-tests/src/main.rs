//! `differently-load`: runs the load harness against a freshly started three-process control
//! plane and prints a table; writes the full report as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use differently_load_tests::{run, Plan};

/// Load generator and benchmark for Differently (see docs/performance.md).
#[derive(Parser)]
#[command(name = "differently-load")]
struct Args {
    /// A few seconds with small numbers (what the test suite runs).
    #[arg(long)]
    smoke: bool,
    /// Organizations to provision.
    #[arg(long)]
    orgs: Option<usize>,
    /// Live sandboxes per organization present during the measurements.
    #[arg(long)]
    live_per_org: Option<usize>,
    /// Creates per admission burst.
    #[arg(long)]
    burst: Option<usize>,
    /// Requests in flight during bursts.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Fixed-rate sessions per second (create → running → exec → delete).
    #[arg(long)]
    rate: Option<u32>,
    /// Length of the fixed-rate phase.
    #[arg(long)]
    duration_seconds: Option<u64>,
    /// Rates of the shorter fixed-rate phases after the main one, comma-separated
    /// (`25,50,100`), or `none`.
    #[arg(long)]
    sweep_rates: Option<String>,
    /// Length of each sweep phase.
    #[arg(long)]
    sweep_seconds: Option<u64>,
    /// Fake backend create/delete latency.
    #[arg(long)]
    latency_ms: Option<u64>,
    /// Exec samples per variant.
    #[arg(long)]
    exec_samples: Option<usize>,
    /// Payload bytes of each streamed-exec transfer (P4s).
    #[arg(long)]
    stream_bytes: Option<u64>,
    /// Transfers per streamed-exec variant; the median is reported.
    #[arg(long)]
    stream_repetitions: Option<usize>,
    /// Length of each baseline measurement, in milliseconds.
    #[arg(long)]
    baseline_millis: Option<u64>,
    /// Sessions counted under callgrind (instructions per session; needs valgrind); 0 skips.
    #[arg(long)]
    instruction_sessions: Option<usize>,
    /// Offered rate of those sessions per second.
    #[arg(long)]
    instruction_rate: Option<u32>,
    /// Quiet seconds after them, measuring the idle work taken out.
    #[arg(long)]
    instruction_idle_seconds: Option<u64>,
    /// Keep each process's callgrind profile of the counted window here
    /// (`callgrind_annotate` reads them), to see where a session's instructions go.
    #[arg(long)]
    callgrind_dir: Option<PathBuf>,
    /// Log level of the control-plane processes.
    #[arg(long)]
    log_level: Option<String>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "report.json")]
    out: PathBuf,
    /// Record `perf` profiles of each process during the bursts into this directory.
    #[arg(long)]
    perf_dir: Option<PathBuf>,
    /// The `differently` binary (default: next to this one).
    #[arg(long)]
    binary: Option<PathBuf>,
}

fn default_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("differently")))
        .unwrap_or_else(|| PathBuf::from("differently"))
}

/// `none`, or comma-separated whole rates per second.
fn parse_rates(text: &str) -> Result<Vec<u32>, String> {
    if text.trim() == "none" {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|r| {
            r.trim()
                .parse::<u32>()
                .map_err(|_| format!("{r:?} is not a whole number of sessions per second"))
        })
        .collect()
}

fn main() -> ExitCode {
    let a = Args::parse();
    let binary = a.binary.unwrap_or_else(default_binary);
    let mut plan = if a.smoke {
        Plan::smoke(binary)
    } else {
        Plan::full(binary)
    };
    if let Some(v) = a.orgs {
        plan.orgs = v;
    }
    if let Some(v) = a.live_per_org {
        plan.live_per_org = v;
    }
    if let Some(v) = a.burst {
        plan.burst = v;
    }
    if let Some(v) = a.concurrency {
        plan.concurrency = v;
    }
    if let Some(v) = a.rate {
        plan.rate = v;
    }
    if let Some(v) = a.duration_seconds {
        plan.duration_seconds = v;
    }
    if let Some(v) = a.sweep_rates {
        match parse_rates(&v) {
            Ok(rates) => plan.sweep_rates = rates,
            Err(e) => {
                eprintln!("differently-load: --sweep-rates: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(v) = a.sweep_seconds {
        plan.sweep_seconds = v;
    }
    if let Some(v) = a.latency_ms {
        plan.latency_ms = v;
    }
    if let Some(v) = a.exec_samples {
        plan.exec_samples = v;
    }
    if let Some(v) = a.stream_bytes {
        plan.stream_bytes = v;
    }
    if let Some(v) = a.stream_repetitions {
        plan.stream_repetitions = v;
    }
    if let Some(v) = a.baseline_millis {
        plan.baseline_millis = v;
    }
    if let Some(v) = a.instruction_sessions {
        plan.instruction_sessions = v;
    }
    if let Some(v) = a.instruction_rate {
        plan.instruction_rate = v;
    }
    if let Some(v) = a.instruction_idle_seconds {
        plan.instruction_idle_seconds = v;
    }
    if a.perf_dir.is_some() {
        plan.perf_dir = a.perf_dir;
    }
    if a.callgrind_dir.is_some() {
        plan.callgrind_dir = a.callgrind_dir;
    }
    if let Some(v) = a.log_level {
        plan.log_level = v;
    }
    match real_main(plan, &a.out) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("differently-load: INVARIANTS VIOLATED (see the table above)");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("differently-load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(plan: Plan, out: &std::path::Path) -> Result<bool, Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(run(plan))?;
    println!("{}", report.render());
    std::fs::write(out, serde_json::to_vec_pretty(&report)?)?;
    eprintln!("report written to {}", out.display());
    Ok(report.invariants.ok)
}

#[cfg(test)]
mod tests {
    use super::parse_rates;

    #[test]
    fn sweep_rates_parse_as_a_list_or_none() {
        assert_eq!(parse_rates("25, 50,100"), Ok(vec![25, 50, 100]));
        assert_eq!(parse_rates("none"), Ok(Vec::new()));
        assert!(parse_rates("25,fast").is_err_and(|e| e.contains("\"fast\"")));
        assert!(parse_rates("").is_err());
    }
}
