//! On-CPU time of the processes under test, read from `/proc`.

use super::*;

/// Nanoseconds process `pid` has been on a CPU, its live threads together
/// (`/proc/<pid>/task/*/schedstat`, first field): finer than the 10 ms ticks of
/// `/proc/<pid>/stat`. A thread that ends between two readings takes its time with it, so a
/// phase should be short next to the runtime's idle-thread timeout (10 s).
pub(super) fn on_cpu_ns(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// Context switches of process `pid`'s live threads so far, voluntary and not
/// (`/proc/<pid>/task/*/status`).
pub(super) fn context_switches(pid: u32) -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// On-CPU nanoseconds of every process named `postgres`.
pub(super) fn postgres_on_cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "postgres" {
            total += on_cpu_ns(pid).unwrap_or(0);
        }
    }
    Some(total)
}

/// On-CPU nanoseconds so far of each of `procs` and of all of Postgres (as `postgres`).
pub(super) fn cpu_readings(procs: &[(String, u32)]) -> Vec<(String, Option<u64>)> {
    procs
        .iter()
        .map(|(name, pid)| (name.clone(), on_cpu_ns(*pid)))
        .chain(std::iter::once((
            "postgres".to_owned(),
            postgres_on_cpu_ns(),
        )))
        .collect()
}

/// µs per exec of the CPU phase between two [`cpu_readings`] of the same processes; one
/// that could not be read both times (or lost a thread's time) is absent.
pub(super) fn per_exec_us(
    before: &[(String, Option<u64>)],
    after: &[(String, Option<u64>)],
) -> std::collections::BTreeMap<String, f64> {
    before
        .iter()
        .zip(after)
        .filter_map(|((name, b), (_, a))| {
            let used = a.as_ref()?.checked_sub((*b)?)?;
            Some((name.clone(), used as f64 / CPU_EXECS as f64 / 1000.0))
        })
        .collect()
}
