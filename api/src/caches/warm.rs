//! Every pool's warm classes and ready counts, kept for `auth::cache::TTL`, for the create
//! path: which class a create matches on its pool (`DirectPlacement::warm_class`) and which
//! permitted pool has a ready instance of it (ranked first). One read of the store per TTL
//! instead of one per create.
//!
//! The counts only rank: the claim inside the admission transaction is the authority, so a
//! count a second old costs at most a create placed cold (a miss) or a warm pool ranked
//! first whose last instance another create just took. Classes written through this process
//! clear the cache at once; through another API process, they reach this one within the TTL.
//!
//! It also tallies this process's matching creates (hits and misses per class) and adds them
//! to the store's per-minute counts every few seconds, which the admin warm document reads
//! (claims per minute, hit ratio) whichever replica answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::SandboxSpec;
use differently_store::warm::{WarmClaims, WarmStore};
use differently_store::StoreError;

use crate::auth::cache::TTL;

/// The warm classes of every pool that has some, and their ready instances.
#[derive(Debug, Default)]
pub struct WarmView {
    classes: HashMap<String, WarmClasses>,
    /// Ready instances by (pool, class); lowered by this process's own claims meanwhile.
    ready: HashMap<(String, String), AtomicU32>,
}

impl WarmView {
    /// The class of `pool` a create with `spec` claims from, if any.
    pub fn class_for(&self, pool: &str, spec: &SandboxSpec) -> Option<&WarmClass> {
        self.classes.get(pool)?.class_for(spec)
    }

    /// Ready instances of `class` of `pool`, as last read.
    pub fn ready(&self, pool: &str, class: &str) -> u32 {
        self.ready
            .get(&(pool.to_owned(), class.to_owned()))
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// One instance of `class` of `pool` was claimed here: one fewer until the next read, so
    /// this process does not rank a pool first for an instance it knows is gone.
    pub fn took(&self, pool: &str, class: &str) {
        if let Some(n) = self.ready.get(&(pool.to_owned(), class.to_owned())) {
            let _ = n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }

    /// Reads every pool's classes and the counts of those that have any.
    pub async fn read(store: &dyn WarmStore) -> Result<WarmView, StoreError> {
        let mut view = WarmView::default();
        for (pool, classes) in store.all_warm_classes().await? {
            if classes.classes.is_empty() {
                continue;
            }
            for count in store.warm_counts(&pool).await? {
                view.ready
                    .insert((pool.clone(), count.class), AtomicU32::new(count.ready));
            }
            view.classes.insert(pool, classes);
        }
        Ok(view)
    }
}

/// How often an API process adds the claims it counted to the store's per-minute counts (at
/// most; a create after this long flushes, and so does the admin warm document's read).
pub const CLAIMS_FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Matching creates counted here and not yet added to the store: (hits, misses) by (pool,
/// class), and when they were last flushed.
#[derive(Default)]
struct Tally {
    counts: HashMap<(String, String), (u64, u64)>,
    flushed: Option<Instant>,
}

/// The last [`WarmView`] read and when, and this process's claim counts to flush.
#[derive(Default)]
pub struct WarmCache(Mutex<Option<(Instant, Arc<WarmView>)>>, Mutex<Tally>);

impl WarmCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Arc<WarmView>)>> {
        crate::locks::lock(&self.0)
    }

    /// Counts a create that matched `class` of `pool` (`hit`: answered from a ready
    /// instance). Every [`CLAIMS_FLUSH_EVERY`] the counts go to the store, on a task of their
    /// own so the create does not wait for it; counts of a process that stops before its
    /// next flush are lost (a few seconds' worth; the metric has them).
    pub fn count_claim(
        &self,
        store: Arc<dyn differently_store::Store>,
        pool: String,
        class: String,
        hit: bool,
    ) {
        let due = {
            let mut t = crate::locks::lock(&self.1);
            let n = t.counts.entry((pool, class)).or_default();
            if hit {
                n.0 += 1;
            } else {
                n.1 += 1;
            }
            let due = t
                .flushed
                .is_none_or(|at| at.elapsed() >= CLAIMS_FLUSH_EVERY);
            if due {
                t.flushed = Some(Instant::now());
            }
            due
        };
        if due {
            let taken = self.take_counts();
            tokio::spawn(async move {
                if let Err(e) = write_counts(store.as_ref(), &taken).await {
                    tracing::warn!(error = %e, "warm: claim counts not written; this process's last few seconds are not counted");
                }
            });
        }
    }

    /// Adds what this process counted to the store now (the admin warm document reads
    /// them, and this process's own creates are then counted to the last).
    pub async fn flush_claims(&self, store: &dyn WarmStore) -> Result<(), StoreError> {
        let taken = self.take_counts();
        crate::locks::lock(&self.1).flushed = Some(Instant::now());
        write_counts(store, &taken).await
    }

    fn take_counts(&self) -> Vec<WarmClaims> {
        std::mem::take(&mut crate::locks::lock(&self.1).counts)
            .into_iter()
            .map(|((pool, class), (hits, misses))| WarmClaims {
                pool,
                class,
                hits,
                misses,
            })
            .collect()
    }

    /// The view read less than the TTL ago, else a fresh one from `store` (and kept).
    pub async fn view(&self, store: &dyn WarmStore) -> Result<Arc<WarmView>, StoreError> {
        if let Some((at, view)) = self.lock().as_ref() {
            if at.elapsed() < TTL {
                return Ok(view.clone());
            }
        }
        let view = Arc::new(WarmView::read(store).await?);
        *self.lock() = Some((Instant::now(), view.clone()));
        Ok(view)
    }

    /// Forgets the view (classes were written here): the next create reads the store.
    pub fn clear(&self) {
        *self.lock() = None;
    }
}

async fn write_counts(store: &dyn WarmStore, counts: &[WarmClaims]) -> Result<(), StoreError> {
    if counts.is_empty() {
        return Ok(());
    }
    store.warm_count_claims(counts, chrono::Utc::now()).await
}
