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

/// The key minting a new key, if a key is the actor: its parent, whose revocation revokes it.
pub(crate) fn minting_key(actor: &Actor) -> Option<&str> {
    match actor {
        Actor::Key(id) => Some(id.as_str()),
        Actor::System(_) => None,
    }
}

/// The audit detail of a key revoked because a key above it was.
pub(crate) fn cascade_detail(
    at: chrono::DateTime<chrono::Utc>,
    revoked: &differently_core::KeyId,
) -> serde_json::Value {
    json!({ "revokedAt": at, "because": revoked })
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
