//! Loading what the caller may see. Visibility comes before permission: another tenant's
//! object is the same 404 as an absent one, so a key cannot probe for ids.

use differently_core::ids::SnapshotId;
use differently_core::{Sandbox, SandboxId};
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
