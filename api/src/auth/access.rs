//! Loading what the caller may see, and the refusal of what it may not do. Visibility comes
//! before permission: another tenant's object is the same 404 as an absent one, so a key
//! cannot probe for ids; a key that can see an object but lacks the right gets 403.

use differently_core::ids::SnapshotId;
use differently_core::tenancy::{Org, Project};
use differently_core::{ErrorCode, OrgId, ProjectId, Sandbox, SandboxId};
use differently_store::lifecycle::SnapshotRecord;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Loads a sandbox the principal may see; anything else is the same 404.
pub async fn load_sandbox(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
) -> ApiResult<Sandbox> {
    let id = SandboxId::parse(raw_id).map_err(|_| ApiError::not_found("sandbox"))?;
    match state.store.get_sandbox(&id).await? {
        Some(s) if principal.owns(&s.org_id, &s.project_id) => Ok(s),
        _ => Err(ApiError::not_found("sandbox")),
    }
}

/// Loads a snapshot the principal may see; anything else is the same 404.
pub(crate) async fn load_snapshot(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
) -> ApiResult<SnapshotRecord> {
    let id = SnapshotId::parse(raw_id).map_err(|_| ApiError::not_found("snapshot"))?;
    match state.store.get_snapshot(&id).await? {
        Some(s) if principal.owns(&s.org_id, &s.project_id) => Ok(s),
        _ => Err(ApiError::not_found("snapshot")),
    }
}

pub(crate) async fn load_org(state: &AppState, p: &Principal, raw: &str) -> ApiResult<Org> {
    let id = OrgId::parse(raw).map_err(|_| ApiError::not_found("organization"))?;
    match state.store.get_org(&id).await? {
        Some(o) if p.sees_org(&o.id) => Ok(o),
        _ => Err(ApiError::not_found("organization")),
    }
}

/// Loads a project the key may see; anything else is the same 404.
pub async fn load_project(state: &AppState, p: &Principal, raw: &str) -> ApiResult<Project> {
    let id = ProjectId::parse(raw).map_err(|_| ApiError::not_found("project"))?;
    match state.store.get_project(&id).await? {
        Some(pr) if p.sees_project(&pr.org_id, &pr.id) => Ok(pr),
        _ => Err(ApiError::not_found("project")),
    }
}

pub(crate) fn forbidden(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::PermissionDenied,
        format!("this key may not {what}"),
    )
}
