//! `POST /v1/events/credentials` and `DELETE /v1/events/credentials/{id}`: NATS credentials
//! with which an organization (or one project, for a project-bound key) subscribes to its
//! own public events and replays them from the `DLY_PUB` stream, and nothing else
//! (`differently_bus::callout`). The token is shown once. Without a NATS server that runs
//! Differently's auth callout (`differently dev`, or `bus.events_account_seed_env` unset),
//! both answer 501 `unsupported_operation`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use differently_bus::callout::{CalloutError, EventAuth, MAX_CREDENTIAL_TTL};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError, ProjectId};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::{invalid, parse_json};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/credentials", post(issue))
        .route("/v1/events/credentials/{id}", delete(revoke))
}

/// Shortest lifetime a caller may ask for.
pub(crate) const MIN_TTL_SECONDS: u64 = 60;

/// Lifetime when none is asked for.
const DEFAULT_TTL_SECONDS: u64 = 3600;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct IssueRequest {
    ttl_seconds: Option<u64>,
    project_id: Option<String>,
}

fn unavailable() -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedOperation,
        "event credentials need a NATS server running Differently's auth callout; this server \
         has none (differently dev, or bus.events_account_seed_env is not set); use GET \
         /v1/events instead",
    )
}

fn auth(state: &AppState) -> ApiResult<&EventAuth> {
    state.event_auth.as_ref().ok_or_else(unavailable)
}

fn store_error(e: CalloutError) -> ApiError {
    tracing::warn!(error = %e, "event credentials");
    ApiError::new(
        ErrorCode::ProviderUnavailable,
        "the event credential store is unavailable",
    )
}

async fn issue(
    State(state): State<AppState>,
    principal: Principal,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    principal.require(Scope::SandboxesRead)?;
    let req: IssueRequest = parse_json(&body)?;
    let ttl = req.ttl_seconds.unwrap_or(DEFAULT_TTL_SECONDS);
    if !(MIN_TTL_SECONDS..=MAX_CREDENTIAL_TTL.as_secs()).contains(&ttl) {
        return Err(invalid(FieldError::new(
            "ttlSeconds",
            format!(
                "must be between {MIN_TTL_SECONDS} and {}",
                MAX_CREDENTIAL_TTL.as_secs()
            ),
        )));
    }
    let project = match req.project_id.as_deref() {
        None => principal.project_id.clone(),
        Some(raw) => {
            let asked = ProjectId::parse(raw)
                .map_err(|_| invalid(FieldError::new("projectId", "not a project id")))?;
            if principal.project_id.as_ref().is_some_and(|b| b != &asked) {
                return Err(ApiError::not_found("project"));
            }
            Some(asked)
        }
    };
    let auth = auth(&state)?;
    let issued = auth
        .issue(
            &principal.org_id,
            project.as_ref(),
            &principal.key_id,
            Duration::from_secs(ttl),
        )
        .await
        .map_err(store_error)?;
    tracing::info!(credential = %issued.id, org = %principal.org_id, key = %principal.key_id, "event credential issued");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": issued.id,
            "token": issued.token,
            "expiresAt": issued.expires_at,
            "orgId": principal.org_id,
            "projectId": project,
            "subscribe": issued.grant.subscribe,
            "inboxPrefix": issued.grant.inbox_prefix,
            "stream": issued.grant.stream,
            "consumerCreate": issued.grant.consumer_create,
        })),
    ))
}

async fn revoke(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::SandboxesRead)?;
    let auth = auth(&state)?;
    if auth
        .revoke(&principal.org_id, &id)
        .await
        .map_err(store_error)?
    {
        tracing::info!(credential = %id, org = %principal.org_id, "event credential revoked");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("event credential"))
    }
}
