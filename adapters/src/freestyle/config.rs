//! Settings of a `freestyle` pool: what an operator writes (`FreestyleConfig`, every key
//! optional so the registry can name a badly typed key) and what the adapter runs on.

use std::time::Duration;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url_or, ca_bundle, opt_u64, ConfigError};

/// Freestyle's API.
pub const DEFAULT_API_URL: &str = "https://api.freestyle.sh";
/// The public snapshot VMs start from when neither the sandbox nor the pool names one.
pub const DEFAULT_SNAPSHOT: &str = "freestyle/ubuntu";

/// Where the sandbox's environment file goes by default.
pub const DEFAULT_ENV_FILE: &str = "/etc/differently.env";

crate::kit::timeouts! {
    /// Ordinary API calls (default 30).
    request_seconds: from_secs(30),
    /// Waiting for `running` after create or start, `stopped` after stop (default 180).
    ready_seconds: from_secs(180),
    /// Longest gap between state polls, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of a `freestyle` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct FreestyleConfig {
        /// The API (default `https://api.freestyle.sh`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// Snapshot VMs start from when the sandbox names no template (default `freestyle/ubuntu`;
        /// the public `freestyle/ubuntu-sm` … `-3xl` set the size).
        pub snapshot: Option<String>,
        /// The VM firewall's rules, passed to Freestyle as written. None (the default) means the
        /// VM reaches nothing outside (seen live); ports still work.
        pub firewall_rules: Option<Vec<serde_json::Value>>,
        /// Pause the VM after this much idleness (Freestyle's `idleTimeoutSeconds`); unset: never.
        #[serde(deserialize_with = "opt_u64")]
        pub idle_timeout_seconds: Option<u64>,
        /// Where the sandbox's environment is written for every command to source (default
        /// `/etc/differently.env`; not under `/tmp`, which Freestyle empties at boot).
        pub env_file: Option<String>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
    ca_bundle("PEM file of extra CA certificates.")
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_url: String,
    pub snapshot: String,
    pub firewall_rules: Vec<serde_json::Value>,
    pub idle_timeout_seconds: Option<u64>,
    pub env_file: String,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    pub ready_timeout: Duration,
    pub poll_interval: Duration,
    pub credential: CredentialRef,
    pub initial_key: Option<Secret>,
}

impl FreestyleConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = base_url_or("apiURL", self.api_url.as_deref(), DEFAULT_API_URL)?;
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let snapshot = match self.snapshot.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_SNAPSHOT.to_owned(),
            Some(s) if s.chars().any(char::is_whitespace) => {
                return bad("snapshot", "a snapshot id or slug has no whitespace")
            }
            Some(s) => s.to_owned(),
        };
        let firewall_rules = self.firewall_rules.clone().unwrap_or_default();
        if let Some(i) = firewall_rules.iter().position(|r| !r.is_object()) {
            return bad(
                "firewallRules",
                format!("rule {i} is not an object (Freestyle's firewall rule shape)"),
            );
        }
        if self.idle_timeout_seconds == Some(0) {
            return bad(
                "idleTimeoutSeconds",
                "must be at least 1 (leave it out: never)",
            );
        }
        let env_file = match self.env_file.as_deref().map(str::trim) {
            None | Some("") => DEFAULT_ENV_FILE.to_owned(),
            Some(f) if !f.starts_with('/') || f.ends_with('/') => {
                return bad("envFile", "must be an absolute file path")
            }
            Some(f) if f.starts_with("/tmp/") => {
                return bad(
                    "envFile",
                    "Freestyle empties /tmp at boot; choose another place",
                )
            }
            Some(f)
                if f.chars()
                    .any(|c| c.is_whitespace() || c == '\'' || c == '\0') =>
            {
                return bad("envFile", "no whitespace or quotes")
            }
            Some(f) => f.to_owned(),
        };
        let t = &self.timeouts;
        let request_timeout = t.request_seconds()?;
        let ready_timeout = t.ready_seconds()?;
        let poll_interval = t.poll_millis()?;
        let (credential, initial_key) = self.credential()?;
        Ok(Settings {
            api_url,
            snapshot,
            firewall_rules,
            idle_timeout_seconds: self.idle_timeout_seconds,
            env_file,
            ca_bundle,
            request_timeout,
            ready_timeout,
            poll_interval,
            credential,
            initial_key,
        })
    }
}
