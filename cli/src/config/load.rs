//! Layering: the file, then the environment on top; `load` then validates.

use std::path::Path;

use super::{invalid, Config, ConfigError};

impl Config {
    /// Reads `path` (if given), applies the environment, and validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut config = match path {
            None => Config::default(),
            Some(p) => {
                let shown = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: shown,
                    message: e.to_string(),
                })?
            }
        };
        config.apply_env(|k| std::env::var(k).ok())?;
        config.validate()?;
        Ok(config)
    }

    pub(super) fn apply_env(
        &mut self,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(v) = get("DIFFERENTLY_DATABASE_URL") {
            self.database_url = Some(v);
        }
        if let Some(v) = get("DIFFERENTLY_NATS_URL") {
            self.nats_url = Some(v);
            // The environment overrides the file, its array form included.
            self.nats_urls.clear();
        }
        if let Some(v) = get("DIFFERENTLY_LISTEN") {
            self.listen = v;
        }
        if let Some(v) = get("DIFFERENTLY_BOOTSTRAP_KEY") {
            self.bootstrap_key = Some(v);
        }
        if let Some(v) = get("DIFFERENTLY_BUS_PREFIX") {
            self.bus.prefix = v;
        }
        if let Some(v) = get("DIFFERENTLY_METRICS_LISTEN").filter(|v| !v.is_empty()) {
            self.metrics.listen = Some(v);
        }
        self.webhooks.apply_env(&get)?;
        if let Some(v) = get("DIFFERENTLY_E2B_DOMAIN") {
            // Set and empty turns DNS mode off, whatever the file says.
            self.e2b.domain = Some(v).filter(|d| !d.trim().is_empty());
        }
        if let Some(v) = get("DIFFERENTLY_DIRECT_PLACEMENT") {
            self.api.direct_placement = v.parse().map_err(|_| {
                invalid(
                    "api.direct_placement",
                    format!("DIFFERENTLY_DIRECT_PLACEMENT is {v:?}, expected true or false"),
                )
            })?;
        }
        Ok(())
    }
}
