//! Typed publishing of the three kinds of bus message, so every role announces changes the
//! same way: admissions to placement, work to a pool, status changes to subscribers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use differently_bus_schema::{
    msg_id, Admitted, Envelope, Naming, Origin, PublicEvent, QueuedSandbox, StatusChanged,
    Terminating, WarmWork, Work, WorkOp,
};
use differently_core::{Sandbox, SandboxStatus};
use serde::Serialize;

use crate::error::Detail;
use crate::{Bus, BusError, Published};

/// Publishes envelopes derived from committed sandbox rows.
#[derive(Clone)]
pub struct Announcer {
    bus: Arc<dyn Bus>,
    naming: Naming,
    /// Longest one publish may take before it is given up on (see [`Announcer::bounded`]).
    bound: Option<Duration>,
    /// Status events being re-sent in the background, by sandbox, with the version each
    /// re-sends: a newer status of the same sandbox supersedes (ends) the older's re-send,
    /// so watchers never get an older status after a newer one from this process.
    resending: Arc<Mutex<HashMap<String, i64>>>,
}

/// How long a status event that could not be stored is re-sent in the background. Status
/// events are the one message no repair re-sends from Postgres, and an open event stream
/// (SSE) only ever learns of a change through one, so one lost while a stream elects a new
/// leader (seconds) would be lost to it for good.
const STATUS_RESEND_FOR: Duration = Duration::from_secs(30);

