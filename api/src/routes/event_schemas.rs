//! `GET /v1/events/schemas` and `GET /v1/events/schemas/{type}`: the JSON Schema of every
//! public event type, served from the same definitions the events are built from
//! (`differently_bus_schema::public`), so a subscriber can validate what it receives.

use axum::extract::Path;
use axum::routing::get;
use axum::{Json, Router};
use differently_bus_schema::public::{envelope_schema, schema, schemas};
use differently_bus_schema::{EventType, PUBLIC_EVENT_VERSION};
use differently_core::tenancy::Scope;
use serde::Serialize;
use serde_json::Value;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/schemas", get(list))
        .route("/v1/events/schemas/{type}", get(one))
}

/// `GET /v1/events/schemas`: the document's `EventSchemaList`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SchemaList {
    version: u32,
    /// The envelope every event shares.
    #[schema(schema_with = event_schema)]
    envelope: Value,
    items: Vec<SchemaItem>,
}

/// One event type and its schema.
#[derive(Serialize, utoipa::ToSchema)]
struct SchemaItem {
    #[serde(rename = "type")]
    ty: &'static str,
    #[schema(schema_with = event_schema)]
    schema: Value,
}

/// A JSON Schema is a document of its own: the OpenAPI document's `EventSchema` describes it
/// in prose, and the list refers to it.
fn event_schema() -> utoipa::openapi::Ref {
    utoipa::openapi::Ref::from_schema_name("EventSchema")
}

async fn list(principal: Principal) -> ApiResult<Json<SchemaList>> {
    principal.require(Scope::SandboxesRead)?;
    Ok(Json(SchemaList {
        version: PUBLIC_EVENT_VERSION,
        envelope: envelope_schema(),
        items: schemas()
            .into_iter()
            .map(|(t, schema)| SchemaItem {
                ty: t.as_str(),
                schema,
            })
            .collect(),
    }))
}

async fn one(principal: Principal, Path(ty): Path<String>) -> ApiResult<Json<Value>> {
    principal.require(Scope::SandboxesRead)?;
    let t = EventType::parse(&ty).ok_or_else(|| ApiError::not_found("event type"))?;
    Ok(Json(schema(t)))
}
