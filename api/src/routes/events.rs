//! `GET /v1/events?projectId=&sandboxId=&types=&format=`: a tenant's events as SSE, read from
//! the public event stream (`DLY_PUB`, subjects `dly.pub.<org>.<project>.<sandbox>.<type>`),
//! the very events a NATS subscriber with `POST /v1/events/credentials` receives.
//!
//! Each event's `id:` is its stream sequence; a client that reconnects with
//! `Last-Event-ID: n` (or `?after=n`) gets every event after `n` once, in order, as long as
//! the stream still holds it (24 h). Without either it gets new events only. A project-bound
//! key sees its project only.
//!
//! `format=public` (the contract): `event:` is the public type (`sandbox.status.changed`, …)
//! and `data:` the public event. `format=status` (the default, kept for the SDKs released
//! before public events): `event: status` with the flat status body, status changes only.
//!
//! Ordering: two processes can publish one sandbox's changes in the other order (each after
//! its own commit), so a late, older change can follow a newer one; it is still sent (never
//! lost: clients order by `statusVersion`), and only a change already sent on this connection
//! (a re-delivery) is dropped.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use differently_bus_schema::{EventData, EventType, PublicEvent};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, OrgId, ProjectId, SandboxId, SandboxStatus};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::page::bad_query;
use crate::requests::query::StrictQuery;
use crate::requests::sse::HEARTBEAT;
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
    types: Option<String>,
    format: Option<String>,
}

/// How events are written on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// The public event, `event:` its type.
    Public,
    /// The pre-public flat status body, `event: status`.
    Status,
}

/// Parses `types`: comma-separated exact types or prefixes ending in `.*` (`snapshot.*`).
fn parse_types(raw: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    let filters: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if filters.is_empty() {
        return Err(bad_query("types", "name at least one event type"));
    }
    for f in &filters {
        if !EventType::ALL.iter().any(|t| t.matches(f)) {
            return Err(bad_query(
                "types",
                format!("{f:?} matches no event type (see GET /v1/events/schemas)"),
            ));
        }
    }
    Ok(Some(filters))
}

/// Status versions one connection remembers per sandbox (a sandbox has a handful).
const SENT_VERSIONS: usize = 64;

/// What one connection has sent: the recent status versions of each sandbox, so a
/// re-delivered change is dropped (see the module doc).
#[derive(Default)]
struct Sent {
    status_versions: HashMap<SandboxId, Vec<i64>>,
}

impl Sent {
    /// Whether `e` goes out: anything but a status change already sent for its sandbox.
    fn admit(&mut self, e: &PublicEvent) -> bool {
        let (EventData::StatusChanged(d), Some(sandbox)) = (&e.data, &e.sandbox_id) else {
            return true;
        };
        let sent = self.status_versions.entry(sandbox.clone()).or_default();
        if sent.contains(&d.status_version) {
            return false;
        }
        if sent.len() >= SENT_VERSIONS {
            sent.remove(0);
        }
        sent.push(d.status_version);
        true
    }
}

/// The SSE event of `e` in `format`; `None` when the format does not carry its type.
fn render(seq: u64, e: &PublicEvent, format: Format) -> Option<Event> {
    let event = Event::default().id(seq.to_string());
    match format {
        Format::Public => {
            let data = serde_json::to_string(e).ok()?;
            Some(event.event(e.event_type().as_str()).data(data))
        }
        Format::Status => {
            let EventData::StatusChanged(d) = &e.data else {
                return None;
            };
            let body = StatusEvent {
                sandbox_id: e.sandbox_id.clone(),
                org_id: e.org_id.clone(),
                project_id: e.project_id.clone(),
                status: d.status,
                status_reason: d.status_reason.clone(),
                pool: d.pool.clone(),
                status_version: d.status_version,
                at: e.time,
            };
            let data = serde_json::to_string(&body).ok()?;
            Some(event.event("status").data(data))
        }
    }
}

/// A `status` event of `GET /v1/events` (the default format): the document's `StatusEvent`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StatusEvent {
    /// Always set: every status change is a sandbox's.
    #[schema(value_type = SandboxId, required)]
    sandbox_id: Option<SandboxId>,
    org_id: OrgId,
    project_id: ProjectId,
    status: SandboxStatus,
    #[schema(required)]
    status_reason: Option<String>,
    #[schema(required)]
    pool: Option<String>,
    status_version: i64,
    at: DateTime<Utc>,
}

