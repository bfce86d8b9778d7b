//! The work claim a worker takes before calling the backend for a create or a delete (see
//! `differently_store::work_claims`): whose it is, how long it holds, keeping it while the
//! call runs, and letting go of it after.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::Utc;
use differently_store::work_claims::{ClaimKey, ClaimOutcome};
use differently_store::{Store, StoreError};

use crate::{Ack, WorkerGroup};

/// A claim this worker took: on what, its try count, and when it was asked for (the claim
/// holds from then until the hold runs out, so a call that starts soon after needs no
/// further check; see [`WorkerGroup::claim_kept`]).
pub(crate) struct Claimed {
    pub(crate) key: ClaimKey,
    pub(crate) tries: u64,
    pub(crate) at: std::time::Instant,
}

impl WorkerGroup {
    /// Runs `call` under `key`'s claim, taken only while the row is still at `key`'s change
    /// (`claim_current_work`); see [`Self::with_claim`].
    pub(crate) async fn under_claim<F, Fut>(&self, key: &ClaimKey, what: &str, call: F) -> Ack
    where
        F: FnOnce(Claimed) -> Fut,
        Fut: Future<Output = Ack>,
    {
        let at = std::time::Instant::now();
        let taken = self
            .store
            .claim_current_work(key, owner(), Utc::now(), self.claim_hold())
            .await;
        self.with_claim(key, what, at, taken, call).await
    }

    /// Runs `call` if `taken` (the answer of a claim asked for at `at`) is this worker's. A
    /// claim someone else holds means another worker (or this one, by its other path) is
    /// making this call: this delivery comes back after [`HELD_RETRY`]. A row that moved on
    /// is stale work, done. After a failed call the claim is let go until the retry's
    /// back-off has passed, so whichever path comes next counts the next try. After a
    /// finished one (`Ack::Done`: the row moved on, by this worker's own status change or
    /// another's) nothing is sent: the claim's change no longer exists, so nobody can claim
    /// it again, and the scan forgets it with every other settled claim in one statement
    /// (`prune_settled_work_claims`).
    pub(crate) async fn with_claim<F, Fut>(
        &self,
        key: &ClaimKey,
        what: &str,
        at: std::time::Instant,
        taken: Result<ClaimOutcome, StoreError>,
        call: F,
    ) -> Ack
    where
        F: FnOnce(Claimed) -> Fut,
        Fut: Future<Output = Ack>,
    {
        let tries = match taken {
            Ok(ClaimOutcome::Taken(tries)) => u64::from(tries),
            Ok(ClaimOutcome::Held) => {
                // Not acknowledged: were the holder to die, a scan takes the row up once its
                // claim runs out, but with the scan off only this message would. It comes
                // back until the row has moved on (then it is stale) or the claim is free.
                tracing::debug!(sandbox = %key.sandbox, what, "worker: already claimed");
                return Ack::Retry(HELD_RETRY);
            }
            Ok(ClaimOutcome::Moved) => {
                tracing::debug!(sandbox = %key.sandbox, what, "worker: the row moved on; stale work");
                return Ack::Done;
            }
            Err(e) => {
                tracing::warn!(sandbox = %key.sandbox, what, error = %e, "worker: cannot claim the call; retrying");
                return Ack::Retry(Duration::from_secs(1));
            }
        };
        let claimed = Claimed {
            key: key.clone(),
            tries,
            at,
        };
        let outcome = call(claimed).await;
        if let Ack::Retry(delay) = outcome {
            let free_at = Utc::now()
                + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::seconds(1));
            if let Err(e) = self.store.release_work_claim(key, owner(), free_at).await {
                // It runs out after the hold: the next try waits that long at most.
                tracing::warn!(sandbox = %key.sandbox, what, error = %e, "worker: cannot let go of the claim");
            }
        }
        outcome
    }

    /// How long this group's claims hold without renewal ([`claim_hold`]).
    pub(crate) fn claim_hold(&self) -> Duration {
        claim_hold(self.config.ack_wait)
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
pub(crate) const HELD_RETRY: Duration = Duration::from_secs(1);

/// This process's name on the claims it takes: the pid for the operator who reads a stuck
/// claim, and a ULID since pids repeat across hosts and restarts.
pub(crate) fn owner() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| format!("worker:{}:{}", std::process::id(), ulid::Ulid::new()))
}

impl WorkerGroup {
    /// Runs the backend `call` while keeping `claimed`'s claim (see [`renewing`]). A claim
    /// asked for less than a third of the hold ago needs no check first: it was taken only
    /// because its row was at its change, in the same statement, and nobody else can take
    /// it before the hold runs out (most calls start a few milliseconds after it). An older
    /// one (a stall, or slow reads before the call) is checked first: [`still_held`] says
    /// the claim is still this worker's and [`row_unmoved`] that the row is still at the
    /// change the call is for. `None`: one of them is not (or could not be read) and nothing
    /// was called, or the claim was lost during the call and it was stopped. Either way the
    /// work comes back to a re-read row. Only the call: like the bus's in-progress acks, the
    /// claim is not kept through what follows it, so a worker that stops right after the
    /// call (fault suite S1) loses it when the bus would redeliver.
    pub(crate) async fn claim_kept<T>(
        &self,
        claimed: &Claimed,
        call: impl Future<Output = T>,
    ) -> Option<T> {
        let hold = self.claim_hold();
        let store = self.store.as_ref();
        let key = &claimed.key;
        let every = renew_every(hold);
        if claimed.at.elapsed() < every {
            let due = tokio::time::Instant::from_std(claimed.at) + every;
            return renewing(store, key, hold, due, call).await;
        }
        // The two checks go out together, one round trip rather than two: each stands alone
        // (a renewal that succeeds means no other owner came between, a row read after the
        // claim cannot be older than it). Answers that took `hold` or longer are not
        // trusted, whichever check stalled: the worker may have stalled after they were
        // read (S15 stopped it inside the row's re-read, which then answered with the row as
        // it was 8 s earlier).
        let started = std::time::Instant::now();
        let (held, unmoved) = tokio::join!(still_held(store, key, hold), row_unmoved(store, key));
        let fresh = held && unmoved;
        if !fresh || started.elapsed() >= hold {
            if fresh {
                tracing::warn!(sandbox = %key.sandbox, "worker: the checks before the call took longer than the claim holds; not calling");
            }
            return None;
        }
        let due = tokio::time::Instant::now() + every;
        renewing(store, key, hold, due, call).await
    }
}

