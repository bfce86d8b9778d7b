//! The checks of every section at load, each error naming its field.

use std::net::SocketAddr;

use differently_core::pool::{check_pool_bounds, validate_pool_name, PoolBounds};

use super::sections::{MAX_PLACEMENT_GROUP, MAX_READ_TIMEOUT_SECONDS};
use super::{invalid, Config, ConfigError};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
            differently_api::auth::throttle::parse_proxy(p)
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
        if let Some(d) = &self.e2b.domain {
            check_dns_name(d).map_err(|m| invalid("e2b.domain", format!("{d:?}: {m}")))?;
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
}

/// Whether `name` is a DNS name the facade can serve under (`api.<name>`,
/// `<port>-<id>.<name>`): dot-separated labels of letters, digits and inner hyphens, each at
/// most 63 characters, 253 in all. Surrounding space and one trailing dot are allowed, as the
/// facade ignores them; empty is off.
fn check_dns_name(name: &str) -> Result<(), String> {
    let name = name.trim();
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Ok(());
    }
    if name.len() > 253 {
        return Err("longer than 253 characters".into());
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("has an empty label".into());
        }
        if label.len() > 63 {
            return Err(format!("label {label:?} is longer than 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "label {label:?} has a character other than a letter, digit or hyphen \
                 (a DNS name, e.g. e2b.example.com, without scheme, port or path)"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label {label:?} starts or ends with a hyphen"));
        }
    }
    Ok(())
}
