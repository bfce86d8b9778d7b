//! Issue #42's warm figure against a real OpenSandbox server: create → first OK exec of
//! `true` through Differently on a warm hit against the same straight to the server, and a
//! cold create through Differently for reference, interleaved in one run
//! (`differently_load_tests::opensandbox_warm`).
//!
//! ```sh
//! cargo build --release -p differently -p differently-load-tests --bin differently --bin opensandbox_warm_bench
//! DIFFERENTLY_TEST_OPENSANDBOX_URL=http://127.0.0.1:8090/v1 DIFFERENTLY_TEST_OPENSANDBOX_KEY=… \
//!   target/release/opensandbox_warm_bench --image osb/debian:bookworm --out osb-warm.json
//! ```
//! Targets only loopback; needs Postgres and a nats-server ≥ 2.10 as the load harness does.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use differently_load_tests::cluster::ClusterOpts;
use differently_load_tests::opensandbox_warm::{run, WarmOpts, TARGET_RATIO};

/// OpenSandbox warm create → first exec benchmark.
#[derive(Parser)]
#[command(name = "opensandbox_warm_bench")]
struct Args {
    /// The server's lifecycle API (ending in /v1), on loopback.
    #[arg(long, env = "DIFFERENTLY_TEST_OPENSANDBOX_URL")]
    url: String,
    /// The server's api_key (prefer the environment variable to the command line).
    #[arg(long, env = "DIFFERENTLY_TEST_OPENSANDBOX_KEY", hide_env_values = true)]
    key: String,
    /// Extra pool settings, a JSON object merged over the defaults.
    #[arg(
        long,
        env = "DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS",
        default_value = "{}"
    )]
    settings: String,
    /// Image every path creates from (it must be on the server's Docker already).
    #[arg(long, default_value = "ubuntu:24.04")]
    image: String,
    /// Timed samples per path (at least 10).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Instances the warm class keeps.
    #[arg(long, default_value_t = 3)]
    size: u32,
    /// The class's refillPerSecond.
    #[arg(long, default_value_t = 2.0)]
    refill: f64,
    /// The `differently` binary (default: next to this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Log level of the control-plane processes.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// Where to write the JSON report.
    #[arg(long, default_value = "opensandbox-warm-bench.json")]
    out: PathBuf,
    /// Exit 1 when the warm ratio misses the target.
    #[arg(long)]
    strict: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let settings: serde_json::Value = match serde_json::from_str(&a.settings) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            eprintln!("opensandbox_warm_bench: --settings must be a JSON object");
            return ExitCode::from(2);
        }
    };
    let binary = a.binary.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("differently")))
            .unwrap_or_else(|| PathBuf::from("differently"))
    });
    let opts = WarmOpts {
        url: a.url,
        key: a.key,
        settings,
        image: a.image,
        rounds: a.rounds,
        size: a.size,
        refill: a.refill,
        cluster: ClusterOpts {
            binary,
            latency_ms: 0,
            max_active: 1000,
            database_max_connections: 8,
            extra_capabilities: Vec::new(),
            pool_lines: String::new(),
            wrapper: Vec::new(),
            log_level: a.log_level,
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("opensandbox_warm_bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match rt.block_on(run(opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("opensandbox_warm_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (d, w, c) = (&r.direct.summary, &r.warm.summary, &r.cold.summary);
    println!(
        "OpenSandbox {} (same run, interleaved, {} samples per path; load {} → {})",
        r.server_version, d.count, r.load_average[0], r.load_average[1]
    );
    println!(
        "create → first OK exec `true`: direct p50 {:.1} ms p99 {:.1} ms | warm hit through \
         Differently p50 {:.1} ms p99 {:.1} ms ({} verified hits) | cold through Differently \
         p50 {:.1} ms p99 {:.1} ms",
        d.p50_ms, d.p99_ms, w.p50_ms, w.p99_ms, r.verified_hits, c.p50_ms, c.p99_ms
    );
    println!(
        "warm ÷ direct: p50 {:.3}× p99 {:.3}× (target ≤ {TARGET_RATIO}×: {}); warm create \
         answered p50 {:.1} ms, running p50 {:.1} ms",
        r.ratio_p50,
        r.ratio_p99,
        if r.target_met { "met" } else { "missed" },
        r.warm_split.answered.summary.p50_ms,
        r.warm_split.running.summary.p50_ms
    );
    let text = serde_json::to_string_pretty(&r).unwrap_or_default();
    if let Err(e) = std::fs::write(&a.out, text) {
        eprintln!("opensandbox_warm_bench: writing {}: {e}", a.out.display());
        return ExitCode::FAILURE;
    }
    if a.strict && !r.target_met {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
