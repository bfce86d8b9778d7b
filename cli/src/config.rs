//! Server configuration: a TOML file, then `DIFFERENTLY_*` environment variables on top,
//! validated at start with errors that name the field.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use differently_core::pool::{check_pool_bounds, validate_pool_name, PoolBounds, Trust};
use differently_core::warm::{WarmClass, WarmClasses};
use serde::Deserialize;

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
        }
    }
}

/// `[audit]`: where the keys are. Values live only in the environment, never in this file
/// or the database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    /// Environment variable holding the audit chain HMAC key (64 hex characters).
    pub key_env: String,
    /// Environment variable holding retired audit keys (64 hex characters each, separated
    /// by commas or whitespace): records they signed still verify after a rotation.
    pub previous_keys_env: String,
    /// Environment variable holding the secrets sealing key (64 hex characters).
    pub secrets_key_env: String,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            key_env: "DIFFERENTLY_AUDIT_KEY".into(),
            previous_keys_env: "DIFFERENTLY_AUDIT_PREVIOUS_KEYS".into(),
            secrets_key_env: "DIFFERENTLY_SECRETS_KEY".into(),
        }
    }
}

/// `[metrics]`: the Prometheus exporter's own listener (unauthenticated: bind it where only
/// the scraper reaches).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// `host:port` serving `/metrics` (`DIFFERENTLY_METRICS_LISTEN`); unset: no exporter.
    pub listen: Option<String>,
}

/// `[bus]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BusSection {
    /// Subject and stream prefix (`DIFFERENTLY_BUS_PREFIX`).
    pub prefix: String,
    /// Stream replicas: 1 on one server, 3 in a cluster.
    pub replicas: usize,
    /// Seconds before unacknowledged work is redelivered.
    pub ack_wait_seconds: u64,
    /// Milliseconds between the client's pings to its NATS server (50–60000); two unanswered
    /// pings and it moves to another cluster member.
    pub ping_interval_ms: u64,
    /// Milliseconds a (re)connection to one NATS server may take before the next member is
    /// tried (100–60000). A hung member accepts the TCP connection and never answers, so
    /// this is what reconnecting away from it can cost.
    pub connect_timeout_ms: u64,
    /// Environment variable holding a NATS token.
    pub token_env: Option<String>,
    /// NATS user (with `password_env`).
    pub user: Option<String>,
    /// Environment variable holding the NATS user's password.
    pub password_env: Option<String>,
    /// A NATS `.creds` file (user JWT and nkey seed).
    pub credentials_file: Option<std::path::PathBuf>,
    /// A file holding a NATS nkey seed (`SU…`), for a server that lists the user's public
    /// nkey.
    pub nkey_seed_file: Option<std::path::PathBuf>,
    /// PEM file of CA certificates for `tls://` servers; TLS is then required.
    pub ca_bundle: Option<std::path::PathBuf>,
    /// Environment variable holding the account nkey seed (`SA…`) that signs tenants' event
    /// credentials; the server's `auth_callout.issuer` is its public key. Unset: `POST
    /// /v1/events/credentials` answers 501.
    pub events_account_seed_env: Option<String>,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            prefix: "dly".into(),
            replicas: 1,
            ack_wait_seconds: 30,
            ping_interval_ms: 500,
            connect_timeout_ms: 1000,
            token_env: None,
            user: None,
            password_env: None,
            credentials_file: None,
            nkey_seed_file: None,
            ca_bundle: None,
            events_account_seed_env: None,
        }
    }
}

/// Largest `scheduler.placement_group_size`: one transaction's locks and statement sizes stay
/// bounded.
const MAX_PLACEMENT_GROUP: usize = 256;

