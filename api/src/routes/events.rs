//! `GET /v1/events?projectId=&sandboxId=`: a tenant's sandbox events as SSE, read from the
//! event stream (`dly.evt.<org>.<project>.<sandbox>`). Each event's `id:` is its stream
//! sequence; a client that reconnects with `Last-Event-ID: n` (or `?after=n`) gets every event
//! after `n` once, in order, as long as the stream still holds it (24 h). Without either it
//! gets new events only. A project-bound key sees its project only.

use std::convert::Infallible;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use differently_bus::{BusExt, TypedEvent};
use differently_bus_schema::StatusChanged;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, ProjectId, SandboxId};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::page::bad_query;
use crate::sse::HEARTBEAT;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/events", get(events))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EventsQuery {
    project_id: Option<String>,
    sandbox_id: Option<String>,
    after: Option<String>,
}

async fn events(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.body_text()))?;
    principal.require(Scope::SandboxesRead)?;
    let project = match q.project_id.as_deref() {
        None => principal.project_id.clone(),
        Some(raw) => {
            let asked =
                ProjectId::parse(raw).map_err(|_| bad_query("projectId", "not a project id"))?;
            if principal.project_id.as_ref().is_some_and(|b| b != &asked) {
                return Err(ApiError::not_found("project"));
            }
            Some(asked)
        }
    };
    let sandbox = match q.sandbox_id.as_deref() {
        None => None,
        Some(raw) => {
            Some(SandboxId::parse(raw).map_err(|_| bad_query("sandboxId", "not a sandbox id"))?)
        }
    };
    let header = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let after = match header.or(q.after) {
        None => None,
        Some(raw) => Some(
            raw.trim()
                .parse::<u64>()
                .map_err(|_| bad_query("Last-Event-ID", "must be an event id from this stream"))?,
        ),
    };
    let naming = state.announcer.naming().clone();
    let filter = naming.event_filter(&principal.org_id, project.as_ref(), sandbox.as_ref());
    let stream = state
        .announcer
        .bus()
        .events_typed::<StatusChanged>(&naming.events_stream().name, &filter, after)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot read the event stream");
            ApiError::new(
                ErrorCode::ProviderUnavailable,
                "the event stream is unavailable",
            )
        })?;
    let events = stream
        .take_while(|item| {
            let ok = item.is_ok();
            if let Err(e) = item {
                tracing::warn!(error = %e, "event stream ended");
            }
            async move { ok }
        })
        .filter_map(|item| async move {
            let TypedEvent { seq, env, .. } = item.ok()?;
            let body = json!({
                "sandboxId": env.sandbox_id,
                "orgId": env.body.org_id,
                "projectId": env.body.project_id,
                "status": env.body.status,
                "statusReason": env.body.status_reason,
                "pool": env.body.pool,
                "statusVersion": env.status_version,
                "at": env.body.at,
            });
            Some(Ok::<_, Infallible>(
                Event::default()
                    .id(seq.to_string())
                    .event("status")
                    .data(body.to_string()),
            ))
        });
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("ping"))
        .into_response();
    resp.headers_mut().insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    Ok(resp)
}
