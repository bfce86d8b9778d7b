//! The pools this process knows: each registered pool's adapter, its record, and the live
//! fleet-wide view (health as the pool's workers last reported it) that placement reads.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use differently_core::policy::PoolProfile;
use differently_core::pool::{PoolHealth, PoolRecord, PoolView};

use crate::credentials::Credentials;
use crate::registry::{self, AdapterConfigError};
use crate::SharedAdapter;

/// One pool: its adapter, its record and whether it is healthy now.
pub struct Pool {
    pub adapter: SharedAdapter,
    pub record: PoolRecord,
    healthy: RwLock<bool>,
    /// Until when the backend refused creates for capacity ([`Pool::refuse_for_capacity`]).
    capacity_until: RwLock<Option<DateTime<Utc>>>,
}

impl Pool {
    /// Builds the adapter of `record`, metered under the pool's name; its credential
    /// references resolve through `credentials` at call time.
    pub fn build(
        record: PoolRecord,
        credentials: &Credentials,
    ) -> Result<Pool, AdapterConfigError> {
        let adapter = registry::build_pool(&record, credentials)?;
        Ok(Pool {
            adapter,
            record,
            healthy: RwLock::new(false),
            capacity_until: RwLock::new(None),
        })
    }

    /// Records that the backend refused a create for capacity and asked for no new work
    /// before `until`: until then this pool gets no new placements in this process, and
    /// its probes report it unhealthy so the rest of the fleet skips it too. Its running
    /// sandboxes are untouched. A later `until` extends the window, an earlier one does not
    /// shorten it.
    pub fn refuse_for_capacity(&self, until: DateTime<Utc>) {
        if let Ok(mut c) = self.capacity_until.write() {
            if c.is_none_or(|t| t < until) {
                *c = Some(until);
            }
        }
    }

    /// Until when new creates are not sent here for capacity, if that is still ahead at `now`.
    pub fn capacity_refused_until(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let until = self.capacity_until.read().ok().and_then(|c| *c)?;
        (until > now).then_some(until)
    }

    /// Whether placement may send new work here.
    pub fn healthy(&self) -> bool {
        self.healthy.read().map(|h| *h).unwrap_or(false)
    }

    fn set_healthy(&self, healthy: bool) {
        if let Ok(mut h) = self.healthy.write() {
            *h = healthy;
        }
    }

    /// The pool as placement sees it. Capabilities are what the adapter implements, whatever
    /// the record claims, so nothing is advertised that would fail later.
    pub fn view(&self) -> PoolView {
        PoolView {
            name: self.record.name.clone(),
            kind: self.record.kind.clone(),
            trust: self.record.trust,
            region: self.record.region.clone(),
            capabilities: differently_core::capability::names(&self.adapter.capabilities()),
            max_concurrent: self.record.max_concurrent,
            healthy: self.healthy() && self.capacity_refused_until(Utc::now()).is_none(),
        }
    }

    /// The pool with ranking data and `used` slots.
    pub fn profile(&self, used: u32) -> PoolProfile {
        let mut p = PoolProfile::new(self.view());
        p.isolation = self.record.isolation;
        p.cost_per_cpu_hour = self.record.cost_per_cpu_hour;
        p.typical_create_seconds = self.record.typical_create_seconds;
        p.used_slots = used;
        p
    }

    /// Probes the backend.
    pub async fn probe(&self, checked_by: &str) -> PoolHealth {
        let result = tokio::time::timeout(Duration::from_secs(10), self.adapter.health()).await;
        let refused = self.capacity_refused_until(Utc::now());
        let error = match result {
            _ if refused.is_some() => refused.map(capacity_health_error),
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("health check timed out after 10 s".to_owned()),
        };
        PoolHealth {
            name: self.record.name.clone(),
            healthy: error.is_none(),
            capabilities: differently_core::capability::names(&self.adapter.capabilities()),
            error,
            checked_at: Utc::now(),
            checked_by: checked_by.to_owned(),
            backend: Some(self.backend_seen()),
        }
    }

    /// What this process's adapter knows of the backend (after a probe: its version, where
    /// the adapter detects one).
    pub fn backend_seen(&self) -> differently_core::pool::BackendSeen {
        let v = self.adapter.verification();
        differently_core::pool::BackendSeen {
            version: self.adapter.backend_version(),
            verified: v.status,
            verified_basis: v.basis,
        }
    }
}

/// Every registered pool, in name order (a stable tie-break for ranking).
#[derive(Clone, Default)]
pub struct PoolSet {
    pools: Arc<RwLock<Vec<Arc<Pool>>>>,
    credentials: Credentials,
}

