//! CPU time of the processes that do the work, from `/proc/<pid>/stat`, so a phase can say
//! where the machine's cores went (our three processes, Postgres, nats-server, the load
//! generator itself).

use std::collections::BTreeMap;
use std::time::Instant;

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 on Linux).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// `(comm, utime + stime in ticks)` from a `/proc/<pid>/stat` line.
pub fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the comm: state is field 3, utime field 14, stime field 15.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

fn ticks_of(pid: u32) -> Option<(String, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU ticks so far per group: each named process, every `postgres` process summed (all
/// backends of the server: it is shared, so another database's work would count too),
/// every `nats-server`, and this process (`load generator`).
fn snapshot(procs: &[(String, u32)]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (name, pid) in procs {
        if let Some((_, t)) = ticks_of(*pid) {
            m.insert(name.clone(), t);
        }
    }
    if let Some((_, t)) = ticks_of(std::process::id()) {
        m.insert("load generator".to_owned(), t);
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((comm, t)) = ticks_of(pid) {
                if comm == "postgres" || comm == "nats-server" {
                    *m.entry(comm).or_insert(0) += t;
                }
            }
        }
    }
    m
}

/// A running measurement.
pub struct CpuMeter {
    procs: Vec<(String, u32)>,
    start: BTreeMap<String, u64>,
    at: Instant,
}

impl CpuMeter {
    /// Starts measuring `procs` (name, pid) and the groups above.
    pub fn start(procs: Vec<(String, u32)>) -> CpuMeter {
        let start = snapshot(&procs);
        CpuMeter {
            procs,
            start,
            at: Instant::now(),
        }
    }

    /// Cores used per group since `start` (CPU seconds ÷ wall seconds), and the wall seconds.
    /// A process that exited (a short-lived backend) is not counted; its time is lost.
    pub fn finish(self) -> (BTreeMap<String, f64>, f64) {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let cores = self
            .finish_seconds()
            .into_iter()
            .map(|(k, used)| (k, used / wall))
            .collect();
        (cores, wall)
    }

    /// CPU seconds used per group since `start` (clock ticks: 10 ms steps). Unlike summing
    /// live threads, a process's figure keeps the time of its threads that ended.
    pub fn finish_seconds(self) -> BTreeMap<String, f64> {
        let tps = ticks_per_second();
        snapshot(&self.procs)
            .into_iter()
            .map(|(k, t)| {
                let used = t.saturating_sub(self.start.get(&k).copied().unwrap_or(0));
                (k, used as f64 / tps)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_spaces_and_parens_in_comm_parse() {
        let line = "4242 (postgres: a (b)) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("postgres: a (b)".to_owned(), 325)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_uses_some_cpu() {
        let m = CpuMeter::start(vec![]);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let (cores, wall) = m.finish();
        assert!(wall > 0.0);
        assert!(
            cores.get("load generator").copied().unwrap_or(0.0) > 0.0,
            "{cores:?}"
        );
    }
}
