//! Lifecycle through the pool's workers (design doc §5): pause, resume, stop, start,
//! keepalive, snapshots and port exposure. Also the helpers every data-plane route shares:
//! loading a sandbox the caller may see, checking its pool can do an operation (501
//! otherwise, never a silent degrade), and waking an idle sandbox on the next call.
//!
//! A mutation is an operation record (`LifecycleStore::begin_op`, at most one exclusive one
//! pending per sandbox, so a conflicting concurrent change is a 409) plus a work message
//! `dly.work.<pool>.<op>`. The handler waits for the worker to record the outcome up to
//! `LIFECYCLE_WAIT`, then answers 202: the change completes even if the caller leaves.
//! Repeating a transition into the current status is a 200 with no backend call.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_adapters::pools::Pool;
use differently_adapters::InstanceRef;
use differently_bus_schema::WorkOp;
use differently_core::ids::{OpId, SnapshotId};
use differently_core::lifecycle::LifecycleStep;
use differently_core::sandbox::SandboxView;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use differently_store::audit::{NewAuditEvent, RowGuard};
use differently_store::lifecycle::{OpBegun, OpRecord, OpState, SnapshotRecord, SnapshotStatus};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::auth::{ListProject, Principal};
use crate::body::parse_json;
use crate::error::{ApiError, ApiResult};
use crate::idempotency::{self, json_answer, Replay};
use crate::page::{parse_cursor, parse_limit, Page};
use crate::sandboxes::load;
use crate::AppState;

/// How long a lifecycle call waits for its outcome before answering 202.
pub const LIFECYCLE_WAIT: Duration = Duration::from_secs(10);
/// How long a data-plane call waits for an idle sandbox to wake.
pub const WAKE_WAIT: Duration = Duration::from_secs(30);
pub use differently_store::lifecycle::IDLE_REASON;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/stop", post(stop))
        .route("/v1/sandboxes/{id}/start", post(start))
        .route("/v1/sandboxes/{id}/keepalive", post(keepalive))
        .route("/v1/sandboxes/{id}", axum::routing::patch(patch_sandbox))
        .route("/v1/sandboxes/{id}/ports", post(expose_port))
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

/// The sandbox's pool, or 409 if it has none yet (queued) and 503 if this replica does not
/// know it.
pub(crate) fn pool_of(state: &AppState, sandbox: &Sandbox) -> ApiResult<Arc<Pool>> {
    let Some(name) = &sandbox.pool else {
        return Err(status_conflict(sandbox, "the sandbox has no backend yet"));
    };
    named_pool(state, name)
}

/// The pool `name` as this replica has it configured.
fn named_pool(state: &AppState, name: &str) -> ApiResult<Arc<Pool>> {
    state.pools.get(name).ok_or_else(|| {
        ApiError::new(
            ErrorCode::ProviderUnavailable,
            "the sandbox's pool is not configured on this replica",
        )
    })
}

/// 501 unless the pool's adapter implements `capability`.
pub(crate) fn require_capability(pool: &Pool, capability: &str) -> ApiResult<()> {
    if pool.adapter.capabilities().iter().any(|c| c == capability) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::UnsupportedOperation,
            format!(
                "the sandbox's pool ({}) does not support {capability}",
                pool.adapter.kind()
            ),
        )
        .with_details(json!({ "capability": capability })))
    }
}

fn status_conflict(sandbox: &Sandbox, message: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        format!("{message} (the sandbox is {})", sandbox.status),
    )
    .with_details(json!({ "status": sandbox.status }))
}