/// A pool whose record could not be turned into an adapter.
#[derive(Debug)]
pub struct BadPool {
    pub name: String,
    pub error: AdapterConfigError,
}

impl PoolSet {
    /// Builds every pool; records whose adapter cannot be built are returned apart. Stored
    /// secrets are not available to these adapters (see [`PoolSet::with_credentials`]).
    pub fn from_records(records: Vec<PoolRecord>) -> (PoolSet, Vec<BadPool>) {
        PoolSet::with_credentials(Credentials::default(), records)
    }

    /// Builds every pool, resolving credential references through `credentials`.
    pub fn with_credentials(
        credentials: Credentials,
        records: Vec<PoolRecord>,
    ) -> (PoolSet, Vec<BadPool>) {
        let set = PoolSet {
            pools: Arc::default(),
            credentials,
        };
        let bad = set.sync(records);
        (set, bad)
    }

    /// The credentials every adapter of this set resolves through; call
    /// [`Credentials::changed`] on them when this process stores a secret.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    fn read(&self) -> Vec<Arc<Pool>> {
        match self.pools.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the set with `records`, keeping adapters whose record did not change (so
    /// their connections and caches survive) and their health.
    pub fn sync(&self, mut records: Vec<PoolRecord>) -> Vec<BadPool> {
        records.sort_by(|a, b| a.name.cmp(&b.name));
        let current: HashMap<String, Arc<Pool>> = self
            .read()
            .into_iter()
            .map(|p| (p.record.name.clone(), p))
            .collect();
        let mut next = Vec::with_capacity(records.len());
        let mut bad = Vec::new();
        for record in records {
            match current.get(&record.name) {
                Some(p) if same_definition(&p.record, &record) => next.push(p.clone()),
                _ => match Pool::build(record.clone(), &self.credentials) {
                    Ok(p) => {
                        if let Some(old) = current.get(&record.name) {
                            p.set_healthy(old.healthy());
                            if let Some(until) = old.capacity_refused_until(Utc::now()) {
                                p.refuse_for_capacity(until);
                            }
                        }
                        next.push(Arc::new(p));
                    }
                    Err(error) => bad.push(BadPool {
                        name: record.name,
                        error,
                    }),
                },
            }
        }
        match self.pools.write() {
            Ok(mut p) => *p = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        bad
    }

    /// The pool called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Pool>> {
        self.read().into_iter().find(|p| p.record.name == name)
    }

    /// Views of every pool.
    pub fn views(&self) -> Vec<PoolView> {
        self.read().iter().map(|p| p.view()).collect()
    }

    /// Profiles of every pool with slots in use from `used`.
    pub fn profiles(&self, used: &HashMap<String, u32>) -> Vec<PoolProfile> {
        self.read()
            .iter()
            .map(|p| p.profile(used.get(&p.record.name).copied().unwrap_or(0)))
            .collect()
    }

    /// Pool names.
    pub fn names(&self) -> Vec<String> {
        self.read().iter().map(|p| p.record.name.clone()).collect()
    }

    /// Applies the fleet-wide health rows: a pool is healthy when its latest probe, no
    /// older than `stale_after`, says so. No probe at all means unhealthy (no worker).
    pub fn apply_health(&self, rows: &[PoolHealth], now: DateTime<Utc>, stale_after: Duration) {
        let stale =
            chrono::Duration::from_std(stale_after).unwrap_or(chrono::Duration::seconds(30));
        for p in self.read() {
            let row = rows.iter().find(|h| h.name == p.record.name);
            let healthy = row.is_some_and(|h| h.healthy && now - h.checked_at <= stale);
            if p.healthy() != healthy {
                tracing::info!(pool = %p.record.name, healthy, "pool health changed");
            }
            p.set_healthy(healthy);
        }
    }

    /// Marks every pool healthy or not from local probes (single-process `dev`).
    pub fn apply_local(&self, rows: &[PoolHealth]) {
        self.apply_health(rows, Utc::now(), Duration::from_secs(3600));
    }
}

/// The health error of a pool that refused creates for capacity until `until`.
pub fn capacity_health_error(until: DateTime<Utc>) -> String {
    format!(
        "insufficient capacity: the backend refused a create; no new placements until {}",
        until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

/// Whether two records would build the same adapter.
fn same_definition(a: &PoolRecord, b: &PoolRecord) -> bool {
    a.kind == b.kind
        && a.settings == b.settings
        && a.trust == b.trust
        && a.region == b.region
        && a.max_concurrent == b.max_concurrent
        && a.isolation == b.isolation
        && a.cost_per_cpu_hour == b.cost_per_cpu_hour
        && a.typical_create_seconds == b.typical_create_seconds
}
