//! Benchmark of the placement leader's fair queue alone: N queued candidates across M
//! organizations; time per pick (pop + charge, as the dispatch loop does) at p50/p99, and
//! the memory the queue holds. Baseline in the same run: re-sorting the whole queue with the
//! static `fair_order` (what a pass did before `FairQueue`), per pick amortized over a
//! 100-pick pass.
//!
//! `cargo run --release -p differently-load-tests --bin fair_queue -- [queued] [orgs]`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use differently_core::fair::{fair_order, Candidate, FairQueue};
use differently_core::{OrgId, SandboxId};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A small deterministic generator, so runs are comparable.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let queued: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let org_count: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let mut rng = Lcg(42);
    let orgs: Vec<OrgId> = (0..org_count).map(|_| OrgId::new()).collect();
    let candidates: Vec<Candidate> = (0..queued)
        .map(|_| Candidate {
            id: SandboxId::new(),
            org: orgs[(rng.next() as usize) % org_count].clone(),
            priority: (rng.next() % 5) as i32 - 2,
            cpu: 1 + rng.next() % 4,
        })
        .collect();
    let active: HashMap<OrgId, u64> = orgs.iter().map(|o| (o.clone(), rng.next() % 64)).collect();

    let rss_before = rss_kib();
    let build = Instant::now();
    let mut q = FairQueue::new();
    q.reset_active_cpu(&active);
    for c in candidates.iter().cloned() {
        q.push(c);
    }
    let build_time = build.elapsed();
    let rss_after = rss_kib();

    let mut picks = Vec::with_capacity(queued);
    while !q.is_empty() {
        let t = Instant::now();
        let Some(c) = q.pop() else { break };
        q.charge(&c.org, c.cpu);
        picks.push(t.elapsed());
    }
    picks.sort();

    // Baseline: one static fair_order over the whole queue per 100-pick pass.
    let passes = 5;
    let mut sort_times = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        let ordered = fair_order(candidates.clone(), &active);
        std::hint::black_box(&ordered);
        sort_times.push(t.elapsed());
    }
    sort_times.sort();
    let per_pick_baseline = percentile(&sort_times, 0.5) / 100;

    let p50 = percentile(&picks, 0.5);
    let p99 = percentile(&picks, 0.99);
    let mem_mib = rss_after.saturating_sub(rss_before) as f64 / 1024.0;
    println!("fair queue: {queued} queued across {org_count} orgs");
    println!("| figure | value |");
    println!("|---|---|");
    println!("| build (push all) | {build_time:?} |");
    println!("| pick p50 (pop + charge) | {p50:?} |");
    println!("| pick p99 (pop + charge) | {p99:?} |");
    println!("| queue memory (RSS growth) | {mem_mib:.1} MiB |");
    println!("| baseline: full re-sort per 100-pick pass, per pick | {per_pick_baseline:?} |");
    println!(
        "| ratio p50 / baseline | {:.4} |",
        p50.as_secs_f64() / per_pick_baseline.as_secs_f64().max(1e-12)
    );
    let json = serde_json::json!({
        "queued": queued,
        "orgs": org_count,
        "buildMs": build_time.as_secs_f64() * 1e3,
        "pickP50Us": p50.as_secs_f64() * 1e6,
        "pickP99Us": p99.as_secs_f64() * 1e6,
        "memoryMiB": mem_mib,
        "baselinePerPickUs": per_pick_baseline.as_secs_f64() * 1e6,
    });
    println!("{json}");
}
