//! `/v1/orgs`: organizations (created, changed and deleted by `admin` keys; any key sees its
//! own).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use differently_core::tenancy::{validate_name, Org, OrgStatus};
use differently_core::{ErrorCode, OrgId};
use serde::Deserialize;

use crate::auth::access::{forbidden, load_org};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::{invalid, parse_json};
use crate::requests::idempotency::{self, json_answer, Replay};
use crate::requests::page::{Page, PageQuery};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/orgs", post(create_org).get(list_orgs))
        .route(
            "/v1/orgs/{id}",
            get(get_org).patch(update_org).delete(delete_org),
        )
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateOrg {
    name: String,
}

async fn create_org(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_org_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/orgs",
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_org_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<Org>)> {
    // Who may ask comes before what was asked: a caller without the scope learns nothing
    // about the body's rules.
    if !p.is_admin() {
        return Err(forbidden("create organizations (admin scope needed)"));
    }
    let req: CreateOrg = parse_json(body)?;
    validate_name("name", &req.name).map_err(invalid)?;
    let org = Org {
        id: OrgId::new(),
        name: req.name.trim().to_owned(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    state.store.create_org(&org, &p.actor()).await?;
    Ok((StatusCode::CREATED, Json(org)))
}

async fn list_orgs(
    State(state): State<AppState>,
    p: Principal,
    q: PageQuery,
) -> ApiResult<Json<Page<Org>>> {
    // Checked for every key: a malformed cursor is a 400 whoever sends it.
    let after = q.cursor_id(OrgId::parse)?;
    if !p.is_admin() {
        let own = state.store.get_org(&p.org_id).await?;
        return Ok(Json(Page {
            items: own.into_iter().collect(),
            next_cursor: None,
        }));
    }
    let rows = state.store.list_orgs(after.as_ref(), q.limit + 1).await?;
    Ok(Json(Page::from_rows(rows, q.limit, |o| o.id.to_string())))
}

async fn get_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Org>> {
    Ok(Json(load_org(&state, &p, &id).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct UpdateOrg {
    name: Option<String>,
    status: Option<OrgStatus>,
}

async fn update_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Org>> {
    let org = load_org(&state, &p, &id).await?;
    if !p.is_admin() {
        return Err(forbidden("change organizations (admin scope needed)"));
    }
    let req: UpdateOrg = parse_json(&body)?;
    if let Some(n) = &req.name {
        validate_name("name", n).map_err(invalid)?;
    }
    let updated = state
        .store
        .update_org(
            &org.id,
            req.name.as_deref().map(str::trim),
            req.status,
            &p.actor(),
        )
        .await?;
    state.auth_cache.forget_org(&org.id);
    Ok(Json(updated))
}

async fn delete_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let org = load_org(&state, &p, &id).await?;
    if !p.is_admin() {
        return Err(forbidden("delete organizations (admin scope needed)"));
    }
    if org.id == state.tenant.org.id {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the bootstrap organization cannot be deleted",
        ));
    }
    state.store.delete_org(&org.id, &p.actor()).await?;
    state.auth_cache.forget_org(&org.id);
    Ok(StatusCode::NO_CONTENT)
}