/// A running sandbox's pool and instance for a data-plane call (exec, files, ports,
/// keepalive), waking it first if the idle sweep paused or stopped it. Records activity.
pub(crate) async fn ready_for_data(
    state: &AppState,
    principal: &Principal,
    mut sandbox: Sandbox,
    capability: &str,
) -> ApiResult<(Arc<Pool>, InstanceRef, Sandbox)> {
    let pool = pool_of(state, &sandbox)?;
    require_capability(&pool, capability)?;
    let idled = sandbox.status_reason.as_deref() == Some(IDLE_REASON);
    let wake = match sandbox.status {
        SandboxStatus::Paused if idled => Some(WorkOp::Resume),
        SandboxStatus::Stopped if idled => Some(WorkOp::Start),
        _ => None,
    };
    if let Some(op) = wake {
        tracing::info!(sandbox = %sandbox.id, op = op.as_str(), "waking an idle sandbox");
        let (code, view) = match transition(state, principal, sandbox.clone(), op, WAKE_WAIT).await
        {
            Err(e) if e.code == ErrorCode::Conflict => {
                // The change that idled it (the sweep's pause or stop) may still be
                // finishing its record: let it finish, then wake from what it left.
                let other = e
                    .details
                    .as_ref()
                    .and_then(|d| d["operation"].as_str())
                    .and_then(|id| OpId::parse(id).ok());
                let Some(other) = other else { return Err(e) };
                wait_op(state, &other, &sandbox.id, WAKE_WAIT).await?;
                let fresh = state
                    .store
                    .get_sandbox(&sandbox.id)
                    .await?
                    .ok_or_else(|| ApiError::not_found("sandbox"))?;
                transition(state, principal, fresh, op, WAKE_WAIT).await?
            }
            other => other?,
        };
        if code != StatusCode::OK {
            return Err(ApiError::new(
                ErrorCode::ProviderUnavailable,
                "the sandbox is still waking up; retry",
            )
            .with_details(json!({ "status": view.status })));
        }
        sandbox = state
            .store
            .get_sandbox(&sandbox.id)
            .await?
            .ok_or_else(|| ApiError::not_found("sandbox"))?;
    }
    let at = running_instance(state, &sandbox)?;
    Ok((pool, at, sandbox))
}

/// The backend instance of a running sandbox, counted as activity (409 if it is not
/// running).
fn running_instance(state: &AppState, sandbox: &Sandbox) -> ApiResult<InstanceRef> {
    if sandbox.status != SandboxStatus::Running {
        return Err(status_conflict(
            sandbox,
            "this call needs a running sandbox",
        ));
    }
    let Some(backend_ref) = sandbox.backend_ref.clone() else {
        return Err(ApiError::internal(format!(
            "running sandbox {} without a backend ref",
            sandbox.id
        )));
    };
    Ok(called(state, sandbox.id.clone(), backend_ref))
}

/// The instance a data-plane call is about to use, counted as the sandbox's activity (off
/// the call's path and batched: the idle sweep only needs it within seconds).
fn called(state: &AppState, sandbox_id: SandboxId, backend_ref: String) -> InstanceRef {
    state.activity.record(&state.store, &sandbox_id, Utc::now());
    InstanceRef {
        sandbox_id,
        backend_ref,
    }
}

/// The row this process remembers running for sandbox `id`, if the principal owns it.
pub(crate) fn remembered(
    state: &AppState,
    principal: &Principal,
    id: &SandboxId,
) -> Option<crate::running_rows::RunningRow> {
    let row = state.events.running.get(id)?;
    principal.owns(&row.org_id, &row.project_id).then_some(row)
}

/// Opens a data-plane call (exec, streamed exec, files) on sandbox `raw_id` for `capability`: the
/// pool and the instance, with the call's `action` record appended first (fail closed). A row
/// remembered from an earlier call or from the event that started it (`EventHub::running`) is
/// used without a read when the record can be appended guarded on it (the row still running
/// at that version); otherwise the row is read (and woken if idle) as [`ready_for_data`]
/// does, and remembered for the next call.
pub(crate) async fn open_data_call(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
    capability: &str,
    action: &str,
    detail: Value,
) -> ApiResult<(Arc<Pool>, InstanceRef)> {
    let id = SandboxId::parse(raw_id).map_err(|_| ApiError::not_found("sandbox"))?;
    if let Some(r) = remembered(state, principal, &id) {
        let pool = named_pool(state, &r.pool)?;
        require_capability(&pool, capability)?;
        let guard = RowGuard {
            sandbox: r.id.clone(),
            status: SandboxStatus::Running,
            status_version: r.status_version,
        };
        let event = audit_event(
            principal,
            (&r.org_id, &r.project_id, &r.id),
            action,
            detail.clone(),
        );
        if state.store.append_audit_if(event, &guard).await?.is_some() {
            return Ok((pool, called(state, r.id, r.backend_ref)));
        }
        // It moved since: read it like any other call.
        state.events.running.forget(&id);
    }
    let sandbox = load(state, principal, raw_id).await?;
    let (pool, at, sandbox) = ready_for_data(state, principal, sandbox, capability).await?;
    audit(state, principal, &sandbox, action, detail).await?;
    state.events.running.remember(&sandbox);
    Ok((pool, at))
}

