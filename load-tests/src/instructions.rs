//! Instructions our processes execute per session, counted by callgrind (issue #47): a figure
//! that, unlike CPU seconds, does not move with the shared machine's noise, and that needs no
//! hardware counter (these VMs expose none to `perf`).
//!
//! Processes under callgrind run 30–50× slower, so the count is a phase of its own: a second,
//! small cluster whose api, scheduler, worker and leader API run under
//! `valgrind --tool=callgrind`, a few sessions at a low rate, and the counters read around them
//! with `callgrind_control` (`-z` zeroes, `-e` prints every thread's total, those that ended
//! included). The idle work of the same processes (leader passes, reconcilers, heartbeats) is
//! measured over a quiet window after, and its rate × the window is taken out.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::client::{provision, Api};
use crate::cluster::{Cluster, ClusterOpts};
use crate::generator::{fixed_rate, wait_all, FixedRate};
use crate::plan::Plan;
use crate::LoadError;

/// What to do when valgrind is missing: said by the preflight and the smoke test.
pub const INSTALL_HINT: &str = "valgrind (with callgrind_control) is not installed: install it \
     (`apt-get install valgrind`, as root) or pass `--instruction-sessions 0` to skip the \
     instruction count";

/// Why callgrind cannot count here, or `None` when `valgrind` and `callgrind_control` run.
pub fn unavailable_reason() -> Option<String> {
    for tool in ["valgrind", "callgrind_control"] {
        let ran = Command::new(tool)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match ran {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Some(format!(
                    "`{tool} --version` exited with {s}; {INSTALL_HINT}"
                ))
            }
            Err(e) => return Some(format!("{tool}: {e}; {INSTALL_HINT}")),
        }
    }
    None
}

/// The command prefix that runs a process under callgrind, its profile (never read; written
/// at exit) in `dir`. Collection is on from the start; the meter zeroes it.
pub fn wrapper(dir: &Path) -> Vec<String> {
    vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--quiet".to_owned(),
        format!(
            "--callgrind-out-file={}",
            dir.join("callgrind.%p.out").display()
        ),
    ]
}

/// The sum of every thread's `Ir` in `callgrind_control -e` output:
/// `  Totals:   Ir` then `   Th 1   81,270` per thread.
pub fn parse_totals(text: &str) -> Result<u64, String> {
    let mut sum = 0u64;
    let mut threads = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("Th") {
            continue;
        }
        let count = words
            .nth(1)
            .ok_or_else(|| format!("callgrind_control: a thread line without a count: {line}"))?;
        let n: u64 = count
            .replace(',', "")
            .parse()
            .map_err(|_| format!("callgrind_control: {count:?} is not a count"))?;
        sum = sum.saturating_add(n);
        threads += 1;
    }
    if threads == 0 {
        return Err(format!(
            "callgrind_control printed no thread totals: {}",
            text.trim()
        ));
    }
    Ok(sum)
}

/// How often `callgrind_control` is asked again when it does not find a process that runs.
const CONTROL_TRIES: u32 = 5;