/// `[scheduler]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub tick_ms: u64,
    pub provisioning_timeout_seconds: u64,
    pub terminating_retry_seconds: u64,
    pub repair_interval_ms: u64,
    /// Idle timeout of sandboxes that set none (`idleTimeoutSeconds`); unset: never idle.
    pub default_idle_timeout_seconds: Option<u64>,
    /// How often each pool's backend listing is reconciled against live rows.
    pub reconcile_interval_seconds: u64,
    /// Most queued sandboxes placed in one transaction (1–256).
    pub placement_group_size: usize,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            tick_ms: 250,
            provisioning_timeout_seconds: 120,
            terminating_retry_seconds: 30,
            repair_interval_ms: 2000,
            default_idle_timeout_seconds: None,
            reconcile_interval_seconds: 5,
            placement_group_size: 32,
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerSection {
    pub concurrency: usize,
    pub max_deliveries: u64,
    pub max_attempts: u32,
    /// How often each pool's workers look in the store for creates and deletes the bus did
    /// not deliver (while a stream elects a leader); 0 turns it off.
    pub scan_every_ms: u64,
    /// How long after its activation (or `terminating`) an unclaimed create (or delete)
    /// counts as not delivered.
    pub scan_after_ms: u64,
}

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection {
            concurrency: 64,
            max_deliveries: 3,
            max_attempts: 3,
            scan_every_ms: 500,
            scan_after_ms: 1000,
        }
    }
}

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

/// Longest header or body read timeout `[api]` accepts (one hour).
const MAX_READ_TIMEOUT_SECONDS: u64 = 3600;

/// `[api]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Sustained requests per second per API key (per API process).
    pub key_requests_per_second: f64,
    /// Burst per API key.
    pub key_burst: f64,
    /// Failed authentications per minute per presented key id (and, for missing or
    /// malformed keys, per client address) before that key id or address gets 429s.
    pub auth_failures_per_minute: f64,
    /// Proxies (addresses or CIDRs) whose `X-Forwarded-For` is believed: from one of these
    /// peers the client is the rightmost hop that is not itself listed. Empty: the TCP peer
    /// is the client and the header is ignored.
    pub trusted_proxies: Vec<String>,
    /// Place a create in its own admission transaction when nothing of its org waits and
    /// every eligible pool is uncapped (saves the leader's round); `false`: every create
    /// is placed by the leader.
    pub direct_placement: bool,
    /// Seconds a client may take to send a request's headers before its connection is
    /// closed (slow-header clients hold no connection for long).
    pub header_read_timeout_seconds: u64,
    /// Seconds a request body may take to arrive (a streamed upload: between two chunks);
    /// over it the request gets 408 `request_timeout` and its connection is closed.
    pub body_read_timeout_seconds: u64,
    /// Seconds a terminal (`GET /v1/sandboxes/{id}/pty`) keeps running after its WebSocket
    /// dropped, waiting for a reattach; then its program is hung up.
    pub pty_grace_seconds: u64,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            key_requests_per_second: 100.0,
            key_burst: 200.0,
            auth_failures_per_minute: 30.0,
            trusted_proxies: Vec::new(),
            direct_placement: true,
            header_read_timeout_seconds: 10,
            body_read_timeout_seconds: 30,
            pty_grace_seconds: 30,
        }
    }
}

/// `[[pools]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    pub name: String,
    pub kind: String,
    pub trust: Option<Trust>,
    pub region: Option<String>,
    pub max_concurrent: Option<u32>,
    /// Declared isolation of the backend runtime (`container` | `microvm`), reported only.
    pub isolation: Option<differently_core::policy::Isolation>,
    /// Cost model: currency units per CPU-hour (ranking by `cheapest`).
    pub cost_per_cpu_hour: Option<f64>,
    /// Speed hint: typical seconds from create to running (ranking by `fastest`).
    pub typical_create_seconds: Option<f64>,
    /// Adapter-specific settings.
    #[serde(default)]
    pub settings: Option<toml::Value>,
    /// Warm classes (`warm = [{ name = "py", size = 2, refill_per_second = 1 }]`); declared,
    /// they replace the pool's stored classes at every start. Absent: the stored classes
    /// (set through the admin API) are left as they are.
    pub warm: Option<Vec<WarmSection>>,
}

