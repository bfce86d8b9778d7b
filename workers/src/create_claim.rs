//! The create claim a worker takes before calling the backend's create (see
//! `differently_store::create_claims`): whose it is, how long it holds, and keeping it while
//! the call runs.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::Utc;
use differently_store::create_claims::ClaimKey;
use differently_store::Store;

/// This process's name on the claims it takes: the pid for the operator who reads a stuck
/// claim, and a ULID since pids repeat across hosts and restarts.
pub(crate) fn owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| format!("worker:{}:{}", std::process::id(), ulid::Ulid::new()))
}

/// Runs `call` while keeping `key`'s claim for `hold` past every renewal (every third of
/// it). A lost claim (this process stalled past `hold` and another worker took it over) is
/// logged and the call goes on: the adapters' create is idempotent, so the worst left is what a
/// bus redelivery always risked.
pub(crate) async fn renewing<T>(
    store: &dyn Store,
    key: &ClaimKey,
    hold: Duration,
    call: impl Future<Output = T>,
) -> T {
    tokio::pin!(call);
    let every = (hold / 3).max(Duration::from_millis(100));
    let mut lost = false;
    loop {
        tokio::select! {
            out = &mut call => return out,
            _ = tokio::time::sleep(every) => {
                if lost {
                    continue;
                }
                match store.renew_create_claim(key, owner(), Utc::now(), hold).await {
                    Ok(true) => {}
                    Ok(false) => {
                        lost = true;
                        tracing::warn!(sandbox = %key.sandbox, "worker: lost the create claim while creating; another worker took it over");
                    }
                    Err(e) => tracing::warn!(sandbox = %key.sandbox, error = %e, "worker: cannot renew the create claim"),
                }
            }
        }
    }
}
