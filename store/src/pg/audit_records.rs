//! The audit record of a change, appended in the change's own transaction.

use chrono::{DateTime, Utc};
use differently_core::{OrgId, Sandbox};
use sqlx::{Postgres, Transaction};

use crate::shared::rules::AuditEntry;
use crate::StoreError;

/// The audit record of `e` about sandbox `s` (its org's chain, its project).
pub(crate) fn sandbox_event(s: &Sandbox, e: AuditEntry) -> crate::audit::NewAuditEvent {
    crate::shared::audit_entry::event_for(
        Some(&s.org_id),
        Some(&s.project_id),
        s.id.as_str(),
        e.actor,
        e.action,
        e.detail,
    )
}

pub(crate) async fn insert_audit(
    tx: &mut Transaction<'static, Postgres>,
    s: &Sandbox,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    super::audit::append_chained(tx, sandbox_event(s, e), at).await?;
    Ok(())
}

/// Appends one record about `resource` to `org`'s audit chain (`pg::audit`): hashed, gapless,
/// in this transaction, so the change and its record commit or fail together.
pub(crate) async fn insert_audit_for(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    resource: &str,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let ev = crate::shared::audit_entry::event_for(
        Some(org),
        None,
        resource,
        e.actor,
        e.action,
        e.detail,
    );
    super::audit::append_chained(tx, ev, at).await?;
    Ok(())
}

/// Appends one record about `resource` to the installation chain (events of no
/// organization: pools, global policy, secrets).
pub(crate) async fn insert_audit_installation(
    tx: &mut Transaction<'static, Postgres>,
    resource: &str,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let ev =
        crate::shared::audit_entry::event_for(None, None, resource, e.actor, e.action, e.detail);
    super::audit::append_chained(tx, ev, at).await?;
    Ok(())
}
