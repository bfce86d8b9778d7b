//! A short-lived per-process cache of stored key records and organization records, so a busy
//! client does not pay two database lookups before every call (exec overhead is a target).
//!
//! What is cached is the record, never a verdict: every request still hashes the presented
//! key and compares it in constant time, and checks revocation and expiry. A key revoked, or
//! an organization suspended or deleted, through this process is dropped at once; through
//! another API process it takes effect here within `TTL`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use differently_core::tenancy::{ApiKeyRecord, Org};
use differently_core::{KeyId, OrgId};

/// How long a record is trusted without re-reading it.
pub const TTL: Duration = Duration::from_secs(1);
/// Entries kept at most; past this the cache starts over (it is only a cache).
const MAX_ENTRIES: usize = 10_000;

/// Entries trusted for `TTL`, shared by this module's and `caches::policy`'s records.
pub(crate) struct Map<K, V>(Mutex<HashMap<K, (Instant, V)>>);

impl<K: std::hash::Hash + Eq, V: Clone> Map<K, V> {
    pub(crate) fn new() -> Self {
        Map(Mutex::new(HashMap::new()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (Instant, V)>> {
        match self.0.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub(crate) fn get(&self, k: &K) -> Option<V> {
        let map = self.lock();
        map.get(k)
            .filter(|(at, _)| at.elapsed() < TTL)
            .map(|(_, v)| v.clone())
    }

    pub(crate) fn put(&self, k: K, v: V) {
        let mut map = self.lock();
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        map.insert(k, (Instant::now(), v));
    }

    fn forget(&self, k: &K) {
        self.lock().remove(k);
    }

    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

/// Stored key records by id and organizations (or their absence) by id.
pub struct AuthCache {
    keys: Map<KeyId, ApiKeyRecord>,
    orgs: Map<OrgId, Option<Org>>,
}

impl Default for AuthCache {
    fn default() -> Self {
        AuthCache {
            keys: Map::new(),
            orgs: Map::new(),
        }
    }
}

impl AuthCache {
    /// The key record read less than `TTL` ago, if any.
    pub fn key(&self, id: &KeyId) -> Option<ApiKeyRecord> {
        self.keys.get(id)
    }

    pub fn put_key(&self, record: ApiKeyRecord) {
        self.keys.put(record.id.clone(), record);
    }

    /// Drops a key (revoked here): the next request reads it again.
    pub fn forget_key(&self, id: &KeyId) {
        self.keys.forget(id);
    }

    /// Drops every key (one revoked here may have revoked the keys it made, too).
    pub fn forget_all_keys(&self) {
        self.keys.clear();
    }

    /// The organization read less than `TTL` ago: `Some(None)` if it did not exist.
    pub fn org(&self, id: &OrgId) -> Option<Option<Org>> {
        self.orgs.get(id)
    }

    pub fn put_org(&self, id: OrgId, org: Option<Org>) {
        self.orgs.put(id, org);
    }

    /// Drops an organization (suspended, renamed or deleted here).
    pub fn forget_org(&self, id: &OrgId) {
        self.orgs.forget(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use differently_core::tenancy::OrgStatus;

    fn org() -> Org {
        Org {
            id: OrgId::new(),
            name: "o".into(),
            status: OrgStatus::Active,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn entries_expire_and_can_be_forgotten() {
        let c = AuthCache::default();
        let o = org();
        assert_eq!(c.org(&o.id), None);
        c.put_org(o.id.clone(), Some(o.clone()));
        assert_eq!(c.org(&o.id), Some(Some(o.clone())));
        c.forget_org(&o.id);
        assert_eq!(c.org(&o.id), None);
        let missing = OrgId::new();
        c.put_org(missing.clone(), None);
        assert_eq!(c.org(&missing), Some(None), "absence is cached too");
        std::thread::sleep(TTL + Duration::from_millis(20));
        assert_eq!(c.org(&missing), None, "expired after the TTL");
    }
}
