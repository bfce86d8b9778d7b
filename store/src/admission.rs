//! Admission: a new sandbox queued (or placed at once) under its tenant's limits.

use async_trait::async_trait;
use differently_core::Sandbox;

use crate::audit;
use crate::{Actor, PoolSlot, Quota, StoreError};

/// Admission of a new sandbox.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The row to insert; its status is `queued` (see `direct`).
    pub sandbox: Sandbox,
    /// Hash of the request body, so an `Idempotency-Key` reused with another body is a conflict.
    pub request_hash: String,
    /// Installation-wide default limits; the organization's and the project's own quotas
    /// (read inside the transaction) take precedence field by field.
    pub defaults: Quota,
    pub actor: Actor,
    /// The request that asked, for the audit record; `None`: the current task's
    /// (`audit::with_request_id`). Set when another task (a group of admissions) writes it.
    pub request_id: Option<String>,
    /// Where to place the sandbox in its admission transaction, if nothing makes it wait
    /// (`None`: it is queued for the placement leader).
    pub direct: Option<DirectPlacement>,
}

/// A placement decided by the admitting API process, applied in the admission transaction
/// when the organization has nothing queued and its quotas admit the sandbox's compute now:
/// the row is inserted `provisioning` (with both audit records, admission then activation)
/// instead of `queued`, saving the leader's round (a bus hop, a pull and a transaction).
/// Anything that would make it wait (a queued sandbox of the org, a quota) queues it as
/// usual, so fair order decides whenever anyone waits. Only for pools without a concurrency
/// cap: a cap is contended across organizations, which only the leader orders.
#[derive(Debug, Clone)]
pub struct DirectPlacement {
    /// The pool, uncapped (`max_concurrent: None`); a capped one is ignored (queued).
    pub pool: PoolSlot,
    /// The placement explanation stored with the activation.
    pub explanation: serde_json::Value,
    /// The warm class of `pool` this create matches (`differently_core::warm::class_for`),
    /// if any. When the placement applies and a ready instance of the class exists (oldest
    /// ready first), the admission claims it in the same transaction: the warm row is
    /// deleted and the sandbox row is inserted with the instance's id and backend ref,
    /// `running` (or `provisioning`, see `claim_call`). The returned row's id is then the
    /// instance's, not the one the admission carried: callers use the returned row's id.
    /// No ready instance: placed as without it.
    pub warm_class: Option<String>,
    /// The pool's adapter needs a call on a claimed instance before it is the tenant's
    /// (e.g. renewing its timeout to the sandbox's TTL): a claimed row is inserted
    /// `provisioning` with the instance's backend ref, and the worker makes the call and
    /// records `running`.
    pub claim_call: bool,
}

impl DirectPlacement {
    /// Whether a store may apply it: its pool has no concurrency cap (a cap is contended
    /// across organizations, and only the leader orders those).
    pub fn applies(&self) -> bool {
        self.pool.max_concurrent.is_none()
    }
}

/// Result of `admit`.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// Inserted now: `queued`, or `provisioning` when its `DirectPlacement` was applied, or
    /// `running` (`provisioning` with a backend ref if the adapter needs a claim call) under
    /// a warm instance's id when it claimed one.
    New(Sandbox),
    /// The `Idempotency-Key` was seen before with the same body: the original sandbox.
    Replayed(Sandbox),
}

/// Admitting new sandboxes: the API's one write per create, checked against the tenant's
/// admission limits and its `Idempotency-Key` in the same transaction.
#[async_trait]
pub trait AdmissionStore: Send + Sync {
    /// Locks the organization row, replays an `Idempotency-Key` of the same project, checks
    /// the admission limits (`maxQueued` of org and project, `maxSandbox` size), inserts the
    /// queued row and its audit record. A tenant at its concurrency limit still queues.
    /// With `direct` set and nothing making it wait, the row is activated in the same
    /// transaction instead (as `activate_explained` would, after the admission's record).
    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError>;

    /// `admit` for admissions that arrived together, one outcome per item in the order given.
    /// Postgres decides each organization's items in one transaction (one org lock and one
    /// commit for the lot), each as `admit` would in that order; a refused item refuses only
    /// itself. The default admits them one by one.
    async fn admit_many(&self, group: Vec<Admission>) -> Vec<Result<Admitted, StoreError>> {
        let mut out = Vec::with_capacity(group.len());
        for a in group {
            out.push(match a.request_id.clone() {
                Some(id) => audit::with_request_id(id, self.admit(a)).await,
                None => self.admit(a).await,
            });
        }
        out
    }
}
