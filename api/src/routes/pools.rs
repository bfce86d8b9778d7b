//! The pool registry: `/v1/admin/pools` (admin only). A record is validated the way the
//! config file is; live health and used slots are served beside it.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use differently_adapters::devhost::DevhostAdapter;
use differently_adapters::registry::AdapterConfigError;
use differently_adapters::{Verification, VerifiedStatus};
use differently_core::policy::Isolation;
use differently_core::pool::{
    check_pool_bounds, validate_pool_name, PoolBounds, PoolHealth, PoolRecord, PoolSource, Trust,
};
use differently_core::{ErrorCode, FieldError};
use serde::{Deserialize, Serialize};

use crate::auth::access::forbidden;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::requests::idempotency::{self, json_answer, Replay};
use crate::requests::page::PageQuery;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/pools", post(create_pool).get(list_pools))
        .route(
            "/v1/admin/pools/{name}",
            get(get_pool).patch(update_pool).delete(delete_pool),
        )
}

/// A pool as served: its record, live health and slots in use (the document's `Pool`).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PoolInfo {
    #[serde(skip)]
    record: PoolRecord,
    /// The record's fields as served ([`served_record`]).
    #[serde(flatten)]
    #[schema(value_type = PoolRecord)]
    served: serde_json::Value,
    capabilities: Vec<String>,
    /// [`Backend`]'s fields, each where the document has always listed it (a flattened
    /// `Backend` would come before `capabilities`).
    #[schema(required)]
    backend_version: Option<String>,
    verified: VerifiedStatus,
    verified_basis: String,
    healthy: bool,
    #[schema(required)]
    health: Option<PoolHealth>,
    used_slots: u32,
}

/// A page of `GET /v1/admin/pools` (the document's `PoolList`).
pub(crate) type PoolList = crate::requests::page::Page<PoolInfo>;

/// What this process's adapter knows of a pool's backend: the version it detected and how
/// far the adapter is verified against it. Served by the pools admin and the trust report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Backend {
    /// As last detected by this process's adapter (OpenSandbox's `GET /version`, E2B's
    /// envd); `None` before its first call or when the backend does not say.
    pub backend_version: Option<String>,
    pub verified: VerifiedStatus,
    pub verified_basis: String,
}

impl Backend {
    /// From this process's adapter when it has detected the backend's version; otherwise
    /// from what the last prober's adapter detected (`health`: in a split deployment the
    /// workers probe, so an API process may never have called the backend); otherwise from
    /// its adapter as it is, or its kind when no adapter could be built.
    pub(crate) fn of(
        state: &AppState,
        record: &PoolRecord,
        health: Option<&PoolHealth>,
    ) -> Backend {
        let live = state.pools.get(&record.name);
        let own = live.as_ref().map(|p| p.backend_seen());
        let seen = match (own, health.and_then(|h| h.backend.clone())) {
            (Some(own), _) if own.version.is_some() => own,
            (_, Some(probed)) => probed,
            (Some(own), None) => own,
            (None, None) => {
                let v = Verification::of_kind(&record.kind);
                differently_core::pool::BackendSeen {
                    version: None,
                    verified: v.status,
                    verified_basis: v.basis,
                }
            }
        };
        Backend {
            backend_version: seen.version,
            verified: seen.verified,
            verified_basis: seen.verified_basis,
        }
    }
}

/// A pool's health as served: what its prober detected of the backend is served in the
/// pool's own fields (`Backend`), not twice.
pub(crate) fn served_health(health: &[PoolHealth], name: &str) -> Option<PoolHealth> {
    health.iter().find(|h| h.name == name).map(|h| PoolHealth {
        backend: None,
        ..h.clone()
    })
}

