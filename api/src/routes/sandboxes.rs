//! `/v1/sandboxes`: admission, list, read, change (`PATCH`) and wait. Status changes and
//! delete are in `lifecycle`, exec in `exec`.
//!
//! Create: authenticate → build and validate → fail-fast placement → admit transaction (on
//! Postgres grouped with the org's concurrent creates) →
//! publish `dly.admit.<org>` → 202. A lost publish is repaired by the scheduler from Postgres.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use differently_bus_schema::WorkOp;
use differently_core::policy::Decision;
use differently_core::sandbox::SandboxView;
use differently_core::sandbox::FROM_SNAPSHOT_LABEL;
use differently_core::tenancy::Scope;
use differently_core::{
    faults, CreateSandboxRequest, ErrorCode, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_store::{Admission, Admitted, SandboxFilter};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::auth::access::load_sandbox;
use crate::auth::{ListProject, Principal};
use crate::control::after_commit::{boxed, publish_bounded};
use crate::control::mutation::{audit, begin};
use crate::control::sandbox_pool::status_conflict;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::requests::page::{bad_query, parse_cursor, parse_limit, Page};
use crate::requests::query::StrictQuery;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(read).patch(patch_sandbox))
        .route("/v1/sandboxes/{id}/wait", get(wait))
}

async fn create(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    principal.require(Scope::SandboxesWrite)?;
    let (req, spec) = parse_create(&body)?;
    let idempotency_key = crate::requests::idempotency::header_key(&headers)?;
    let project_id = match (&req.project_id, &principal.project_id) {
        (Some(asked), _) => match state.store.get_project(asked).await? {
            Some(p)
                if p.org_id == principal.org_id
                    && principal.project_id.as_ref().is_none_or(|b| b == &p.id) =>
            {
                p.id
            }
            _ => return Err(ApiError::not_found("project")),
        },
        (None, Some(bound)) => bound.clone(),
        (None, None) => {
            return Err(ApiError::field(
                ErrorCode::ValidationFailed,
                differently_core::FieldError::new(
                    "projectId",
                    "required for an organization-wide key",
                ),
            ))
        }
    };
    let mut spec = spec;
    pin_to_snapshot(&state, &principal, &req, &project_id, &mut spec).await?;
    // Fail fast: a request no permitted pool could ever take is refused now, not queued.
    let (explained, effective, warm) = crate::control::placement_decision::decide_warm(
        &state,
        &principal.org_id,
        &project_id,
        &spec,
        false,
    )
    .await?;
    if let Decision::Rejected { code, reason } = explained.decision {
        count_admission("rejected");
        return Err(ApiError::new(code, reason)
            .with_details(serde_json::json!({ "pools": explained.pools })));
    }
    let direct =
        crate::control::placement_decision::direct(&state, &explained, &effective, &spec, &warm);
    // (pool, class) the admission may claim from, for the claim's metric.
    let warm_class = direct
        .as_ref()
        .and_then(|d| Some((d.pool.name.clone(), d.warm_class.clone()?, d.claim_only())));
    let canonical = serde_json::to_vec(&req).map_err(ApiError::internal)?;
    let request_hash = crate::auth::hex(&Sha256::digest(&canonical));
    let sandbox = Sandbox::queued(
        principal.org_id.clone(),
        project_id,
        spec,
        idempotency_key,
        Utc::now(),
    );
    let admitted_id = sandbox.id.clone();
    let admitted = state
        .store
        .admit(Admission {
            sandbox,
            request_hash,
            defaults: state.limits.quota_defaults,
            actor: principal.actor(),
            request_id: None,
            direct,
        })
        .await
        .inspect_err(|_| count_admission("rejected"))?;
    let sandbox = match admitted {
        Admitted::Replayed(s) => {
            count_admission("replayed");
            let replayed = [("idempotent-replayed", "true")];
            return Ok((StatusCode::ACCEPTED, replayed, Json(s.view())).into_response());
        }
        Admitted::New(s) => s,
    };
    // Before its events are published: they move it from here on.
    state.events.remember_status(&sandbox);
    count_admission("admitted");
    tracing::info!(sandbox = %sandbox.id, org = %sandbox.org_id, "sandbox admitted");
    let claimed = sandbox.id != admitted_id;
    if let Some((pool, class, claim_only)) = warm_class {
        if claimed {
            warm.took(&pool, &class);
        }
        if count_warm_claim(&sandbox, pool.clone(), class.clone(), claimed, claim_only) {
            state
                .warm
                .count_claim(state.store.clone(), pool, class, claimed);
        }
    }
    if let Some(pause) = state.faults.pause_at(faults::API_AFTER_ADMIT_COMMIT) {
        tokio::time::sleep(pause).await;
    }
    if claimed && sandbox.status == SandboxStatus::Running {
        announce_claimed(&state, &sandbox).await;
    } else if sandbox.status == SandboxStatus::Provisioning {
        // A claim whose adapter needs a call is provisioning with its instance: the create
        // work makes the call (the worker sees the backend ref) and records it running.
        announce_placed(&state, &sandbox).await;
    } else {
        // Committed is committed: the scheduler's repair pass finds the queued row.
        let (a, b) = (state.announcer.clone(), state.announcer.clone());
        let (s1, s2) = (sandbox.clone(), sandbox.clone());
        let origin = principal.origin();
        publish_bounded(
            sandbox.id.as_str(),
            vec![
                ("admission", boxed(async move { a.admitted(&s1, "").await })),
                (
                    "status",
                    boxed(async move { b.status_by(&s2, origin).await }),
                ),
            ],
        )
        .await;
    }
    Ok((StatusCode::ACCEPTED, Json(sandbox.view())).into_response())
}