/// Appends an audit record of `action` on `sandbox` by the caller, before the action runs:
/// if it cannot be written the action does not happen (fail closed). Never argument values.
pub(crate) async fn audit(
    state: &AppState,
    principal: &Principal,
    sandbox: &Sandbox,
    action: &str,
    detail: Value,
) -> ApiResult<()> {
    state
        .store
        .append_audit(audit_event(
            principal,
            (&sandbox.org_id, &sandbox.project_id, &sandbox.id),
            action,
            detail,
        ))
        .await?;
    Ok(())
}

/// The record of `action` on sandbox `(org, project, id)` by the caller, before the action
/// runs.
fn audit_event(
    principal: &Principal,
    (org, project, id): (&OrgId, &ProjectId, &SandboxId),
    action: &str,
    detail: Value,
) -> NewAuditEvent {
    NewAuditEvent {
        org_id: Some(org.clone()),
        project_id: Some(project.clone()),
        actor: principal.actor().as_audit(),
        action: action.to_owned(),
        resource: id.to_string(),
        outcome: "requested".to_owned(),
        detail,
    }
}

/// Waits up to `bound` for operation `id` to finish; `None` if it is still pending.
pub(crate) async fn wait_op(
    state: &AppState,
    id: &OpId,
    sandbox: &SandboxId,
    bound: Duration,
) -> ApiResult<Option<OpRecord>> {
    let mut events = state.events.watch(sandbox);
    let deadline = tokio::time::Instant::now() + bound;
    let mut poll = Duration::from_millis(25);
    loop {
        match state.store.get_op(id).await? {
            Some(op) if op.state != OpState::Pending => return Ok(Some(op)),
            Some(_) => {}
            None => return Err(ApiError::internal(format!("operation {id} vanished"))),
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        // The worker records the outcome right after the status event: an event of this
        // sandbox or a short poll, whichever comes first.
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = tokio::time::sleep(poll) => {}
            _ = events.changed() => {}
        }
        poll = (poll * 2).min(Duration::from_millis(250));
    }
}

/// The error a failed operation carries, as served.
fn op_failure(op: &OpRecord) -> ApiError {
    let (code, message) = match &op.error {
        Some(e) => (
            serde_json::from_value::<ErrorCode>(Value::String(e.code.clone()))
                .unwrap_or(ErrorCode::Internal),
            e.message.clone(),
        ),
        None => (ErrorCode::Internal, "the operation failed".to_owned()),
    };
    ApiError::new(code, message).with_details(json!({ "operation": op.id, "kind": op.kind }))
}

/// Inserts (or joins) an operation and publishes its work message.
pub(crate) async fn begin(
    state: &AppState,
    sandbox: &Sandbox,
    pool: &str,
    op: WorkOp,
    exclusive: bool,
    args: Value,
    actor: String,
) -> ApiResult<OpRecord> {
    let record = OpRecord::new(sandbox, op.as_str(), exclusive, args, actor, Utc::now());
    let record = match state.store.begin_op(&record).await? {
        OpBegun::New(r) => {
            if let Err(e) = state
                .announcer
                .op(sandbox, pool, op, r.id.as_str(), "")
                .await
            {
                // The operation record is durable: the scheduler's repair re-sends it.
                tracing::warn!(sandbox = %sandbox.id, op = %r.id, error = %e, "operation publish failed; repair will re-send it");
            }
            r
        }
        OpBegun::Joined(r) => r,
        OpBegun::Busy(other) => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "another change ({}) of this sandbox is in progress; retry when it is done",
                    other.kind
                ),
            )
            .with_details(json!({ "operation": other.id, "kind": other.kind })))
        }
    };
    Ok(record)
}

/// A status transition through the workers; see the module docs.
pub(crate) async fn transition(
    state: &AppState,
    principal: &Principal,
    sandbox: Sandbox,
    op: WorkOp,
    bound: Duration,
) -> ApiResult<(StatusCode, SandboxView)> {
    let Some(lifecycle) = op.lifecycle() else {
        return Err(ApiError::internal(format!("{op:?} is not a transition")));
    };
    let pool = pool_of(state, &sandbox)?;
    let capability = match op {
        WorkOp::Pause | WorkOp::Resume => "lifecycle.pause",
        _ => "lifecycle.stop",
    };
    require_capability(&pool, capability)?;
    match lifecycle.step(sandbox.status) {
        LifecycleStep::AlreadyDone => return Ok((StatusCode::OK, sandbox.view())),
        LifecycleStep::Refused => {
            return Err(status_conflict(
                &sandbox,
                &format!("cannot {} the sandbox", op.as_str()),
            ))
        }
        LifecycleStep::Proceed => {}
    }
    audit(
        state,
        principal,
        &sandbox,
        &format!("sandbox.{}", op.as_str()),
        json!({}),
    )
    .await?;
    let record = begin(
        state,
        &sandbox,
        &pool_name(&pool),
        op,
        true,
        json!({ "reason": null }),
        principal.actor().as_audit(),
    )
    .await?;
    match wait_op(state, &record.id, &sandbox.id, bound).await? {
        Some(done) if done.state == OpState::Done => {
            let now = state
                .store
                .get_sandbox(&sandbox.id)
                .await?
                .ok_or_else(|| ApiError::not_found("sandbox"))?;
            Ok((StatusCode::OK, now.view()))
        }
        Some(failed) => Err(op_failure(&failed)),
        None => {
            let now = state
                .store
                .get_sandbox(&sandbox.id)
                .await?
                .unwrap_or(sandbox);
            Ok((StatusCode::ACCEPTED, now.view()))
        }
    }
}

