//! Refusals both stores phrase the same way, so clients see one message whichever serves.

use crate::StoreError;

/// `AlreadyExists` for a taken name, e.g. `organization name "acme"`.
pub(crate) fn name_taken(kind: &str, name: &str) -> StoreError {
    StoreError::AlreadyExists(format!("{kind} name {name:?}"))
}

/// `HasDependents` for an organization that still has projects.
pub(crate) fn org_has_projects(n: u64) -> StoreError {
    StoreError::HasDependents(format!("organization has {n} projects"))
}

/// `HasDependents` for a project that still has snapshots: no snapshot may outlive its
/// project (its backend copy would leak and its record could not be deleted), and deleting
/// them is backend work, so the caller deletes them first.
pub(crate) fn project_has_snapshots(n: u64) -> StoreError {
    StoreError::HasDependents(format!(
        "project has {n} snapshots; delete them first (DELETE /v1/snapshots/{{id}})"
    ))
}

/// `HasDependents` for a project that still has sandboxes that are not final.
pub(crate) fn project_has_live_sandboxes(n: u64) -> StoreError {
    StoreError::HasDependents(format!("project has {n} live sandboxes"))
}
