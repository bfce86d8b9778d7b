//! Per-pool worker groups: execute backend mutations from `dly.work.<pool>.*` with
//! at-least-once delivery and idempotent effects (the sandbox id is the key everywhere).
//!
//! Create: adapter create (idempotent) → `provisioning → running` → event → ack. A worker
//! killed between create and commit leaves the message unacked; it is redelivered after the
//! ack wait and the next create finds the existing instance. Delete: adapter delete
//! (missing is fine) → `terminating → terminated`. Warm instances (`warm`): created and
//! deleted without a sandbox row. A claim (`WorkOp::Claim`, or a create of a `provisioning`
//! row that already has its instance): the adapter's claim call if it needs one, then
//! `provisioning → running`.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_adapters::{AdapterError, CreateInstance, SharedAdapter};
use differently_bus::{Acker, Announcer, BusExt, Delivery, Typed};
use differently_bus_schema::{Envelope, Work, WorkOp};
use differently_core::faults::{self, Faults};
use differently_core::ids::InstallationId;
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use differently_store::work_claims::ClaimKey;
use differently_store::{Actor, Store, StoreError, Transition};
use tokio::sync::{watch, Semaphore};

use crate::claim::Claimed;

mod claim;
pub mod ops;
mod scan;
pub mod warm;

/// Tunables of a worker group.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Redelivery timer of unacked work; in-progress acks extend it during long calls.
    pub ack_wait: Duration,
    /// Create deliveries per activation before giving the sandbox back to placement.
    pub max_deliveries: u64,
    /// Activations per sandbox before it fails for good.
    pub max_attempts: u32,
    /// Backend calls in flight per process.
    pub concurrency: usize,
    /// Quota defaults (the org's stored quota goes over them): starting a stopped sandbox
    /// reserves compute again and is checked against them.
    pub quota: differently_store::Quota,
    /// How often the group looks in the store for creates and deletes the bus has not brought
    /// to any worker (`scan`); zero turns the scan off.
    pub scan_every: Duration,
    /// How long after its change (activation, `terminating`) a call nobody has claimed counts
    /// as not delivered.
    pub scan_after: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            ack_wait: Duration::from_secs(30),
            max_deliveries: 3,
            max_attempts: 3,
            concurrency: 64,
            quota: differently_store::Quota::default(),
            scan_every: Duration::from_millis(500),
            scan_after: Duration::from_secs(1),
        }
    }
}

/// Where a worker group gets its pool's adapter for each call.
#[derive(Clone)]
pub enum AdapterSource {
    /// Always this adapter.
    Fixed(SharedAdapter),
    /// The pool's adapter in this process's pool set at the time of the call, so a pool
    /// changed through the admin API (endpoint, credential, settings) is used by the next
    /// call without restarting the worker. A pool since removed keeps its last adapter (its
    /// remaining work, e.g. deletes, still has to run).
    Live {
        pools: differently_adapters::pools::PoolSet,
        last: Arc<std::sync::Mutex<SharedAdapter>>,
    },
}

impl AdapterSource {
    /// Follows `pool` in `pools`, starting from its current adapter.
    pub fn live(pools: differently_adapters::pools::PoolSet, first: SharedAdapter) -> Self {
        AdapterSource::Live {
            pools,
            last: Arc::new(std::sync::Mutex::new(first)),
        }
    }

    fn current(&self, pool: &str) -> SharedAdapter {
        match self {
            AdapterSource::Fixed(a) => a.clone(),
            AdapterSource::Live { pools, last } => {
                let mut last = match last.lock() {
                    Ok(g) => g,
                    Err(poisoned) => poisoned.into_inner(),
                };
                if let Some(p) = pools.get(pool) {
                    *last = p.adapter.clone();
                }
                last.clone()
            }
        }
    }
}

/// The workers of one pool in this process.
#[derive(Clone)]
pub struct WorkerGroup {
    pub pool: String,
    pub adapter: AdapterSource,
    pub store: Arc<dyn Store>,
    pub announcer: Announcer,
    pub installation: InstallationId,
    pub config: WorkerConfig,
    pub faults: Faults,
}

impl WorkerGroup {
    /// The pool's adapter for the next call (see `AdapterSource`).
    fn adapter(&self) -> SharedAdapter {
        self.adapter.current(&self.pool)
    }

