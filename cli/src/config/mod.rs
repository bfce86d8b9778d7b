//! Server configuration: a TOML file, then `DIFFERENTLY_*` environment variables on top,
//! validated at start with errors that name the field.

mod load;
mod pools;
mod sections;
#[cfg(test)]
mod tests;
mod validate;
mod webhooks;

use std::time::Duration;

use serde::Deserialize;

pub use pools::PoolSection;
pub use sections::{
    ApiSection, AuditSection, BusSection, E2bSection, MetricsSection, SchedulerSection,
    WorkerSection,
};
pub use webhooks::WebhooksSection;

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config: {field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Postgres URL (`DIFFERENTLY_DATABASE_URL`). Never logged: it may hold a password.
    pub database_url: Option<String>,
    /// NATS URL (`DIFFERENTLY_NATS_URL`).
    pub nats_url: Option<String>,
    /// The members of a NATS cluster as an array (instead of a comma list in `nats_url`).
    pub nats_urls: Vec<String>,
    /// API listen address (`DIFFERENTLY_LISTEN`).
    pub listen: String,
    /// The bootstrap admin key (`DIFFERENTLY_BOOTSTRAP_KEY`); prefer the environment.
    pub bootstrap_key: Option<String>,
    pub database_max_connections: u32,
    pub bus: BusSection,
    pub scheduler: SchedulerSection,
    pub worker: WorkerSection,
    /// Installation-wide quota defaults (`[quota]`, same fields as the quota API, camelCase).
    pub quota: differently_core::tenancy::Quota,
    pub api: ApiSection,
    pub pools: Vec<PoolSection>,
    pub audit: AuditSection,
    pub metrics: MetricsSection,
    pub webhooks: WebhooksSection,
    pub e2b: E2bSection,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: None,
            nats_url: None,
            nats_urls: vec![],
            listen: "127.0.0.1:8080".into(),
            bootstrap_key: None,
            database_max_connections: 16,
            bus: BusSection::default(),
            scheduler: SchedulerSection::default(),
            worker: WorkerSection::default(),
            quota: Default::default(),
            api: ApiSection::default(),
            pools: vec![],
            audit: AuditSection::default(),
            metrics: MetricsSection::default(),
            webhooks: WebhooksSection::default(),
            e2b: E2bSection::default(),
        }
    }
}

impl Config {
    /// The database URL, or an error naming how to set it.
    pub fn require_database_url(&self) -> Result<&str, ConfigError> {
        self.database_url
            .as_deref()
            .ok_or_else(|| invalid("database_url", "required (or set DIFFERENTLY_DATABASE_URL)"))
    }

    /// The NATS URL, or an error naming how to set it.
    pub fn require_nats_url(&self) -> Result<String, ConfigError> {
        if !self.nats_urls.is_empty() {
            if self.nats_url.is_some() {
                return Err(invalid(
                    "nats_urls",
                    "set either nats_url (or DIFFERENTLY_NATS_URL) or nats_urls, not both",
                ));
            }
            return Ok(self.nats_urls.join(","));
        }
        self.nats_url
            .clone()
            .ok_or_else(|| invalid("nats_url", "required (or set DIFFERENTLY_NATS_URL)"))
    }

    /// The bootstrap key, or an error naming how to set it.
    pub fn require_bootstrap_key(&self) -> Result<&str, ConfigError> {
        self.bootstrap_key.as_deref().ok_or_else(|| {
            invalid(
                "bootstrap_key",
                "required for the api role (or set DIFFERENTLY_BOOTSTRAP_KEY)",
            )
        })
    }

    /// How the bus connects: replicas and the ping interval from `[bus]`.
    pub fn bus_connect_options(&self) -> differently_bus::jetstream::ConnectOptions {
        differently_bus::jetstream::ConnectOptions {
            replicas: self.bus.replicas,
            ping_interval: Duration::from_millis(self.bus.ping_interval_ms),
            connect_timeout: Duration::from_millis(self.bus.connect_timeout_ms),
            // Validated at load; a config that fails here never reached a caller.
            auth: self
                .bus_auth()
                .unwrap_or(differently_bus::jetstream::NatsAuth::None),
            ca_bundle: self.bus.ca_bundle.clone(),
        }
    }

    /// The one NATS credential `[bus]` names, or an error naming the fields in conflict.
    fn bus_auth(&self) -> Result<differently_bus::jetstream::NatsAuth, ConfigError> {
        use differently_bus::jetstream::NatsAuth;
        let b = &self.bus;
        let mut chosen = vec![];
        if let Some(var) = &b.token_env {
            chosen.push(("bus.token_env", NatsAuth::TokenEnv(var.clone())));
        }
        match (&b.user, &b.password_env) {
            (Some(user), Some(var)) => chosen.push((
                "bus.user",
                NatsAuth::UserPassword {
                    user: user.clone(),
                    password_env: var.clone(),
                },
            )),
            (Some(_), None) => return Err(invalid("bus.password_env", "required with bus.user")),
            (None, Some(_)) => return Err(invalid("bus.user", "required with bus.password_env")),
            (None, None) => {}
        }
        if let Some(path) = &b.credentials_file {
            chosen.push((
                "bus.credentials_file",
                NatsAuth::CredentialsFile(path.clone()),
            ));
        }
        if let Some(path) = &b.nkey_seed_file {
            chosen.push(("bus.nkey_seed_file", NatsAuth::NkeySeedFile(path.clone())));
        }
        match chosen.len() {
            0 => Ok(NatsAuth::None),
            1 => Ok(chosen.remove(0).1),
            _ => Err(invalid(
                chosen[1].0,
                format!(
                    "only one NATS credential may be set ({} too)",
                    chosen.iter().map(|c| c.0).collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    /// Ack wait as a duration.
    pub fn ack_wait(&self) -> Duration {
        Duration::from_secs(self.bus.ack_wait_seconds)
    }
}
