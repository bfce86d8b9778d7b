//! What a successful change writes to the audit log besides the row, and the record it
//! becomes on a chain.

use differently_core::{OrgId, ProjectId};

use crate::audit::{self, NewAuditEvent};

/// What a successful change writes to the audit log besides the row.
#[derive(Clone)]
pub(crate) struct AuditEntry {
    pub actor: String,
    pub action: String,
    pub detail: serde_json::Value,
}

impl AuditEntry {
    /// The record of this entry about `resource`, with its project when known.
    pub(crate) fn into_event(
        self,
        org: Option<&OrgId>,
        project: Option<&ProjectId>,
        resource: &str,
    ) -> NewAuditEvent {
        event_for(org, project, resource, self.actor, self.action, self.detail)
    }
}

/// The record about `resource` in `org`'s chain, with its project when the resource is a
/// project or the detail names one.
pub(crate) fn event_for(
    org: Option<&OrgId>,
    project: Option<&ProjectId>,
    resource: &str,
    actor: String,
    action: String,
    detail: serde_json::Value,
) -> NewAuditEvent {
    let project = project.cloned().or_else(|| {
        ProjectId::parse(resource).ok().or_else(|| {
            detail
                .get("projectId")
                .and_then(|p| p.as_str())
                .and_then(|p| ProjectId::parse(p).ok())
        })
    });
    NewAuditEvent {
        org_id: org.cloned(),
        project_id: project,
        actor,
        action,
        resource: resource.to_owned(),
        outcome: audit::OUTCOME_OK.to_owned(),
        detail,
    }
}
