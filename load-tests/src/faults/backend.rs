//! S14's out-of-process backend: the fake OpenSandbox server (`differently-fake-opensandbox`)
//! running inside a network namespace of the suite's own ([`Netns`]), registered as the
//! `opensandbox` pool `os`. Its own ledger (every create and delete it served) and its own
//! list of live sandboxes are the ground truth for that pool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::faults::netns::Netns;
use crate::faults::procs::Spawned;
use crate::faults::topology::random_hex32;
use crate::LoadError;

/// The environment variable every role process reads the fake's API key from.
pub const KEY_ENV: &str = "DIFFERENTLY_FAULTS_OPENSANDBOX_KEY";

/// The pool's name in the config (and in `sandboxes.pool`).
pub const POOL: &str = "os";

/// The fake server's binary next to `differently` (cargo builds both into one directory).
pub fn binary_next_to(differently: &Path) -> PathBuf {
    differently
        .parent()
        .map(|d| d.join("differently-fake-opensandbox"))
        .unwrap_or_else(|| PathBuf::from("differently-fake-opensandbox"))
}

/// The running backend. Field order is drop order: the process, then the namespace.
pub struct OsBackend {
    /// The fake server, inside the namespace.
    pub proc: Spawned,
    /// The namespace and its link.
    pub net: Netns,
    /// `http://10.213.X.2:PORT/v1`.
    pub api_url: String,
    /// Its ledger (fake-adapter ledger lines).
    pub ledger: PathBuf,
    /// The API key it accepts (random per run; only in the environment of our processes).
    pub key: String,
}

impl OsBackend {
    /// Makes the namespace, starts the fake in it, waits until it answers from the host.
    pub async fn start(binary: &Path, dir: &Path) -> Result<OsBackend, LoadError> {
        if !binary.is_file() {
            return Err(LoadError::Preflight(format!(
                "{} is missing: build it with `cargo build -p differently-load-tests --bin \
                 differently-fake-opensandbox`",
                binary.display()
            )));
        }
        let net = Netns::create(0)?;
        let key = random_hex32()?;
        let ledger = dir.join("opensandbox-ledger.jsonl");
        let ready = dir.join("opensandbox-ready.json");
        let (program, args) = net.wrap(
            &binary.display().to_string(),
            vec![
                "--listen".to_owned(),
                net.ns_ip.to_string(),
                "--ledger".to_owned(),
                ledger.display().to_string(),
                "--ready".to_owned(),
                ready.display().to_string(),
            ],
        );
        let mut proc = Spawned::start(
            Path::new(&program),
            args,
            vec![("FAKE_OPENSANDBOX_API_KEY".to_owned(), key.clone())],
            dir.join("opensandbox.log"),
            &[],
        )?;
        let deadline = Instant::now() + Duration::from_secs(15);
        let api_url = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if let Some(u) = v["api"].as_str() {
                    break u.to_owned();
                }
            }
            if let Some(s) = proc.exited() {
                return Err(LoadError::Process(format!(
                    "the fake OpenSandbox exited with {s}: {}",
                    std::fs::read_to_string(dir.join("opensandbox.log")).unwrap_or_default()
                )));
            }
            if Instant::now() > deadline {
                return Err(LoadError::Timeout(
                    "the fake OpenSandbox did not come up in 15 s".to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        net.require_target(&api_url)?;
        let b = OsBackend {
            proc,
            net,
            api_url,
            ledger,
            key,
        };
        // Reachable from the host through the link before anything depends on it.
        b.live_refs().await?;
        Ok(b)
    }

    /// The `[[pools]]` block of the config: preferred over the in-process fake (cheaper; the
    /// fake pool is given a cost), with short client timeouts so a cut link shows at once.
    pub fn pool_toml(&self) -> String {
        format!(
            r#"[[pools]]
name = "{POOL}"
kind = "opensandbox"
trust = "private"
cost_per_cpu_hour = 0.0

[pools.settings]
apiURL = "{url}"
trust = "private"
apiKeyEnv = "{KEY_ENV}"
timeouts = {{ requestSeconds = 2, createSeconds = 4, readySeconds = 4, pollMillis = 50 }}

"#,
            url = self.api_url
        )
    }

    /// The fake's own list of live sandboxes (its ids), read through the link.
    pub async fn live_refs(&self) -> Result<BTreeSet<String>, LoadError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| LoadError::http("client", e))?;
        let mut out = BTreeSet::new();
        for page in 1..=1000u32 {
            let url = format!("{}/sandboxes?page={page}&pageSize=100", self.api_url);
            self.net.require_target(&url)?;
            let r = http
                .get(&url)
                .header("open-sandbox-api-key", &self.key)
                .send()
                .await
                .map_err(|e| LoadError::http("listing the fake OpenSandbox", e))?;
            let v: serde_json::Value = r
                .json()
                .await
                .map_err(|e| LoadError::http("reading the fake OpenSandbox's list", e))?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            for s in &items {
                if let Some(id) = s["id"].as_str() {
                    out.insert(id.to_owned());
                }
            }
            if v["pagination"]["hasNextPage"] != true || items.is_empty() {
                break;
            }
        }
        Ok(out)
    }
}