/// One warm class of a `[[pools]]` entry: `core::warm::WarmClass` in the file's
/// snake_case.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmSection {
    pub name: String,
    pub size: u32,
    pub max_size: Option<u32>,
    pub refill_per_second: f64,
    pub max_age_seconds: Option<u64>,
    pub template: Option<String>,
    pub resources: Option<WarmResources>,
}

/// A warm class's resources, all three given (a class fixes them whole).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmResources {
    pub cpu: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
}

impl PoolSection {
    /// The declared warm classes as the store keeps them, validated; `None` if the pool
    /// declares none. Errors name the file's field (`pools[0].warm[1].refill_per_second`)
    /// under `at` (`pools[0]`).
    pub fn warm_classes(&self, at: &str) -> Result<Option<WarmClasses>, ConfigError> {
        let Some(warm) = &self.warm else {
            return Ok(None);
        };
        let classes = WarmClasses {
            classes: warm
                .iter()
                .map(|w| WarmClass {
                    name: w.name.clone(),
                    size: w.size,
                    max_size: w.max_size,
                    refill_per_second: w.refill_per_second,
                    max_age_seconds: w
                        .max_age_seconds
                        .unwrap_or(differently_core::warm::DEFAULT_MAX_AGE_SECONDS),
                    template: w.template.clone(),
                    resources: w.resources.map(|r| differently_core::Resources {
                        cpu: r.cpu,
                        memory_mib: r.memory_mib,
                        disk_gib: r.disk_gib,
                    }),
                })
                .collect(),
        };
        classes.validate().map_err(|e| {
            invalid(
                warm_field_in_config(at, &e.field),
                format!("pool {:?}: {}", self.name, e.message),
            )
        })?;
        Ok(Some(classes))
    }
}

