//! Settings of a `vercel` pool ([`VercelConfig`] as written, [`Settings`] validated; the
//! token's reference is checked here and read at call time).

use std::time::Duration;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url, ConfigError};

crate::kit::timeouts! {
    /// Ordinary calls (default 30).
    request_seconds: from_secs(30),
    /// Waiting for a session to run after create or start (default 120).
    ready_seconds: from_secs(120),
    /// Longest silence on a command's output stream (default 120).
    stream_idle_seconds: from_secs(120),
    /// Longest gap between state polls, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of a `vercel` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct VercelConfig {
        /// The API (default `https://vercel.com/api`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// The team every request names (required).
        pub team_id: Option<String>,
        /// The project sandboxes belong to (required).
        pub project_id: Option<String>,
        /// Managed image for sandboxes without a template (Vercel's default when unset).
        pub image: Option<String>,
        /// Region (`iad1`, …); Vercel's default when unset.
        pub region: Option<String>,
        /// Persistent sandboxes keep their disk when stopped, so `lifecycle.stop` is offered
        /// (default true).
        pub persistent: Option<bool>,
        /// Ports opened at create; only these can be exposed (Vercel routes are fixed at create).
        pub ports: Option<Vec<u16>>,
        /// The plan's longest session in seconds (default 2700, Hobby's 45 min; Pro is 18000).
        pub max_timeout_seconds: Option<u64>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("token", "access token") { token_env, token_file, token_secret }
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_url: String,
    pub team_id: String,
    pub project_id: String,
    pub image: Option<String>,
    pub region: Option<String>,
    pub persistent: bool,
    pub ports: Vec<u16>,
    pub max_timeout_seconds: u64,
    pub request_timeout: Duration,
    pub ready_timeout: Duration,
    pub stream_idle: Duration,
    pub poll_interval: Duration,
    pub credential: CredentialRef,
    pub initial_token: Option<Secret>,
}

fn ident(field: &str, v: Option<&str>, required: bool) -> Result<Option<String>, ConfigError> {
    match v.map(str::trim).filter(|s| !s.is_empty()) {
        None if required => bad(field, "required"),
        None => Ok(None),
        Some(s)
            if s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')) =>
        {
            Ok(Some(s.to_owned()))
        }
        Some(s) => bad(field, format!("`{s}` is not an id")),
    }
}

impl VercelConfig {
    /// Checks every rule and resolves the token reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = base_url(
            "apiURL",
            self.api_url.as_deref().unwrap_or("https://vercel.com/api"),
        )?;
        let team_id = ident("teamId", self.team_id.as_deref(), true)?.unwrap_or_default();
        let project_id = ident("projectId", self.project_id.as_deref(), true)?.unwrap_or_default();
        let image = ident("image", self.image.as_deref(), false)?;
        let region = ident("region", self.region.as_deref(), false)?;
        let ports = self.ports.clone().unwrap_or_default();
        if ports.contains(&0) {
            return bad("ports", "ports are 1-65535");
        }
        if ports.len() > 4 {
            return bad("ports", "Vercel opens at most 4 ports per sandbox");
        }
        let max_timeout_seconds = match self.max_timeout_seconds.unwrap_or(2700) {
            n if n < 60 => return bad("maxTimeoutSeconds", "must be at least 60"),
            n => n,
        };
        let t = &self.timeouts;
        let request_timeout = t.request_seconds()?;
        let ready_timeout = t.ready_seconds()?;
        let stream_idle = t.stream_idle_seconds()?;
        let poll_interval = t.poll_millis()?;
        let (credential, initial_token) = self.credential()?;
        Ok(Settings {
            api_url,
            team_id,
            project_id,
            image,
            region,
            persistent: self.persistent.unwrap_or(true),
            ports,
            max_timeout_seconds,
            request_timeout,
            ready_timeout,
            stream_idle,
            poll_interval,
            credential,
            initial_token,
        })
    }
}
