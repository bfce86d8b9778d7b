//! Lifecycle operations (`dly.work.<pool>.{pause,resume,stop,start,snapshot,deletesnapshot,
//! exposeport,renew}`): the API (or a sweep) inserted an operation record and published its
//! id; the worker executes it against the adapter and records the outcome on the record, where
//! the waiting caller (or nobody: the change completes anyway) reads it.
//!
//! Idempotent under redelivery: a finished record is not executed again; a status transition
//! already made (the row is in the target status) is recorded as done without a backend call,
//! except `start`, which records first (to reserve quota) and so issues its backend start
//! again on a pending record; adapters' lifecycle calls are themselves idempotent. Retryable
//! backend errors are retried with back-off up to `max_deliveries`, then the operation fails
//! with `provider_unavailable` (`insufficient_capacity` when the backend said it has no room).

use differently_bus_schema::public::{EventError, SnapshotEvent};
use differently_bus_schema::{EventData, Origin, PublicEvent};
use std::time::Duration;

use chrono::Utc;
use differently_adapters::{AdapterError, InstanceRef};
use differently_bus::Acker;
use differently_bus_schema::WorkOp;
use differently_core::ids::{OpId, SnapshotId};
use differently_core::{faults, ErrorCode, Sandbox, SandboxStatus};
use differently_store::lifecycle::{OpError, OpRecord, OpState, SnapshotStatus};
use differently_store::{Actor, StoreError, Transition};
use serde_json::{json, Value};

use crate::{backoff, with_progress, Ack, WorkerGroup};

fn op_error(code: ErrorCode, message: impl Into<String>) -> OpError {
    OpError {
        code: code.as_str().to_owned(),
        message: message.into(),
    }
}

/// How a backend error is served to the caller that waits for the operation.
fn adapter_op_error(e: &AdapterError) -> OpError {
    match e {
        AdapterError::Unsupported(m) => op_error(ErrorCode::UnsupportedOperation, m.clone()),
        AdapterError::NotFound => op_error(
            ErrorCode::ProviderUnavailable,
            "the sandbox's backend instance is missing",
        ),
        AdapterError::PathNotFound(p) => op_error(ErrorCode::NotFound, p.clone()),
        AdapterError::Permanent(m) => op_error(ErrorCode::Conflict, m.clone()),
        AdapterError::Transient(_) | AdapterError::Unavailable(_) => op_error(
            ErrorCode::ProviderUnavailable,
            "the sandbox's backend is unavailable",
        ),
        AdapterError::Capacity(_) => op_error(
            ErrorCode::InsufficientCapacity,
            "the sandbox's backend has no capacity for this now; retry later",
        ),
        AdapterError::BadPath(p) => op_error(ErrorCode::Conflict, p.to_string()),
    }
}

/// Operations being executed by this process, so that duplicate deliveries of one are not
/// executed side by side (across processes, the record's state and idempotent adapter calls
/// still settle them).
static IN_FLIGHT: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<OpId>>> =
    std::sync::LazyLock::new(Default::default);

/// This process's claim on executing one operation, released when dropped.
struct InFlight(OpId);

