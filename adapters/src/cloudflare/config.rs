//! Settings of a `cloudflare` pool: what an operator writes (`CloudflareConfig`, every key
//! optional so the registry can name a badly typed one) and what the adapter runs on after
//! validation (`Settings`). The bridge is a Worker each operator deploys, so its URL has no
//! default; its `SANDBOX_API_KEY` is read by reference at call time.

use std::time::Duration;

use serde::Deserialize;

use crate::credentials::CredentialRef;
use crate::http::Secret;
use crate::settings::{bad, base_url, ca_bundle, ConfigError};

/// Whether sandbox ports may be published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ports {
    /// No port URLs (`ports.expose` is not offered).
    #[default]
    None,
    /// Ports are published through the bridge's tunnels: public URLs anyone holding them
    /// can open, with no expiry and no signature.
    Public,
}

crate::kit::timeouts! {
    /// Ordinary bridge calls (default 60: the first call for a sandbox waits for its
    /// container to start).
    request_seconds: from_secs(60),
}

crate::kit::pool_config! {
    /// Settings of a `cloudflare` pool (`adapterSettings`), as written. See `docs/providers.md`.
    pub struct CloudflareConfig {
        /// The bridge Worker's URL (`https://<worker>.<account>.workers.dev`); required.
        #[serde(rename = "bridgeURL", alias = "bridgeUrl")]
        pub bridge_url: Option<String>,
        /// `none` (default) or `public` (tunnels).
        pub ports: Option<Ports>,
        /// Client timeouts.
        pub timeouts: TimeoutsConfig,
    }
    credential("apiKey", "API key") { api_key_env, api_key_file, api_key_secret }
    ca_bundle("PEM file of extra CA certificates (a bridge behind a private CA).")
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub bridge_url: String,
    pub ports: Ports,
    pub ca_bundle: Vec<reqwest::Certificate>,
    pub request_timeout: Duration,
    /// Where the API key is read from, at call time.
    pub credential: CredentialRef,
    /// The key as read at validation (env and file references).
    pub initial_key: Option<Secret>,
}

impl CloudflareConfig {
    /// Checks every rule and resolves the API key reference.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let bridge_url =
            match self.bridge_url.as_deref().map(str::trim) {
                None | Some("") => return bad(
                    "bridgeURL",
                    "the bridge Worker's URL is required (https://<worker>.<account>.workers.dev)",
                ),
                Some(u) => base_url("bridgeURL", u)?,
            };
        let ca_bundle = ca_bundle(self.ca_bundle.as_ref())?;
        let request_timeout = self.timeouts.request_seconds()?;
        let (credential, initial_key) = self.credential()?;
        Ok(Settings {
            bridge_url,
            ports: self.ports.unwrap_or_default(),
            ca_bundle,
            request_timeout,
            credential,
            initial_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_and_the_key_are_required() {
        let e = CloudflareConfig::default().validate().unwrap_err();
        assert_eq!(e.field, "bridgeURL");
        let cfg = CloudflareConfig {
            bridge_url: Some("https://bridge.example.workers.dev/".into()),
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, "apiKeyEnv");
        let cfg = CloudflareConfig {
            api_key_secret: Some("bridge-key".into()),
            ..cfg
        };
        let s = cfg.validate().unwrap();
        assert_eq!(s.bridge_url, "https://bridge.example.workers.dev");
        assert_eq!(s.ports, Ports::None);
        assert_eq!(s.request_timeout, Duration::from_secs(60));
        let e = CloudflareConfig {
            bridge_url: Some("https://k:v@bridge".into()),
            ..cfg
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.field, "bridgeURL");
    }
}
