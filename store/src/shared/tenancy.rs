//! Tenancy changes' audit entries (organizations, projects, keys, quotas, secrets).

use serde_json::json;

use super::audit_entry::AuditEntry;
use crate::{Actor, ApiKeyRecord, Org, OrgStatus};

/// A tenancy audit entry (`org.create`, `key.revoke`, …) by `actor`.
pub(crate) fn tenancy_entry(actor: &Actor, action: &str, detail: serde_json::Value) -> AuditEntry {
    AuditEntry {
        actor: actor.as_audit(),
        action: action.to_owned(),
        detail,
    }
}

/// The audit detail of a new key: everything but the hash, which must never be logged.
pub(crate) fn key_detail(k: &ApiKeyRecord) -> serde_json::Value {
    json!({
        "name": k.name,
        "projectId": k.project_id,
        "scopes": k.scopes,
        "expiresAt": k.expires_at,
    })
}

/// Applies `update_org`'s changes to `org`; the audit detail holds old and new values.
pub(crate) fn update_org(
    org: &mut Org,
    name: Option<&str>,
    status: Option<OrgStatus>,
) -> serde_json::Value {
    let before = json!({ "name": org.name, "status": org.status });
    if let Some(n) = name {
        org.name = n.to_owned();
    }
    if let Some(st) = status {
        org.status = st;
    }
    json!({ "old": before, "new": { "name": org.name, "status": org.status } })
}
