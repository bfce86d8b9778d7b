//! `differently-faults`: the seeded fault suite (FAULTS.md S1–S16, invariants I1–I7) and the
//! noisy-neighbour test, against freshly started production-topology clusters. Prints the
//! seed first, then one verdict block per scenario; exits 1 if any invariant was violated.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use differently_load_tests::faults::noisy::{run_noisy, NoisyOpts};
use differently_load_tests::faults::rng::clock_seed;
use differently_load_tests::faults::{run_scenario, Length, Scenario};

/// Seeded fault suite for Differently (see docs/reliability.md, "Fault suite").
#[derive(Parser)]
#[command(name = "differently-faults")]
struct Args {
    /// Seed of the workload and the nemesis (default: from the clock; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Scenarios, comma-separated (`S1,S4,S16`), `all`, or `none`.
    #[arg(long, default_value = "all")]
    scenarios: String,
    /// Workload seconds per scenario (S16 chaos: see --chaos-seconds).
    #[arg(long, default_value_t = 12)]
    seconds: u64,
    /// Seconds of S16 chaos (the long version: 300).
    #[arg(long, default_value_t = 30)]
    chaos_seconds: u64,
    /// The long version: 30 s nats stop (S8), three cluster-member kills (S9), 20 s backend
    /// hang (S12), 60 s backend partition (S14).
    #[arg(long)]
    long: bool,
    /// Also run the noisy-neighbour test.
    #[arg(long)]
    noisy: bool,
    /// The flood's total request rate in the noisy-neighbour test (0: unbounded).
    #[arg(long, default_value_t = 300.0)]
    flood_rate: f64,
    /// Where to write the JSON reports.
    #[arg(long, default_value = "faults-report.json")]
    out: PathBuf,
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

fn main() -> ExitCode {
    let a = Args::parse();
    let seed = a.seed.unwrap_or_else(clock_seed);
    println!("fault suite seed: {seed} (replay with --seed {seed})");
    let binary = a.binary.unwrap_or_else(default_binary);
    let list: Vec<Scenario> = match a.scenarios.trim() {
        "all" => Scenario::ALL.to_vec(),
        "none" => vec![],
        s => {
            let mut v = Vec::new();
            for part in s.split(',') {
                match Scenario::parse(part) {
                    Some(x) => v.push(x),
                    None => {
                        eprintln!(
                            "unknown scenario {part:?} (implemented: {:?})",
                            Scenario::ALL
                        );
                        return ExitCode::from(2);
                    }
                }
            }
            v
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    let mut reports = Vec::new();
    for sc in list {
        let secs = if sc == Scenario::S16 {
            a.chaos_seconds
        } else {
            a.seconds
        };
        let len = Length {
            workload: Duration::from_secs(secs),
            long: a.long,
        };
        match rt.block_on(run_scenario(binary.clone(), sc, seed, len)) {
            Ok(r) => {
                print!("{}", r.render());
                ok &= r.ok;
                reports.push(serde_json::to_value(&r).unwrap_or_default());
            }
            Err(e) => {
                println!("{sc:?} seed={seed} ERROR: {e}");
                ok = false;
            }
        }
    }
    if a.noisy {
        let mut o = NoisyOpts::new(binary.clone(), seed);
        o.flood_rate = a.flood_rate;
        match rt.block_on(run_noisy(o)) {
            Ok(r) => {
                print!("{}", r.render());
                ok &= r.ok;
                reports.push(serde_json::to_value(&r).unwrap_or_default());
            }
            Err(e) => {
                println!("noisy neighbour seed={seed} ERROR: {e}");
                ok = false;
            }
        }
    }
    let json = serde_json::json!({"seed": seed, "reports": reports});
    if let Err(e) = std::fs::write(&a.out, json.to_string()) {
        eprintln!("cannot write {}: {e}", a.out.display());
    }
    println!(
        "fault suite seed: {seed}: {}",
        if ok { "all held" } else { "VIOLATIONS" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
