//! Settings of a `runloop` pool ([`RunloopConfig`] as written, [`Settings`] validated; the
//! API key's reference is checked here and read at call time).

use std::time::Duration;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url_or, ca_bundle, ConfigError};

/// Runloop's API.
pub const DEFAULT_API_URL: &str = "https://api.runloop.ai";

/// The domain tunnel URLs are under (`https://{port}-{key}.tunnel.runloop.ai`).
pub const DEFAULT_TUNNEL_DOMAIN: &str = "tunnel.runloop.ai";

/// The longest keep-alive Runloop accepts: 48 hours.
pub const MAX_KEEP_ALIVE_SECONDS: u64 = 172_800;

/// Runloop's named sizes (`resource_size_request`), smallest first.
pub const SIZES: [&str; 6] = ["X_SMALL", "SMALL", "MEDIUM", "LARGE", "X_LARGE", "XX_LARGE"];

crate::kit::timeouts! {
    /// Ordinary calls (default 30).
    request_seconds: from_secs(30),
    /// Waiting for a devbox to run after create or resume, or to suspend (default 300).
    ready_seconds: from_secs(300),
    /// Longest gap between retries of a status read, in milliseconds (default 500).
    poll_millis: from_millis(500),
}

crate::kit::pool_config! {
    /// Settings of a `runloop` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct RunloopConfig {
        /// The API (default `https://api.runloop.ai`).
        #[serde(rename = "apiURL", alias = "apiUrl")]
        pub api_url: Option<String>,
        /// Blueprint of devboxes created without a template: an id (`bpt_…`) or a name (the
        /// latest good build of it). Runloop's default image when unset.
        pub blueprint: Option<String>,
        /// A named size (`X_SMALL` … `XX_LARGE`) for every devbox; unset, each devbox is sized
        /// from its sandbox's resources (`CUSTOM_SIZE`).
        pub resource_size: Option<String>,
        /// `x86_64` or `arm64` (Runloop's default, x86_64, when unset).
        pub architecture: Option<String>,
        /// Runloop's shutdown backstop for every devbox, in seconds (default and most 172800).
        pub keep_alive_seconds: Option<u64>,
        /// Network policy applied to every devbox (`network_policy_id`).
        pub network_policy_id: Option<String>,
        /// Domain of tunnel URLs (default `tunnel.runloop.ai`).
        pub tunnel_domain: Option<String>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
    ca_bundle("Extra CA certificates (PEM) to trust for the API.")
}

/// Validated settings (the key inside prints as `***`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub api_url: String,
    pub blueprint: Option<String>,
    pub resource_size: Option<String>,
    pub architecture: Option<String>,
    pub keep_alive_seconds: u64,
    pub network_policy_id: Option<String>,
    pub tunnel_domain: String,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    pub ready_timeout: Duration,
    pub poll_interval: Duration,
    /// Where the API key is read from, at call time.
    pub credential: CredentialRef,
    /// The key as read at validation (env and file references).
    pub initial_key: Option<Secret>,
}

/// A trimmed, non-blank value of printable ASCII without spaces.
fn word(field: &str, v: Option<&str>) -> Result<Option<String>, ConfigError> {
    match v.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) if s.bytes().all(|b| (0x21..0x7f).contains(&b)) => Ok(Some(s.to_owned())),
        Some(s) => bad(
            field,
            format!("`{s}` must be printable ASCII without spaces"),
        ),
    }
}

/// A DNS name (letters, digits, dashes, dots), lower-cased.
fn domain(v: Option<&str>) -> Result<String, ConfigError> {
    let d = v
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_TUNNEL_DOMAIN)
        .to_ascii_lowercase();
    let ok = d
        .split('.')
        .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if ok {
        Ok(d)
    } else {
        bad("tunnelDomain", format!("`{d}` is not a DNS name"))
    }
}

impl RunloopConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let api_url = base_url_or("apiURL", self.api_url.as_deref(), DEFAULT_API_URL)?;
        let resource_size = match word("resourceSize", self.resource_size.as_deref())? {
            Some(s) if SIZES.contains(&s.to_ascii_uppercase().as_str()) => {
                Some(s.to_ascii_uppercase())
            }
            Some(s) => {
                return bad(
                    "resourceSize",
                    format!("`{s}` is not one of {}", SIZES.join(", ")),
                )
            }
            None => None,
        };
        let architecture = match word("architecture", self.architecture.as_deref())? {
            Some(a) if matches!(a.as_str(), "x86_64" | "arm64") => Some(a),
            Some(a) => return bad("architecture", format!("`{a}` is not x86_64 or arm64")),
            None => None,
        };
        let keep_alive_seconds = match self.keep_alive_seconds.unwrap_or(MAX_KEEP_ALIVE_SECONDS) {
            n if (60..=MAX_KEEP_ALIVE_SECONDS).contains(&n) => n,
            _ => {
                return bad(
                    "keepAliveSeconds",
                    format!("must be between 60 and {MAX_KEEP_ALIVE_SECONDS} (48 hours)"),
                )
            }
        };
        let t = &self.timeouts;
        let (credential, initial_key) = self.credential()?;
        Ok(Settings {
            api_url,
            blueprint: word("blueprint", self.blueprint.as_deref())?,
            resource_size,
            architecture,
            keep_alive_seconds,
            network_policy_id: word("networkPolicyId", self.network_policy_id.as_deref())?,
            tunnel_domain: domain(self.tunnel_domain.as_deref())?,
            ca_bundle: ca_bundle(self.ca_bundle.as_ref())?,
            request_timeout: t.request_seconds()?,
            ready_timeout: t.ready_seconds()?,
            poll_interval: t.poll_millis()?,
            credential,
            initial_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_key() -> RunloopConfig {
        RunloopConfig {
            api_key_secret: Some("runloop-key".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_runloop_cloud_and_the_key_is_required() {
        let e = RunloopConfig::default().validate().unwrap_err();
        assert_eq!(e.field, "apiKeyEnv");
        let s = with_key().validate().unwrap();
        assert_eq!(s.api_url, DEFAULT_API_URL);
        assert_eq!(s.tunnel_domain, DEFAULT_TUNNEL_DOMAIN);
        assert_eq!(s.keep_alive_seconds, MAX_KEEP_ALIVE_SECONDS);
        assert_eq!(s.credential, CredentialRef::Secret("runloop-key".into()));
    }

    #[test]
    fn each_refusal_names_its_field() {
        let cases = [
            (
                RunloopConfig {
                    resource_size: Some("HUGE".into()),
                    ..with_key()
                },
                "resourceSize",
            ),
            (
                RunloopConfig {
                    architecture: Some("riscv".into()),
                    ..with_key()
                },
                "architecture",
            ),
            (
                RunloopConfig {
                    keep_alive_seconds: Some(172_801),
                    ..with_key()
                },
                "keepAliveSeconds",
            ),
            (
                RunloopConfig {
                    tunnel_domain: Some("bad domain".into()),
                    ..with_key()
                },
                "tunnelDomain",
            ),
            (
                RunloopConfig {
                    api_url: Some("ftp://x".into()),
                    ..with_key()
                },
                "apiURL",
            ),
            (
                RunloopConfig {
                    blueprint: Some("a b".into()),
                    ..with_key()
                },
                "blueprint",
            ),
        ];
        for (cfg, field) in cases {
            assert_eq!(cfg.validate().unwrap_err().field, field);
        }
        let s = RunloopConfig {
            resource_size: Some("small".into()),
            ..with_key()
        }
        .validate()
        .unwrap();
        assert_eq!(s.resource_size.as_deref(), Some("SMALL"));
    }
}