/// The pool's name as its work subject uses it.
pub(crate) fn pool_name(pool: &Pool) -> String {
    pool.view().name
}

async fn lifecycle_call(
    state: AppState,
    principal: Principal,
    id: String,
    op: WorkOp,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    principal.require(Scope::SandboxesWrite)?;
    let sandbox = load(&state, &principal, &id).await?;
    let (code, view) = transition(&state, &principal, sandbox, op, LIFECYCLE_WAIT).await?;
    Ok((code, Json(view)))
}

async fn pause(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    lifecycle_call(state, principal, id, WorkOp::Pause).await
}

async fn resume(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    lifecycle_call(state, principal, id, WorkOp::Resume).await
}

async fn stop(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    lifecycle_call(state, principal, id, WorkOp::Stop).await
}

async fn start(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    lifecycle_call(state, principal, id, WorkOp::Start).await
}

/// Counts as activity (and wakes an idle sandbox); 204.
async fn keepalive(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if !principal.has(Scope::SandboxesExec) {
        principal.require(Scope::SandboxesWrite)?;
    }
    let sandbox = load(&state, &principal, &id).await?;
    ready_for_data(&state, &principal, sandbox, "exec").await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PortRequest {
    port: u32,
    expires_seconds: Option<u64>,
}

/// Longest port URL lifetime a caller may ask for: 7 days.
const MAX_PORT_SECONDS: u64 = 7 * 24 * 3600;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PortAnswer {
    url: String,
    expires_at: Option<DateTime<Utc>>,
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
    let sandbox = load(&state, &principal, &id).await?;
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
            Json(json!({ "operation": record.id, "status": "pending" })),
        )
            .into_response()),
    }
}

/// A snapshot as served (no backend ref).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotView {
    pub id: SnapshotId,
    pub org_id: differently_core::OrgId,
    pub project_id: ProjectId,
    pub sandbox_id: SandboxId,
    pub pool: String,
    pub name: Option<String>,
    pub status: SnapshotStatus,
    pub status_reason: Option<String>,
    pub created_at: DateTime<Utc>,
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
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SnapshotRequest {
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
        "POST /v1/sandboxes/{id}/snapshots",
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
        .is_some_and(|n| n.is_empty() || n.len() > 255)
    {
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            differently_core::FieldError::new("name", "must be 1-255 characters"),
        ));
    }
    let sandbox = load(state, principal, id).await?;
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
    state.store.insert_snapshot(&snap).await?;
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
            // Busy (or joined another snapshot): this one was never started.
            let _ = state.store.remove_snapshot(&snap.id).await;
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
    query: Result<Query<SnapshotListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<SnapshotView>>> {
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.body_text()))?;
    principal.require(Scope::SandboxesRead)?;
    let project = match principal.list_project(q.project_id.as_deref())? {
        ListProject::Only(p) => p,
        ListProject::Nothing => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }))
        }
    };
    let limit = parse_limit(q.limit.as_deref())?;
    let after = parse_cursor(q.cursor.as_deref(), SnapshotId::parse)?;
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

