//! The work claim a worker takes before calling the backend for a create or a delete (see
//! `differently_store::work_claims`): whose it is, how long it holds, keeping it while the
//! call runs, and letting go of it after.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::Utc;
use differently_store::work_claims::ClaimKey;
use differently_store::Store;

use crate::{Ack, WorkerGroup};

impl WorkerGroup {
    /// Runs `call` (given this claim's try count) under `key`'s claim. A claim someone else
    /// holds means another worker (or this one, by its other path) is making this call: this
    /// delivery comes back after [`HELD_RETRY`]. After the call the claim is dropped (done) or let go until the retry's back-off
    /// has passed, so whichever path comes next counts the next try.
    pub(crate) async fn under_claim<F, Fut>(&self, key: &ClaimKey, what: &str, call: F) -> Ack
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Ack>,
    {
        let hold = claim_hold(self.config.ack_wait);
        let tries = match self.store.claim_work(key, owner(), Utc::now(), hold).await {
            Ok(Some(tries)) => u64::from(tries),
            Ok(None) => {
                // Not acknowledged: were the holder to die, a scan takes the row up once its
                // claim runs out, but with the scan off only this message would. It comes
                // back until the row has moved on (then it is stale) or the claim is free.
                tracing::debug!(sandbox = %key.sandbox, what, "worker: already claimed");
                return Ack::Retry(HELD_RETRY);
            }
            Err(e) => {
                tracing::warn!(sandbox = %key.sandbox, what, error = %e, "worker: cannot claim the call; retrying");
                return Ack::Retry(Duration::from_secs(1));
            }
        };
        let outcome = call(tries).await;
        let settled = match outcome {
            Ack::Done => self.store.drop_work_claim(key).await,
            Ack::Retry(delay) => {
                let free_at = Utc::now()
                    + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::seconds(1));
                self.store.release_work_claim(key, owner(), free_at).await
            }
        };
        if let Err(e) = settled {
            // It runs out after the hold: the next try waits that long at most.
            tracing::warn!(sandbox = %key.sandbox, what, error = %e, "worker: cannot settle the claim");
        }
        outcome
    }
}

/// How long a claim holds without renewal: two thirds of the ack wait, so a dead holder's
/// claim has run out by the time the bus redelivers its message (after the ack wait) and the
/// redelivery makes the call at once, as it did before claims. With the full ack wait the
/// redelivery came a few milliseconds early, found the claim held and waited another
/// second (fault suite S1 saw the client delete the sandbox first). A live holder renews it
/// every third of the hold.
fn claim_hold(ack_wait: Duration) -> Duration {
    (ack_wait * 2 / 3).max(Duration::from_millis(500))
}

/// How soon work whose claim another worker holds is looked at again.
const HELD_RETRY: Duration = Duration::from_secs(1);

/// This process's name on the claims it takes: the pid for the operator who reads a stuck
/// claim, and a ULID since pids repeat across hosts and restarts.
pub(crate) fn owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| format!("worker:{}:{}", std::process::id(), ulid::Ulid::new()))
}

impl WorkerGroup {
    /// Runs the backend `call` while keeping `key`'s claim (see [`renewing`]). Only the call:
    /// like the bus's in-progress acks, the claim is not kept through what follows it, so a
    /// worker that stops right after the call (fault suite S1) loses it when the bus would
    /// redeliver.
    pub(crate) async fn claim_kept<T>(&self, key: &ClaimKey, call: impl Future<Output = T>) -> T {
        let hold = claim_hold(self.config.ack_wait);
        renewing(self.store.as_ref(), key, hold, call).await
    }
}

/// Runs `call` while keeping `key`'s claim for `hold` past every renewal (every third of
/// it). A lost claim (this process stalled past `hold` and another worker took it over) is
/// logged and the call goes on: the adapters' create is idempotent and a delete of a missing
/// instance is fine, so the worst left is what a bus redelivery always risked.
async fn renewing<T>(
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
                match store.renew_work_claim(key, owner(), Utc::now(), hold).await {
                    Ok(true) => {}
                    Ok(false) => {
                        lost = true;
                        tracing::warn!(sandbox = %key.sandbox, "worker: lost the claim during the call; another worker took it over");
                    }
                    Err(e) => tracing::warn!(sandbox = %key.sandbox, error = %e, "worker: cannot renew the claim"),
                }
            }
        }
    }
}