    /// Announces a change this worker committed, with the audit chain head it left, so the
    /// API process that runs the sandbox's next data-plane call appends its record without a
    /// compare-and-swap miss. A lost event only delays watchers until they re-read.
    pub(crate) async fn announce(&self, s: &differently_core::Sandbox) {
        let head = self
            .store
            .audit_head_after(s.id.as_str())
            .map(|(chain, seq, hash)| differently_bus_schema::AuditHead { chain, seq, hash });
        let _ = self.announcer.status_after(s, head).await;
    }

    /// Pulls and executes work until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let def = self
            .announcer
            .naming()
            .work_consumer(&self.pool, self.config.ack_wait);
        let permits = Arc::new(Semaphore::new(self.config.concurrency.max(1)));
        if !self.config.scan_every.is_zero() {
            tokio::spawn(self.clone().scan(permits.clone(), shutdown.clone()));
        }
        loop {
            if *shutdown.borrow() {
                return;
            }
            let mut pull = match self.announcer.bus().pull_typed::<Work>(&def).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(pool = %self.pool, error = %e, "worker: cannot bind consumer; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            tracing::info!(pool = %self.pool, "worker: consuming");
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                // This slot and the free ones: what one request may bring here.
                pull.set_room(permits.available_permits() + 1);
                let next = tokio::select! {
                    n = pull.next(Duration::from_secs(5)) => n,
                    _ = shutdown.changed() => return,
                };
                match next {
                    Ok(Some(work)) => {
                        let group = self.clone();
                        tokio::spawn(async move {
                            group.handle(work).await;
                            drop(permit);
                        });
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(pool = %self.pool, error = %e, "worker: pull failed");
                        break;
                    }
                }
            }
        }
    }

    /// Executes one decoded work message (undecodable ones never get here: the typed pull
    /// settles them).
    async fn handle(&self, work: Typed<Work>) {
        let Typed { env, delivery: d } = work;
        differently_bus::trace::record_consume_lag("work", env.published_at);
        let trace = env.trace.clone();
        differently_bus::trace::scope("work", trace, self.handle_env(env, d)).await;
    }

    async fn handle_env(&self, env: Envelope<Work>, d: Delivery) {
        if env.body.op.is_warm() {
            // No sandbox row under a warm instance's id: nothing to read first.
            let outcome = self.warm(&env, d.delivered, d.acker.as_ref()).await;
            return finish(&env.sandbox_id, outcome, &d).await;
        }
        if let (WorkOp::Delete, Some(t)) = (env.body.op, &env.body.terminating) {
            // Committed `terminating` when published: nothing to read (see `Work::terminating`).
            let id = &env.sandbox_id;
            let key = ClaimKey {
                sandbox: id.clone(),
                status_version: env.status_version,
            };
            let reason = t.reason.clone();
            let outcome = self
                .under_claim(&key, "delete", |claimed| {
                    self.delete_instance(claimed, reason, d.acker.as_ref())
                })
                .await;
            return finish(id, outcome, &d).await;
        }
        if matches!(env.body.op, WorkOp::Create | WorkOp::Claim) {
            // A claim is the create of a sandbox whose instance exists already (`create`).
            return self.create_delivered(&env.sandbox_id, &d).await;
        }
        let read = self.store.get_sandbox(&env.sandbox_id).await;
        let Some(row) = settle_unread(read, &d).await else {
            return;
        };
        let outcome = match env.body.op {
            WorkOp::Create | WorkOp::Claim => self.create(&row, d.acker.as_ref()).await,
            WorkOp::Delete => self.delete(&row, d.acker.as_ref()).await,
            op => {
                self.run_op(
                    &row,
                    op,
                    env.body.op_id.as_deref(),
                    d.delivered,
                    d.acker.as_ref(),
                )
                .await
            }
        };
        finish(&row.id, outcome, &d).await;
    }

    /// A create that came by the bus: the row is read and its create claimed in one round
    /// trip (`claim_create_reading`), then made as [`Self::create`] makes it.
    async fn create_delivered(&self, id: &SandboxId, d: &Delivery) {
        let at = std::time::Instant::now();
        let read = self
            .store
            .claim_create_reading(
                id,
                &self.pool,
                claim::owner(),
                Utc::now(),
                self.claim_hold(),
            )
            .await;
        let Some((row, taken)) = settle_unread(read, d).await else {
            return;
        };
        let key = ClaimKey::of(&row);
        let outcome = self
            .with_claim(&key, "create", at, Ok(taken), |claimed| {
                self.create_claimed(&row, claimed, d.acker.as_ref())
            })
            .await;
        finish(&row.id, outcome, d).await;
    }

    /// Creates `row`'s instance under its activation's claim (`under_claim`): attempts are
    /// counted by the claim, whichever path each came by.
    async fn create(&self, row: &Sandbox, acker: &dyn Acker) -> Ack {
        if row.status != SandboxStatus::Provisioning || row.pool.as_deref() != Some(&self.pool) {
            return Ack::Done; // stale: the row moved on
        }
        let key = ClaimKey::of(row);
        self.under_claim(&key, "create", |claimed| {
            self.create_claimed(row, claimed, acker)
        })
        .await
    }

    async fn create_claimed(&self, row: &Sandbox, claimed: Claimed, acker: &dyn Acker) -> Ack {
        let delivered = claimed.tries;
        if let Some(backend_ref) = &row.backend_ref {
            return self.claim_warm(row, backend_ref, &claimed, acker).await;
        }
        let from_snapshot = match self.restore_ref(row).await {
            Ok(r) => r,
            Err(e) => return self.create_failed(row, delivered, e).await,
        };
        let req = CreateInstance {
            sandbox_id: row.id.clone(),
            installation_id: self.installation.clone(),
            template: row.spec.template.clone(),
            resources: row.spec.resources,
            env: row.spec.env.clone(),
            ttl_seconds: row.spec.ttl_seconds,
            from_snapshot,
        };
        let adapter = self.adapter();
        let call = self.claim_kept(&claimed, adapter.create(&req));
        let Some(created) = with_progress(acker, self.config.ack_wait, call).await else {
            // Another worker has the call; the message comes back to a re-read row.
            return Ack::Retry(claim::HELD_RETRY);
        };
        let instance = match created {
            Ok(i) => i,
            Err(e) => return self.create_failed(row, delivered, e).await,
        };
        tracing::info!(sandbox = %row.id, pool = %self.pool, "worker: instance created");
        if let Some(pause) = self.faults.pause_at(faults::WORKER_AFTER_CREATE) {
            tracing::warn!(sandbox = %row.id, ?pause, "fault point: pausing after create");
            tokio::time::sleep(pause).await;
        }
        self.record_running(row, &instance.backend_ref).await
    }

    /// A `provisioning` row that has its instance already: it claimed a warm instance whose
    /// backend needs a call first (`Adapter::claim_call`, e.g. the tenant's TTL as the
    /// instance's expiry). The call is idempotent, so a redelivery makes it again; then the
    /// row runs as a created one does. See `claim_failed` for a call that fails.
    async fn claim_warm(
        &self,
        row: &Sandbox,
        backend_ref: &str,
        claimed: &Claimed,
        acker: &dyn Acker,
    ) -> Ack {
        let delivered = claimed.tries;
        let adapter = self.adapter();
        if adapter.claim_call() {
            let at = differently_adapters::InstanceRef {
                sandbox_id: row.id.clone(),
                backend_ref: backend_ref.to_owned(),
            };
            let call = self.claim_kept(claimed, adapter.claim(&at, row.spec.ttl_seconds));
            let Some(claimed) = with_progress(acker, self.config.ack_wait, call).await else {
                return Ack::Retry(claim::HELD_RETRY);
            };
            if let Err(e) = claimed {
                return self.claim_failed(row, delivered, e).await;
            }
            if let Some(pause) = self.faults.pause_at(faults::WORKER_AFTER_CLAIM_CALL) {
                tracing::warn!(sandbox = %row.id, ?pause, "fault point: pausing after a claim call");
                tokio::time::sleep(pause).await;
            }
        }
        tracing::info!(sandbox = %row.id, pool = %self.pool, "worker: warm instance claimed");
        self.record_running(row, backend_ref).await
    }

    /// A claim call that failed: retried with back-off while it may pass, then the sandbox
    /// fails. It is never requeued: its id names an instance on this pool, which a placement
    /// elsewhere could not use (the reconciler deletes the instance of a failed row).
    async fn claim_failed(&self, row: &Sandbox, delivered: u64, e: AdapterError) -> Ack {
        tracing::warn!(sandbox = %row.id, pool = %self.pool, attempt = delivered, error = %e, "worker: claim call failed");
        if e.is_retryable() && delivered < self.config.max_deliveries {
            return Ack::Retry(backoff(delivered));
        }
        let t = Transition {
            id: row.id.clone(),
            from: vec![SandboxStatus::Provisioning],
            to: SandboxStatus::Failed,
            reason: Some(format!("the warm instance could not be claimed: {e}")),
            actor: Actor::System("worker"),
        };
        match self.store.transition(t, Utc::now()).await {
            Ok(failed) => {
                self.announce(&failed).await;
                Ack::Done
            }
            Err(StoreError::StatusConflict { .. }) | Err(StoreError::NotFound) => Ack::Done,
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "worker: cannot record failure; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    /// `provisioning → running` with the instance's `backend_ref`, announced.
    async fn record_running(&self, row: &Sandbox, backend_ref: &str) -> Ack {
        match self
            .store
            .mark_running(&row.id, backend_ref, Utc::now())
            .await
        {
            Ok(running) => {
                self.announce(&running).await;
                Ack::Done
            }
            Err(StoreError::StatusConflict { current }) => {
                if current.is_final() {
                    // Deleted or failed while we created: do not leave an orphan behind.
                    if let Err(e) = self.adapter().delete(&row.id).await {
                        tracing::warn!(sandbox = %row.id, error = %e, "worker: orphan delete failed; reconciler will retry");
                    }
                }
                Ack::Done
            }
            Err(StoreError::NotFound) => Ack::Done,
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "worker: cannot record running; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    async fn create_failed(&self, row: &Sandbox, delivered: u64, e: AdapterError) -> Ack {
        tracing::warn!(sandbox = %row.id, pool = %self.pool, attempt = delivered, error = %e, "worker: create failed");
        let capacity = matches!(e, AdapterError::Capacity(_));
        // A pool without room is not asked again: the sandbox goes back to placement at once.
        if !capacity && e.is_retryable() && delivered < self.config.max_deliveries {
            return Ack::Retry(retry_delay(delivered, &e));
        }
        let now = Utc::now();
        if capacity {
            self.refuse_for_capacity(&e, now).await;
        }
        let result = if e.is_retryable() && row.attempts < self.config.max_attempts {
            let not_before = if capacity {
                // Long enough for every process's pool view (re-read every 2 s) to have
                // taken up the refusal, so the next placement skips this pool.
                now + CAPACITY_REQUEUE_DELAY
            } else {
                let own = Duration::from_secs(2_u64.pow(row.attempts.min(6)));
                let wait = own.max(honoured_retry_after(&e));
                now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::seconds(64))
            };
            self.store
                .requeue(&row.id, &format!("create failed: {e}"), not_before)
                .await
        } else {
            let t = Transition {
                id: row.id.clone(),
                from: vec![SandboxStatus::Provisioning],
                to: SandboxStatus::Failed,
                reason: Some(format!(
                    "create failed after {} attempts: {e}",
                    row.attempts
                )),
                actor: Actor::System("worker"),
            };
            self.store.transition(t, now).await
        };
        match result {
            Ok(updated) => {
                if updated.status == SandboxStatus::Queued {
                    let _ = self.announcer.admitted(&updated, "-requeue").await;
                }
                self.announce(&updated).await;
                Ack::Done
            }
            Err(StoreError::StatusConflict { .. }) | Err(StoreError::NotFound) => Ack::Done,
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "worker: cannot record failure; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    /// The backend refused a create for capacity: no new placements on this pool for the
    /// backend's `Retry-After` (or [`CAPACITY_BACKOFF`]), here at once and fleet-wide
    /// through the health view (this worker's probes keep reporting it until then).
    async fn refuse_for_capacity(&self, e: &AdapterError, now: chrono::DateTime<Utc>) {
        let wait = e
            .retry_after()
            .unwrap_or(CAPACITY_BACKOFF)
            .clamp(Duration::from_secs(1), MAX_CAPACITY_BACKOFF);
        let until = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::seconds(30));
        if let AdapterSource::Live { pools, .. } = &self.adapter {
            if let Some(p) = pools.get(&self.pool) {
                p.refuse_for_capacity(until);
            }
        }
        let health = differently_core::pool::PoolHealth {
            name: self.pool.clone(),
            healthy: false,
            capabilities: differently_core::capability::names(&self.adapter().capabilities()),
            error: Some(differently_adapters::pools::capacity_health_error(until)),
            checked_at: now,
            checked_by: format!("worker:{}", std::process::id()),
            backend: None,
        };
        tracing::warn!(pool = %self.pool, until = %until, "worker: pool refused a create for capacity; no new placements on it until then");
        if let Err(e) = self.store.report_pool_health(&health).await {
            tracing::warn!(pool = %self.pool, error = %e, "worker: cannot report the capacity refusal");
        }
    }

    /// Deletes a terminating row's instance under the claim of its delete (`under_claim`).
    async fn delete(&self, row: &Sandbox, acker: &dyn Acker) -> Ack {
        if row.status != SandboxStatus::Terminating {
            return Ack::Done;
        }
        let reason = row.status_reason.clone();
        let key = ClaimKey::of(row);
        self.under_claim(&key, "delete", |claimed| {
            self.delete_instance(claimed, reason, acker)
        })
        .await
    }

    /// Deletes the instance of sandbox `id`, committed `terminating` for `reason`, and records
    /// `terminated` (keeping the reason). Redelivery is harmless: a missing instance is fine and
    /// a row already past `terminating` refuses the change.
    async fn delete_instance(
        &self,
        claimed: Claimed,
        reason: Option<String>,
        acker: &dyn Acker,
    ) -> Ack {
        let (id, delivered) = (&claimed.key.sandbox, claimed.tries);
        let adapter = self.adapter();
        let call = self.claim_kept(&claimed, adapter.delete(id));
        let Some(deleted) = with_progress(acker, self.config.ack_wait, call).await else {
            return Ack::Retry(claim::HELD_RETRY);
        };
        match deleted {
            Ok(()) | Err(AdapterError::NotFound) => {
                if let Some(pause) = self.faults.pause_at(faults::WORKER_AFTER_DELETE) {
                    tracing::warn!(sandbox = %id, ?pause, "fault point: pausing after delete");
                    tokio::time::sleep(pause).await;
                }
            }
            Err(e) => {
                // Deletes never give up: a leaked sandbox costs money.
                tracing::warn!(sandbox = %id, error = %e, attempt = delivered, "worker: delete failed; retrying");
                return Ack::Retry(backoff(delivered));
            }
        }
        let t = Transition {
            id: id.clone(),
            from: vec![SandboxStatus::Terminating],
            to: SandboxStatus::Terminated,
            reason,
            actor: Actor::System("worker"),
        };
        match self.store.transition(t, Utc::now()).await {
            Ok(done) => {
                self.announce(&done).await;
                Ack::Done
            }
            Err(StoreError::StatusConflict { .. }) | Err(StoreError::NotFound) => Ack::Done,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "worker: cannot record terminated; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }
}

/// The row a work message needs, or the message settled without it: a sandbox that is gone
/// ends the message (`term`: no redelivery can find it), a store that cannot answer sends it
/// back for a retry in a second.
async fn settle_unread<T>(read: Result<Option<T>, StoreError>, d: &Delivery) -> Option<T> {
    match read {
        Ok(Some(row)) => Some(row),
        Ok(None) => {
            let _ = d.acker.term().await;
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "worker: store unavailable; retrying");
            let _ = d.acker.nak(Duration::from_secs(1)).await;
            None
        }
    }
}

impl WorkerGroup {
    /// The backend ref of the snapshot a fork/restore starts from (label
    /// `differently.dev/from-snapshot`). A snapshot that is missing, not ready or on another
    /// pool fails the create: starting empty instead would be a silent degrade.
    async fn restore_ref(&self, row: &Sandbox) -> Result<Option<String>, AdapterError> {
        let Some(raw) = row.spec.labels.get(FROM_SNAPSHOT_LABEL) else {
            return Ok(None);
        };
        let unusable = |why: &str| AdapterError::permanent(format!("snapshot {raw}: {why}"));
        let id = differently_core::ids::SnapshotId::parse(raw).map_err(|_| unusable("bad id"))?;
        match self.store.get_snapshot(&id).await {
            Ok(Some(s)) if s.pool != self.pool => Err(unusable("held by another pool")),
            Ok(Some(s)) => s.backend_ref.map(Some).ok_or_else(|| unusable("not ready")),
            Ok(None) => Err(unusable("does not exist")),
            Err(e) => Err(AdapterError::transient(format!(
                "cannot read snapshot: {e}"
            ))),
        }
    }
}

pub use differently_core::sandbox::FROM_SNAPSHOT_LABEL;

/// Acknowledges a handled message as `outcome` says.
async fn finish(id: &SandboxId, outcome: Ack, d: &Delivery) {
    let result = match outcome {
        Ack::Done => d.acker.ack().await,
        Ack::Retry(delay) => d.acker.nak(delay).await,
    };
    if let Err(e) = result {
        tracing::warn!(sandbox = %id, error = %e, "worker: ack failed; the message will be redelivered");
    }
}

pub(crate) enum Ack {
    Done,
    Retry(Duration),
}

/// How long a pool that refused a create for capacity without a `Retry-After` gets no new
/// placements.
pub const CAPACITY_BACKOFF: Duration = Duration::from_secs(30);

/// Longest capacity back-off, whatever the backend's `Retry-After` says: the pool is tried
/// again after this.
pub const MAX_CAPACITY_BACKOFF: Duration = Duration::from_secs(600);

/// Delay before a sandbox refused for capacity is placed again (see `create_failed`).
const CAPACITY_REQUEUE_DELAY: chrono::Duration = chrono::Duration::seconds(2);

/// Exponential back-off for redeliveries: 1 s, 2 s, 4 s … capped at 60 s.
pub(crate) fn backoff(delivered: u64) -> Duration {
    doubling(Duration::from_secs(1), Duration::from_secs(60), delivered)
}

/// Longest backend `Retry-After` a retry waits for: a larger one is taken as this, so a
/// wrong header cannot park a sandbox for hours.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The backend's `Retry-After` on a retryable error, capped at [`MAX_RETRY_AFTER`]; zero
/// when it sent none.
fn honoured_retry_after(e: &AdapterError) -> Duration {
    e.retry_after().unwrap_or_default().min(MAX_RETRY_AFTER)
}

/// When to try a retryable call again: our own back-off, or later if the backend asked for
/// longer (a throttled create answers 429 with `Retry-After`; retrying earlier only earns
/// another 429).
pub(crate) fn retry_delay(delivered: u64, e: &AdapterError) -> Duration {
    backoff(delivered).max(honoured_retry_after(e))
}

/// `first` on the first delivery, doubling with each redelivery, never above `cap`.
pub(crate) fn doubling(first: Duration, cap: Duration, delivered: u64) -> Duration {
    let doublings = delivered.saturating_sub(1).min(16) as u32;
    first.saturating_mul(1u32 << doublings).min(cap)
}

/// Runs `fut`, telling the bus we are still working every third of the ack wait.
pub(crate) async fn with_progress<T>(
    acker: &dyn Acker,
    ack_wait: Duration,
    fut: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(fut);
    let every = (ack_wait / 3).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            out = &mut fut => return out,
            _ = tokio::time::sleep(every) => {
                if let Err(e) = acker.in_progress().await {
                    tracing::warn!(error = %e, "worker: in-progress ack failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_waits_for_the_backends_retry_after_when_it_is_longer() {
        use differently_adapters::Reason;
        let throttled = |secs| {
            AdapterError::Transient(Reason::from("429").with_retry_after(Duration::from_secs(secs)))
        };
        assert_eq!(retry_delay(1, &throttled(45)), Duration::from_secs(45));
        // Our own back-off is longer: it wins.
        assert_eq!(retry_delay(7, &throttled(3)), Duration::from_secs(60));
        // None sent: our back-off.
        assert_eq!(
            retry_delay(2, &AdapterError::transient("x")),
            Duration::from_secs(2)
        );
        // A wrong header cannot park it for hours.
        assert_eq!(retry_delay(1, &throttled(86_400)), MAX_RETRY_AFTER);
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(100), Duration::from_secs(60));
        let ms = Duration::from_millis;
        let polls: Vec<Duration> = (1..=7).map(|d| doubling(ms(100), ms(2000), d)).collect();
        assert_eq!(
            polls,
            [
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1600),
                ms(2000),
                ms(2000)
            ]
        );
    }
}