/// A warm-class field path as the store names it (`classes[1].refillPerSecond`) as the file
/// names it (`pools[0].warm[1].refill_per_second`).
fn warm_field_in_config(at: &str, field: &str) -> String {
    let rest = field.strip_prefix("classes").unwrap_or(field);
    let rest = [
        ("maxSize", "max_size"),
        ("refillPerSecond", "refill_per_second"),
        ("maxAgeSeconds", "max_age_seconds"),
        ("memoryMiB", "memory_mib"),
        ("diskGiB", "disk_gib"),
    ]
    .iter()
    .fold(rest.to_owned(), |f, (api, file)| f.replace(api, file));
    format!("{at}.warm{rest}")
}

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

    fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
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

    fn validate(&self) -> Result<(), ConfigError> {
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("listen", format!("{e} (expected host:port)")))?;
        if let Some(m) = &self.metrics.listen {
            let addr = m
                .parse::<SocketAddr>()
                .map_err(|e| invalid("metrics.listen", format!("{e} (expected host:port)")))?;
            if self.listen.parse::<SocketAddr>().ok() == Some(addr) {
                return Err(invalid(
                    "metrics.listen",
                    "must differ from listen: metrics are never served on the API listener",
                ));
            }
        }
        differently_bus_schema::Naming::new(&self.bus.prefix)
            .map_err(|m| invalid("bus.prefix", m))?;
        if self.bus.replicas == 0 || self.bus.replicas > 5 {
            return Err(invalid("bus.replicas", "must be between 1 and 5"));
        }
        self.bus_auth()?;
        if let Some(ca) = &self.bus.ca_bundle {
            if !ca.is_file() {
                return Err(invalid(
                    "bus.ca_bundle",
                    format!("{} is not a readable file", ca.display()),
                ));
            }
        }
        if !(50..=60_000).contains(&self.bus.ping_interval_ms) {
            return Err(invalid("bus.ping_interval_ms", "must be 50 to 60000"));
        }
        if !(100..=60_000).contains(&self.bus.connect_timeout_ms) {
            return Err(invalid("bus.connect_timeout_ms", "must be 100 to 60000"));
        }
        if self.bus.ack_wait_seconds == 0 {
            return Err(invalid("bus.ack_wait_seconds", "must be at least 1"));
        }
        if self.database_max_connections == 0 {
            return Err(invalid("database_max_connections", "must be at least 1"));
        }
        if self.webhooks.concurrency == 0 {
            return Err(invalid("webhooks.concurrency", "must be at least 1"));
        }
        if !(1..=300).contains(&self.webhooks.timeout_seconds) {
            return Err(invalid(
                "webhooks.timeout_seconds",
                "must be between 1 and 300",
            ));
        }
        if self.webhooks.initial_backoff_ms == 0 {
            return Err(invalid("webhooks.initial_backoff_ms", "must be at least 1"));
        }
        if self.worker.scan_every_ms > 0 && self.worker.scan_after_ms < 100 {
            return Err(invalid(
                "worker.scan_after_ms",
                "must be at least 100 while the scan is on: younger work is the bus's",
            ));
        }
        if self.worker.concurrency == 0 {
            return Err(invalid("worker.concurrency", "must be at least 1"));
        }
        if self.worker.max_attempts == 0 || self.worker.max_deliveries == 0 {
            return Err(invalid("worker.max_attempts", "must be at least 1"));
        }
        self.quota
            .validate()
            .map_err(|e| invalid(format!("quota.{}", e.field), e.message))?;
        if !(self.api.key_requests_per_second > 0.0 && self.api.key_burst >= 1.0) {
            return Err(invalid(
                "api.key_requests_per_second",
                "rate must be > 0 and burst >= 1",
            ));
        }
        if self.api.auth_failures_per_minute.is_nan() || self.api.auth_failures_per_minute <= 0.0 {
            return Err(invalid("api.auth_failures_per_minute", "must be > 0"));
        }
        for (field, v) in [
            (
                "api.header_read_timeout_seconds",
                self.api.header_read_timeout_seconds,
            ),
            (
                "api.body_read_timeout_seconds",
                self.api.body_read_timeout_seconds,
            ),
            ("api.pty_grace_seconds", self.api.pty_grace_seconds),
        ] {
            if !(1..=MAX_READ_TIMEOUT_SECONDS).contains(&v) {
                return Err(invalid(
                    field,
                    format!("must be between 1 and {MAX_READ_TIMEOUT_SECONDS}"),
                ));
            }
        }
        for p in &self.api.trusted_proxies {
            differently_api::auth_throttle::parse_proxy(p)
                .map_err(|m| invalid("api.trusted_proxies", m))?;
        }
        if self.scheduler.default_idle_timeout_seconds == Some(0) {
            return Err(invalid(
                "scheduler.default_idle_timeout_seconds",
                "must be at least 1",
            ));
        }
        if self.scheduler.reconcile_interval_seconds == 0 {
            return Err(invalid(
                "scheduler.reconcile_interval_seconds",
                "must be at least 1",
            ));
        }
        if !(1..=MAX_PLACEMENT_GROUP).contains(&self.scheduler.placement_group_size) {
            return Err(invalid(
                "scheduler.placement_group_size",
                format!("must be between 1 and {MAX_PLACEMENT_GROUP}"),
            ));
        }
        if self.scheduler.tick_ms == 0 {
            return Err(invalid("scheduler.tick_ms", "must be at least 1"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            validate_pool_name(&p.name)
                .map_err(|e| invalid(format!("pools[{i}].name"), e.message))?;
            if !names.insert(p.name.as_str()) {
                return Err(invalid(
                    format!("pools[{i}].name"),
                    format!("duplicate pool {:?}", p.name),
                ));
            }
            // The admin API's bounds, from the one check both use.
            check_pool_bounds(PoolBounds {
                region: p.region.as_deref(),
                max_concurrent: p.max_concurrent,
                cost_per_cpu_hour: p.cost_per_cpu_hour,
                typical_create_seconds: p.typical_create_seconds,
            })
            .map_err(|(field, message)| {
                invalid(
                    format!("pools[{i}].{}", field.config_name()),
                    format!("pool {:?}: {message}", p.name),
                )
            })?;
            p.warm_classes(&format!("pools[{i}]"))?;
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "t".into(),
            message: e.to_string(),
        })?;
        c.apply_env(|_| None).unwrap();
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn defaults_are_valid() {
        assert!(parse("").is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse("listen = \"nope\"").unwrap_err().to_string();
        assert!(e.contains("listen"), "{e}");
        let e = parse("bogus = 1").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = parse("[bus]\nprefix = \"A.B\"").unwrap_err().to_string();
        assert!(e.contains("bus.prefix"), "{e}");
        let e = parse("[[pools]]\nname = \"Bad Name\"\nkind = \"fake\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pools[0].name"), "{e}");
        let e = parse(
            "[[pools]]\nname = \"a\"\nkind = \"fake\"\n[[pools]]\nname = \"a\"\nkind = \"fake\"",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("duplicate"), "{e}");
    }

    #[test]
    fn config_pools_get_the_admin_apis_bounds_naming_pool_and_field() {
        // Each of these passed the config's own checks before and the admin API refused it.
        for (line, field) in [
            ("max_concurrent = 2000000", "pools[0].max_concurrent"),
            ("cost_per_cpu_hour = 1e300", "pools[0].cost_per_cpu_hour"),
            (
                "typical_create_seconds = 1e9",
                "pools[0].typical_create_seconds",
            ),
            ("region = \"\"", "pools[0].region"),
            (
                &format!("region = \"{}\"", "r".repeat(64)),
                "pools[0].region",
            ),
            ("region = \"eu\\u0000west\"", "pools[0].region"),
        ] {
            let e = parse(&format!(
                "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n{line}"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(field) && e.contains("\"edge\""), "{line}: {e}");
        }
        assert!(parse(
            "[[pools]]\nname = \"edge\"\nkind = \"fake\"\nmax_concurrent = 1000000\n\
             cost_per_cpu_hour = 1000000.0\ntypical_create_seconds = 86400.0\nregion = \"eu-west\""
        )
        .is_ok());
    }

    #[test]
    fn nats_urls_is_the_array_form_of_a_server_list() {
        let c = parse("nats_urls = [\"nats://a:4222\", \"nats://b:4222\"]").unwrap();
        assert_eq!(c.require_nats_url().unwrap(), "nats://a:4222,nats://b:4222");
        let c = parse("nats_url = \"nats://a:4222\"\nnats_urls = [\"nats://b:4222\"]").unwrap();
        let e = c.require_nats_url().unwrap_err().to_string();
        assert!(e.contains("nats_urls"), "{e}");
        let mut c = parse("nats_urls = [\"nats://b:4222\"]").unwrap();
        c.apply_env(|k| (k == "DIFFERENTLY_NATS_URL").then(|| "nats://env:4222".to_owned()))
            .unwrap();
        assert_eq!(c.require_nats_url().unwrap(), "nats://env:4222");
    }

    #[test]
    fn bus_credentials_are_one_reference_and_never_a_value() {
        use differently_bus::jetstream::NatsAuth;
        let c = parse("[bus]\ntoken_env = \"NATS_TOKEN\"").unwrap();
        assert_eq!(
            c.bus_connect_options().auth,
            NatsAuth::TokenEnv("NATS_TOKEN".into())
        );
        let c = parse("[bus]\nuser = \"dly\"\npassword_env = \"NATS_PW\"").unwrap();
        assert_eq!(
            c.bus_connect_options().auth,
            NatsAuth::UserPassword {
                user: "dly".into(),
                password_env: "NATS_PW".into()
            }
        );
        let e = parse("[bus]\nuser = \"dly\"").unwrap_err().to_string();
        assert!(e.contains("bus.password_env"), "{e}");
        let e = parse("[bus]\ntoken_env = \"T\"\ncredentials_file = \"/x.creds\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bus.credentials_file") && e.contains("only one"),
            "{e}"
        );
        let e = parse("[bus]\nca_bundle = \"/nonexistent/ca.pem\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bus.ca_bundle"), "{e}");
        let e = parse("[bus]\nping_interval_ms = 10")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bus.ping_interval_ms"), "{e}");
        let e = parse("[bus]\nconnect_timeout_ms = 5")
            .expect_err("connect timeout too short")
            .to_string();
        assert!(e.contains("bus.connect_timeout_ms"), "{e}");
        let e = parse("[bus]\ncredentials_file = \"/x.creds\"\nnkey_seed_file = \"/x.nk\"")
            .expect_err("two credentials")
            .to_string();
        assert!(
            e.contains("bus.nkey_seed_file") && e.contains("only one"),
            "{e}"
        );
        assert!(
            parse("[bus]\npassword = \"x\"").is_err(),
            "a literal password is refused"
        );
    }

    #[test]
    fn trusted_proxies_are_addresses_or_cidrs() {
        assert!(parse("").unwrap().api.trusted_proxies.is_empty());
        let c = parse("[api]\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.4\"]").unwrap();
        assert_eq!(c.api.trusted_proxies.len(), 2);
        let e = parse("[api]\ntrusted_proxies = [\"lb.local\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("api.trusted_proxies"), "{e}");
    }

    #[test]
    fn metrics_listener_is_optional_and_validated() {
        assert_eq!(parse("").unwrap().metrics.listen, None);
        let c = parse("[metrics]\nlisten = \"127.0.0.1:9464\"").unwrap();
        assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:9464"));
        let e = parse("[metrics]\nlisten = \"nope\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.listen"), "{e}");
        let e = parse("listen = \"127.0.0.1:9000\"\n[metrics]\nlisten = \"127.0.0.1:9000\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics.listen"), "{e}");
        let mut c: Config = toml::from_str("").unwrap();
        c.apply_env(|k| (k == "DIFFERENTLY_METRICS_LISTEN").then(|| "127.0.0.1:1".to_owned()))
            .unwrap();
        assert_eq!(c.metrics.listen.as_deref(), Some("127.0.0.1:1"));
    }

    #[test]
    fn read_timeouts_default_and_are_bounded() {
        let c = parse("").unwrap();
        assert_eq!(
            (
                c.api.header_read_timeout_seconds,
                c.api.body_read_timeout_seconds
            ),
            (10, 30)
        );
        let c =
            parse("[api]\nheader_read_timeout_seconds = 2\nbody_read_timeout_seconds = 5").unwrap();
        assert_eq!(
            (
                c.api.header_read_timeout_seconds,
                c.api.body_read_timeout_seconds
            ),
            (2, 5)
        );
        for field in ["header_read_timeout_seconds", "body_read_timeout_seconds"] {
            for bad in [0, 3601] {
                let e = parse(&format!("[api]\n{field} = {bad}"))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(field) && e.contains("3600"), "{e}");
            }
        }
    }

    #[test]
    fn placement_group_size_is_bounded() {
        assert_eq!(parse("").unwrap().scheduler.placement_group_size, 32);
        let c = parse("[scheduler]\nplacement_group_size = 64").unwrap();
        assert_eq!(c.scheduler.placement_group_size, 64);
        for bad in [0, 257] {
            let e = parse(&format!("[scheduler]\nplacement_group_size = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("scheduler.placement_group_size"), "{e}");
        }
    }

    #[test]
    fn environment_overrides_the_file() {
        let mut c: Config = toml::from_str("listen = \"127.0.0.1:1\"").unwrap();
        c.apply_env(|k| (k == "DIFFERENTLY_LISTEN").then(|| "127.0.0.1:2".to_owned()))
            .unwrap();
        assert_eq!(c.listen, "127.0.0.1:2");
    }

    #[test]
    fn direct_placement_defaults_on_and_the_environment_can_turn_it_off() {
        assert!(parse("").unwrap().api.direct_placement);
        assert!(
            !parse("[api]\ndirect_placement = false")
                .unwrap()
                .api
                .direct_placement
        );
        let mut c: Config = toml::from_str("").unwrap();
        c.apply_env(|k| (k == "DIFFERENTLY_DIRECT_PLACEMENT").then(|| "false".to_owned()))
            .unwrap();
        assert!(!c.api.direct_placement);
        let e = c
            .apply_env(|k| (k == "DIFFERENTLY_DIRECT_PLACEMENT").then(|| "no".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("api.direct_placement"), "{e}");
    }

    #[test]
    fn pool_warm_classes_are_read_in_the_files_style_and_checked_naming_the_field() {
        let c = parse(
            "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
             warm = [{ name = \"default\", size = 2, refill_per_second = 1 },\n\
                     { name = \"py\", size = 1, max_size = 3, refill_per_second = 0.5, \
                       max_age_seconds = 600, template = \"python:3.12\", \
                       resources = { cpu = 2, memory_mib = 2048, disk_gib = 5 } }]",
        )
        .unwrap();
        let classes = c.pools[0].warm_classes("pools[0]").unwrap().unwrap();
        assert_eq!(classes.classes.len(), 2);
        assert_eq!(
            classes.classes[0].max_age_seconds,
            differently_core::warm::DEFAULT_MAX_AGE_SECONDS
        );
        let py = &classes.classes[1];
        assert_eq!(py.max_size, Some(3));
        assert_eq!(py.refill_per_second, 0.5);
        assert_eq!(py.template.as_deref(), Some("python:3.12"));
        assert_eq!(py.resources.map(|r| r.memory_mib), Some(2048));
        // The array-of-tables form is the same list.
        let c = parse(
            "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
             [[pools.warm]]\nname = \"default\"\nsize = 2\nrefill_per_second = 1",
        )
        .unwrap();
        assert_eq!(c.pools[0].warm.as_ref().map(Vec::len), Some(1));
        // Without `warm`, nothing is declared (the stored classes are left alone).
        let c = parse("[[pools]]\nname = \"edge\"\nkind = \"fake\"").unwrap();
        assert_eq!(c.pools[0].warm_classes("pools[0]").unwrap(), None);

        for (class, field) in [
            (
                "name = \"A\", size = 1, refill_per_second = 1",
                "pools[1].warm[0].name",
            ),
            (
                "name = \"a\", size = 1, refill_per_second = 0",
                "pools[1].warm[0].refill_per_second",
            ),
            (
                "name = \"a\", size = 3, max_size = 2, refill_per_second = 1",
                "pools[1].warm[0].max_size",
            ),
            (
                "name = \"a\", size = 1, refill_per_second = 1, max_age_seconds = 1",
                "pools[1].warm[0].max_age_seconds",
            ),
            (
                "name = \"a\", size = 1, refill_per_second = 1, \
                 resources = { cpu = 1, memory_mib = 1, disk_gib = 5 }",
                "pools[1].warm[0].resources.memory_mib",
            ),
        ] {
            let e = parse(&format!(
                "[[pools]]\nname = \"one\"\nkind = \"fake\"\n\
                 [[pools]]\nname = \"edge\"\nkind = \"fake\"\nwarm = [{{ {class} }}]"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(field) && e.contains("\"edge\""), "{class}: {e}");
        }
        let e = parse(
            "[[pools]]\nname = \"edge\"\nkind = \"fake\"\n\
             warm = [{ name = \"a\", size = 1, refill_per_second = 1, refillPerSecond = 1 }]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("refillPerSecond"),
            "unknown fields are refused: {e}"
        );
    }
}
