//! Instructions retired by our role processes over a phase, from `perf stat -e instructions`
//! attached to their pids: a count that does not move with the shared machine's noise the way
//! CPU seconds do (issue #47). Where the CPU's counter is not exposed (a VM without a PMU),
//! the figure is reported as not measured, with the reason, never as zero.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::LoadError;

/// Why instructions cannot be counted here, or `None` when `perf stat -e instructions` counts.
pub fn unsupported_reason() -> Option<String> {
    let out = match Command::new("perf")
        .args(["stat", "-x", ",", "-e", "instructions", "true"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => return Some(format!("perf is not installed ({e})")),
    };
    let text = String::from_utf8_lossy(&out.stderr);
    match parse_count(&text) {
        Ok(_) if out.status.success() => None,
        Ok(_) => Some(format!("perf stat failed: {}", text.trim())),
        Err(e) => Some(e),
    }
}

/// The instruction count from `perf stat -x ,` output: its `instructions` line is
/// `COUNT,UNIT,EVENT,…`, where COUNT is `<not supported>` or `<not counted>` when the counter
/// is unavailable.
pub fn parse_count(csv: &str) -> Result<u64, String> {
    let line = csv
        .lines()
        .find(|l| {
            l.split(',')
                .nth(2)
                .is_some_and(|e| e.starts_with("instructions"))
        })
        .ok_or_else(|| format!("perf stat printed no instructions line: {}", csv.trim()))?;
    let count = line.split(',').next().unwrap_or_default().trim();
    count.parse::<u64>().map_err(|_| {
        format!(
            "perf stat: instructions {count} (the CPU's instruction counter is not exposed here)"
        )
    })
}

/// A running `perf stat` attached to some processes.
pub struct InstructionMeter {
    child: Child,
    out: PathBuf,
}

impl InstructionMeter {
    /// Attaches `perf stat -e instructions` to `pids`, writing its CSV to `out`.
    pub fn start(pids: &[u32], out: &Path) -> Result<InstructionMeter, LoadError> {
        let list: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", "instructions", "-o"])
            .arg(out)
            .args(["-p", &list.join(",")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| LoadError::io("spawning perf stat", e))?;
        Ok(InstructionMeter {
            child,
            out: out.to_owned(),
        })
    }

    /// Stops `perf stat` (SIGINT, which makes it print its counts; bounded wait) and returns
    /// the instructions counted, or why there is no count.
    pub async fn finish(mut self) -> Result<u64, String> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-INT", &pid]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out)
            .map_err(|e| format!("reading perf stat's output {}: {e}", self.out.display()))?;
        parse_count(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn counts_and_unsupported_counters_parse() {
        let ok =
            "# started on Sun Dec  6 10:00:00 2026\n\n123456789,,instructions,2000000,100.00,,\n";
        assert_eq!(parse_count(ok), Ok(123_456_789));
        let vm = "<not supported>,,instructions,0,100.00,,\n";
        assert!(parse_count(vm).is_err_and(|e| e.contains("<not supported>")));
        assert!(parse_count("").is_err());
    }
}