/// A create placed in its admission, announced as the leader announces an activation. A
/// lost work message is re-sent by the scheduler's sweep.
async fn announce_placed(state: &AppState, sandbox: &Sandbox) {
    let pool = sandbox.pool.as_deref().unwrap_or("");
    tracing::info!(sandbox = %sandbox.id, pool, "placement: activated in admission");
    metrics::counter!("differently_activations_total", "pool" => pool.to_owned()).increment(1);
    // A lost create is re-sent by the provisioning sweep.
    let (a, s) = (state.announcer.clone(), sandbox.clone());
    publish_bounded(
        sandbox.id.as_str(),
        vec![(
            "create",
            boxed(async move { a.activated_in_admission(&s).await }),
        )],
    )
    .await;
}

/// A create that claimed a warm instance needing no call is running already: its status
/// for watchers and its placement event, and no work for the pool's workers.
async fn announce_claimed(state: &AppState, sandbox: &Sandbox) {
    let pool = sandbox.pool.as_deref().unwrap_or("");
    tracing::info!(sandbox = %sandbox.id, pool, "placement: warm instance claimed in admission");
    metrics::counter!("differently_activations_total", "pool" => pool.to_owned()).increment(1);
    let (a, s) = (state.announcer.clone(), sandbox.clone());
    let (b, placed) = (state.announcer.clone(), sandbox.clone());
    tokio::spawn(async move {
        let _ = b.placed(&placed).await;
    });
    publish_bounded(
        sandbox.id.as_str(),
        vec![("status", boxed(async move { a.status(&s).await }))],
    )
    .await;
}

/// `differently_warm_claims_total{pool,class,result}` for a create that matched a warm
/// class of the pool it was placed on in its admission: `hit` when it claimed an instance
/// (the row came back under the instance's id), `miss` when none was ready. A create the
/// admission queued instead tried no claim here, so it is not counted, except on a capped
/// pool (`claim_only`), where queuing for the leader is how a claim misses. Whether it
/// counted.
fn count_warm_claim(
    sandbox: &Sandbox,
    pool: String,
    class: String,
    claimed: bool,
    claim_only: bool,
) -> bool {
    let result = match (claimed, sandbox.status) {
        (true, _) => "hit",
        (false, SandboxStatus::Provisioning | SandboxStatus::Running) => "miss",
        (false, SandboxStatus::Queued) if claim_only => "miss",
        _ => return false,
    };
    metrics::counter!("differently_warm_claims_total",
        "pool" => pool, "class" => class, "result" => result)
    .increment(1);
    true
}

/// `differently_admissions_total{outcome}`: `admitted`, `replayed` (idempotent retry) or
/// `rejected` (no pool could ever take it, or quota/store refused the admission).
fn count_admission(outcome: &'static str) {
    metrics::counter!("differently_admissions_total", "outcome" => outcome).increment(1);
}

/// A create body as the handler reads it: strict JSON, then the spec built and validated
/// from it. Everything here is the body alone (no store, no key), so it is public for the
/// fuzzers (`fuzz/`), which must call what the handler calls.
pub fn parse_create(body: &Bytes) -> ApiResult<(CreateSandboxRequest, SandboxSpec)> {
    let req: CreateSandboxRequest = parse_json(body)?;
    let spec =
        SandboxSpec::build(&req).map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    Ok((req, spec))
}