impl Announcer {
    /// An announcer on `bus` under `naming`.
    pub fn new(bus: Arc<dyn Bus>, naming: Naming) -> Self {
        Announcer {
            bus,
            naming,
            bound: None,
            resending: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// This announcer with every publish given up after `limit`: the caller gets an error
    /// and goes on, while the message may still be stored (its id makes a later re-send a
    /// duplicate). For loops that must not stall behind one publish to a hung or electing
    /// NATS node, whose acknowledgement can otherwise take the client's full timeout.
    pub fn bounded(mut self, limit: Duration) -> Self {
        self.bound = Some(limit);
        self
    }

    /// The naming scheme in use.
    pub fn naming(&self) -> &Naming {
        &self.naming
    }

    /// The bus itself, for consumers.
    pub fn bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    async fn send<T: Serialize>(
        &self,
        subject: String,
        id: String,
        env: &mut Envelope<T>,
    ) -> Result<Published, BusError> {
        if env.trace.traceparent.is_none() {
            env.trace = crate::trace::current();
        }
        let payload = env
            .encode()
            .map_err(|e| BusError::Publish(Detail::caused(format!("encode: {e}"), e)))?;
        let started = std::time::Instant::now();
        let publish = self.bus.publish(&subject, &id, Bytes::from(payload));
        let out = match self.bound {
            None => publish.await,
            Some(limit) => match tokio::time::timeout(limit, publish).await {
                Ok(out) => out,
                Err(_) => {
                    metrics::counter!("differently_bus_publish_failures_total", "why" => "bound")
                        .increment(1);
                    Err(BusError::Publish(Detail::new(format!(
                        "{subject}: not acknowledged within {} ms; given up (it may still be \
                         stored)",
                        limit.as_millis()
                    ))))
                }
            },
        };
        metrics::histogram!("differently_bus_publish_seconds")
            .record(started.elapsed().as_secs_f64());
        out
    }

    /// `dly.admit.<org>`: wake placement for a queued sandbox. `attempt` distinguishes
    /// deliberate re-announcements (repair, requeue) from duplicates.
    pub async fn admitted(&self, s: &Sandbox, attempt: &str) -> Result<Published, BusError> {
        let mut env = Envelope::new(
            s.id.clone(),
            s.status_version,
            Admitted {
                org_id: s.org_id.clone(),
                project_id: s.project_id.clone(),
                sandbox: (s.status == SandboxStatus::Queued)
                    .then(|| Box::new(QueuedSandbox::of(s))),
            },
        );
        let id = msg_id(&s.id, &format!("admit{attempt}"), s.status_version);
        self.send(self.naming.admit_subject(&s.org_id), id, &mut env)
            .await
    }

    /// `dly.work.<pool>.<op>` for the sandbox's pool. `attempt` as for `admitted`.
    pub async fn work(
        &self,
        s: &Sandbox,
        op: WorkOp,
        attempt: &str,
    ) -> Result<Published, BusError> {
        let pool = s
            .pool
            .clone()
            .ok_or_else(|| BusError::Publish(format!("sandbox {} has no pool", s.id).into()))?;
        let mut env = Envelope::new(
            s.id.clone(),
            s.status_version,
            Work {
                op,
                pool: pool.clone(),
                op_id: None,
                terminating: (op == WorkOp::Delete && s.status == SandboxStatus::Terminating).then(
                    || Terminating {
                        reason: s.status_reason.clone(),
                    },
                ),
                warm: None,
            },
        );
        let id = msg_id(
            &s.id,
            &format!("{}{attempt}", op.as_str()),
            s.status_version,
        );
        self.send(self.naming.work_subject(&pool, op), id, &mut env)
            .await
    }

    /// `dly.work.<pool>.<op>` for a lifecycle operation record `op_id` (pause, snapshot, …).
    /// The message id is the operation id, so a repair re-send of the same operation is
    /// dropped as a duplicate unless `attempt` distinguishes it.
    pub async fn op(
        &self,
        s: &Sandbox,
        pool: &str,
        op: WorkOp,
        op_id: &str,
        attempt: &str,
    ) -> Result<Published, BusError> {
        let mut env = Envelope::new(
            s.id.clone(),
            s.status_version,
            Work {
                op,
                pool: pool.to_owned(),
                op_id: Some(op_id.to_owned()),
                terminating: None,
                warm: None,
            },
        );
        let id = format!("{}:{op_id}{attempt}", s.id);
        self.send(self.naming.work_subject(pool, op), id, &mut env)
            .await
    }

    /// `dly.work.<pool>.<op>` for a warm instance (`op` is `WarmCreate` or `WarmDelete`):
    /// there is no sandbox row, so the envelope carries the warm instance's id at status
    /// version 0 and the body its class. `attempt` distinguishes deliberate re-sends (a
    /// delete of a row still retiring) from duplicates, as for `admitted`.
    pub async fn warm_work(
        &self,
        pool: &str,
        id: &differently_core::SandboxId,
        op: WorkOp,
        class: &str,
        attempt: &str,
    ) -> Result<Published, BusError> {
        let mut env = Envelope::new(
            id.clone(),
            0,
            Work {
                op,
                pool: pool.to_owned(),
                op_id: None,
                terminating: None,
                warm: Some(WarmWork {
                    class: class.to_owned(),
                }),
            },
        );
        let msg = msg_id(id, &format!("{}{attempt}", op.as_str()), 0);
        self.send(self.naming.work_subject(pool, op), msg, &mut env)
            .await
    }

    /// An activated (`provisioning`) sandbox: its create work for the pool's workers and its
    /// status for watchers (the work matters only to the worker, the status only to
    /// watchers). Answers the work's publish; a lost status event only delays watchers until
    /// they re-read the row.
    ///
    /// The caller waits for the work alone: the status and `placement.decided` go out in a
    /// task of their own (a status not stored is re-sent there), so a request or a placement
    /// pass is never held up by the slowest of several acknowledgements.
    pub async fn activated(&self, s: &Sandbox) -> Result<Published, BusError> {
        self.activated_with(s, false).await
    }

    /// [`activated`](Self::activated) for a sandbox the API placed in its own admission: the
    /// same work and `placement.decided`, and its `provisioning` in public only
    /// ([`public_status_by`](Self::public_status_by)). No internal reader acts on it: the
    /// admitting process knows the status from its commit (`EventHub::remember_status`), and
    /// no other process can be waiting on a sandbox whose id it has not been told.
    pub async fn activated_in_admission(&self, s: &Sandbox) -> Result<Published, BusError> {
        self.activated_with(s, true).await
    }

    /// The work of an activation, answered; its status (in public only, or both forms) and
    /// `placement.decided` in a task of their own.
    async fn activated_with(&self, s: &Sandbox, public_only: bool) -> Result<Published, BusError> {
        let (me, row) = (self.clone(), s.clone());
        let watchers = async move {
            let status = async {
                if public_only {
                    me.public_status_by(&row, None).await
                } else {
                    me.status(&row).await
                }
            };
            let _ = tokio::join!(status, me.placed(&row));
        };
        tokio::spawn(crate::trace::scope(
            "publish",
            crate::trace::current(),
            watchers,
        ));
        self.work(s, WorkOp::Create, "").await
    }

    /// `placement.decided` for an activated sandbox: its pool and which attempt this is.
    /// Cause `quota`: placement decides under quotas and capacity. Its id is the attempt's,
    /// so a re-sent activation is a duplicate; a lost one is not re-sent (the row says where
    /// the sandbox is, and its status event follows).
    /// `None` for a row with no pool (not activated): nothing was decided.
    pub async fn placed(&self, s: &Sandbox) -> Option<Result<Published, BusError>> {
        use differently_bus_schema::public::PlacementDecided;
        use differently_bus_schema::{Cause, EventData};
        let pool = s.pool.clone()?;
        let attempt = s.attempts.max(1);
        let event = PublicEvent::new(
            s.org_id.clone(),
            s.project_id.clone(),
            Some(s.id.clone()),
            Origin::system(Cause::Quota),
            chrono::Utc::now(),
            &format!("attempt{attempt}"),
            EventData::PlacementDecided(PlacementDecided {
                pool,
                region: s.spec.region.clone(),
                attempt,
            }),
        );
        Some(self.public(&event).await)
    }

    /// `dly.evt.<org>.<project>.<sandbox>.<phase>`: the row's current status (and its public
    /// `sandbox.status.changed`), with no word on why (public `cause`: `backend`).
    pub async fn status(&self, s: &Sandbox) -> Result<Published, BusError> {
        self.status_full(s, None, None).await
    }

    /// [`status`](Self::status), saying why the row changed and which key changed it.
    pub async fn status_by(&self, s: &Sandbox, origin: Origin) -> Result<Published, BusError> {
        self.status_full(s, None, Some(origin)).await
    }

    /// [`status`](Self::status), with the audit chain head the change left when the
    /// publisher knows it (`StatusChanged::audit_head`).
    pub async fn status_after(
        &self,
        s: &Sandbox,
        audit_head: Option<differently_bus_schema::AuditHead>,
    ) -> Result<Published, BusError> {
        self.status_full(s, audit_head, None).await
    }

    /// The internal status event on `dly.evt.…` and its public form on `dly.pub.…`, both
    /// at once. Answers the internal publish (what the waiters of this platform need); a
    /// public one that is not stored is re-sent in the background like the internal one.
    pub async fn status_full(
        &self,
        s: &Sandbox,
        audit_head: Option<differently_bus_schema::AuditHead>,
        origin: Option<Origin>,
    ) -> Result<Published, BusError> {
        let (subject, id, mut env) = self.status_event(s, audit_head, origin);
        let key = s.id.to_string();
        {
            let mut resending = self.resending();
            if resending.get(&key).is_some_and(|v| *v < s.status_version) {
                resending.remove(&key);
            }
        }
        let public = PublicEvent::from_status(&env);
        let (out, public_out) = tokio::join!(
            self.send(subject.clone(), id.clone(), &mut env),
            self.public(&public)
        );
        if out.is_err() || public_out.is_err() {
            self.resend_status(key, s.status_version, subject, id, env);
        }
        out
    }

    /// The public `sandbox.status.changed` of the row's status alone, for a change the API
    /// made and answered that no internal reader acts on (its admission's `provisioning`, its
    /// delete's `terminating`): one message instead of two. Internal readers act on a sandbox
    /// starting (the data-plane cache, the audit head) and ending (placement, waiters). A
    /// waiter on another process for such a status learns it at its next re-read or at the
    /// final status; a process that remembers the row running learns it at its next call,
    /// whose audit append is guarded on the status. Not stored: re-sent in the background
    /// with its internal form, as [`status_full`](Self::status_full) does.
    pub async fn public_status_by(
        &self,
        s: &Sandbox,
        origin: Option<Origin>,
    ) -> Result<Published, BusError> {
        let (subject, id, env) = self.status_event(s, None, origin);
        let out = self.public(&PublicEvent::from_status(&env)).await;
        if out.is_err() {
            self.resend_status(s.id.to_string(), s.status_version, subject, id, env);
        }
        out
    }

    /// The internal status event of row `s` as committed: its subject, its message id and
    /// its envelope (from which the public form is derived).
    fn status_event(
        &self,
        s: &Sandbox,
        audit_head: Option<differently_bus_schema::AuditHead>,
        origin: Option<Origin>,
    ) -> (String, String, Envelope<StatusChanged>) {
        let mut body = StatusChanged::of(s);
        body.audit_head = audit_head;
        body.origin = origin;
        let env = Envelope::new(s.id.clone(), s.status_version, body);
        let id = msg_id(&s.id, "evt", s.status_version);
        let subject = self
            .naming
            .event_subject(&s.org_id, &s.project_id, &s.id, s.status);
        (subject, id, env)
    }

    /// `sandbox.operation.requested|finished|failed` (`ty`) for operation `op_id` of kind
    /// `kind` on `s`. Its id is the operation's and the type's, so a re-send is a duplicate.
    /// A publish that fails is logged and counted, not retried: the operation's outcome is
    /// in the API (the sandbox's status, `GET /v1/sandboxes/{id}`, or for a snapshot its own,
    /// `GET /v1/snapshots/{id}`).
    pub async fn operation(
        &self,
        s: &Sandbox,
        ty: differently_bus_schema::EventType,
        op_id: &str,
        kind: &str,
        error: Option<differently_bus_schema::public::EventError>,
        origin: Origin,
    ) -> Result<Published, BusError> {
        use differently_bus_schema::public::Operation;
        use differently_bus_schema::{EventData, EventType};
        let op = Operation {
            operation_id: op_id.to_owned(),
            operation: kind.to_owned(),
            error,
        };
        let data = match ty {
            EventType::OperationRequested => EventData::OperationRequested(op),
            EventType::OperationFinished => EventData::OperationFinished(op),
            EventType::OperationFailed => EventData::OperationFailed(op),
            other => {
                return Err(BusError::Publish(
                    format!("{other} is not an operation event").into(),
                ))
            }
        };
        let event = PublicEvent::new(
            s.org_id.clone(),
            s.project_id.clone(),
            Some(s.id.clone()),
            origin,
            chrono::Utc::now(),
            op_id,
            data,
        );
        self.public(&event).await
    }

    /// `dly.pub.<org>.<project>.<sandbox>.<type>`: one public event, with its `id` as the
    /// message id, so a re-send of the same change is dropped as a duplicate.
    pub async fn public(&self, event: &PublicEvent) -> Result<Published, BusError> {
        let subject = self.naming.public_subject(
            &event.org_id,
            &event.project_id,
            event.sandbox_id.as_ref(),
            event.event_type(),
        );
        let payload = event
            .encode()
            .map_err(|e| BusError::Publish(Detail::caused(format!("encode: {e}"), e)))?;
        let publish = self.bus.publish(&subject, &event.id, Bytes::from(payload));
        let out = match self.bound {
            None => publish.await,
            Some(limit) => tokio::time::timeout(limit, publish)
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::Publish(Detail::new(format!(
                    "{subject}: not acknowledged within {} ms; given up (it may still be stored)",
                    limit.as_millis()
                ))))
                }),
        };
        if let Err(e) = &out {
            metrics::counter!("differently_bus_public_publish_failures_total").increment(1);
            tracing::warn!(subject = %subject, error = %e, "bus: public event not stored");
        }
        out
    }

    fn resending(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.resending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-sends a status event (internal and public) that was not stored, in the background, until it is, a newer
    /// status of the sandbox supersedes it, or [`STATUS_RESEND_FOR`] has passed. Its message
    /// id makes a re-send of one that was stored after all a duplicate.
    fn resend_status(
        &self,
        key: String,
        version: i64,
        subject: String,
        id: String,
        mut env: Envelope<StatusChanged>,
    ) {
        {
            let mut resending = self.resending();
            if resending.get(&key).is_some_and(|v| *v >= version) {
                return;
            }
            resending.insert(key.clone(), version);
        }
        let me = self.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + STATUS_RESEND_FOR;
            let mut delay = Duration::from_millis(250);
            let outcome = loop {
                tokio::time::sleep(delay).await;
                if me.resending().get(&key) != Some(&version) {
                    break "superseded";
                }
                // Both the internal and the public form: each is de-duplicated by its id, so
                // re-sending the one that was stored costs nothing.
                let public = PublicEvent::from_status(&env);
                let (internal, public) = tokio::join!(
                    me.send(subject.clone(), id.clone(), &mut env),
                    me.public(&public)
                );
                match internal.and(public) {
                    Ok(_) => {
                        tracing::info!(sandbox = %key, version, "bus: status event stored on a re-send");
                        break "stored";
                    }
                    Err(_) if tokio::time::Instant::now() < until => {
                        delay = (delay * 2).min(Duration::from_secs(2));
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %key, version, error = %e, "bus: status event not stored after re-sending it for 30 s; watchers learn of it when they re-read");
                        break "gave_up";
                    }
                }
            };
            metrics::counter!("differently_bus_status_resends_total", "outcome" => outcome)
                .increment(1);
            let mut resending = me.resending();
            if resending.get(&key) == Some(&version) {
                resending.remove(&key);
            }
        });
    }
}