async fn pool_infos(state: &AppState) -> ApiResult<Vec<PoolInfo>> {
    let records = state.store.list_pools().await?;
    let health = state.store.pool_health().await?;
    let used = state.store.pool_slots_used().await?;
    Ok(records
        .into_iter()
        .map(|record| {
            let live = state.pools.get(&record.name);
            let backend = Backend::of(
                state,
                &record,
                health.iter().find(|h| h.name == record.name),
            );
            PoolInfo {
                capabilities: live
                    .as_ref()
                    .map(|p| differently_core::capability::names(&p.adapter.capabilities()))
                    .unwrap_or_default(),
                backend_version: backend.backend_version,
                verified: backend.verified,
                verified_basis: backend.verified_basis,
                healthy: live.as_ref().is_some_and(|p| p.healthy()),
                health: served_health(&health, &record.name),
                used_slots: used.get(&record.name).copied().unwrap_or(0),
                served: served_record(&record),
                record,
            }
        })
        .collect())
}

/// A record's fields as served. A devhost pool's `isolation` is what its commands really
/// run under, `bwrap` or `none` (its settings decide, not a declaration); other pools serve
/// the isolation their operator declared.
fn served_record(record: &PoolRecord) -> serde_json::Value {
    let mut v = serde_json::to_value(record).unwrap_or_default();
    if differently_adapters::registry::is_dev_only(&record.kind) {
        let real = DevhostAdapter::isolation_of(&record.settings);
        if let (Some(obj), Some(real)) = (v.as_object_mut(), real) {
            obj.insert("isolation".to_owned(), real.into());
        }
    }
    v
}

fn require_admin(p: &Principal) -> ApiResult<()> {
    if p.is_admin() {
        Ok(())
    } else {
        Err(forbidden("manage pools (admin scope needed)"))
    }
}

/// Body of `POST /v1/admin/pools` (and, all optional, of `PATCH`).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PoolBody {
    name: Option<String>,
    kind: Option<String>,
    trust: Option<Trust>,
    region: Option<String>,
    max_concurrent: Option<u32>,
    isolation: Option<Isolation>,
    cost_per_cpu_hour: Option<f64>,
    typical_create_seconds: Option<f64>,
    settings: Option<serde_json::Value>,
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::field(ErrorCode::ValidationFailed, FieldError::new(field, message))
}

/// Validates a record the way the config file is validated; errors name the field.
fn check_record(r: &PoolRecord, declared_trust: Option<Trust>) -> ApiResult<Trust> {
    validate_pool_name(&r.name).map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    let trust = differently_adapters::registry::resolve_trust(&r.kind, declared_trust)
        .map_err(|e| ApiError::field(ErrorCode::ValidationFailed, e))?;
    check_pool_bounds(PoolBounds {
        region: r.region.as_deref(),
        max_concurrent: r.max_concurrent,
        cost_per_cpu_hour: Some(r.cost_per_cpu_hour),
        typical_create_seconds: r.typical_create_seconds,
    })
    .map_err(|(field, message)| invalid(field.api_name(), message))?;
    differently_adapters::registry::build(&r.kind, &r.settings).map_err(|e| {
        let field = match &e {
            AdapterConfigError::UnknownKind { .. } => "kind".to_owned(),
            AdapterConfigError::InvalidSettings { field: Some(f), .. } => format!("settings.{f}"),
            AdapterConfigError::InvalidSettings { field: None, .. } => "settings".to_owned(),
        };
        ApiError::new(ErrorCode::ValidationFailed, format!("{field}: {e}"))
            .with_details(serde_json::json!({ "field": field }))
    })?;
    Ok(trust)
}

async fn create_pool(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_pool_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/admin/pools",
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_pool_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<serde_json::Value>)> {
    require_admin(p)?;
    let b: PoolBody = parse_json(body)?;
    let name = b.name.ok_or_else(|| invalid("name", "required"))?;
    let kind = b.kind.ok_or_else(|| invalid("kind", "required"))?;
    if state
        .store
        .list_pools()
        .await?
        .iter()
        .any(|r| r.name == name)
    {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("pool {name} already exists"),
        ));
    }
    let now = Utc::now();
    let mut record = PoolRecord {
        name,
        kind,
        trust: Trust::Private,
        region: b.region,
        max_concurrent: b.max_concurrent,
        isolation: b.isolation,
        cost_per_cpu_hour: b.cost_per_cpu_hour.unwrap_or(0.0),
        typical_create_seconds: b.typical_create_seconds,
        settings: b.settings.unwrap_or(serde_json::Value::Null),
        source: PoolSource::Api,
        created_at: now,
        updated_at: now,
    };
    record.trust = check_record(&record, b.trust)?;
    state.store.upsert_pool(&record, &p.actor()).await?;
    state.pools.sync(state.store.list_pools().await?);
    Ok((StatusCode::CREATED, Json(served_record(&record))))
}