/// Runs `callgrind_control <args> <pid>`; its output, or why not. It finds the process through
/// vgdb, which on a saturated machine sometimes misses one that is alive ("Callgrind task
/// with PID … not detected"): that answer is asked again, a second apart, a few times.
fn control(args: &[&str], pid: u32) -> Result<String, LoadError> {
    let mut tries = 1;
    loop {
        match control_once(args, pid) {
            Err(LoadError::Process(why))
                if why.contains("not detected") && tries < CONTROL_TRIES =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

fn control_once(args: &[&str], pid: u32) -> Result<String, LoadError> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LoadError::io(format!("running callgrind_control {args:?} {pid}"), e))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.contains("No active callgrind runs") {
        return Err(LoadError::Process(format!(
            "callgrind_control {args:?} {pid} failed ({}): {} {}",
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(text)
}

/// Zeroes the counters of every process.
fn zero(pids: &[(String, u32)]) -> Result<(), LoadError> {
    for (_, pid) in pids {
        control(&["-z"], *pid)?;
    }
    Ok(())
}

/// Dumps every process's profile since the last zero (the counted window) and copies it to
/// `dir` as `callgrind.<process>.out`.
fn keep_profiles(pids: &[(String, u32)], from: &Path, dir: &Path) -> Result<(), LoadError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| LoadError::io(format!("creating {}", dir.display()), e))?;
    for (name, pid) in pids {
        control(&["-d"], *pid)?;
        // The dump is `callgrind.<pid>.out.<n>`, the highest n the newest.
        let prefix = format!("callgrind.{pid}.out.");
        let newest = std::fs::read_dir(from)
            .map_err(|e| LoadError::io(format!("reading {}", from.display()), e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e
                    .file_name()
                    .to_str()?
                    .strip_prefix(&prefix)?
                    .parse::<u32>()
                    .ok()?;
                Some((n, e.path()))
            })
            .max_by_key(|(n, _)| *n)
            .ok_or_else(|| LoadError::Process(format!("{name}: callgrind wrote no dump")))?;
        let to = dir.join(format!("callgrind.{name}.out"));
        std::fs::copy(&newest.1, &to)
            .map_err(|e| LoadError::io(format!("copying {}", newest.1.display()), e))?;
    }
    Ok(())
}

/// Instructions since the last zero, per process.
fn read(pids: &[(String, u32)]) -> Result<BTreeMap<String, u64>, LoadError> {
    let mut out = BTreeMap::new();
    for (name, pid) in pids {
        let text = control(&["-e"], *pid)?;
        let n = parse_totals(&text).map_err(|e| LoadError::Process(format!("{name}: {e}")))?;
        out.insert(name.clone(), n);
    }
    Ok(out)
}

/// One process's count.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInstructions {
    /// `api`, `scheduler`, `worker`, `api-leader`.
    pub process: String,
    /// Counted over the window, idle work included.
    pub window: u64,
    /// Its rate with no sessions running.
    pub idle_per_second: f64,
    /// (window − idle rate × window seconds) ÷ sessions.
    pub per_session: f64,
}

/// The instruction phase's result.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Instructions {
    /// Sessions completed in the window (each create → running → exec → delete, and its
    /// sandbox `terminated`).
    pub sessions: u64,
    /// Offered sessions per second.
    pub rate: u32,
    /// From the zeroing to the reading: the sessions, their sandboxes' termination and the
    /// drain of every JetStream consumer.
    pub window_seconds: f64,
    /// The quiet window that measures the idle work.
    pub idle_seconds: f64,
    /// Per process, largest per session first.
    pub processes: Vec<ProcessInstructions>,
    /// Every process together, per session.
    pub per_session: f64,
    /// The whole phase, cluster start under callgrind included.
    pub phase_seconds: f64,
}

impl Instructions {
    /// A Markdown table for the text report.
    pub fn render(&self) -> String {
        let mut out = format!(
            "\nInstructions per session of our processes (callgrind, a cluster of its own: {} sessions at {}/s in a {:.1} s window; idle work measured over {:.1} s and taken out; phase {:.0} s):\n\n| process | per session | window total | idle per second |\n|---|---:|---:|---:|\n",
            self.sessions, self.rate, self.window_seconds, self.idle_seconds, self.phase_seconds
        );
        for p in &self.processes {
            out.push_str(&format!(
                "| {} | {:.0} | {} | {:.0} |\n",
                p.process, p.per_session, p.window, p.idle_per_second
            ));
        }
        out.push_str(&format!("| all | {:.0} | | |\n", self.per_session));
        out
    }
}

/// Whether every JetStream consumer of the nats-server at `monitor` has nothing pending and
/// nothing unacknowledged (`/jsz`): the events of the window have all been read.
async fn consumers_drained(http: &reqwest::Client, monitor: &str) -> Result<bool, String> {
    let url = format!("{monitor}/jsz?accounts=true&streams=true&consumers=true");
    let jsz: serde_json::Value = http
        .get(&url)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET {url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let empty = Vec::new();
    let list = |v: &serde_json::Value, k: &str| v[k].as_array().unwrap_or(&empty).clone();
    for account in list(&jsz, "account_details") {
        for stream in list(&account, "stream_detail") {
            for c in list(&stream, "consumer_detail") {
                let pending = c["num_pending"].as_u64().unwrap_or(0);
                let unacked = c["num_ack_pending"].as_u64().unwrap_or(0);
                if pending + unacked > 0 {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// Sessions at `rate` for `n` of them; the finished ones, or the first error.
async fn sessions(
    api: &Api,
    tenancy: &crate::client::Tenancy,
    rate: u32,
    n: usize,
    plan: &Plan,
) -> Result<FixedRate, LoadError> {
    let duration = Duration::from_secs_f64(n as f64 / f64::from(rate.max(1)));
    let deadline = Instant::now() + duration + plan.phase_timeout();
    let fr = fixed_rate(api, tenancy, rate.max(1), duration, n.max(1), deadline).await;
    let failed: Vec<&String> = fr
        .sessions
        .iter()
        .filter_map(|s| s.error.as_ref())
        .collect();
    if let Some(e) = failed.first() {
        return Err(LoadError::Process(format!(
            "instruction phase: {} of {} sessions failed, e.g. {e}",
            failed.len(),
            fr.started
        )));
    }
    if fr.unfinished > 0 || fr.shed > 0 {
        return Err(LoadError::Timeout(format!(
            "instruction phase: {} sessions unfinished and {} shed under callgrind",
            fr.unfinished, fr.shed
        )));
    }
    Ok(fr)
}

/// Every sandbox of `fr` terminated, then every consumer drained (bounded by the plan's
/// phase timeout).
async fn settled(
    cluster: &Cluster,
    fr: &FixedRate,
    http: &reqwest::Client,
    plan: &Plan,
) -> Result<(), LoadError> {
    let deadline = Instant::now() + plan.phase_timeout();
    let ids: Vec<String> = fr.sessions.iter().filter_map(|s| s.id.clone()).collect();
    wait_all(cluster.db.store().pool(), &ids, "terminated", deadline).await?;
    let monitor = format!("http://127.0.0.1:{}", cluster.nats_monitor_port);
    loop {
        match consumers_drained(http, &monitor).await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(LoadError::Process(format!("instruction phase: {e}"))),
        }
        if Instant::now() > deadline {
            return Err(LoadError::Timeout(
                "instruction phase: JetStream consumers still had pending messages".to_owned(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Starts a cluster under callgrind, runs `plan.instruction_sessions` sessions at
/// `plan.instruction_rate` after a two-session warm-up, and counts the instructions each
/// process executed for them.
pub async fn measure(plan: &Plan) -> Result<Instructions, LoadError> {
    if let Some(why) = unavailable_reason() {
        return Err(LoadError::Preflight(why));
    }
    let t0 = Instant::now();
    let profiles = tempfile::Builder::new()
        .prefix("differently-callgrind-")
        .tempdir()
        .map_err(|e| LoadError::io("creating a temporary directory", e))?;
    let n = plan.instruction_sessions;
    let cluster = Cluster::start(ClusterOpts {
        binary: plan.binary.clone(),
        latency_ms: plan.latency_ms,
        max_active: u32::try_from(n * 2 + 100).unwrap_or(u32::MAX),
        database_max_connections: plan.database_max_connections,
        extra_capabilities: Vec::new(),
        pool_lines: String::new(),
        log_level: plan.log_level.clone(),
        wrapper: wrapper(profiles.path()),
    })
    .await?;
    let api = Api::new(cluster.url())?;
    let tenancy = provision(&api, &cluster.key, 1).await?;
    let http = reqwest::Client::new();
    // First use of every path (lazy statics, pool connections, prepared statements) is not
    // what a session costs.
    let warm = sessions(&api, &tenancy, plan.instruction_rate, 2, plan).await?;
    settled(&cluster, &warm, &http, plan).await?;
    let pids = cluster.pids();
    zero(&pids)?;
    let window = Instant::now();
    let fr = sessions(&api, &tenancy, plan.instruction_rate, n, plan).await?;
    settled(&cluster, &fr, &http, plan).await?;
    let counted = read(&pids)?;
    let window_seconds = window.elapsed().as_secs_f64();
    if let Some(dir) = &plan.callgrind_dir {
        keep_profiles(&pids, profiles.path(), dir)?;
    }
    zero(&pids)?;
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_secs(plan.instruction_idle_seconds)).await;
    let idle = read(&pids)?;
    let idle_seconds = quiet.elapsed().as_secs_f64();
    let mut cluster = cluster;
    cluster.check_alive()?;
    let completed = fr.sessions.len() as u64;
    let per = completed.max(1) as f64;
    let mut processes: Vec<ProcessInstructions> = counted
        .iter()
        .map(|(name, &w)| {
            let rate = idle.get(name).copied().unwrap_or(0) as f64 / idle_seconds.max(1e-9);
            ProcessInstructions {
                process: name.clone(),
                window: w,
                idle_per_second: rate,
                per_session: (w as f64 - rate * window_seconds) / per,
            }
        })
        .collect();
    processes.sort_by(|a, b| b.per_session.total_cmp(&a.per_session));
    Ok(Instructions {
        sessions: completed,
        rate: plan.instruction_rate,
        window_seconds,
        idle_seconds,
        per_session: processes.iter().map(|p| p.per_session).sum(),
        processes,
        phase_seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_totals;

    #[test]
    fn thread_totals_sum_and_bad_output_is_an_error() {
        let text = "PID 42: /usr/bin/differently server\n\n  Totals:         Ir \n   Th 1      113,300 \n   Th 2  869,472,832 \n";
        assert_eq!(parse_totals(text), Ok(869_586_132));
        assert!(parse_totals("No active callgrind runs detected.").is_err());
        assert!(parse_totals("   Th 1  lots\n").is_err_and(|e| e.contains("lots")));
    }
}
