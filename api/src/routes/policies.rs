//! Placement policies per level: `/v1/admin/policies/global`, `/v1/orgs/{id}/policy` and
//! `/v1/projects/{id}/policy`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use differently_core::policy::Policy;
use differently_core::{ErrorCode, OrgId};
use differently_store::placement::PolicyScope;

use crate::auth::access::{forbidden, load_project};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/policies/global", get(get_global).put(put_global))
        .route(
            "/v1/orgs/{id}/policy",
            get(get_org_policy).put(put_org_policy),
        )
        .route(
            "/v1/projects/{id}/policy",
            get(get_project_policy).put(put_project_policy),
        )
}

async fn read_policy(state: &AppState, scope: PolicyScope) -> ApiResult<Json<Policy>> {
    Ok(Json(
        state.store.get_policy(&scope).await?.unwrap_or_default(),
    ))
}

async fn write_policy(
    state: &AppState,
    p: &Principal,
    scope: PolicyScope,
    body: &Bytes,
) -> ApiResult<Json<Policy>> {
    if !p.is_admin() {
        return Err(forbidden("change placement policy (admin scope needed)"));
    }
    let policy: Policy = parse_json(body)?;
    policy
        .validate()
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    state.store.put_policy(&scope, &policy, &p.actor()).await?;
    state.policies.clear();
    Ok(Json(policy))
}

async fn get_global(State(state): State<AppState>, p: Principal) -> ApiResult<Json<Policy>> {
    if !p.is_admin() {
        return Err(forbidden("read the global policy (admin scope needed)"));
    }
    read_policy(&state, PolicyScope::Global).await
}

async fn put_global(
    State(state): State<AppState>,
    p: Principal,
    body: Bytes,
) -> ApiResult<Json<Policy>> {
    write_policy(&state, &p, PolicyScope::Global, &body).await
}

async fn org_scope(state: &AppState, p: &Principal, raw: &str) -> ApiResult<PolicyScope> {
    let id = OrgId::parse(raw).map_err(|_| ApiError::not_found("organization"))?;
    match state.store.get_org(&id).await? {
        Some(o) if p.sees_org(&o.id) => Ok(PolicyScope::Org(o.id)),
        _ => Err(ApiError::not_found("organization")),
    }
}

async fn get_org_policy(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Policy>> {
    let scope = org_scope(&state, &p, &id).await?;
    read_policy(&state, scope).await
}

async fn put_org_policy(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Policy>> {
    let scope = org_scope(&state, &p, &id).await?;
    write_policy(&state, &p, scope, &body).await
}

async fn get_project_policy(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Policy>> {
    let project = load_project(&state, &p, &id).await?;
    read_policy(&state, PolicyScope::Project(project.id)).await
}

async fn put_project_policy(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Policy>> {
    let project = load_project(&state, &p, &id).await?;
    write_policy(&state, &p, PolicyScope::Project(project.id), &body).await
}