/// A restore or fork (`fromSnapshot`): checks the snapshot as [`restore_source`] does, labels
/// the spec with it and pins it to the pool that holds it. Nothing to do without one. The
/// create and the placement dry-run both call it, so a dry run is placed as the create is.
pub(crate) async fn pin_to_snapshot(
    state: &AppState,
    principal: &Principal,
    req: &CreateSandboxRequest,
    project: &differently_core::ProjectId,
    spec: &mut SandboxSpec,
) -> ApiResult<()> {
    if let Some(raw) = &req.from_snapshot {
        let snap = restore_source(state, principal, raw, project).await?;
        spec.labels
            .insert(FROM_SNAPSHOT_LABEL.to_owned(), snap.id.to_string());
        spec.pinned_pool = Some(snap.pool);
    }
    Ok(())
}

/// The snapshot a create names in `fromSnapshot`, if the key may see it, it is of `project`
/// (the one the sandbox is created in) and it is ready.
async fn restore_source(
    state: &AppState,
    principal: &Principal,
    raw: &str,
    project: &differently_core::ProjectId,
) -> ApiResult<differently_store::lifecycle::SnapshotRecord> {
    let not_found = || {
        ApiError::new(ErrorCode::NotFound, "fromSnapshot: snapshot not found")
            .with_details(serde_json::json!({ "field": "fromSnapshot" }))
    };
    let id = differently_core::ids::SnapshotId::parse(raw).map_err(|_| not_found())?;
    let snap = state.store.get_snapshot(&id).await?.ok_or_else(not_found)?;
    let visible = snap.org_id == principal.org_id
        && principal
            .project_id
            .as_ref()
            .is_none_or(|p| p == &snap.project_id);
    if !visible {
        return Err(not_found());
    }
    // A snapshot is its project's: restoring it elsewhere would copy one project's data into
    // another and leave a sandbox depending on a snapshot another project may delete.
    if &snap.project_id != project {
        return Err(ApiError::new(
            ErrorCode::ValidationFailed,
            format!(
                "fromSnapshot: the snapshot belongs to project {}; restore it there",
                snap.project_id
            ),
        )
        .with_details(serde_json::json!({ "field": "fromSnapshot" })));
    }
    if snap.status != differently_store::lifecycle::SnapshotStatus::Ready {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "fromSnapshot: the snapshot is {}, not ready",
                snap.status.as_str()
            ),
        )
        .with_details(serde_json::json!({ "field": "fromSnapshot" })));
    }
    Ok(snap)
}

