//! `/v1/projects`: an org-wide key with `sandboxes:write` manages its own organization's
//! projects; `admin` manages everything.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use differently_core::tenancy::{validate_name, Project};
use differently_core::{ErrorCode, OrgId, ProjectId};
use serde::Deserialize;

use crate::auth::access::{forbidden, load_org, load_project};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::{invalid, parse_json};
use crate::requests::idempotency::{self, json_answer, Replay};
use crate::requests::page::{Page, PageQuery};
use crate::requests::query::StrictQuery;

use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/projects", post(create_project).get(list_projects))
        .route(
            "/v1/projects/{id}",
            get(get_project)
                .patch(update_project)
                .delete(delete_project),
        )
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateProject {
    org_id: Option<OrgId>,
    name: String,
}

async fn create_project(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_project_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/projects",
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_project_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<Project>)> {
    let req: CreateProject = parse_json(body)?;
    let org_id = req.org_id.unwrap_or_else(|| p.org_id.clone());
    let org = load_org(state, p, org_id.as_str()).await?;
    if !p.manages_org(&org.id) {
        return Err(forbidden("create projects in this organization"));
    }
    validate_name("name", &req.name).map_err(invalid)?;
    let project = Project {
        id: ProjectId::new(),
        org_id: org.id,
        name: req.name.trim().to_owned(),
        created_at: Utc::now(),
    };
    state.store.create_project(&project, &p.actor()).await?;
    Ok((StatusCode::CREATED, Json(project)))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListProjects {
    org_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_projects(
    State(state): State<AppState>,
    p: Principal,
    StrictQuery(q): StrictQuery<ListProjects>,
) -> ApiResult<Json<Page<Project>>> {
    // Checked before the organization is looked up: a malformed query is 400 for any org.
    let page = PageQuery {
        limit: crate::requests::page::parse_limit(q.limit.as_deref())?,
        cursor: q.cursor,
    };
    let after = page.cursor_id(ProjectId::parse)?;
    let org = match q.org_id.as_deref() {
        Some(raw) => load_org(&state, &p, raw).await?.id,
        None => p.org_id.clone(),
    };
    let rows = state
        .store
        .list_projects(&org, after.as_ref(), page.limit + 1)
        .await?;
    let rows = rows
        .into_iter()
        .filter(|pr| p.sees_project(&pr.org_id, &pr.id))
        .collect();
    Ok(Json(Page::from_rows(rows, page.limit, |pr| {
        pr.id.to_string()
    })))
}

async fn get_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Project>> {
    Ok(Json(load_project(&state, &p, &id).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct UpdateProject {
    name: String,
}

async fn update_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Project>> {
    let project = load_project(&state, &p, &id).await?;
    if !p.manages_org(&project.org_id) {
        return Err(forbidden("change projects of this organization"));
    }
    let req: UpdateProject = parse_json(&body)?;
    validate_name("name", &req.name).map_err(invalid)?;
    Ok(Json(
        state
            .store
            .rename_project(&project.id, req.name.trim(), &p.actor())
            .await?,
    ))
}

async fn delete_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let project = load_project(&state, &p, &id).await?;
    if !p.manages_org(&project.org_id) {
        return Err(forbidden("delete projects of this organization"));
    }
    if project.id == state.tenant.project.id {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the bootstrap project cannot be deleted",
        ));
    }
    state.store.delete_project(&project.id, &p.actor()).await?;
    Ok(StatusCode::NO_CONTENT)
}
