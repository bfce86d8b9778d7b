//! `/v1/snapshots` and `/v1/sandboxes/{id}/snapshots`: taking, listing, reading and deleting
//! snapshots; taking and deleting go through the pool's workers (`mutation`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_bus_schema::WorkOp;
use differently_core::ids::SnapshotId;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, ProjectId, SandboxId, SandboxStatus};
use differently_store::lifecycle::{OpState, SnapshotRecord, SnapshotStatus};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::access::{load_sandbox, load_snapshot};
use crate::auth::{ListProject, Principal};
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::requests::idempotency::{self, json_answer, Replay};
use std::time::Duration;

use crate::control::mutation::{audit, audit_event, begin, op_failure, wait_op, LIFECYCLE_WAIT};
use crate::control::sandbox_pool::{
    named_pool, pool_name, pool_of, require_capability, status_conflict,
};
use crate::requests::page::{parse_cursor, parse_limit, Page, PageQuery};
use crate::requests::query::StrictQuery;

use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/snapshots",
            post(create_snapshot).get(list_sandbox_snapshots),
        )
        .route("/v1/snapshots", get(list_snapshots))
        .route(
            "/v1/snapshots/{id}",
            get(read_snapshot).delete(delete_snapshot),
        )
}

/// A snapshot as served (no backend ref).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    pub id: SnapshotId,
    pub org_id: differently_core::OrgId,
    pub project_id: ProjectId,
    pub sandbox_id: SandboxId,
    pub pool: String,
    #[schema(required)]
    pub name: Option<String>,
    pub status: SnapshotStatus,
    #[schema(required)]
    pub status_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When its status or reason last changed: for a `ready` snapshot, when it became ready.
    pub updated_at: DateTime<Utc>,
}

impl From<&SnapshotRecord> for SnapshotView {
    fn from(s: &SnapshotRecord) -> Self {
        SnapshotView {
            id: s.id.clone(),
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            sandbox_id: s.sandbox_id.clone(),
            pool: s.pool.clone(),
            name: s.name.clone(),
            status: s.status,
            status_reason: s.status_reason.clone(),
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// Body of `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SnapshotRequest {
    name: Option<String>,
}

async fn create_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create =
        || async { json_answer(create_snapshot_now(&state, &principal, &id, &body).await?) };
    idempotency::once(
        &state,
        &principal,
        &headers,
        &format!("POST /v1/sandboxes/{id}/snapshots"),
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_snapshot_now(
    state: &AppState,
    principal: &Principal,
    id: &str,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<SnapshotView>)> {
    principal.require(Scope::SandboxesWrite)?;
    let req: SnapshotRequest = if body.is_empty() {
        SnapshotRequest::default()
    } else {
        parse_json(body)?
    };
    if req
        .name
        .as_ref()
        .is_some_and(|n| n.is_empty() || n.chars().count() > 255)
    {
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            differently_core::FieldError::new("name", "must be 1-255 characters"),
        ));
    }
    let sandbox = load_sandbox(state, principal, id).await?;
    let pool = pool_of(state, &sandbox)?;
    require_capability(&pool, "snapshots")?;
    if !matches!(
        sandbox.status,
        SandboxStatus::Running | SandboxStatus::Paused | SandboxStatus::Stopped
    ) {
        return Err(status_conflict(&sandbox, "cannot snapshot the sandbox"));
    }
    let now = Utc::now();
    let mut snap = SnapshotRecord {
        id: SnapshotId::new(),
        org_id: sandbox.org_id.clone(),
        project_id: sandbox.project_id.clone(),
        sandbox_id: sandbox.id.clone(),
        pool: pool_name(&pool),
        name: req.name,
        status: SnapshotStatus::Creating,
        status_reason: None,
        backend_ref: None,
        created_at: now,
        updated_at: now,
    };
    audit(
        state,
        principal,
        &sandbox,
        "snapshot.create",
        json!({ "snapshotId": snap.id }),
    )
    .await?;
    if let Err(e) = state.store.insert_snapshot(&snap).await {
        audit_failed(
            state,
            principal,
            &sandbox,
            &snap.id,
            "the snapshot record was not written",
        )
        .await;
        return Err(e.into());
    }
    let record = begin(
        state,
        &sandbox,
        &snap.pool,
        WorkOp::Snapshot,
        true,
        json!({ "snapshotId": snap.id }),
        principal.actor().as_audit(),
    )
    .await;
    let record = match record {
        Ok(r) if r.args["snapshotId"] == json!(snap.id) => r,
        Ok(_) | Err(_) => {
            // Busy (or joined another snapshot): this one was never started, and the audit
            // log says so after its request.
            let _ = state.store.remove_snapshot(&snap.id).await;
            audit_failed(state, principal, &sandbox, &snap.id, "never started").await;
            return Err(record.err().unwrap_or_else(|| {
                ApiError::new(
                    ErrorCode::Conflict,
                    "another snapshot of this sandbox is in progress",
                )
            }));
        }
    };
    if let Some(op) = wait_op(state, &record.id, &sandbox.id, LIFECYCLE_WAIT).await? {
        if op.state == OpState::Failed {
            return Err(op_failure(&op));
        }
    }
    if let Some(now) = state.store.get_snapshot(&snap.id).await? {
        snap = now;
    }
    Ok((StatusCode::ACCEPTED, Json(SnapshotView::from(&snap))))
}

/// Records that a requested snapshot was never made (outcome `failed`), so the log shows
/// only snapshots that exist as made. Best effort: the refusal is answered either way.
async fn audit_failed(
    state: &AppState,
    principal: &Principal,
    sandbox: &differently_core::Sandbox,
    snapshot: &SnapshotId,
    reason: &str,
) {
    let mut event = audit_event(
        principal,
        (&sandbox.org_id, &sandbox.project_id, &sandbox.id),
        "snapshot.create",
        json!({ "snapshotId": snapshot, "reason": reason }),
    );
    event.outcome = "failed".to_owned();
    if let Err(e) = state.store.append_audit(event).await {
        tracing::warn!(sandbox = %sandbox.id, snapshot = %snapshot, error = %e, "snapshot: the failure's audit record was not written");
    }
}

/// Deletes a snapshot whose source sandbox row is gone (its project was deleted before a
/// project with snapshots was refused): no operation can run on a sandbox that no longer
/// exists, so the backend copy is deleted here, through this replica's pool (503 while the
/// pool is not configured or unreachable, so nothing leaks), then the record.
async fn delete_orphan(
    state: &AppState,
    principal: &Principal,
    snap: SnapshotRecord,
) -> ApiResult<Response> {
    state
        .store
        .append_audit(audit_event(
            principal,
            (&snap.org_id, &snap.project_id, &snap.sandbox_id),
            "snapshot.delete",
            json!({ "snapshotId": snap.id, "sourceGone": true }),
        ))
        .await?;
    if let Some(backend_ref) = &snap.backend_ref {
        let pool = named_pool(state, &snap.pool)?;
        pool.adapter.delete_snapshot(backend_ref).await?;
    }
    state.store.remove_snapshot(&snap.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SnapshotListQuery {
    project_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_snapshots(
    State(state): State<AppState>,
    principal: Principal,
    StrictQuery(q): StrictQuery<SnapshotListQuery>,
) -> ApiResult<Json<Page<SnapshotView>>> {
    principal.require(Scope::SandboxesRead)?;
    // Checked before the empty page a key bound to another project gets.
    let limit = parse_limit(q.limit.as_deref())?;
    let after = parse_cursor(q.cursor.as_deref(), SnapshotId::parse)?;
    let project = match principal.list_project(q.project_id.as_deref())? {
        ListProject::Only(p) => p,
        ListProject::Nothing => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }))
        }
    };
    let rows = state
        .store
        .list_snapshots(
            &principal.org_id,
            project.as_ref(),
            after.as_ref(),
            limit + 1,
        )
        .await?;
    let views = rows.iter().map(SnapshotView::from).collect();
    Ok(Json(Page::from_rows(views, limit, |s: &SnapshotView| {
        s.id.to_string()
    })))
}

