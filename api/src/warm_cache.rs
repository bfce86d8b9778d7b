//! Every pool's warm classes and ready counts, kept for `auth_cache::TTL`, for the create
//! path: which class a create matches on its pool (`DirectPlacement::warm_class`) and which
//! permitted pool has a ready instance of it (ranked first). One read of the store per TTL
//! instead of one per create.
//!
//! The counts only rank: the claim inside the admission transaction is the authority, so a
//! count a second old costs at most a create placed cold (a miss) or a warm pool ranked
//! first whose last instance another create just took. Classes written through this process
//! clear the cache at once; through another API process, they reach this one within the TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::SandboxSpec;
use differently_store::warm::WarmStore;
use differently_store::StoreError;

use crate::auth_cache::TTL;

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

/// The last [`WarmView`] read and when.
#[derive(Default)]
pub struct WarmCache(Mutex<Option<(Instant, Arc<WarmView>)>>);

impl WarmCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Arc<WarmView>)>> {
        crate::locks::lock(&self.0)
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
