//! `/v1/orgs/{id}/quota` and `/v1/projects/{id}/quota`: what is stored at each level, what
//! applies, and current usage.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::{Json, Router};
use differently_core::tenancy::{Quota, Usage};
use differently_store::QuotaScope;
use serde::Serialize;

use crate::auth::access::{forbidden, load_org, load_project};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::requests::body::{invalid, parse_json};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/orgs/{id}/quota", get(get_org_quota).put(put_org_quota))
        .route(
            "/v1/projects/{id}/quota",
            get(get_project_quota).put(put_project_quota),
        )
}

/// A quota as served: what is stored at this level, what applies, and current usage.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaView {
    quota: Quota,
    effective: Quota,
    #[schema(value_type = Object)]
    usage: Usage,
}

async fn quota_view(state: &AppState, scope: QuotaScope) -> ApiResult<QuotaView> {
    let stored = state.store.get_quota(&scope).await?.unwrap_or_default();
    let effective = match scope {
        QuotaScope::Org(_) => stored.or(&state.limits.quota_defaults),
        QuotaScope::Project(_) => stored,
    };
    let usage = state.store.usage(&scope).await?;
    Ok(QuotaView {
        quota: stored,
        effective,
        usage,
    })
}

async fn get_org_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<QuotaView>> {
    let org = load_org(&state, &p, &id).await?;
    Ok(Json(quota_view(&state, QuotaScope::Org(org.id)).await?))
}

async fn put_quota(
    state: &AppState,
    p: &Principal,
    scope: QuotaScope,
    body: &Bytes,
) -> ApiResult<QuotaView> {
    if !p.is_admin() {
        return Err(forbidden("change quotas (admin scope needed)"));
    }
    let quota: Quota = parse_json(body)?;
    quota.validate().map_err(invalid)?;
    state.store.put_quota(&scope, &quota, &p.actor()).await?;
    quota_view(state, scope).await
}

async fn put_org_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<QuotaView>> {
    let org = load_org(&state, &p, &id).await?;
    Ok(Json(
        put_quota(&state, &p, QuotaScope::Org(org.id), &body).await?,
    ))
}

async fn get_project_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<QuotaView>> {
    let project = load_project(&state, &p, &id).await?;
    Ok(Json(
        quota_view(&state, QuotaScope::Project(project.id)).await?,
    ))
}

async fn put_project_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<QuotaView>> {
    let project = load_project(&state, &p, &id).await?;
    Ok(Json(
        put_quota(&state, &p, QuotaScope::Project(project.id), &body).await?,
    ))
}
