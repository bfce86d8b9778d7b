//! Settings of an `e2b` pool: what an operator writes ([`E2bConfig`], every key optional so the
//! registry can name a badly typed key) and what the adapter runs on ([`Settings`], validated,
//! with the API key's reference checked; the key itself is read at call time).

use std::time::Duration;

use serde::Deserialize;

use super::addressing::Envd;
use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url, ConfigError};

/// How port URLs are handed out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ports {
    /// Sandboxes are created with `allowPublicTraffic: false`; no port URLs (E2B's need a
    /// traffic token header, which would hand out a credential).
    #[default]
    None,
    /// Sandbox URLs (`https://<port>-<id>.<domain>`) are public: anyone with one reaches it.
    Public,
}

/// Outbound network policy sent with every sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Egress {
    /// No policy: E2B's default (internet access).
    #[default]
    Public,
    /// `allow_internet_access: false`.
    None,
    /// Deny `0.0.0.0/0` but the `egressAllow` entries (CIDRs, IPs or domains).
    Allowlist,
}

/// How the API key is written in its header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthScheme {
    /// The bare key (E2B's `X-API-Key: e2b_…`).
    #[default]
    None,
    /// `Bearer <key>` (the header defaults to `Authorization`).
    Bearer,
}

crate::kit::timeouts! {
    /// Ordinary control-plane and envd calls (default 30).
    request_seconds: from_secs(30),
    /// The create call, which answers once the microVM runs (default 120).
    create_seconds: from_secs(120),
    /// Waiting for envd to answer after create or resume (default 60).
    ready_seconds: from_secs(60),
    /// Longest silence on an exec stream; envd sends keep-alives (default 90).
    stream_idle_seconds: from_secs(90),
    /// Longest gap between readiness polls, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of an `e2b` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct E2bConfig {
        /// The control-plane API (default `https://api.e2b.app`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// Base domain of sandbox hosts (default `e2b.app`; the create answer's `domain` wins).
        pub domain: Option<String>,
        /// Reach every sandbox's envd at this one URL with `E2b-Sandbox-Id`/`E2b-Sandbox-Port`
        /// headers instead of at a host per sandbox (E2B Embed's client-proxy, a self-hosted edge).
        #[serde(rename = "envdURL", alias = "envdUrl")]
        pub envd_url: Option<String>,
        /// envd's base URL per sandbox, with `{port}`, `{sandboxId}` and `{domain}` (default
        /// `https://{port}-{sandboxId}.{domain}`, E2B's cloud).
        pub envd_host: Option<String>,
        /// Dial this `host:port` for every envd call, sending the `envdHost` name as `Host`
        /// (a proxy reached without wildcard DNS; `http://` patterns only).
        pub envd_connect_to: Option<String>,
        /// The header the API key goes in (default `X-API-Key`; `Authorization` with `bearer`).
        pub auth_header: Option<String>,
        /// `none` (default: the bare key) or `bearer`.
        pub auth_scheme: Option<AuthScheme>,
        /// Template a sandbox without one starts from (default `base`).
        pub template: Option<String>,
        /// Linux user commands run as and files belong to (default `user`).
        pub user: Option<String>,
        /// The plan's longest sandbox lifetime in seconds (default 3600, the Hobby plan; Pro
        /// is 86400): a longer TTL is refused at create rather than killed early by E2B.
        pub max_timeout_seconds: Option<u64>,
        /// `none` (default) or `public`.
        pub ports: Option<Ports>,
        /// `public` (default), `none` or `allowlist`.
        pub egress: Option<Egress>,
        /// Destinations allowed with `egress: allowlist`.
        pub egress_allow: Option<Vec<String>>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Without a trailing slash.
    pub api_url: String,
    pub domain: String,
    /// How envd is addressed.
    pub envd: Envd,
    /// The API key's header and scheme.
    pub auth_header: String,
    pub auth_scheme: AuthScheme,
    pub template: String,
    pub user: String,
    pub max_timeout_seconds: u64,
    pub ports: Ports,
    pub egress: Egress,
    pub egress_allow: Vec<String>,
    pub request_timeout: Duration,
    pub create_timeout: Duration,
    pub ready_timeout: Duration,
    pub stream_idle: Duration,
    pub poll_interval: Duration,
    /// Where the API key is read from, at call time.
    pub credential: CredentialRef,
    /// The key as read at validation (env and file references).
    pub initial_key: Option<Secret>,
}

