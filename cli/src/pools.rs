//! The pool manager of a process: registers the config file's pools, keeps the local
//! `PoolSet` in step with the registry (config and admin-API pools) and with the fleet-wide
//! health view, and — in worker processes — probes its pools and reports their health.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_adapters::credentials::{Credentials, SecretSource, SecretSourceError};
use differently_adapters::pools::PoolSet;
use differently_core::pool::{PoolRecord, PoolSource};
use differently_store::{Actor, Store};

use crate::config::Config;
use crate::roles::AnyError;

/// How often the registry and the health view are re-read.
const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How often a worker probes its pools.
const PROBE_EVERY: Duration = Duration::from_secs(3);
/// A probe older than this no longer counts: the pool is treated as unhealthy.
pub const HEALTH_STALE_AFTER: Duration = Duration::from_secs(15);

/// Turns the config file's pools into registry records, checking trust per kind.
pub fn config_records(config: &Config) -> Result<Vec<PoolRecord>, AnyError> {
    let now = Utc::now();
    let mut out = Vec::new();
    for (i, p) in config.pools.iter().enumerate() {
        let trust = differently_adapters::registry::resolve_trust(&p.kind, p.trust)
            .map_err(|e| format!("config: pools[{i}].{}: {}", e.field, e.message))?;
        let settings = match &p.settings {
            Some(v) => serde_json::to_value(v)?,
            None => serde_json::Value::Null,
        };
        let record = PoolRecord {
            name: p.name.clone(),
            kind: p.kind.clone(),
            trust,
            region: p.region.clone(),
            max_concurrent: p.max_concurrent,
            isolation: p.isolation,
            cost_per_cpu_hour: p.cost_per_cpu_hour.unwrap_or(0.0),
            typical_create_seconds: p.typical_create_seconds,
            settings,
            source: PoolSource::Config,
            created_at: now,
            updated_at: now,
        };
        // Refuse a bad adapter configuration at start, naming the pool and field.
        differently_adapters::registry::build(&record.kind, &record.settings)
            .map_err(|e| format!("config: pools[{i}] ({}): {e}", p.name))?;
        out.push(record);
    }
    Ok(out)
}

/// Writes the config file's pools to the registry (config wins over an API pool of the
/// same name) and drops config pools no longer in the file.
pub async fn register(store: &dyn Store, records: &[PoolRecord]) -> Result<(), AnyError> {
    let existing = store.list_pools().await?;
    for old in existing.iter().filter(|p| p.source == PoolSource::Config) {
        if !records.iter().any(|r| r.name == old.name) {
            if let Err(e) = store.delete_pool(&old.name, &Actor::System("config")).await {
                tracing::warn!(pool = %old.name, error = %e, "pool removed from config but kept: still in use");
            }
        }
    }
    for r in records {
        let mut r = r.clone();
        if let Some(old) = existing.iter().find(|p| p.name == r.name) {
            r.created_at = old.created_at;
        }
        store.upsert_pool(&r, &Actor::System("config")).await?;
    }
    Ok(())
}

/// Writes the warm classes the config file declares for its pools, replacing what is
/// stored (an edit through the admin API lasts until the next start); a pool that declares
/// no `warm` keeps its stored classes.
pub async fn register_warm(store: &dyn Store, config: &Config) -> Result<(), AnyError> {
    for (i, p) in config.pools.iter().enumerate() {
        if let Some(classes) = p.warm_classes(&format!("pools[{i}]"))? {
            store
                .set_warm_classes(&p.name, &classes, &Actor::System("config"))
                .await
                .map_err(|e| format!("config: pools[{i}].warm ({}): {e}", p.name))?;
        }
    }
    Ok(())
}

/// Stored secrets for pool credentials (`apiKeySecret`), read from the store and opened with
/// this process's sealing key when an adapter needs one.
pub struct StoreSecrets(pub Arc<dyn Store>);

#[async_trait::async_trait]
impl SecretSource for StoreSecrets {
    async fn open(&self, name: &str) -> Result<Option<Vec<u8>>, SecretSourceError> {
        // Store errors name the secret and the failure, never the value.
        self.0
            .open_secret(name)
            .await
            .map_err(|e| SecretSourceError(e.to_string()))
    }
}

/// Loads the registry into a `PoolSet` whose adapters resolve stored secrets through
/// `store`, logging pools whose adapter cannot be built.
pub async fn load(store: Arc<dyn Store>) -> Result<PoolSet, AnyError> {
    let records = store.list_pools().await?;
    let credentials = Credentials::new(Arc::new(StoreSecrets(store)));
    let (set, bad) = PoolSet::with_credentials(credentials, records);
    for b in bad {
        tracing::error!(pool = %b.name, error = %b.error, "pool skipped: adapter cannot be built");
    }
    Ok(set)
}