async fn list_sandbox_snapshots(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Page<SnapshotView>>> {
    principal.require(Scope::SandboxesRead)?;
    let sandbox = load(&state, &principal, &id).await?;
    let rows = state
        .store
        .list_snapshots(&sandbox.org_id, Some(&sandbox.project_id), None, 1000)
        .await?;
    let items = rows
        .iter()
        .filter(|s| s.sandbox_id == sandbox.id)
        .map(SnapshotView::from)
        .collect();
    Ok(Json(Page {
        items,
        next_cursor: None,
    }))
}

/// Loads a snapshot the principal may see; anything else is the same 404.
pub(crate) async fn load_snapshot(
    state: &AppState,
    principal: &Principal,
    raw_id: &str,
) -> ApiResult<SnapshotRecord> {
    let id = SnapshotId::parse(raw_id).map_err(|_| ApiError::not_found("snapshot"))?;
    match state.store.get_snapshot(&id).await? {
        Some(s) if principal.owns(&s.org_id, &s.project_id) => Ok(s),
        _ => Err(ApiError::not_found("snapshot")),
    }
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
        return Err(ApiError::internal(format!(
            "snapshot {} without its source row",
            snap.id
        )));
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
    match wait_op(&state, &record.id, &source.id, LIFECYCLE_WAIT).await? {
        Some(op) if op.state == OpState::Done => Ok(StatusCode::NO_CONTENT.into_response()),
        Some(op) => Err(op_failure(&op)),
        None => Ok((StatusCode::ACCEPTED, Json(SnapshotView::from(&snap))).into_response()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PatchRequest {
    ttl_seconds: Option<u64>,
    /// Replaces the caller's labels (reserved `differently.dev/` ones are kept).
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// A number sets it; `null` clears it (the server's default applies); absent: unchanged.
    #[serde(default, deserialize_with = "present")]
    idle_timeout_seconds: Option<Option<u64>>,
}

/// Tells a present `null` (`Some(None)`) from an absent field (`None`, via `default`).
fn present<'de, D>(d: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<u64>::deserialize(d).map(Some)
}

/// `PATCH /v1/sandboxes/{id}` `{ttlSeconds?, labels?, idleTimeoutSeconds?}`. Labels and the
/// idle timeout change the record at once (the idle sweep reads it). A TTL renew moves
/// `expiresAt` to now + ttl at once (the TTL sweep reads it); the backend-side backstop
/// follows through a `renew` operation on the pool's workers, which the caller does not wait
/// for. Everything is validated before anything changes.
async fn patch_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<SandboxView>> {
    principal.require(Scope::SandboxesWrite)?;
    let req: PatchRequest = parse_json(&body)?;
    let sandbox = load(&state, &principal, &id).await?;
    let max = differently_core::sandbox::MAX_TTL_SECONDS;
    if req.ttl_seconds.is_some_and(|t| t == 0 || t > max) {
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            differently_core::FieldError::new("ttlSeconds", format!("must be between 1 and {max}")),
        ));
    }
    if let Some(labels) = &req.labels {
        differently_core::sandbox::validate_labels(labels)
            .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    }
    if req.idle_timeout_seconds == Some(Some(0)) {
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            differently_core::FieldError::new("idleTimeoutSeconds", "must be at least 1"),
        ));
    }
    let changes_spec = req.labels.is_some() || req.idle_timeout_seconds.is_some();
    if req.ttl_seconds.is_none() && !changes_spec {
        return Ok(Json(sandbox.view()));
    }
    if sandbox.status.is_final() || sandbox.status == SandboxStatus::Terminating {
        return Err(status_conflict(&sandbox, "cannot change the sandbox"));
    }
    let mut current = sandbox;
    if changes_spec {
        let mut detail = serde_json::Map::new();
        if let Some(labels) = &req.labels {
            // Keys only: values are the caller's data.
            detail.insert("labels".into(), json!(labels.keys().collect::<Vec<_>>()));
        }
        if let Some(idle) = req.idle_timeout_seconds {
            detail.insert("idleTimeoutSeconds".into(), json!(idle));
        }
        audit(
            &state,
            &principal,
            &current,
            "sandbox.update",
            Value::Object(detail),
        )
        .await?;
        current = state
            .store
            .update_spec(&current.id, req.labels.clone(), req.idle_timeout_seconds)
            .await?;
    }
    let Some(ttl) = req.ttl_seconds else {
        return Ok(Json(current.view()));
    };
    let sandbox = current;
    audit(
        &state,
        &principal,
        &sandbox,
        "sandbox.renew",
        json!({ "ttlSeconds": ttl }),
    )
    .await?;
    let renewed = state.store.renew_ttl(&sandbox.id, ttl, Utc::now()).await?;
    if let (Some(pool), true) = (
        renewed.pool.clone(),
        matches!(
            renewed.status,
            SandboxStatus::Running | SandboxStatus::Paused | SandboxStatus::Stopped
        ),
    ) {
        begin(
            &state,
            &renewed,
            &pool,
            WorkOp::Renew,
            false,
            json!({ "ttlSeconds": ttl }),
            principal.actor().as_audit(),
        )
        .await?;
    }
    Ok(Json(renewed.view()))
}