async fn events(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    StrictQuery(q): StrictQuery<EventsQuery>,
) -> ApiResult<Response> {
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
    let format = match q.format.as_deref() {
        None | Some("status") => Format::Status,
        Some("public") => Format::Public,
        Some(_) => return Err(bad_query("format", "must be public or status")),
    };
    let types = parse_types(q.types.as_deref())?;
    if types.is_some() && format == Format::Status {
        // The status form carries status changes only: a filter on it would silently narrow
        // nothing (or everything) — refused, naming what it needs.
        return Err(bad_query(
            "types",
            "needs format=public (the default status format carries status changes only)",
        ));
    }
    // The header (a reconnecting `EventSource` sends it) wins over `?after=`; a bad value is
    // refused naming the one it came from.
    let header = headers
        .get("last-event-id")
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned());
    let resume = match header {
        Some(raw) => Some(("Last-Event-ID", raw)),
        None => q.after.map(|raw| ("after", raw)),
    };
    let after = match resume {
        None => None,
        Some((source, raw)) => Some(
            raw.trim()
                .parse::<u64>()
                .map_err(|_| bad_query(source, "must be an event id from this stream"))?,
        ),
    };
    let naming = state.announcer.naming().clone();
    let filter = naming.public_filter(&principal.org_id, project.as_ref(), sandbox.as_ref());
    let stream = state
        .announcer
        .bus()
        .events(&naming.public_stream().name, &filter, after)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "cannot read the public event stream");
            ApiError::new(
                ErrorCode::ProviderUnavailable,
                "the event stream is unavailable",
            )
        })?;
    let org = principal.org_id.clone();
    let mut sent = Sent::default();
    let events = stream
        .take_while(|item| {
            let ok = item.is_ok();
            if let Err(e) = item {
                tracing::warn!(error = %e, "event stream ended");
            }
            async move { ok }
        })
        .filter_map(move |item| {
            let out = item.ok().and_then(|ev| {
                // Undecodable: logged and counted by the bus layer, and skipped here.
                let e = differently_bus::decode_public(&ev.subject, &ev.payload).ok()?;
                // The filter is the org's subjects; the body is checked too, so a mis-filed
                // event never crosses tenants.
                if e.org_id != org {
                    return None;
                }
                if let Some(types) = &types {
                    if !types.iter().any(|f| e.event_type().matches(f)) {
                        return None;
                    }
                }
                if !sent.admit(&e) {
                    return None;
                }
                render(ev.seq, &e, format)
            });
            async move { out.map(Ok::<_, Infallible>) }
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

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use differently_bus_schema::public::StatusData;
    use differently_bus_schema::{Cause, Origin};
    use differently_core::{OrgId, SandboxStatus};

    use super::*;

    fn status(sandbox: &SandboxId, version: i64) -> PublicEvent {
        PublicEvent::new(
            OrgId::new(),
            ProjectId::new(),
            Some(sandbox.clone()),
            Origin::system(Cause::Backend),
            Utc::now(),
            &version.to_string(),
            EventData::StatusChanged(StatusData {
                status: SandboxStatus::Running,
                status_reason: None,
                status_version: version,
                pool: None,
            }),
        )
    }

    #[test]
    fn a_late_older_status_change_is_sent_and_a_repeat_dropped_per_sandbox() {
        let (a, b) = (SandboxId::new(), SandboxId::new());
        let mut sent = Sent::default();
        assert!(sent.admit(&status(&a, 3)));
        assert!(sent.admit(&status(&a, 2)), "older, late: sent, never lost");
        assert!(!sent.admit(&status(&a, 3)), "the same version again");
        assert!(!sent.admit(&status(&a, 2)), "the late one again");
        assert!(sent.admit(&status(&b, 1)), "another sandbox is apart");
        assert!(sent.admit(&status(&a, 4)));
    }

    #[test]
    fn types_must_name_a_known_type_or_prefix() {
        assert!(parse_types(Some("sandbox.exec.*,snapshot.created")).is_ok());
        assert!(parse_types(Some("*")).is_ok());
        assert!(parse_types(Some("sandbox.nope")).is_err());
        assert!(parse_types(Some(" , ")).is_err());
        assert_eq!(parse_types(None).ok(), Some(None));
    }
}
