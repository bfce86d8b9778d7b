//! Resident set size of processes from `/proc/<pid>/status`, and a sampler that keeps the
//! peak per process during a load phase.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

/// `VmRSS` of `pid` in KiB; `None` if the process is gone or the file is unreadable.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&text)
}

/// Extracts `VmRSS:   1234 kB` from a `/proc/<pid>/status` text.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Samples the RSS of named processes every `every` until stopped; keeps the peak.
pub struct Sampler {
    peaks: Arc<Mutex<BTreeMap<String, u64>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling `procs` (name, pid).
    pub fn start(procs: Vec<(String, u32)>, every: Duration) -> Sampler {
        let peaks: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let (stop, mut rx) = watch::channel(false);
        let p = peaks.clone();
        let task = tokio::spawn(async move {
            loop {
                for (name, pid) in &procs {
                    if let Some(kib) = rss_kib(*pid) {
                        let mut m = p.lock().unwrap_or_else(|e| e.into_inner());
                        let e = m.entry(name.clone()).or_insert(0);
                        *e = (*e).max(kib);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = rx.changed() => return,
                }
            }
        });
        Sampler { peaks, stop, task }
    }

    /// Stops sampling and returns the peak RSS (KiB) per process.
    pub async fn finish(self) -> BTreeMap<String, u64> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let m = self.peaks.lock().unwrap_or_else(|e| e.into_inner());
        m.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_rss() {
        let s = "Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t   2345 kB\nThreads: 3\n";
        assert_eq!(parse_vm_rss(s), Some(2345));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(rss_kib(std::process::id()).is_some());
    }
}
