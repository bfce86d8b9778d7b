//! Settings of a `daytona` pool: what an operator writes (`DaytonaConfig`, every key optional so
//! the registry can name a badly typed key) and what the adapter runs on after validation
//! (`Settings`, the API key's reference checked; the key itself is read at call time).

use std::time::Duration;

use serde::Deserialize;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url_or, ca_bundle, opt_bool, opt_u64, ConfigError};

/// Daytona Cloud's API.
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";
/// Daytona Cloud's toolbox proxy (the in-sandbox API, `{toolboxURL}/{sandboxId}/…`).
pub const DEFAULT_TOOLBOX_URL: &str = "https://proxy.app.daytona.io/toolbox";

/// Outbound network of the sandboxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// Whatever the Daytona organization allows.
    #[default]
    Public,
    /// `networkBlockAll`: no network access at all.
    None,
}

crate::kit::timeouts! {
    /// Ordinary API and toolbox calls (default 30).
    request_seconds: from_secs(30),
    /// Waiting for `started` and the toolbox after create, start or resume (default 180).
    ready_seconds: from_secs(180),
    /// Longest gap between state and log polls, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of a `daytona` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct DaytonaConfig {
        /// The main API (default Daytona Cloud, `https://app.daytona.io/api`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// The toolbox proxy (default `https://proxy.app.daytona.io/toolbox`); the API key is
        /// sent here too, so it is configured, never taken from an answer.
        #[serde(rename = "toolboxURL", alias = "toolboxUrl")]
        pub toolbox_url: Option<String>,
        /// Sent as `X-Daytona-Organization-ID` (needed only by keys of several organizations).
        pub organization_id: Option<String>,
        /// Region to create in (`target`); Daytona's default region when absent.
        pub target: Option<String>,
        /// Snapshot sandboxes start from when the sandbox names no template (Daytona's default
        /// snapshot when absent). With a snapshot Daytona refuses resources: it sets the size.
        pub snapshot: Option<String>,
        /// Whether the pool's sandboxes can pause (Daytona pauses VM-class sandboxes only).
        #[serde(deserialize_with = "opt_bool")]
        pub pause: Option<bool>,
        /// `public` (default) or `none` (`networkBlockAll`).
        pub egress: Option<Egress>,
        /// Lifetime of a signed preview URL when the caller gives none (default 3600).
        #[serde(
            rename = "portURLSeconds",
            alias = "portUrlSeconds",
            deserialize_with = "opt_u64"
        )]
        pub port_url_seconds: Option<u64>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
    ca_bundle("PEM file of extra CA certificates (a self-hosted Daytona behind a private CA).")
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_url: String,
    pub toolbox_url: String,
    pub organization_id: Option<String>,
    pub target: Option<String>,
    pub snapshot: Option<String>,
    pub pause: bool,
    pub egress: Egress,
    pub port_url_seconds: u64,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    pub ready_timeout: Duration,
    pub poll_interval: Duration,
    /// Where the API key is read from, at call time.
    pub credential: CredentialRef,
    /// The key as read at validation (env and file references).
    pub initial_key: Option<Secret>,
}

impl DaytonaConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = base_url_or("apiURL", self.api_url.as_deref(), DEFAULT_API_URL)?;
        let toolbox_url = base_url_or(
            "toolboxURL",
            self.toolbox_url.as_deref(),
            DEFAULT_TOOLBOX_URL,
        )?;
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let nonblank = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
        let organization_id = nonblank(&self.organization_id);
        if organization_id
            .as_deref()
            .is_some_and(|o| !o.bytes().all(|b| (0x21..0x7f).contains(&b)))
        {
            return bad("organizationId", "must be printable ASCII without spaces");
        }
        let t = &self.timeouts;
        let request_timeout = t.request_seconds()?;
        let ready_timeout = t.ready_seconds()?;
        let poll_interval = t.poll_millis()?;
        let port_url_seconds = match self.port_url_seconds.unwrap_or(3600) {
            n if n < 60 => return bad("portURLSeconds", "must be at least 60"),
            n => n,
        };
        let (credential, initial_key) = self.credential()?;
        Ok(Settings {
            api_url,
            toolbox_url,
            organization_id,
            target: nonblank(&self.target),
            snapshot: nonblank(&self.snapshot),
            pause: self.pause.unwrap_or(false),
            egress: self.egress.unwrap_or_default(),
            port_url_seconds,
            ca_bundle,
            request_timeout,
            ready_timeout,
            poll_interval,
            credential,
            initial_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_daytona_cloud_and_the_key_is_required() {
        let e = DaytonaConfig::default().validate().unwrap_err();
        assert_eq!(e.field, "apiKeyEnv");
        let cfg = DaytonaConfig {
            api_key_secret: Some("daytona-key".into()),
            ..Default::default()
        };
        let s = cfg.validate().unwrap();
        assert_eq!(s.api_url, DEFAULT_API_URL);
        assert_eq!(s.toolbox_url, DEFAULT_TOOLBOX_URL);
        assert_eq!(s.credential, CredentialRef::Secret("daytona-key".into()));
        assert!(!s.pause);
    }

    #[test]
    fn urls_with_credentials_or_queries_are_refused() {
        for (url, why) in [
            ("ftp://x", "http"),
            ("https://user:pw@x/api", "credentials"),
            ("https://x/api?k=v", "query"),
            ("https://", "host"),
        ] {
            let e = base_url_or("apiURL", Some(url), DEFAULT_API_URL).unwrap_err();
            assert!(e.message.contains(why), "{url}: {}", e.message);
        }
        assert_eq!(
            base_url_or("apiURL", Some("http://127.0.0.1:3000/api/"), "").unwrap(),
            "http://127.0.0.1:3000/api"
        );
    }
}
