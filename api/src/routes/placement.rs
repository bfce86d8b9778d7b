//! `GET /v1/sandboxes/{id}/placement` (the stored explanation of a sandbox's placement) and
//! `POST /v1/placement/dry-run` (where a create would go now, and why).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use differently_core::tenancy::Scope;
use differently_core::{CreateSandboxRequest, ErrorCode, FieldError, SandboxSpec};

use crate::auth::access::load_project;
use crate::auth::Principal;
use crate::control::placement_decision::{dry_run as dry_run_decision, explain, request_error};
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/placement", get(sandbox_placement))
        .route("/v1/placement/dry-run", post(dry_run))
}

async fn sandbox_placement(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    p.require(Scope::SandboxesRead)?;
    let sandbox = crate::auth::access::load_sandbox(&state, &p, &id).await?;
    match state.store.get_placement(&sandbox.id).await? {
        Some(doc) => Ok(Json(doc)),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            "no placement decision recorded yet",
        )),
    }
}

async fn dry_run(
    State(state): State<AppState>,
    p: Principal,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    p.require(Scope::SandboxesRead)?;
    let req: CreateSandboxRequest = parse_json(&body)?;
    let mut spec = SandboxSpec::build(&req).map_err(request_error)?;
    let project = match (&req.project_id, &p.project_id) {
        (Some(asked), _) => {
            let pr = load_project(&state, &p, asked.as_str()).await?;
            pr.id
        }
        (None, Some(bound)) => bound.clone(),
        (None, None) => {
            return Err(ApiError::field(
                ErrorCode::ValidationFailed,
                FieldError::new("projectId", "required for an organization-wide key"),
            ))
        }
    };
    let org = match state.store.get_project(&project).await? {
        Some(pr) => pr.org_id,
        None => return Err(ApiError::not_found("project")),
    };
    crate::routes::sandboxes::pin_to_snapshot(&state, &p, &req, &project, &mut spec).await?;
    let explained = explain(&state, &org, &project, &spec, true).await?;
    Ok(Json(
        dry_run_decision(&state, &org, &project, &spec, explained).await?,
    ))
}
