//! `[webhooks]`: where webhooks may point and how deliveries are retried, and the two
//! switches `dev` reads from the environment too.

use std::time::Duration;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[webhooks]`: where webhooks may point, and how deliveries are retried (docs/webhooks.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksSection {
    /// Allow loopback, private, link-local, CGNAT and other non-public targets
    /// (`DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE`): for receivers on the operator's own network.
    pub allow_private: bool,
    /// Allow plain `http://` URLs (`DIFFERENTLY_WEBHOOKS_ALLOW_HTTP`).
    pub allow_http: bool,
    /// Seconds one delivery request may take, connecting included.
    pub timeout_seconds: u64,
    /// Wait after the first failed attempt; it doubles per attempt, with jitter.
    pub initial_backoff_ms: u64,
    /// Longest wait between two attempts.
    pub max_backoff_seconds: u64,
    /// No attempt later than this after the event (24 h).
    pub retry_for_seconds: u64,
    /// A webhook is disabled after at least this many failed attempts in a row…
    pub disable_after_failures: u32,
    /// …that span at least this long.
    pub disable_after_seconds: u64,
    /// How long a rotated-out secret keeps signing next to the new one.
    pub rotation_overlap_seconds: u64,
    /// Requests in flight at once per worker process.
    pub concurrency: usize,
    /// A delivery is held by its claimer for `timeout_seconds` plus this; a claimer killed
    /// mid-attempt delays the retry by that long.
    pub lease_margin_seconds: u64,
}

impl Default for WebhooksSection {
    fn default() -> Self {
        WebhooksSection {
            allow_private: false,
            allow_http: false,
            timeout_seconds: 10,
            initial_backoff_ms: 5000,
            max_backoff_seconds: 7200,
            retry_for_seconds: 24 * 3600,
            disable_after_failures: 15,
            disable_after_seconds: 24 * 3600,
            rotation_overlap_seconds: 24 * 3600,
            concurrency: 8,
            lease_margin_seconds: 30,
        }
    }
}

impl WebhooksSection {
    /// The URL rules.
    pub fn url_policy(&self) -> differently_webhooks::UrlPolicy {
        differently_webhooks::UrlPolicy {
            allow_http: self.allow_http,
            allow_private: self.allow_private,
            // Only `dev` allows loopback alone (it sets this itself).
            allow_loopback: false,
        }
    }

    /// What the API needs.
    pub fn api_settings(&self) -> differently_webhooks::ApiSettings {
        differently_webhooks::ApiSettings {
            url_policy: self.url_policy(),
            rotation_overlap: Duration::from_secs(self.rotation_overlap_seconds),
        }
    }

    /// What the delivering process needs.
    pub fn delivery(&self) -> differently_webhooks::DeliveryConfig {
        differently_webhooks::DeliveryConfig {
            url_policy: self.url_policy(),
            timeout: Duration::from_secs(self.timeout_seconds),
            backoff: differently_webhooks::Backoff {
                initial: Duration::from_millis(self.initial_backoff_ms),
                max: Duration::from_secs(self.max_backoff_seconds),
                retry_for: Duration::from_secs(self.retry_for_seconds),
            },
            disable: differently_store::webhooks::DisablePolicy {
                min_failures: self.disable_after_failures,
                min_duration: chrono::Duration::seconds(
                    i64::try_from(self.disable_after_seconds).unwrap_or(i64::MAX / 1000),
                ),
            },
            concurrency: self.concurrency,
            lease_margin: Duration::from_secs(self.lease_margin_seconds.max(1)),
            ..differently_webhooks::DeliveryConfig::default()
        }
    }

    /// Reads the two switches from the environment (`dev` has no configuration file).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (var, field, slot) in [
            (
                "DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE",
                "webhooks.allow_private",
                &mut self.allow_private,
            ),
            (
                "DIFFERENTLY_WEBHOOKS_ALLOW_HTTP",
                "webhooks.allow_http",
                &mut self.allow_http,
            ),
        ] {
            if let Some(v) = get(var) {
                *slot = v.parse().map_err(|_| {
                    invalid(field, format!("{var} is {v:?}, expected true or false"))
                })?;
            }
        }
        Ok(())
    }
}