/// The prefix of a pool list's cursor (`pool_<name>` of the last pool served): a name
/// alone would make any word a well-formed cursor, and `_` is in no pool name.
const CURSOR_PREFIX: &str = "pool_";

/// The name a pool list's cursor holds.
fn cursor_name(cursor: &str) -> Result<String, ()> {
    let name = cursor.strip_prefix(CURSOR_PREFIX).ok_or(())?;
    validate_pool_name(name).map_err(|_| ())?;
    Ok(name.to_owned())
}

/// `GET /v1/admin/pools?limit=&cursor=`: the pools by name, paged like every list.
async fn list_pools(
    State(state): State<AppState>,
    p: Principal,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<PoolList>> {
    require_admin(&p)?;
    let page = PageQuery::parse(raw.as_deref())?;
    let after = page.cursor_id(cursor_name)?;
    let mut items = pool_infos(&state).await?;
    items.sort_by(|a, b| a.record.name.cmp(&b.record.name));
    if let Some(after) = after {
        items.retain(|i| i.record.name > after);
    }
    Ok(Json(PoolList::from_rows(items, page.limit, |i| {
        format!("{CURSOR_PREFIX}{}", i.record.name)
    })))
}

async fn find_pool(state: &AppState, name: &str) -> ApiResult<PoolRecord> {
    state
        .store
        .list_pools()
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| ApiError::not_found("pool"))
}

async fn get_pool(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<PoolInfo>> {
    require_admin(&p)?;
    pool_infos(&state)
        .await?
        .into_iter()
        .find(|i| i.record.name == name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("pool"))
}

async fn update_pool(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    require_admin(&p)?;
    let b: PoolBody = parse_json(&body)?;
    let mut record = find_pool(&state, &name).await?;
    if record.source == PoolSource::Config {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("pool {name} comes from the configuration file; change it there"),
        ));
    }
    if b.name.as_ref().is_some_and(|n| n != &name) {
        return Err(invalid("name", "a pool cannot be renamed"));
    }
    if b.kind.as_ref().is_some_and(|k| k != &record.kind) {
        return Err(invalid(
            "kind",
            "a pool's kind cannot change; register a new pool",
        ));
    }
    if b.region.is_some() {
        record.region = b.region;
    }
    if b.max_concurrent.is_some() {
        record.max_concurrent = b.max_concurrent;
    }
    if b.isolation.is_some() {
        record.isolation = b.isolation;
    }
    if let Some(c) = b.cost_per_cpu_hour {
        record.cost_per_cpu_hour = c;
    }
    if b.typical_create_seconds.is_some() {
        record.typical_create_seconds = b.typical_create_seconds;
    }
    if let Some(s) = b.settings {
        record.settings = s;
    }
    record.updated_at = Utc::now();
    record.trust = check_record(&record, b.trust.or(Some(record.trust)))?;
    state.store.upsert_pool(&record, &p.actor()).await?;
    state.pools.sync(state.store.list_pools().await?);
    Ok(Json(served_record(&record)))
}

async fn delete_pool(
    State(state): State<AppState>,
    p: Principal,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    require_admin(&p)?;
    let record = find_pool(&state, &name).await?;
    if record.source == PoolSource::Config {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("pool {name} comes from the configuration file; remove it there"),
        ));
    }
    crate::routes::warm::drain_for_delete(&state, &name, &p.actor()).await?;
    state.store.delete_pool(&name, &p.actor()).await?;
    state.pools.sync(state.store.list_pools().await?);
    Ok(StatusCode::NO_CONTENT)
}