impl E2bConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = base_url(
            "apiURL",
            self.api_url.as_deref().unwrap_or("https://api.e2b.app"),
        )?;
        let domain = self
            .domain
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .unwrap_or("e2b.app")
            .to_owned();
        if !is_host(&domain) {
            return bad("domain", format!("`{domain}` is not a host name"));
        }
        let envd = Envd::validate(
            self.envd_host.as_deref(),
            self.envd_url.as_deref(),
            self.envd_connect_to.as_deref(),
            &api_url,
            &domain,
        )?;
        let auth_scheme = self.auth_scheme.unwrap_or_default();
        let auth_header = match (self.auth_header.as_deref().map(str::trim), auth_scheme) {
            (None | Some(""), AuthScheme::None) => "X-API-Key".to_owned(),
            (None | Some(""), AuthScheme::Bearer) => "Authorization".to_owned(),
            (Some(h), _) if reqwest::header::HeaderName::from_bytes(h.as_bytes()).is_err() => {
                return bad("authHeader", format!("`{h}` is not a header name"))
            }
            (Some(h), _)
                if [
                    "x-access-token",
                    "e2b-sandbox-id",
                    "e2b-sandbox-port",
                    "host",
                ]
                .contains(&h.to_ascii_lowercase().as_str()) =>
            {
                return bad("authHeader", format!("`{h}` is a header envd routing uses"))
            }
            (Some(h), _) => h.to_owned(),
        };
        let template = match self.template.as_deref().map(str::trim) {
            None | Some("") => "base".to_owned(),
            Some(t) if t.chars().any(|c| c.is_whitespace() || c == '?' || c == '#') => {
                return bad("template", "a template id or alias has no whitespace")
            }
            Some(t) => t.to_owned(),
        };
        let user = match self.user.as_deref().map(str::trim) {
            None | Some("") => "user".to_owned(),
            Some(u) if u.contains(':') || u.chars().any(char::is_whitespace) => {
                return bad("user", "a Linux user name has no `:` or whitespace")
            }
            Some(u) => u.to_owned(),
        };
        let max_timeout_seconds = match self.max_timeout_seconds.unwrap_or(3600) {
            n if n < 60 => return bad("maxTimeoutSeconds", "must be at least 60"),
            n => n,
        };
        let egress = self.egress.unwrap_or_default();
        let egress_allow = self.egress_allow.clone().unwrap_or_default();
        match egress {
            Egress::Allowlist if egress_allow.is_empty() => {
                return bad("egressAllow", "required with egress `allowlist`")
            }
            Egress::Public | Egress::None if !egress_allow.is_empty() => {
                return bad("egressAllow", "only with egress `allowlist`")
            }
            _ => {}
        }
        if let Some(bad_entry) = egress_allow
            .iter()
            .find(|e| e.is_empty() || e.chars().any(|c| c.is_whitespace() || c == ','))
        {
            return bad(
                "egressAllow",
                format!("`{bad_entry}` is not a CIDR, IP or domain"),
            );
        }
        let t = &self.timeouts;
        let request_timeout = t.request_seconds()?;
        let create_timeout = t.create_seconds()?;
        let ready_timeout = t.ready_seconds()?;
        let stream_idle = t.stream_idle_seconds()?;
        let poll_interval = t.poll_millis()?;
        let (credential, initial_key) = self.credential()?;
        Ok(Settings {
            api_url,
            domain,
            envd,
            auth_header,
            auth_scheme,
            template,
            user,
            max_timeout_seconds,
            ports: self.ports.unwrap_or_default(),
            egress,
            egress_allow,
            request_timeout,
            create_timeout,
            ready_timeout,
            stream_idle,
            poll_interval,
            credential,
            initial_key,
        })
    }
}

fn is_host(s: &str) -> bool {
    s.len() <= 253
        && s.split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_plain() {
        assert_eq!(
            base_url("f", "https://api.e2b.app/").as_deref(),
            Ok("https://api.e2b.app")
        );
        assert!(base_url("f", "ftp://x").is_err());
        assert!(base_url("f", "https://u:p@x").is_err());
        assert!(base_url("f", "https://x/?a=b").is_err());
        assert!(is_host("e2b.app") && !is_host("e2b..app") && !is_host("a b"));
    }
}
