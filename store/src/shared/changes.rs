//! Sandbox status changes as both stores write them: the core rule mutates the row, and the
//! audit entry says who did what.

use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{Sandbox, SandboxId};
use serde_json::json;

use super::audit_entry::AuditEntry;
use crate::{Actor, DirectPlacement, PoolSlot, StoreError, Transition};

/// `queued → provisioning` on `pool`, by the placement leader.
pub(crate) fn activate(sbx: &mut Sandbox, pool: &PoolSlot, now: DateTime<Utc>) -> AuditEntry {
    accounting::activate(sbx, &pool.name, now);
    AuditEntry {
        actor: Actor::System("scheduler").as_audit(),
        action: "sandbox.activate".to_owned(),
        detail: json!({ "pool": pool.name, "attempts": sbx.attempts }),
    }
}

/// [`activate`] applied by the admitting API process in the admission itself
/// (`DirectPlacement`): the record says so.
pub(crate) fn activate_direct(
    sbx: &mut Sandbox,
    pool: &PoolSlot,
    now: DateTime<Utc>,
) -> AuditEntry {
    let mut entry = activate(sbx, pool, now);
    entry.actor = Actor::System("admission").as_audit();
    if let Some(detail) = entry.detail.as_object_mut() {
        detail.insert("direct".to_owned(), json!(true));
    }
    entry
}

/// [`activate_direct`] answered from a warm instance of `direct.warm_class`: the row takes
/// the instance's id (the backend instance is tagged with it) and backend ref, and is
/// `running` from now (TTL clock started), or `provisioning` until the worker's claim call
/// when the adapter needs one (`direct.claim_call`). One record says both (activation and
/// start) and that the warm pool answered it: `cause: "warm"`.
pub(crate) fn claim_warm(
    sbx: &mut Sandbox,
    direct: &DirectPlacement,
    id: SandboxId,
    backend_ref: &str,
    now: DateTime<Utc>,
) -> Result<AuditEntry, StoreError> {
    sbx.id = id;
    sbx.warm_class = direct.warm_class.clone();
    let mut entry = activate_direct(sbx, &direct.pool, now);
    if direct.claim_call {
        sbx.backend_ref = Some(backend_ref.to_owned());
    } else {
        accounting::mark_running(sbx, backend_ref, now)?;
    }
    if let Some(detail) = entry.detail.as_object_mut() {
        detail.insert("cause".to_owned(), json!("warm"));
        detail.insert("warmClass".to_owned(), json!(direct.warm_class));
        detail.insert("backendRef".to_owned(), json!(backend_ref));
        detail.insert("status".to_owned(), json!(sbx.status));
    }
    Ok(entry)
}

/// `provisioning → running`; conflict if the row is elsewhere.
pub(crate) fn mark_running(
    sbx: &mut Sandbox,
    backend_ref: &str,
    now: DateTime<Utc>,
) -> Result<AuditEntry, StoreError> {
    accounting::mark_running(sbx, backend_ref, now)?;
    Ok(AuditEntry {
        actor: Actor::System("worker").as_audit(),
        action: "sandbox.running".to_owned(),
        detail: json!({ "backendRef": backend_ref, "pool": sbx.pool }),
    })
}

/// `provisioning → queued`, clearing the pool; conflict if the row is elsewhere.
pub(crate) fn requeue(
    sbx: &mut Sandbox,
    reason: &str,
    not_before: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<AuditEntry, StoreError> {
    let from_pool = accounting::requeue(sbx, reason, now)?;
    Ok(AuditEntry {
        actor: Actor::System("scheduler").as_audit(),
        action: "sandbox.requeue".to_owned(),
        detail: json!({ "reason": reason, "fromPool": from_pool, "notBefore": not_before }),
    })
}

/// Any other legal change: compare-and-set on `t.from`, then the state machine.
pub(crate) fn transition(
    sbx: &mut Sandbox,
    t: &Transition,
    now: DateTime<Utc>,
) -> Result<AuditEntry, StoreError> {
    let current = accounting::transition(sbx, &t.from, t.to, t.reason.clone(), now)?;
    if t.to.is_final() {
        clear_env_values(sbx);
    }
    Ok(transition_entry(t, current))
}

/// The audit entry of `t` applied to a row that was at `from`: what [`transition`] records,
/// for a store that applies it without the row in hand (`pg::transition_patch`).
pub(crate) fn transition_entry(
    t: &Transition,
    from: differently_core::SandboxStatus,
) -> AuditEntry {
    AuditEntry {
        actor: t.actor.as_audit(),
        action: format!("sandbox.{}", t.to),
        detail: json!({ "from": from, "to": t.to, "reason": t.reason }),
    }
}

/// Forgets the env values of a sandbox that ended: nothing reads them after (deleting the
/// instance does not, and a restore or fork takes its env from its own request), so they are
/// not kept for as long as the row is. The names stay, as the API shows them.
pub(crate) fn clear_env_values(sbx: &mut Sandbox) {
    for v in sbx.spec.env.values_mut() {
        v.clear();
    }
}

/// The audit entry of an admission.
pub(crate) fn admit_entry(sbx: &Sandbox, actor: &Actor) -> AuditEntry {
    AuditEntry {
        actor: actor.as_audit(),
        action: "sandbox.admit".to_owned(),
        detail: json!({
            "projectId": sbx.project_id,
            "idempotencyKey": sbx.idempotency_key,
            "resources": sbx.spec.resources,
        }),
    }
}