/// `GET /v1/sandboxes/{id}/snapshots?limit=&cursor=`: the sandbox's snapshots, paged like
/// every other list.
async fn list_sandbox_snapshots(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    page: PageQuery,
) -> ApiResult<Json<Page<SnapshotView>>> {
    principal.require(Scope::SandboxesRead)?;
    let after = page.cursor_id(SnapshotId::parse)?;
    let sandbox = load_sandbox(&state, &principal, &id).await?;
    let rows = state
        .store
        .list_sandbox_snapshots(&sandbox.id, after.as_ref(), page.limit + 1)
        .await?;
    let views = rows.iter().map(SnapshotView::from).collect();
    Ok(Json(Page::from_rows(
        views,
        page.limit,
        |s: &SnapshotView| s.id.to_string(),
    )))
}

async fn read_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<SnapshotView>> {
    principal.require(Scope::SandboxesRead)?;
    Ok(Json(SnapshotView::from(
        &load_snapshot(&state, &principal, &id).await?,
    )))
}

async fn delete_snapshot(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    principal.require(Scope::SandboxesWrite)?;
    let mut snap = load_snapshot(&state, &principal, &id).await?;
    if snap.status == SnapshotStatus::Creating {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the snapshot is still being taken; delete it once it is ready or failed",
        ));
    }
    let Some(source) = state.store.get_sandbox(&snap.sandbox_id).await? else {
        return delete_orphan(&state, &principal, snap).await;
    };
    audit(
        &state,
        &principal,
        &source,
        "snapshot.delete",
        json!({ "snapshotId": snap.id }),
    )
    .await?;
    snap.status = SnapshotStatus::Deleting;
    // A reason left by an earlier attempt would be mistaken for this one's.
    snap.status_reason = None;
    snap.updated_at = Utc::now();
    state.store.update_snapshot(&snap).await?;
    let record = begin(
        &state,
        &source,
        &snap.pool,
        WorkOp::DeleteSnapshot,
        false,
        json!({ "snapshotId": snap.id }),
        principal.actor().as_audit(),
    )
    .await?;
    // Waits for the outcome, but answers as soon as the worker says why the backend has not
    // deleted it yet (in use by a restored sandbox, still being written): the delete goes on
    // being retried, and the caller learns the reason now instead of after the whole wait.
    let deadline = tokio::time::Instant::now() + LIFECYCLE_WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let step = left.min(REFUSAL_CHECK);
        match wait_op(&state, &record.id, &source.id, step).await? {
            Some(op) if op.state == OpState::Done => {
                return Ok(StatusCode::NO_CONTENT.into_response())
            }
            Some(op) => return Err(op_failure(&op)),
            None => {}
        }
        let now = state
            .store
            .get_snapshot(&snap.id)
            .await?
            .unwrap_or(snap.clone());
        if now.status_reason.is_some() || left <= step {
            return Ok((StatusCode::ACCEPTED, Json(SnapshotView::from(&now))).into_response());
        }
    }
}

/// How often a snapshot delete that is still waiting looks for the worker's reason.
const REFUSAL_CHECK: Duration = Duration::from_millis(250);