async fn read(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxView>> {
    principal.require(Scope::SandboxesRead)?;
    Ok(Json(load_sandbox(&state, &principal, &id).await?.view()))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    project_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// `GET /v1/sandboxes`'s query: `label=key=value` may repeat (every one must match); any
/// other parameter is given at most once.
fn parse_list_query(raw: Option<&str>) -> ApiResult<(ListQuery, Vec<String>)> {
    let mut labels = Vec::new();
    let mut rest = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if k == "label" {
            labels.push(v.into_owned());
        } else if rest
            .insert(k.to_string(), Value::String(v.into_owned()))
            .is_some()
        {
            return Err(bad_query(&k, "given more than once"));
        }
    }
    let q = crate::requests::query::from_params(rest)?;
    Ok((q, labels))
}

async fn list(
    State(state): State<AppState>,
    principal: Principal,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
) -> ApiResult<Json<Page<SandboxView>>> {
    let (q, raw_labels) = parse_list_query(raw.as_deref())?;
    principal.require(Scope::SandboxesRead)?;
    // The whole query is checked before any answer that needs no rows: an empty page must
    // not make a malformed query look accepted.
    let limit = parse_limit(q.limit.as_deref())?;
    let after = parse_cursor(q.cursor.as_deref(), SandboxId::parse)?;
    let status = match q.status.as_deref() {
        None => None,
        Some(s) => Some(
            s.parse::<SandboxStatus>()
                .map_err(|m| bad_query("status", m))?,
        ),
    };
    let mut labels = std::collections::BTreeMap::new();
    let mut contradictory = false;
    for l in &raw_labels {
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| bad_query("label", "expected key=value"))?;
        // Two values for one key: no sandbox carries both.
        contradictory |= labels
            .insert(k.to_owned(), v.to_owned())
            .is_some_and(|was| was != v);
    }
    let project_id = match principal.list_project(q.project_id.as_deref())? {
        ListProject::Only(p) if !contradictory => p,
        ListProject::Only(_) | ListProject::Nothing => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }))
        }
    };
    let rows = state
        .store
        .list_sandboxes(&SandboxFilter {
            org_id: Some(principal.org_id.clone()),
            project_id,
            status,
            labels,
            after,
            limit: limit + 1,
        })
        .await?;
    let views = rows.iter().map(Sandbox::view).collect();
    Ok(Json(Page::from_rows(views, limit, |s: &SandboxView| {
        s.id.to_string()
    })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitQuery {
    status: Option<String>,
    timeout_seconds: Option<String>,
}

pub const MAX_WAIT_SECONDS: u64 = 300;

async fn wait(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<WaitQuery>,
) -> ApiResult<Json<SandboxView>> {
    principal.require(Scope::SandboxesRead)?;
    let target = match q.status.as_deref() {
        None => SandboxStatus::Running,
        Some(s) => s
            .parse::<SandboxStatus>()
            .map_err(|m| bad_query("status", m))?,
    };
    let timeout = match q.timeout_seconds.as_deref() {
        None => 30,
        Some(t) => t
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX_WAIT_SECONDS)
            .ok_or_else(|| {
                bad_query(
                    "timeoutSeconds",
                    format!("must be an integer between 0 and {MAX_WAIT_SECONDS}"),
                )
            })?,
    };
    let sandbox_id = SandboxId::parse(&id).map_err(|_| ApiError::not_found("sandbox"))?;
    // Watch before reading, so a change between the read and the wait is not missed.
    let mut events = state.events.watch(&sandbox_id);
    // Right after this process admitted it (a create, then a wait for it), the hub knows its
    // status: a wait that is not over by that status starts without reading the row. What
    // it answers is still a read or an event's committed view.
    let known = state.events.known_status(&sandbox_id).filter(|k| {
        principal.owns(&k.org_id, &k.project_id) && k.status != target && !k.status.is_final()
    });
    let (mut version, mut view) = match known {
        Some(k) => (k.status_version, None),
        None => {
            let s = load_sandbox(&state, &principal, &id).await?;
            (s.status_version, Some(s.view()))
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        if let Some(v) = view.take_if(|v| v.status == target || v.status.is_final()) {
            return Ok(Json(v));
        }
        // Events on the way (queued → provisioning on the way to running) cost no read. The
        // event that ends the wait carries the row's view as committed, which is the answer
        // when it is newer than what this wait has; otherwise (an older publisher, or an
        // event that arrived out of order) the row is read. A missed event is caught by the
        // recheck.
        let recheck = tokio::time::sleep(WAIT_RECHECK);
        tokio::pin!(recheck);
        let newer = loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    return match view {
                        Some(v) => Ok(Json(v)),
                        None => Ok(Json(load_sandbox(&state, &principal, &id).await?.view())),
                    };
                }
                event = events.changed() => match event {
                    Some(e) if e.status != target && !e.status.is_final() => continue,
                    Some(e) => break e.newer_view(version),
                    None => break None,
                },
                _ = &mut recheck => break None,
            }
        };
        (version, view) = match newer {
            Some((v, answer)) => (v, Some(answer)),
            None => {
                let s = load_sandbox(&state, &principal, &id).await?;
                (s.status_version, Some(s.view()))
            }
        };
    }
}

/// How long a wait trusts the event stream before reading the row again.
const WAIT_RECHECK: Duration = Duration::from_secs(1);

/// The body of `PATCH /v1/sandboxes/{id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchRequest {
    pub ttl_seconds: Option<u64>,
    /// Replaces the caller's labels (reserved `differently.dev/` ones are kept).
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// A number sets it; `null` clears it (the server's default applies); absent: unchanged.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>)]
    pub idle_timeout_seconds: Option<Option<u64>>,
}

/// Tells a present `null` (`Some(None)`) from an absent field (`None`, via `default`).
fn present<'de, D>(d: D) -> Result<Option<Option<u64>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<u64>::deserialize(d).map(Some)
}

/// A PATCH body as the handler reads it, validated before the sandbox is looked up (so a
/// bad body is the same 400/422 whatever the id); public for the fuzzers.
pub fn parse_patch(body: &Bytes) -> ApiResult<PatchRequest> {
    let req: PatchRequest = parse_json(body)?;
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
    if let Some(idle) = req.idle_timeout_seconds {
        differently_core::sandbox::validate_idle_timeout(idle)
            .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    }
    Ok(req)
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
    let req = parse_patch(&body)?;
    let sandbox = load_sandbox(&state, &principal, &id).await?;
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