/// What this process knows of each pool: when its record last changed and whether it is
/// healthy. Compared across syncs, so each change is logged once (`action=pool_changed`),
/// which tells an operator (and a test) when a process took up an edit or a health flip.
fn pool_states(pools: &PoolSet) -> BTreeMap<String, (chrono::DateTime<Utc>, bool)> {
    pools
        .names()
        .into_iter()
        .filter_map(|name| {
            let pool = pools.get(&name)?;
            Some((name, (pool.record.updated_at, pool.healthy())))
        })
        .collect()
}

/// Keeps `pools` in step with the registry and the fleet-wide health view.
pub fn spawn_sync(store: Arc<dyn Store>, pools: PoolSet) {
    tokio::spawn(async move {
        let mut known = pool_states(&pools);
        loop {
            match store.list_pools().await {
                Ok(records) => {
                    for b in pools.sync(records) {
                        tracing::error!(pool = %b.name, error = %b.error, "pool skipped: adapter cannot be built");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the pool registry"),
            }
            match store.pool_health().await {
                Ok(rows) => pools.apply_health(&rows, Utc::now(), HEALTH_STALE_AFTER),
                Err(e) => tracing::warn!(error = %e, "cannot read pool health"),
            }
            let now = pool_states(&pools);
            for (name, (updated, healthy)) in &now {
                let before = known.get(name);
                let record_changed = before.map(|b| b.0) != Some(*updated);
                if record_changed || before.map(|b| b.1) != Some(*healthy) {
                    tracing::info!(pool = %name, record_changed, healthy, action = "pool_changed", "pools: this process took up a change of the pool");
                }
            }
            known = now;
            tokio::time::sleep(SYNC_EVERY).await;
        }
    });
}

/// Probes `names` (all pools when empty) and reports their health, once now and then
/// periodically.
pub async fn start_probes(store: Arc<dyn Store>, pools: PoolSet, names: Vec<String>) {
    let who = format!(
        "{}:{}",
        std::fs::read_to_string("/etc/hostname")
            .unwrap_or_default()
            .trim(),
        std::process::id()
    );
    probe_once(store.as_ref(), &pools, &names, &who).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            probe_once(store.as_ref(), &pools, &names, &who).await;
        }
    });
}

async fn probe_once(store: &dyn Store, pools: &PoolSet, names: &[String], who: &str) {
    let targets = if names.is_empty() {
        pools.names()
    } else {
        names.to_vec()
    };
    let mut rows = Vec::new();
    for name in targets {
        let Some(pool) = pools.get(&name) else {
            continue;
        };
        let health = pool.probe(who).await;
        if let Err(e) = store.report_pool_health(&health).await {
            tracing::warn!(pool = %name, error = %e, "cannot report pool health");
        }
        rows.push(health);
    }
    if !rows.is_empty() {
        // This process saw it first-hand: no need to wait for the next sync.
        let mut all = store.pool_health().await.unwrap_or_default();
        all.retain(|h| !rows.iter().any(|r| r.name == h.name));
        all.extend(rows);
        pools.apply_health(&all, Utc::now(), HEALTH_STALE_AFTER);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use differently_core::warm::WarmClasses;
    use differently_store::memory::MemoryStore;
    use differently_store::warm::WarmStore;

    use super::*;

    fn config(text: &str) -> Config {
        toml::from_str(text).unwrap()
    }

    #[tokio::test]
    async fn declared_warm_classes_replace_the_stored_ones_at_every_start() {
        let store = MemoryStore::new();
        let declared = config(
            "[[pools]]\nname = \"a\"\nkind = \"fake\"\n\
             warm = [{ name = \"d\", size = 2, refill_per_second = 1 }]\n\
             [[pools]]\nname = \"b\"\nkind = \"fake\"",
        );
        register(&store, &config_records(&declared).unwrap())
            .await
            .unwrap();
        register_warm(&store, &declared).await.unwrap();
        let a = store.warm_classes("a").await.unwrap();
        assert_eq!(a.classes.len(), 1);
        assert_eq!(a.classes[0].size, 2);

        // Edits through the API: one on the pool that declares classes, one on the other.
        let api_doc: WarmClasses = serde_json::from_value(serde_json::json!({
            "classes": [{ "name": "api", "size": 5, "refillPerSecond": 2 }]
        }))
        .unwrap();
        let admin = Actor::System("test");
        store.set_warm_classes("a", &api_doc, &admin).await.unwrap();
        store.set_warm_classes("b", &api_doc, &admin).await.unwrap();

        // The next start: the file's classes win where declared; elsewhere the stored stay.
        register_warm(&store, &declared).await.unwrap();
        assert_eq!(store.warm_classes("a").await.unwrap(), a);
        assert_eq!(store.warm_classes("b").await.unwrap(), api_doc);

        // An empty list is a declaration too: no classes.
        let none = config(
            "[[pools]]\nname = \"a\"\nkind = \"fake\"\nwarm = []\n\
             [[pools]]\nname = \"b\"\nkind = \"fake\"",
        );
        register_warm(&store, &none).await.unwrap();
        assert!(store.warm_classes("a").await.unwrap().classes.is_empty());
    }
}
