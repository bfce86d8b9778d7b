//! The audit log and stored secrets over HTTP.
//!
//! `GET /v1/audit` lists the caller's own organization's records (a project-bound key: its
//! project's only); operators may name any organization. `/v1/admin/audit/*` verifies the
//! chains, writes a checkpoint, and exports everything as JSON lines for the offline
//! verifier (`differently audit verify`). `/v1/admin/secrets` stores credentials sealed;
//! a value is accepted once and never served back, only its fingerprint.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_bus_schema::TraceContext;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, OrgId, ProjectId};
use differently_store::audit::{
    self, AuditEvent, AuditFilter, Checkpoint, ExportCursor, ExportLine, VerifyReport,
};
use differently_store::secrets::{validate_secret_name, SecretInfo};
use serde::Deserialize;
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::page::{bad_query, parse_limit, Page};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/audit", get(list_audit))
        .route("/v1/admin/audit/verify", get(verify))
        .route("/v1/admin/audit/export", get(export))
        .route("/v1/admin/audit/checkpoints", post(checkpoint))
        .route("/v1/admin/secrets", get(list_secrets))
        .route("/v1/admin/secrets/{name}", put(put_secret))
}

/// Longest request id accepted from a client's `X-Request-Id`.
const MAX_REQUEST_ID: usize = 64;

/// Middleware: every request gets a request id (the client's `X-Request-Id` if it is short
/// and plain, a new ULID otherwise), served back in `X-Request-Id` and written into every
/// audit record the request causes.
pub async fn request_id(req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_REQUEST_ID
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(str::to_owned);
    let id = given.unwrap_or_else(|| ulid::Ulid::new().to_string());
    // W3C trace context: the caller's valid `traceparent`, else a new root. It is on the
    // request's span (so on every log line) and in every envelope published while serving it.
    let trace = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceContext::from_header)
        .unwrap_or_else(|| TraceContext::from_random(rand::random(), rand::random()));
    let traceparent = trace.traceparent.clone();
    let run = audit::with_request_id(id.clone(), next.run(req));
    let mut resp = differently_bus::trace::scope("request", trace, run).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if let Some(v) = traceparent.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("traceparent", v);
    }
    resp
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
    q: Result<Query<RawAuditQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<AuditEvent>>> {
    let Query(q) = q.map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.body_text()))?;
    p.require(Scope::SandboxesRead)?;
    let limit = parse_limit(q.limit.as_deref())?;
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
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            c.parse::<i64>()
                .map_err(|_| bad_query("cursor", "not a cursor from this API"))
        })
        .transpose()?;
    let filter = AuditFilter {
        org_id: Some(org),
        project_id: project,
        action: q.action,
        actor: q.actor,
        resource: q.resource,
        since: parse_time("since", q.since.as_deref())?,
        until: parse_time("until", q.until.as_deref())?,
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

/// `GET /v1/admin/secrets`: names, fingerprints, who changed them and when.
async fn list_secrets(
    State(state): State<AppState>,
    p: Principal,
) -> ApiResult<Json<Page<SecretInfo>>> {
    p.require(Scope::Admin)?;
    let items = state.store.list_secrets().await?;
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

/// Most bytes of one stored secret.
const MAX_SECRET_BYTES: usize = 64 * 1024;

/// `PUT /v1/admin/secrets/{name}` with `{"value": "…"}`: seals and stores it; answers with
/// the fingerprint. Error messages never quote the body.
async fn put_secret(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SecretInfo>> {
    p.require(Scope::Admin)?;
    validate_secret_name(&name).map_err(|m| {
        ApiError::new(ErrorCode::ValidationFailed, format!("name: {m}"))
            .with_details(json!({ "field": "name" }))
    })?;
    let value = secret_value(&body)?;
    if differently_store::sealed::process_key().is_none() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "stored secrets are not enabled: the server has no secrets key \
             (set DIFFERENTLY_SECRETS_KEY); use an env or file reference instead",
        ));
    }
    let info = state
        .store
        .put_secret(&name, value.as_bytes(), &p.actor())
        .await?;
    // Adapters of this process read the new value on their next call; other processes
    // within their credential cache's few seconds.
    state.pools.credentials().changed();
    Ok(Json(info))
}

/// The `value` of a `{"value": "…"}` body, with errors that never echo what was sent.
fn secret_value(body: &Bytes) -> ApiResult<String> {
    let bad = |m: &str| {
        ApiError::new(ErrorCode::InvalidArgument, m.to_owned())
            .with_details(json!({ "field": "value" }))
    };
    if body.len() > MAX_SECRET_BYTES {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("a secret is at most {MAX_SECRET_BYTES} bytes"),
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| bad("expected a JSON body {\"value\": \"…\"}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("expected a JSON body {\"value\": \"…\"}"))?;
    if obj.keys().any(|k| k != "value") {
        return Err(bad("only the field value is accepted"));
    }
    match obj.get("value").and_then(|v| v.as_str()) {
        Some(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(bad("value: a non-empty string is required")),
    }
}