impl InFlight {
    /// The claim, or `None` when another delivery of `id` holds it.
    fn claim(id: &OpId) -> Option<InFlight> {
        let mut set = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(id.clone()).then(|| InFlight(id.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

enum Outcome {
    Done(Value),
    Failed(OpError),
    Retry(Duration),
}

impl WorkerGroup {
    /// Executes the operation `op_id` of kind `op` on `row`'s instance.
    pub(crate) async fn run_op(
        &self,
        row: &Sandbox,
        op: WorkOp,
        op_id: Option<&str>,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Ack {
        let Some(id) = op_id.and_then(|s| OpId::parse(s).ok()) else {
            tracing::warn!(sandbox = %row.id, ?op, "worker: lifecycle work without an operation id dropped");
            return Ack::Done;
        };
        let record = match self.store.get_op(&id).await {
            Ok(Some(r)) => r,
            Ok(None) => return Ack::Done,
            Err(e) => {
                tracing::warn!(op = %id, error = %e, "worker: cannot read operation; retrying");
                return Ack::Retry(Duration::from_secs(1));
            }
        };
        if record.state != OpState::Pending {
            return Ack::Done; // redelivery of finished work
        }
        // Another delivery of it runs in this process: let that one settle it. Without this,
        // duplicates handled at once each called the backend, and a late one could re-apply a
        // pause after the resume that followed it.
        let Some(_running) = InFlight::claim(&id) else {
            return Ack::Retry(Duration::from_millis(200));
        };
        let outcome = self.execute(row, op, &record, delivered, acker).await;
        let (state, result, error) = match outcome {
            Outcome::Retry(d) => return Ack::Retry(d),
            Outcome::Done(v) => (OpState::Done, v, None),
            Outcome::Failed(e) => (OpState::Failed, Value::Null, Some(e)),
        };
        tracing::info!(sandbox = %row.id, op = %id, kind = op.as_str(), state = state.as_str(), "worker: operation finished");
        match self
            .store
            .finish_op(&id, state, result, error.clone(), Utc::now())
            .await
        {
            Ok(_) => {
                // The public outcome, with the cause of the request (the operation's actor).
                let (ty, error) = match &error {
                    None => (differently_bus_schema::EventType::OperationFinished, None),
                    Some(e) => (
                        differently_bus_schema::EventType::OperationFailed,
                        Some(differently_bus_schema::public::EventError {
                            code: e.code.clone(),
                            message: e.message.clone(),
                        }),
                    ),
                };
                let origin = differently_bus_schema::Origin::from_audit_actor(&record.actor);
                let _ = self
                    .announcer
                    .operation(row, ty, id.as_str(), op.as_str(), error, origin)
                    .await;
                // Wake waiters even when the status did not change (snapshot, port): they
                // re-read the operation on any event of the sandbox.
                Ack::Done
            }
            Err(e) => {
                tracing::warn!(op = %id, error = %e, "worker: cannot record outcome; retrying");
                Ack::Retry(Duration::from_secs(1))
            }
        }
    }

    fn instance_ref(row: &Sandbox) -> Option<InstanceRef> {
        row.backend_ref.as_ref().map(|r| InstanceRef {
            sandbox_id: row.id.clone(),
            backend_ref: r.clone(),
        })
    }

    /// A backend error: retry while it may pass, then fail the operation.
    fn failed(&self, row: &Sandbox, e: AdapterError, delivered: u64) -> Outcome {
        tracing::warn!(sandbox = %row.id, pool = %self.pool, error = %e, attempt = delivered, "worker: lifecycle call failed");
        if e.is_retryable() && delivered < self.config.max_deliveries {
            Outcome::Retry(backoff(delivered))
        } else {
            Outcome::Failed(adapter_op_error(&e))
        }
    }

    async fn execute(
        &self,
        row: &Sandbox,
        op: WorkOp,
        record: &OpRecord,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Outcome {
        let wait = self.config.ack_wait;
        if let Some(t) = op.lifecycle() {
            let (from, to) = (t.from(), t.to());
            return self
                .transition(row, op, from, to, record, delivered, acker)
                .await;
        }
        match op {
            WorkOp::Snapshot => self.snapshot(row, record, delivered, acker).await,
            WorkOp::DeleteSnapshot => {
                let Some(snap) = snapshot_arg(record) else {
                    return Outcome::Failed(op_error(ErrorCode::Internal, "no snapshot id"));
                };
                let rec = match self.store.get_snapshot(&snap).await {
                    Ok(Some(r)) => r,
                    Ok(None) => return Outcome::Done(Value::Null),
                    Err(_) => return Outcome::Retry(Duration::from_secs(1)),
                };
                if let Some(r) = rec.backend_ref.clone() {
                    let res = with_progress(acker, wait, self.adapter().delete_snapshot(&r)).await;
                    if let Err(e) = res {
                        return self.snapshot_delete_failed(row, rec, e, delivered).await;
                    }
                }
                match self.store.remove_snapshot(&snap).await {
                    Ok(()) => {
                        self.announce_snapshot(&rec, record, EventData::SnapshotDeleted, None)
                            .await;
                        Outcome::Done(Value::Null)
                    }
                    Err(_) => Outcome::Retry(Duration::from_secs(1)),
                }
            }
            WorkOp::ExposePort => {
                let Some(at) = Self::instance_ref(row) else {
                    return Outcome::Failed(op_error(
                        ErrorCode::Conflict,
                        "the sandbox has no instance",
                    ));
                };
                let port = record.args["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok());
                let Some(port) = port else {
                    return Outcome::Failed(op_error(ErrorCode::Internal, "no port"));
                };
                let expires = record.args["expiresSeconds"]
                    .as_u64()
                    .map(Duration::from_secs);
                let adapter = self.adapter();
                let call = adapter.expose_port(&at, port, expires);
                match with_progress(acker, wait, call).await {
                    Ok(ep) => Outcome::Done(json!({ "url": ep.url, "expiresAt": ep.expires_at })),
                    Err(e) => self.failed(row, e, delivered),
                }
            }
            WorkOp::Renew => {
                let Some(at) = Self::instance_ref(row) else {
                    return Outcome::Done(Value::Null);
                };
                let ttl = Duration::from_secs(record.args["ttlSeconds"].as_u64().unwrap_or(0));
                match with_progress(acker, wait, self.adapter().renew(&at, ttl)).await {
                    Ok(()) => Outcome::Done(Value::Null),
                    Err(e) => self.failed(row, e, delivered),
                }
            }
            WorkOp::Create
            | WorkOp::Delete
            | WorkOp::Claim
            | WorkOp::WarmCreate
            | WorkOp::WarmDelete => Outcome::Done(Value::Null),
            WorkOp::Pause | WorkOp::Resume | WorkOp::Stop | WorkOp::Start => {
                Outcome::Done(Value::Null)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn transition(
        &self,
        row: &Sandbox,
        op: WorkOp,
        from: SandboxStatus,
        to: SandboxStatus,
        record: &OpRecord,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Outcome {
        if row.status == to {
            if op == WorkOp::Start {
                if let Some(at) = Self::instance_ref(row) {
                    // A start that reserved the room and did not finish (a crash, or a failed
                    // compensation): the backend start is issued again, which is idempotent.
                    return self.start_reserved(row, &at, None, delivered, acker).await;
                }
            }
            return Outcome::Done(Value::Null);
        }
        if row.status != from {
            return Outcome::Failed(op_error(
                ErrorCode::Conflict,
                format!("the sandbox is {}; cannot {}", row.status, op.as_str()),
            ));
        }
        let Some(at) = Self::instance_ref(row) else {
            return Outcome::Failed(op_error(ErrorCode::Conflict, "the sandbox has no instance"));
        };
        if op == WorkOp::Start {
            return self
                .start_within_quota(row, &at, record, delivered, acker)
                .await;
        }
        let wait = self.config.ack_wait;
        let call = async {
            match op {
                WorkOp::Pause => self.adapter().pause(&at).await,
                WorkOp::Resume => self.adapter().resume(&at).await,
                WorkOp::Stop => self.adapter().stop(&at).await,
                _ => self.adapter().start(&at).await,
            }
        };
        if let Err(e) = with_progress(acker, wait, call).await {
            return self.failed(row, e, delivered);
        }
        let reason = record.args["reason"].as_str().map(str::to_owned);
        let t = Transition {
            id: row.id.clone(),
            from: vec![from],
            to,
            reason,
            actor: Actor::System("worker"),
        };
        let now = Utc::now();
        let recorded = self.store.transition(t, now).await;
        self.recorded(row, to, now, recorded).await
    }

    /// Starting a stopped sandbox reserves its CPU and memory again, so the quota is checked
    /// first: the row becomes `running` under the check (no concurrent start or activation
    /// can take the same room), then the backend starts (`start_reserved`).
    async fn start_within_quota(
        &self,
        row: &Sandbox,
        at: &InstanceRef,
        record: &OpRecord,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Outcome {
        let reason = record.args["reason"].as_str().map(str::to_owned);
        let t = Transition {
            id: row.id.clone(),
            from: vec![SandboxStatus::Stopped],
            to: SandboxStatus::Running,
            reason,
            actor: Actor::System("worker"),
        };
        let now = Utc::now();
        let reserved = match self
            .store
            .transition_within_quota(t, &self.config.quota, now)
            .await
        {
            Ok(updated) => updated,
            Err(StoreError::QuotaExceeded(m)) => {
                return Outcome::Failed(op_error(ErrorCode::QuotaExceeded, m))
            }
            other => return self.recorded(row, SandboxStatus::Running, now, other).await,
        };
        if let Some(pause) = self.faults.pause_at(faults::WORKER_AFTER_START_RESERVE) {
            tracing::warn!(sandbox = %row.id, ?pause, "fault point: pausing after the start's reservation");
            tokio::time::sleep(pause).await;
        }
        self.start_reserved(row, at, Some(reserved), delivered, acker)
            .await
    }

    /// Starts the backend instance of a row already `running` under the quota: `reserved` is
    /// the row this delivery reserved, `None` when an earlier delivery did and did not finish.
    /// If the start fails the row goes back to `stopped`, so a retry starts over; until that
    /// is recorded the operation stays pending (retried), because a `running` row over a
    /// stopped instance must not be left as the outcome.
    async fn start_reserved(
        &self,
        row: &Sandbox,
        at: &InstanceRef,
        reserved: Option<Sandbox>,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Outcome {
        let adapter = self.adapter();
        let call = adapter.start(at);
        if let Err(e) = with_progress(acker, self.config.ack_wait, call).await {
            let back = Transition {
                id: row.id.clone(),
                from: vec![SandboxStatus::Running],
                to: SandboxStatus::Stopped,
                reason: Some("start failed".into()),
                actor: Actor::System("worker"),
            };
            match self.store.transition(back, Utc::now()).await {
                Ok(stopped) => {
                    self.announce(&stopped).await;
                }
                // The row moved on (deleted, say): it is no longer this start's to put back.
                Err(StoreError::StatusConflict { .. } | StoreError::IllegalTransition { .. }) => {}
                Err(err) => {
                    tracing::error!(sandbox = %row.id, error = %err, "worker: cannot put a failed start back to stopped; retrying");
                    return Outcome::Retry(backoff(delivered));
                }
            }
            return self.failed(row, e, delivered);
        }
        let now = Utc::now();
        let running = reserved.unwrap_or_else(|| row.clone());
        self.recorded(row, SandboxStatus::Running, now, Ok(running))
            .await
    }

    /// Serves the outcome of recording a transition to `to`.
    async fn recorded(
        &self,
        row: &Sandbox,
        to: SandboxStatus,
        now: chrono::DateTime<Utc>,
        recorded: Result<Sandbox, StoreError>,
    ) -> Outcome {
        match recorded {
            Ok(updated) => {
                if to == SandboxStatus::Running {
                    // A wake is activity: the idle clock restarts now.
                    let _ = self.store.touch_activity(&row.id, now).await;
                }
                self.announce(&updated).await;
                Outcome::Done(Value::Null)
            }
            Err(StoreError::StatusConflict { current }) if current == to => {
                Outcome::Done(Value::Null)
            }
            Err(StoreError::StatusConflict { current }) => Outcome::Failed(op_error(
                ErrorCode::Conflict,
                format!("the sandbox changed concurrently; it is now {current}"),
            )),
            Err(StoreError::IllegalTransition { from, to }) => Outcome::Failed(op_error(
                ErrorCode::Conflict,
                format!("a {from} sandbox cannot become {to}"),
            )),
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "worker: cannot record transition; retrying");
                Outcome::Retry(Duration::from_secs(1))
            }
        }
    }

    /// A snapshot delete the backend did not confirm. Like sandbox deletes, a retryable one
    /// never gives up (a leaked snapshot costs storage): the snapshot stays `deleting`, says
    /// why in its `statusReason` (OpenSandbox refuses while a sandbox restored from it runs),
    /// and the delete is retried with back-off; the pending operation is also re-sent by the
    /// scheduler's repair if its message is lost. A refusal that will not change leaves the
    /// snapshot `ready` with the reason, so the caller can act on it.
    async fn snapshot_delete_failed(
        &self,
        row: &Sandbox,
        mut rec: differently_store::lifecycle::SnapshotRecord,
        e: AdapterError,
        delivered: u64,
    ) -> Outcome {
        tracing::warn!(sandbox = %row.id, snapshot = %rec.id, pool = %self.pool, error = %e, attempt = delivered, "worker: snapshot delete not confirmed");
        rec.updated_at = Utc::now();
        let outcome = if e.is_retryable() {
            rec.status_reason = Some(format!(
                "the backend has not deleted it yet ({e}); retrying"
            ));
            Outcome::Retry(backoff(delivered))
        } else {
            rec.status = SnapshotStatus::Ready;
            rec.status_reason = Some(format!("the backend refused to delete it: {e}"));
            Outcome::Failed(adapter_op_error(&e))
        };
        match self.store.update_snapshot(&rec).await {
            Ok(()) => outcome,
            Err(_) => Outcome::Retry(Duration::from_secs(1)),
        }
    }

    async fn snapshot(
        &self,
        row: &Sandbox,
        record: &OpRecord,
        delivered: u64,
        acker: &dyn Acker,
    ) -> Outcome {
        let Some(snap) = snapshot_arg(record) else {
            return Outcome::Failed(op_error(ErrorCode::Internal, "no snapshot id"));
        };
        let mut rec = match self.store.get_snapshot(&snap).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Outcome::Failed(op_error(ErrorCode::NotFound, "snapshot record gone"))
            }
            Err(_) => return Outcome::Retry(Duration::from_secs(1)),
        };
        if rec.status == SnapshotStatus::Ready {
            return Outcome::Done(Value::Null);
        }
        let Some(at) = Self::instance_ref(row) else {
            return Outcome::Failed(op_error(ErrorCode::Conflict, "the sandbox has no instance"));
        };
        let taken = with_progress(
            acker,
            self.config.ack_wait,
            self.adapter().snapshot(&at, snap.as_str()),
        )
        .await;
        let outcome = match taken {
            Ok(info) if info.ready => {
                rec.backend_ref = Some(info.backend_ref);
                rec.status = SnapshotStatus::Ready;
                rec.status_reason = None;
                Outcome::Done(Value::Null)
            }
            // Still being written: stays `creating` (a fork of it is refused until then) and
            // is asked again shortly; the same id finds the same backend snapshot.
            Ok(info) => {
                rec.backend_ref = Some(info.backend_ref);
                let waited = (Utc::now() - record.created_at)
                    .to_std()
                    .unwrap_or_default();
                let limit = self.adapter().snapshot_timeout();
                if waited >= limit {
                    let err = op_error(
                        ErrorCode::ProviderUnavailable,
                        format!("the snapshot was not ready after {} s", limit.as_secs()),
                    );
                    rec.status = SnapshotStatus::Failed;
                    rec.status_reason = Some(err.message.clone());
                    Outcome::Failed(err)
                } else {
                    Outcome::Retry(readiness_poll(delivered))
                }
            }
            Err(e) => match self.failed(row, e, delivered) {
                Outcome::Failed(err) => {
                    rec.status = SnapshotStatus::Failed;
                    rec.status_reason = Some(err.message.clone());
                    Outcome::Failed(err)
                }
                other => return other,
            },
        };
        rec.updated_at = Utc::now();
        if let Err(e) = self.store.update_snapshot(&rec).await {
            tracing::warn!(snapshot = %rec.id, error = %e, "worker: cannot record the snapshot; retrying");
            return Outcome::Retry(Duration::from_secs(1));
        }
        match (&outcome, rec.status) {
            (Outcome::Done(_), SnapshotStatus::Ready) => {
                self.announce_snapshot(&rec, record, EventData::SnapshotCreated, None)
                    .await;
            }
            (Outcome::Failed(err), SnapshotStatus::Failed) => {
                let error = EventError {
                    code: err.code.clone(),
                    message: err.message.clone(),
                };
                self.announce_snapshot(&rec, record, EventData::SnapshotFailed, Some(error))
                    .await;
            }
            _ => {}
        }
        outcome
    }

    /// `snapshot.created|failed|deleted` (`kind`: `EventData::Snapshot…`) for `rec`, attributed like the operation that
    /// asked for it. Published once its row says so; a lost publish is not re-sent (the
    /// snapshot's state is in the API, and its operation's outcome event follows).
    async fn announce_snapshot(
        &self,
        rec: &differently_store::lifecycle::SnapshotRecord,
        record: &OpRecord,
        kind: fn(SnapshotEvent) -> EventData,
        error: Option<EventError>,
    ) {
        let data = kind(SnapshotEvent {
            snapshot_id: rec.id.to_string(),
            size_bytes: None,
            error,
        });
        let ty = data.event_type();
        let event = PublicEvent::new(
            rec.org_id.clone(),
            rec.project_id.clone(),
            Some(rec.sandbox_id.clone()),
            Origin::from_audit_actor(&record.actor),
            Utc::now(),
            rec.id.as_str(),
            data,
        );
        if let Err(e) = self.announcer.public(&event).await {
            tracing::warn!(snapshot = %rec.id, event = %ty, error = %e, "worker: snapshot event not published");
        }
    }
}

/// When to ask again about a snapshot the backend is still writing: 100 ms after the first
/// answer, doubling to 2 s (a Docker snapshot is ready in ~0.3 s; a Fast Sandbox checkpoint
/// takes minutes).
fn readiness_poll(delivered: u64) -> Duration {
    crate::doubling(
        Duration::from_millis(100),
        Duration::from_secs(2),
        delivered,
    )
}

fn snapshot_arg(record: &OpRecord) -> Option<SnapshotId> {
    record.args["snapshotId"]
        .as_str()
        .and_then(|s| SnapshotId::parse(s).ok())
}
