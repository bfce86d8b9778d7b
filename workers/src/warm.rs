//! Warm instances (`dly.work.<pool>.{warmcreate,warmdelete}`): created ahead of any sandbox
//! and deleted when the refill leader retires them. There is no sandbox row: the envelope's
//! sandbox id is the warm row's id (`differently_store::warm`), and these handlers never read
//! a sandbox.
//!
//! At-least-once and idempotent: the adapter's create is idempotent on the id, a create whose
//! row is no longer `creating` does nothing (already ready, retiring or gone), a row retired
//! while its create ran has the instance deleted at once, and a delete of a missing instance
//! is a success. Duplicate deliveries of one id in this process wait for each other.
//!
//! Failures: a retryable create is redelivered with the usual back-off up to
//! `max_deliveries`; after that, or at once for a refusal that will not pass (a permanent
//! error, no capacity), the row is removed (`warm_failed`) and the leader backs off the class
//! before it tries again. Deletes never give up (a leaked instance costs money).

use std::collections::{BTreeMap, HashSet};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use chrono::Utc;
use differently_adapters::{AdapterError, CreateInstance};
use differently_bus::Acker;
use differently_bus_schema::{Envelope, Work, WorkOp};
use differently_core::SandboxId;
use differently_store::warm::{WarmInstance, WarmState};

use crate::{backoff, with_progress, Ack, WorkerGroup};

/// How much longer than its class's `maxAgeSeconds` a warm instance's backend-side expiry
/// is: the leader retires it at its max age, so the backend's own expiry is only a backstop
/// for a plane that stopped retiring.
pub const WARM_TTL_MARGIN_SECONDS: u64 = 600;

/// Warm ids being handled by this process.
static IN_FLIGHT: LazyLock<Mutex<HashSet<SandboxId>>> = LazyLock::new(Default::default);

/// This process's hold on one warm id, released when dropped.
struct Held(SandboxId);

