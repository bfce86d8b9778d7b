//! Typed publishing of the three kinds of bus message, so every role announces changes the
//! same way: admissions to placement, work to a pool, status changes to subscribers.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use differently_bus_schema::{
    msg_id, Admitted, Envelope, Naming, QueuedSandbox, StatusChanged, Terminating, Work, WorkOp,
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
}

impl Announcer {
    /// An announcer on `bus` under `naming`.
    pub fn new(bus: Arc<dyn Bus>, naming: Naming) -> Self {
        Announcer {
            bus,
            naming,
            bound: None,
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
            },
        );
        let id = format!("{}:{op_id}{attempt}", s.id);
        self.send(self.naming.work_subject(pool, op), id, &mut env)
            .await
    }

    /// An activated (`provisioning`) sandbox: its create work for the pool's workers and its
    /// status for watchers, both at once (the work matters only to the worker, the status
    /// only to watchers). Answers the work's publish; a lost status event only delays
    /// watchers until they re-read the row.
    pub async fn activated(&self, s: &Sandbox) -> Result<Published, BusError> {
        let (work, _) = tokio::join!(self.work(s, WorkOp::Create, ""), self.status(s));
        work
    }

    /// `dly.evt.<org>.<project>.<sandbox>`: the row's current status.
    pub async fn status(&self, s: &Sandbox) -> Result<Published, BusError> {
        self.status_after(s, None).await
    }

    /// [`status`](Self::status), with the audit chain head the change left when the
    /// publisher knows it (`StatusChanged::audit_head`).
    pub async fn status_after(
        &self,
        s: &Sandbox,
        audit_head: Option<differently_bus_schema::AuditHead>,
    ) -> Result<Published, BusError> {
        let mut body = StatusChanged::of(s);
        body.audit_head = audit_head;
        let mut env = Envelope::new(s.id.clone(), s.status_version, body);
        let id = msg_id(&s.id, "evt", s.status_version);
        self.send(
            self.naming.event_subject(&s.org_id, &s.project_id, &s.id),
            id,
            &mut env,
        )
        .await
    }
}
