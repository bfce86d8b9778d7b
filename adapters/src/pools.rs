//! The pools this process knows: each pool's adapter and the live view placement decides on.
//! Health is per process (refreshed by `refresh_health`), as in the seeds' pool manager.

use std::sync::{Arc, RwLock};

use differently_core::pool::PoolView;

use crate::SharedAdapter;

/// One pool: its adapter and its current view.
pub struct Pool {
    pub adapter: SharedAdapter,
    view: RwLock<PoolView>,
}

impl Pool {
    /// The pool's current view.
    pub fn view(&self) -> PoolView {
        match self.view.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_healthy(&self, healthy: bool) {
        match self.view.write() {
            Ok(mut v) => v.healthy = healthy,
            Err(poisoned) => poisoned.into_inner().healthy = healthy,
        }
    }
}

/// Every configured pool, in configuration order (the first-fit policy depends on it).
#[derive(Clone, Default)]
pub struct PoolSet {
    pools: Arc<Vec<Arc<Pool>>>,
}

impl PoolSet {
    /// Builds the set. A pool's advertised capabilities are what its adapter implements,
    /// whatever `view.capabilities` said, so nothing is advertised that would fail later.
    pub fn new(pools: Vec<(PoolView, SharedAdapter)>) -> PoolSet {
        let pools = pools
            .into_iter()
            .map(|(mut view, adapter)| {
                view.capabilities = adapter.capabilities();
                Arc::new(Pool {
                    adapter,
                    view: RwLock::new(view),
                })
            })
            .collect();
        PoolSet {
            pools: Arc::new(pools),
        }
    }

    /// The pool called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools.iter().find(|p| p.view().name == name).cloned()
    }

    /// Views of every pool, in order.
    pub fn views(&self) -> Vec<PoolView> {
        self.pools.iter().map(|p| p.view()).collect()
    }

    /// Pool names, in order.
    pub fn names(&self) -> Vec<String> {
        self.pools.iter().map(|p| p.view().name).collect()
    }

    /// Asks every adapter whether its backend answers and records the result.
    pub async fn refresh_health(&self) {
        for p in self.pools.iter() {
            let ok = p.adapter.health().await.is_ok();
            if p.view().healthy != ok {
                tracing::info!(pool = %p.view().name, healthy = ok, "pool health changed");
            }
            p.set_healthy(ok);
        }
    }
}
