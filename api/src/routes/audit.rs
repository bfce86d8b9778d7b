//! The audit log over HTTP.
//!
//! `GET /v1/audit` lists the caller's own organization's records (a project-bound key: its
//! project's only); operators may name any organization. `/v1/admin/audit/*` verifies the
//! chains, writes a checkpoint, and exports everything as JSON lines for the offline
//! verifier (`differently audit verify`).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, OrgId, ProjectId};
use differently_store::audit::{
    AuditEvent, AuditFilter, Checkpoint, ExportCursor, ExportLine, NewAuditEvent, ProblemKind,
    Segment, VerifyReport,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::page::{bad_query, parse_limit, Page};
use crate::requests::query::StrictQuery;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/audit", get(list_audit))
        .route("/v1/admin/audit/verify", get(verify))
        .route("/v1/admin/audit/export", get(export))
        .route("/v1/admin/audit/checkpoints", post(checkpoint))
        .route("/v1/admin/audit/segments", post(segment))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAuditQuery {
    org_id: Option<String>,
    project_id: Option<String>,
    action: Option<String>,
    actor: Option<String>,
    resource: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

fn parse_time(field: &str, raw: Option<&str>) -> ApiResult<Option<DateTime<Utc>>> {
    raw.map(|t| {
        DateTime::parse_from_rfc3339(t)
            .map(|d| d.with_timezone(&Utc))
            .map_err(|_| bad_query(field, "must be an RFC 3339 time"))
    })
    .transpose()
}

/// `GET /v1/audit?orgId=&projectId=&action=&actor=&resource=&since=&until=&limit=&cursor=`
async fn list_audit(
    State(state): State<AppState>,
    p: Principal,
    StrictQuery(q): StrictQuery<RawAuditQuery>,
) -> ApiResult<Json<Page<AuditEvent>>> {
    p.require(Scope::SandboxesRead)?;
    // The whole query is checked before the organization and project are looked at, so a
    // malformed one is 400 whoever's records it asks for.
    let limit = parse_limit(q.limit.as_deref())?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>()
                .map_err(|_| bad_query("cursor", "not a cursor from this API"))
        })
        .transpose()?;
    let since = parse_time("since", q.since.as_deref())?;
    let until = parse_time("until", q.until.as_deref())?;
    let org = match q.org_id.as_deref() {
        None => p.org_id.clone(),
        Some(raw) => {
            let id = OrgId::parse(raw).map_err(|_| ApiError::not_found("organization"))?;
            // Another tenant's records look like an absent organization's.
            if !p.sees_org(&id) {
                return Err(ApiError::not_found("organization"));
            }
            id
        }
    };
    let project = match (q.project_id.as_deref(), &p.project_id) {
        (Some(raw), _) => {
            let id = ProjectId::parse(raw).map_err(|_| ApiError::not_found("project"))?;
            if !p.sees_project(&org, &id) {
                return Err(ApiError::not_found("project"));
            }
            Some(id)
        }
        // A project-bound key sees its project's records only.
        (None, Some(own)) if !p.is_admin() => Some(own.clone()),
        (None, _) => None,
    };
    let filter = AuditFilter {
        org_id: Some(org),
        project_id: project,
        action: q.action,
        actor: q.actor,
        resource: q.resource,
        since,
        until,
        after,
        limit: limit + 1,
    };
    let rows = state.store.list_audit(&filter).await?;
    Ok(Json(Page::from_rows(rows, limit, |r| r.seq.to_string())))
}

/// `GET /v1/admin/audit/verify`: walks every chain and the checkpoints.
async fn verify(State(state): State<AppState>, p: Principal) -> ApiResult<Json<VerifyReport>> {
    p.require(Scope::Admin)?;
    let report = state.store.verify_audit().await?;
    if !report.ok {
        tracing::warn!(first_bad = ?report.first_bad, "audit verification failed");
    }
    Ok(Json(report))
}

