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
/// usual, so fair order decides whenever anyone waits.
///
/// On a pool **without** a concurrency cap it places the sandbox, warm or cold. On a
/// **capped** pool (a cap is contended across organizations, which only the leader orders)
/// it applies only as a warm claim: the claimed instance already holds a slot of the cap
/// (the refill counts warm rows against it), so the claim takes no new backend capacity. It
/// is applied only when, besides the above, the pool's live sandboxes leave a slot (as the
/// leader's activation counts them, under the pool's lock), no queued sandbox of any
/// organization may be waiting for that pool (`differently_core::wait_reason::may_want`: a
/// stored capacity wait naming the pool, or a row the leader has not decided yet), and a
/// ready instance of the class is left. Otherwise it is queued for the leader, never placed
/// cold.
#[derive(Debug, Clone)]
pub struct DirectPlacement {
    /// The pool and its cap (`max_concurrent: Some`: claim only, see above).
    pub pool: PoolSlot,
    /// The placement explanation stored with the activation.
    pub explanation: serde_json::Value,
    /// The warm class of `pool` this create matches (`differently_core::warm::class_for`),
    /// if any. When the placement applies and a ready instance of the class exists (oldest
    /// ready first), the admission claims it in the same transaction: the warm row is
    /// deleted and the sandbox row is inserted with the instance's id and backend ref,
    /// `running` (or `provisioning`, see `claim_call`). The returned row's id is then the
    /// instance's, not the one the admission carried: callers use the returned row's id.
    /// No ready instance: placed as without it (uncapped), or queued (capped).
    pub warm_class: Option<String>,
    /// The pool's adapter needs a call on a claimed instance before it is the tenant's
    /// (e.g. renewing its timeout to the sandbox's TTL): a claimed row is inserted
    /// `provisioning` with the instance's backend ref, and the worker makes the call and
    /// records `running`.
    pub claim_call: bool,
}

impl DirectPlacement {
    /// Whether a store may try it at all: an uncapped pool, or a capped one with a warm
    /// class to claim from (`claim_only`).
    pub fn applies(&self) -> bool {
        self.pool.max_concurrent.is_none() || self.warm_class.is_some()
    }

    /// Whether it may only claim a warm instance, never place cold: its pool is capped.
    pub fn claim_only(&self) -> bool {
        self.pool.max_concurrent.is_some()
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
