//! P6: the resident memory of `differently dev` (every role in one process, in-memory store
//! and bus, a devhost pool) after it has idled.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Serialize;

use crate::cluster::free_port;
use crate::rss::rss_kib;
use crate::LoadError;

/// What was measured.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DevRss {
    /// VmRSS after idling, KiB.
    pub rss_kib: u64,
    /// How long it idled before the reading.
    pub idle_millis: u64,
}

/// Starts `differently dev` on a free port with a temporary root, waits for its two
/// `export` lines, idles `idle`, reads VmRSS, and kills it.
pub async fn dev_idle_rss(binary: &Path, idle: Duration) -> Result<DevRss, LoadError> {
    let root = tempfile::Builder::new()
        .prefix("differently-load-dev-")
        .tempdir()
        .map_err(|e| LoadError::io("dev root", e))?;
    let port = free_port()?;
    let mut child = Command::new(binary)
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(root.path().join("sandboxes"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| LoadError::io("spawning differently dev", e))?;
    let pid = child.id();
    let stdout = child.stdout.take();
    // Reading the two lines blocks: do it off the runtime, bounded by a timeout.
    let read = tokio::task::spawn_blocking(move || {
        let mut n = 0;
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("export ") {
                    n += 1;
                }
                if n == 2 {
                    break;
                }
            }
        }
        n
    });
    let result = match tokio::time::timeout(Duration::from_secs(30), read).await {
        Ok(Ok(2)) => {
            tokio::time::sleep(idle).await;
            rss_kib(pid)
                .map(|rss_kib| DevRss {
                    rss_kib,
                    idle_millis: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
                })
                .ok_or_else(|| LoadError::Process("differently dev exited while idle".to_owned()))
        }
        _ => Err(LoadError::Process(
            "differently dev did not print its two export lines within 30 s".to_owned(),
        )),
    };
    let _ = child.kill();
    let _ = child.wait();
    result
}
