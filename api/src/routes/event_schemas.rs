//! `GET /v1/events/schemas` and `GET /v1/events/schemas/{type}`: the JSON Schema of every
//! public event type, served from the same definitions the events are built from
//! (`differently_bus_schema::public`), so a subscriber can validate what it receives.

use axum::extract::Path;
use axum::routing::get;
use axum::{Json, Router};
use differently_bus_schema::public::{envelope_schema, schema, schemas};
use differently_bus_schema::{EventType, PUBLIC_EVENT_VERSION};
use differently_core::tenancy::Scope;
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/schemas", get(list))
        .route("/v1/events/schemas/{type}", get(one))
}

async fn list(principal: Principal) -> ApiResult<Json<Value>> {
    principal.require(Scope::SandboxesRead)?;
    let items: Vec<Value> = schemas()
        .into_iter()
        .map(|(t, s)| json!({ "type": t.as_str(), "schema": s }))
        .collect();
    Ok(Json(json!({
        "version": PUBLIC_EVENT_VERSION,
        "envelope": envelope_schema(),
        "items": items,
    })))
}

async fn one(principal: Principal, Path(ty): Path<String>) -> ApiResult<Json<Value>> {
    principal.require(Scope::SandboxesRead)?;
    let t = EventType::parse(&ty).ok_or_else(|| ApiError::not_found("event type"))?;
    Ok(Json(schema(t)))
}
