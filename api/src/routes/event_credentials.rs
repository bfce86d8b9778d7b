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
use chrono::{DateTime, Utc};
use differently_bus::callout::{CalloutError, EventAuth, MAX_CREDENTIAL_TTL};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError, OrgId, ProjectId};
use serde::{Deserialize, Serialize};

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

/// `POST`'s answer: the document's `EventCredentials` (the token is shown this once).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Credentials {
    /// `evc_…`: what `DELETE` revokes.
    id: String,
    token: String,
    expires_at: DateTime<Utc>,
    org_id: OrgId,
    #[schema(required)]
    project_id: Option<ProjectId>,
    subscribe: String,
    inbox_prefix: String,
    stream: String,
    consumer_create: String,
}

async fn issue(
    State(state): State<AppState>,
    principal: Principal,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Credentials>)> {
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
        Json(Credentials {
            id: issued.id,
            token: issued.token,
            expires_at: issued.expires_at,
            org_id: principal.org_id.clone(),
            project_id: project,
            subscribe: issued.grant.subscribe,
            inbox_prefix: issued.grant.inbox_prefix,
            stream: issued.grant.stream,
            consumer_create: issued.grant.consumer_create,
        }),
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
