//! Bus traffic per message of the two ways to read a durable consumer (`pull` and
//! `pull_ahead`), in alternated rounds on one nats-server:
//!
//! ```sh
//! cargo build --release -p differently-load-tests --bin pull_bench
//! target/release/pull_bench --rounds 5 --messages 2000 --out pull-bench.json
//! ```
//!
//! Needs a nats-server ≥ 2.10 (`DIFFERENTLY_NATS_SERVER`, or on `PATH`); runs it on loopback.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use differently_load_tests::pull_bench::{run, PullBenchOpts};

#[derive(Parser, Debug)]
#[command(name = "pull_bench")]
struct Args {
    /// Rounds per way (alternated).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Messages per round (published in pairs, as an exec's two events).
    #[arg(long, default_value_t = 2000)]
    messages: usize,
    /// Pause between pairs, in milliseconds.
    #[arg(long, default_value_t = 2)]
    pace_ms: u64,
    /// Where to write the JSON report.
    #[arg(long, default_value = "pull-bench.json")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pull_bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = PullBenchOpts {
        rounds: a.rounds,
        messages: a.messages,
        pace: Duration::from_millis(a.pace_ms),
    };
    match rt.block_on(run(opts)) {
        Ok(r) => {
            for round in &r.rounds {
                println!(
                    "{:?}: nats-server {:.1} µs, this process {:.1} µs per message ({} taken buffered)",
                    round.way, round.server_us, round.client_us, round.buffered
                );
            }
            println!(
                "pull_ahead / pull, medians of the rounds: nats-server {:.2}x, this process {:.2}x",
                r.server_ratio, r.client_ratio
            );
            if let Err(e) =
                std::fs::write(&a.out, serde_json::to_string_pretty(&r).unwrap_or_default())
            {
                eprintln!("pull_bench: writing {}: {e}", a.out.display());
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pull_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
