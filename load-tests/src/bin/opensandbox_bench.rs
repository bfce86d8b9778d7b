//! P7 (create → running) and exec overhead of Differently against a real OpenSandbox server
//! used directly, interleaved in one run (`differently_load_tests::opensandbox`).
//!
//! ```sh
//! cargo build --release -p differently -p differently-load-tests
//! DIFFERENTLY_TEST_OPENSANDBOX_URL=http://127.0.0.1:8090/v1 DIFFERENTLY_TEST_OPENSANDBOX_KEY=… \
//!   target/release/opensandbox_bench --image osb/debian:bookworm --out osb-bench.json
//! ```
//! Targets only loopback; needs Postgres and a nats-server ≥ 2.10 as the load harness does.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use differently_load_tests::cluster::ClusterOpts;
use differently_load_tests::opensandbox::{run, BenchOpts};

/// OpenSandbox P7 and exec-overhead benchmark.
#[derive(Parser)]
#[command(name = "opensandbox_bench")]
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
    /// Image both paths create from (it must be on the server's Docker already).
    #[arg(long, default_value = "ubuntu:24.04")]
    image: String,
    /// Creates per path (at least 10).
    #[arg(long, default_value_t = 10)]
    creates: usize,
    /// `echo hi` samples per path (at least 50).
    #[arg(long, default_value_t = 50)]
    execs: usize,
    /// The `differently` binary (default: next to this one).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Log level of the control-plane processes.
    #[arg(long, default_value = "warn")]
    log_level: String,
    /// Where to write the JSON report.
    #[arg(long, default_value = "opensandbox-bench.json")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let settings: serde_json::Value = match serde_json::from_str(&a.settings) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            eprintln!("opensandbox_bench: --settings must be a JSON object");
            return ExitCode::from(2);
        }
    };
    let binary = a.binary.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("differently")))
            .unwrap_or_else(|| PathBuf::from("differently"))
    });
    let opts = BenchOpts {
        url: a.url,
        key: a.key,
        settings,
        image: a.image,
        creates: a.creates,
        execs: a.execs,
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
            eprintln!("opensandbox_bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(opts)) {
        Ok(r) => {
            println!("OpenSandbox {} (same run, interleaved)", r.server_version);
            println!(
                "P7 create: direct p50 {:.0} ms p90 {:.0} ms | adapter in-process p50 {:.0} ms p90 {:.0} ms | differently p50 {:.0} ms p90 {:.0} ms | ratio p50 {:.2}x p90 {:.2}x (target <= 1.1x)",
                r.create_direct.p50_ms, r.create_direct.p90_ms, r.create_adapter.p50_ms,
                r.create_adapter.p90_ms, r.create_differently.p50_ms,
                r.create_differently.p90_ms, r.p7_ratio_p50, r.p7_ratio_p90
            );
            println!(
                "exec echo hi p50: execd {:.2} ms | server proxy {:.2} ms | adapter in-process {:.2} ms | differently {:.2} ms | overhead {:.2} ms (target <= 1 ms); API GET floor {:.2} ms, API /healthz hop {:.2} ms, audit append {:.2} ms, guarded swap staged {:.2} ms",
                r.exec_direct.p50_ms, r.exec_server_proxy.p50_ms, r.exec_adapter.p50_ms,
                r.exec_differently.p50_ms, r.exec_overhead_p50_ms, r.api_get.p50_ms, r.api_hop.p50_ms, r.audit_append.p50_ms, r.audit_stage.p50_ms
            );
            println!(
                "exec echo hi streamed (SSE) through differently p50 {:.2} ms | overhead {:.2} ms",
                r.exec_differently_stream.p50_ms, r.exec_stream_overhead_p50_ms
            );
            println!(
                "exec overhead, median of each round's own difference: {:.2} ms collected, {:.2} ms streamed",
                r.exec_overhead_paired_p50_ms, r.exec_stream_overhead_paired_p50_ms
            );
            let us = |v: Option<f64>| v.map_or("unread".to_owned(), |v| format!("{v:.0} µs"));
            println!(
                "CPU per exec through Differently ({} back to back): API process {} ({} context switches), all postgres processes {}",
                differently_load_tests::opensandbox::CPU_EXECS,
                us(r.api_cpu_per_exec_us),
                r.api_switches_per_exec.map_or("unread".to_owned(), |v| format!("{v:.1}")),
                us(r.postgres_cpu_per_exec_us)
            );
            let each = |m: &std::collections::BTreeMap<String, f64>| {
                let parts: Vec<String> = m
                    .iter()
                    .map(|(name, v)| format!("{name} {v:.0} µs"))
                    .collect();
                format!(
                    "{} (sum {:.0} µs)",
                    parts.join(", "),
                    m.values().sum::<f64>()
                )
            };
            println!(
                "CPU per exec, every process of the run: {}; idle for as long: {}",
                each(&r.cpu_per_exec_us),
                each(&r.idle_cpu_per_exec_us)
            );
            let text = serde_json::to_string_pretty(&r).unwrap_or_default();
            if let Err(e) = std::fs::write(&a.out, text) {
                eprintln!("opensandbox_bench: writing {}: {e}", a.out.display());
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("opensandbox_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