/// `POST /v1/admin/audit/checkpoints`: signs every chain's head now (`204` if unchanged).
async fn checkpoint(State(state): State<AppState>, p: Principal) -> ApiResult<Response> {
    p.require(Scope::Admin)?;
    Ok(match state.store.write_audit_checkpoint().await? {
        Some(cp) => (StatusCode::CREATED, Json::<Checkpoint>(cp)).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Longest `reason` of a segment, in characters.
const MAX_SEGMENT_REASON: usize = 500;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SegmentRequest {
    reason: String,
}

/// `POST …/segments`'s answer: the document's `AuditSegment`.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SegmentAnswer {
    checkpoint: Checkpoint,
    /// Verification with the segment in place.
    report: VerifyReport,
}

/// Whether a report holds something only a lost key explains (a signature no key checks).
fn needs_segment(r: &VerifyReport) -> bool {
    !r.unknown_key_ids.is_empty()
        || r.problems.iter().any(|p| {
            matches!(
                p.kind,
                ProblemKind::HashMismatch | ProblemKind::UnknownKey | ProblemKind::BadCheckpoint
            )
        })
}

/// `POST /v1/admin/audit/segments {"reason"}`: after a lost audit key, signs every chain's
/// head with the current key as a checkpoint that starts a new segment (docs/audit.md). It
/// rewrites nothing: what came before stays, its links still checked, counted as
/// unverifiable. Refused (409) when every signature already checks out.
async fn segment(State(state): State<AppState>, p: Principal, body: Bytes) -> ApiResult<Response> {
    p.require(Scope::Admin)?;
    let req: SegmentRequest = crate::requests::body::parse_json(&body)?;
    let reason = req.reason.trim().to_owned();
    if reason.is_empty() || reason.chars().count() > MAX_SEGMENT_REASON {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            format!("reason: must be 1 to {MAX_SEGMENT_REASON} characters"),
        )
        .with_details(json!({ "field": "reason" })));
    }
    let before = state.store.verify_audit().await?;
    if !needs_segment(&before) {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "every audit signature verifies with the keys this server holds: a segment is \
             only for records signed with a lost key",
        ));
    }
    let lost_key_ids = before.unknown_key_ids.clone();
    let cp = state
        .store
        .write_audit_segment(Segment {
            reason: reason.clone(),
            lost_key_ids: lost_key_ids.clone(),
        })
        .await?;
    state
        .store
        .append_audit(NewAuditEvent {
            org_id: None,
            project_id: None,
            actor: p.actor().as_audit(),
            action: "audit.segment".into(),
            resource: format!("checkpoint/{}", cp.seq),
            outcome: "ok".into(),
            detail: json!({ "reason": reason, "lostKeyIds": lost_key_ids }),
        })
        .await?;
    let report = state.store.verify_audit().await?;
    tracing::warn!(
        checkpoint = cp.seq,
        lost_key_ids = ?cp.segment.as_ref().map(|s| &s.lost_key_ids),
        "audit segment started after a lost key"
    );
    Ok((
        StatusCode::CREATED,
        Json(SegmentAnswer {
            checkpoint: cp,
            report,
        }),
    )
        .into_response())
}

/// Records per store query while exporting.
const EXPORT_BATCH: u32 = 1000;

/// Where an export stream is.
enum ExportState {
    Start,
    After(Option<ExportCursor>),
    Done,
}

/// `GET /v1/admin/audit/export`: JSON lines, every checkpoint then every chained record in
/// `(chain, chainSeq)` order, streamed in batches.
async fn export(State(state): State<AppState>, p: Principal) -> ApiResult<Response> {
    p.require(Scope::Admin)?;
    let store = state.store.clone();
    let stream = futures::stream::unfold(ExportState::Start, move |st| {
        let store = store.clone();
        async move {
            let (lines, next): (Vec<ExportLine>, ExportState) = match st {
                ExportState::Done => return None,
                ExportState::Start => match store.audit_checkpoints().await {
                    Ok(cps) => (
                        cps.into_iter().map(ExportLine::Checkpoint).collect(),
                        ExportState::After(None),
                    ),
                    Err(e) => return Some((Err(export_error(e)), ExportState::Done)),
                },
                ExportState::After(cursor) => {
                    match store.export_audit(cursor.as_ref(), EXPORT_BATCH).await {
                        Ok(recs) => {
                            let next = match recs.last() {
                                Some(r) if recs.len() == EXPORT_BATCH as usize => {
                                    ExportState::After(Some(ExportCursor {
                                        chain: r.chain.clone(),
                                        chain_seq: r.chain_seq,
                                    }))
                                }
                                _ => ExportState::Done,
                            };
                            (
                                recs.into_iter()
                                    .map(|r| ExportLine::Record(Box::new(r)))
                                    .collect(),
                                next,
                            )
                        }
                        Err(e) => return Some((Err(export_error(e)), ExportState::Done)),
                    }
                }
            };
            Some((encode_lines(&lines), next))
        }
    });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

fn export_error(e: differently_store::StoreError) -> std::io::Error {
    // Logged here; the client sees a cut-off stream, which the verifier reports.
    tracing::error!(error = %e, "audit export failed");
    std::io::Error::other("audit export failed")
}

fn encode_lines(lines: &[ExportLine]) -> Result<Bytes, std::io::Error> {
    let mut out = Vec::new();
    for l in lines {
        serde_json::to_writer(&mut out, l).map_err(std::io::Error::other)?;
        out.push(b'\n');
    }
    Ok(Bytes::from(out))
}