impl Held {
    fn take(id: &SandboxId) -> Option<Held> {
        let mut set = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(id.clone()).then(|| Held(id.clone()))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        IN_FLIGHT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

impl WorkerGroup {
    /// Executes a warm create or delete (`op.is_warm()`).
    pub(crate) async fn warm(
        &self,
        env: &Envelope<Work>,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Ack {
        let id = &env.sandbox_id;
        let Some(_held) = Held::take(id) else {
            return Ack::Retry(Duration::from_millis(200));
        };
        match env.body.op {
            WorkOp::WarmCreate => {
                let Some(class) = env.body.warm.as_ref().map(|w| w.class.as_str()) else {
                    tracing::warn!(warm = %id, "worker: warm create without a class dropped");
                    return Ack::Done;
                };
                self.warm_create(id, class, delivered, acker).await
            }
            _ => self.warm_delete(id, delivered, acker).await,
        }
    }

    /// The stored warm row of `id` in this pool, if any.
    async fn warm_row(&self, id: &SandboxId) -> Result<Option<WarmInstance>, Ack> {
        match self.store.warm_instances(&self.pool).await {
            Ok(rows) => Ok(rows.into_iter().find(|r| &r.id == id)),
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: cannot read warm instances; retrying");
                Err(Ack::Retry(Duration::from_secs(1)))
            }
        }
    }

    async fn warm_create(
        &self,
        id: &SandboxId,
        class: &str,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Ack {
        let row = match self.warm_row(id).await {
            Ok(Some(r)) if r.state == WarmState::Creating => r,
            // Ready already (a redelivery), retiring (its delete follows) or gone.
            Ok(_) => return Ack::Done,
            Err(ack) => return ack,
        };
        let classes = match self.store.warm_classes(&self.pool).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: cannot read warm classes; retrying");
                return Ack::Retry(Duration::from_secs(1));
            }
        };
        let Some(spec) = classes.classes.iter().find(|c| c.name == class) else {
            // Removed since: the leader retires the row (and deletes what may exist).
            return Ack::Done;
        };
        let req = CreateInstance {
            sandbox_id: id.clone(),
            installation_id: self.installation.clone(),
            template: spec.template.clone(),
            resources: spec.effective_resources(),
            // Never tenant data: the claimer's env is applied by the data plane per call.
            env: BTreeMap::new(),
            ttl_seconds: spec.max_age_seconds + WARM_TTL_MARGIN_SECONDS,
            from_snapshot: None,
        };
        let adapter = self.adapter();
        let created = with_progress(acker, self.config.ack_wait, adapter.create(&req)).await;
        let instance = match created {
            Ok(i) => i,
            Err(e) => return self.warm_create_failed(id, class, delivered, e).await,
        };
        match self
            .store
            .warm_ready(id, &instance.backend_ref, Utc::now())
            .await
        {
            Ok(true) => {
                let took = (Utc::now() - row.created_at).to_std().unwrap_or_default();
                metrics::histogram!("differently_warm_refill_seconds", "pool" => self.pool.clone(), "class" => class.to_owned())
                    .record(took.as_secs_f64());
                tracing::info!(warm = %id, pool = %self.pool, class, "worker: warm instance ready");
                Ack::Done
            }
            Ok(false) => {
                // Retired or removed while it was being created: nobody will claim it.
                tracing::info!(warm = %id, pool = %self.pool, class, "worker: warm instance no longer wanted; deleting it");
                if let Err(e) = adapter.delete(id).await {
                    tracing::warn!(warm = %id, error = %e, "worker: delete of an unwanted warm instance failed; the reconciler deletes it");
                }
                Ack::Done
            }
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: cannot record a warm instance ready; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    async fn warm_create_failed(
        &self,
        id: &SandboxId,
        class: &str,
        delivered: u64,
        e: AdapterError,
    ) -> Ack {
        tracing::warn!(warm = %id, pool = %self.pool, class, attempt = delivered, error = %e, "worker: warm create failed");
        let passing = e.is_retryable() && !matches!(e, AdapterError::Capacity(_));
        if passing && delivered < self.config.max_deliveries {
            return Ack::Retry(backoff(delivered));
        }
        // Whatever an attempt may have left behind is deleted before the row goes, so the
        // id is never an instance nobody accounts for (the reconciler would find it anyway).
        if let Err(d) = self.adapter().delete(id).await {
            if !matches!(d, AdapterError::NotFound) {
                tracing::warn!(warm = %id, error = %d, "worker: cannot clean up after a failed warm create; retrying");
                return Ack::Retry(backoff(delivered));
            }
        }
        match self.store.warm_failed(id).await {
            Ok(_) => Ack::Done,
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: cannot record a failed warm create; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    async fn warm_delete(&self, id: &SandboxId, delivered: u64, acker: &dyn Acker) -> Ack {
        match self.warm_row(id).await {
            // Claimed meanwhile? A claim removes the row in the transaction that makes the
            // sandbox, and a retired row is never claimed; a ready or creating row here is one
            // the leader has not retired (a stray message): leave it.
            Ok(Some(r)) if r.state != WarmState::Retiring => return Ack::Done,
            Ok(_) => {}
            Err(ack) => return ack,
        }
        // Never delete the instance of a sandbox that owns the id (a row gone because it
        // was claimed is the sandbox's now).
        match self.store.get_sandbox(id).await {
            Ok(Some(_)) => return Ack::Done,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: store unavailable; retrying");
                return Ack::Retry(Duration::from_secs(1));
            }
        }
        let adapter = self.adapter();
        match with_progress(acker, self.config.ack_wait, adapter.delete(id)).await {
            Ok(()) | Err(AdapterError::NotFound) => {}
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, attempt = delivered, "worker: warm delete failed; retrying");
                return Ack::Retry(backoff(delivered));
            }
        }
        match self.store.warm_gone(id).await {
            Ok(_) => Ack::Done,
            Err(e) => {
                tracing::warn!(warm = %id, error = %e, "worker: cannot record a warm instance gone; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }
}