/// How often a claim is renewed while its call runs: every third of the hold.
fn renew_every(hold: Duration) -> Duration {
    (hold / 3).max(Duration::from_millis(100))
}

/// Whether `key`'s row is still at the change its call is for. A worker stalled while it
/// read the row (fault suite S15: SIGSTOP during that read) went on with the row as it was
/// before the stall; meanwhile another worker had made the call, the sandbox had been
/// deleted and the claim dropped, so its fresh claim held and its call made a second
/// instance. A row read after the claim cannot be older than the claim.
async fn row_unmoved(store: &dyn Store, key: &ClaimKey) -> bool {
    match store.get_sandbox(&key.sandbox).await {
        Ok(Some(row)) if row.status_version == key.status_version => true,
        Ok(_) => {
            tracing::info!(sandbox = %key.sandbox, "worker: the row moved on before the call; not calling");
            false
        }
        Err(e) => {
            tracing::warn!(sandbox = %key.sandbox, error = %e, "worker: cannot re-read the row before the call");
            false
        }
    }
}

/// Whether `key`'s claim is still this worker's, renewed for `hold`, right before its call.
/// A worker stalled between its claim and its call (fault suite S15: SIGSTOP) found, when
/// it went on, that another worker had taken the lapsed claim over and made the call, the
/// sandbox had been deleted meanwhile, and its own call made a second instance. What is
/// left is a stall between these checks and the call's request.
async fn still_held(store: &dyn Store, key: &ClaimKey, hold: Duration) -> bool {
    match store.renew_work_claim(key, owner(), Utc::now(), hold).await {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(sandbox = %key.sandbox, "worker: the claim lapsed before the call; another worker has it or will");
            false
        }
        Err(e) => {
            tracing::warn!(sandbox = %key.sandbox, error = %e, "worker: cannot check the claim before the call");
            false
        }
    }
}

/// Runs `call` while keeping `key`'s claim for `hold` past every renewal (the first at
/// `due`, then every third of the hold); `None` if the claim was lost meanwhile (this process stalled past `hold` and another
/// worker took it over): the call is dropped unfinished, since the other worker makes it.
/// The call is never polled once a renewal is due, by the clock rather than by a timer: a
/// worker woken from a stall (fault suite S15: SIGSTOP in the fake backend's latency) had
/// its call's timer fire before the renewal's and went on to make a second instance of a
/// sandbox the other worker had made and that had since been deleted.
async fn renewing<T>(
    store: &dyn Store,
    key: &ClaimKey,
    hold: Duration,
    mut due: tokio::time::Instant,
    call: impl Future<Output = T>,
) -> Option<T> {
    tokio::pin!(call);
    let every = renew_every(hold);
    loop {
        let mut pending = call.as_mut();
        let until_due = std::future::poll_fn(move |cx| {
            if tokio::time::Instant::now() >= due {
                return std::task::Poll::Ready(None);
            }
            pending.as_mut().poll(cx).map(Some)
        });
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(due) => {}
            out = until_due => if let Some(out) = out {
                return Some(out);
            },
        }
        due = tokio::time::Instant::now() + every;
        match store.renew_work_claim(key, owner(), Utc::now(), hold).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(sandbox = %key.sandbox, "worker: lost the claim during the call; another worker took it over, so this call stops");
                return None;
            }
            Err(e) => {
                tracing::warn!(sandbox = %key.sandbox, error = %e, "worker: cannot renew the claim")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use differently_core::SandboxId;
    use differently_store::memory::MemoryStore;
    use differently_store::work_claims::WorkClaimStore;

    #[tokio::test]
    async fn a_lapsed_claim_taken_over_and_done_stops_the_call_of_its_first_holder() {
        let store = MemoryStore::new();
        let key = ClaimKey {
            sandbox: SandboxId::new(),
            status_version: 3,
        };
        let hold = Duration::from_millis(500);
        let now = Utc::now();
        assert!(store
            .claim_work(&key, owner(), now, hold)
            .await
            .unwrap()
            .is_some());
        assert!(still_held(&store, &key, hold).await, "its own live claim");
        // This worker stalls past the hold; another takes the claim over and finishes.
        let later = now + chrono::Duration::seconds(5);
        assert!(store
            .claim_work(&key, "worker:other", later, hold)
            .await
            .unwrap()
            .is_some());
        assert!(
            !still_held(&store, &key, hold).await,
            "held by the other worker"
        );
        store.drop_work_claim(&key).await.unwrap();
        assert!(
            !still_held(&store, &key, hold).await,
            "done by the other worker"
        );
    }
}
