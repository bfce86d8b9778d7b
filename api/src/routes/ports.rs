//! `POST /v1/sandboxes/{id}/ports`: a URL to a port of a running sandbox, made by the pool's
//! workers (`mutation`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_bus_schema::WorkOp;
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use differently_store::lifecycle::OpState;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::access::load_sandbox;
use crate::auth::Principal;
use crate::control::mutation::{audit, begin, op_failure, wait_op, LIFECYCLE_WAIT};
use crate::control::sandbox_pool::pool_name;
use crate::data_plane::ready_for_data;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/sandboxes/{id}/ports", post(expose_port))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PortRequest {
    port: u32,
    expires_seconds: Option<u64>,
}

/// Longest port URL lifetime a caller may ask for: 7 days.
pub const MAX_PORT_SECONDS: u64 = 7 * 24 * 3600;

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PortAnswer {
    url: String,
    #[schema(required)]
    expires_at: Option<DateTime<Utc>>,
}

/// A 202: the work goes on after the answer (the document's `PendingOperation`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct PendingOperation {
    #[schema(value_type = String)]
    operation: differently_core::ids::OpId,
    status: &'static str,
}

async fn expose_port(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    principal.require(Scope::SandboxesWrite)?;
    let req: PortRequest = parse_json(&body)?;
    if req.port == 0 || req.port > 65535 {
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            differently_core::FieldError::new("port", "must be between 1 and 65535"),
        ));
    }
    if let Some(s) = req.expires_seconds {
        if s == 0 || s > MAX_PORT_SECONDS {
            return Err(ApiError::field(
                ErrorCode::ValidationFailed,
                differently_core::FieldError::new(
                    "expiresSeconds",
                    format!("must be between 1 and {MAX_PORT_SECONDS}"),
                ),
            ));
        }
    }
    let sandbox = load_sandbox(&state, &principal, &id).await?;
    let (pool, _, sandbox) = ready_for_data(&state, &principal, sandbox, "ports.expose").await?;
    audit(
        &state,
        &principal,
        &sandbox,
        "sandbox.expose_port",
        json!({ "port": req.port }),
    )
    .await?;
    let record = begin(
        &state,
        &sandbox,
        &pool_name(&pool),
        WorkOp::ExposePort,
        false,
        json!({ "port": req.port, "expiresSeconds": req.expires_seconds }),
        principal.actor().as_audit(),
    )
    .await?;
    match wait_op(&state, &record.id, &sandbox.id, LIFECYCLE_WAIT).await? {
        Some(op) if op.state == OpState::Done => {
            let answer = PortAnswer {
                url: op.result["url"].as_str().unwrap_or_default().to_owned(),
                expires_at: serde_json::from_value(op.result["expiresAt"].clone()).unwrap_or(None),
            };
            Ok((StatusCode::OK, Json(answer)).into_response())
        }
        Some(op) => Err(op_failure(&op)),
        None => Ok((
            StatusCode::ACCEPTED,
            Json(PendingOperation {
                operation: record.id,
                status: "pending",
            }),
        )
            .into_response()),
    }
}
