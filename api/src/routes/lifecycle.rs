//! `/v1/sandboxes/{id}/{pause,resume,stop,start,keepalive}` and `DELETE /v1/sandboxes/{id}`:
//! status changes. Pause, resume, stop and start go through the pool's workers
//! (`mutation::transition`); delete is one status-checked change announced after commit.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::delete;
use axum::routing::post;
use axum::{Json, Router};
use chrono::Utc;
use differently_bus_schema::WorkOp;
use differently_core::sandbox::SandboxView;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, Sandbox, SandboxId, SandboxStatus};
use differently_store::{SeenRow, StoreError, Transition};

use crate::auth::access::load_sandbox;
use crate::auth::Principal;
use crate::control::after_commit::{boxed, publish_bounded};
use crate::control::mutation::{transition, LIFECYCLE_WAIT};
use crate::data_plane::{ready_for_data, remembered};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/stop", post(stop))
        .route("/v1/sandboxes/{id}/start", post(start))
        .route("/v1/sandboxes/{id}/keepalive", post(keepalive))
        .route("/v1/sandboxes/{id}", delete(delete_sandbox))
}

async fn lifecycle_call(
    state: AppState,
    principal: Principal,
    id: String,
    op: WorkOp,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    principal.require(Scope::SandboxesWrite)?;
    let sandbox = load_sandbox(&state, &principal, &id).await?;
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
    let sandbox = load_sandbox(&state, &principal, &id).await?;
    ready_for_data(&state, &principal, sandbox, "exec").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Announces a committed delete: the backend's delete work (when there is an instance to
/// remove) and the status event; the answer is 202 with the row.
async fn deleted(
    state: &AppState,
    principal: &Principal,
    updated: Sandbox,
) -> (StatusCode, Json<SandboxView>) {
    let mut publishes = Vec::with_capacity(2);
    let (a, s) = (state.announcer.clone(), updated.clone());
    let origin = principal.origin();
    if updated.status == SandboxStatus::Terminating {
        state.events.committed_here(&updated);
        let (w, row) = (state.announcer.clone(), updated.clone());
        publishes.push((
            "delete",
            boxed(async move { w.work(&row, WorkOp::Delete, "").await }),
        ));
        // No internal reader acts on `terminating` (`Announcer::public_status_by`); its end
        // is announced in full by the worker.
        publishes.push((
            "status",
            boxed(async move { a.public_status_by(&s, Some(origin)).await }),
        ));
    } else {
        publishes.push((
            "status",
            boxed(async move { a.status_by(&s, origin).await }),
        ));
    }
    // Repair re-sends a lost delete (the terminating sweep).
    publish_bounded(updated.id.as_str(), publishes).await;
    (StatusCode::ACCEPTED, Json(updated.view()))
}

async fn delete_sandbox(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<SandboxView>)> {
    principal.require(Scope::SandboxesWrite)?;
    let actor = principal.actor();
    // A row this process saw running (an exec on it, or the event that started it) is most
    // likely still running: try that change without reading the row first (the store sends
    // it guarded on the status and version seen). The change is compare-and-set on the
    // status, so a row that moved is refused and read below.
    let remembered = SandboxId::parse(&id)
        .ok()
        .and_then(|sid| remembered(&state, &principal, &sid));
    if let Some(r) = remembered {
        let t = Transition {
            id: r.id.clone(),
            from: vec![SandboxStatus::Running],
            to: SandboxStatus::Terminating,
            reason: Some("deleted".into()),
            actor: actor.clone(),
        };
        state.events.running.forget(&r.id);
        let seen = SeenRow {
            org_id: r.org_id.clone(),
            project_id: r.project_id.clone(),
            status_version: r.status_version,
        };
        match state.store.transition_seen(t, seen, Utc::now()).await {
            Ok(updated) => return Ok(deleted(&state, &principal, updated).await),
            Err(StoreError::StatusConflict { .. } | StoreError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for _ in 0..5 {
        let sandbox = load_sandbox(&state, &principal, &id).await?;
        let (from, to) = match sandbox.status {
            SandboxStatus::Queued => (SandboxStatus::Queued, SandboxStatus::Terminated),
            SandboxStatus::Terminating => return Ok((StatusCode::ACCEPTED, Json(sandbox.view()))),
            s if s.is_final() => return Ok((StatusCode::OK, Json(sandbox.view()))),
            s => (s, SandboxStatus::Terminating),
        };
        let t = Transition {
            id: sandbox.id.clone(),
            from: vec![from],
            to,
            reason: Some("deleted".into()),
            actor: actor.clone(),
        };
        match state.store.transition(t, Utc::now()).await {
            Ok(updated) => return Ok(deleted(&state, &principal, updated).await),
            // Raced with placement or a worker: read again and retry with the new status.
            Err(StoreError::StatusConflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::new(
        ErrorCode::Conflict,
        "the sandbox keeps changing; retry",
    ))
}
