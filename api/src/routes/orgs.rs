//! Organizations, projects, API keys and quotas.
//!
//! Visibility first, then permission: a key asking about another tenant's object gets the
//! same 404 as for an absent one; a key that can see the object but lacks the right gets 403.
//! An org-wide key with `sandboxes:write` manages its own organization's projects and keys
//! (and can grant at most its own scopes); `admin` manages everything.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::tenancy::{
    validate_name, ApiKeyRecord, Org, OrgStatus, Project, Quota, Scope, Usage,
};
use differently_core::{ErrorCode, FieldError, KeyId, OrgId, ProjectId};
use differently_store::QuotaScope;
use serde::{Deserialize, Serialize};

use crate::auth::{generate_key, hash_key, hex, Principal};
use crate::body::parse_json;
use crate::error::{ApiError, ApiResult};
use crate::idempotency::{self, json_answer, Replay};
use crate::page::{Page, PageQuery};
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/orgs", post(create_org).get(list_orgs))
        .route(
            "/v1/orgs/{id}",
            get(get_org).patch(update_org).delete(delete_org),
        )
        .route("/v1/orgs/{id}/quota", get(get_org_quota).put(put_org_quota))
        .route("/v1/projects", post(create_project).get(list_projects))
        .route(
            "/v1/projects/{id}",
            get(get_project)
                .patch(update_project)
                .delete(delete_project),
        )
        .route(
            "/v1/projects/{id}/quota",
            get(get_project_quota).put(put_project_quota),
        )
        .route("/v1/keys", post(create_key).get(list_keys))
        .route("/v1/keys/{id}", get(get_key).delete(revoke_key))
}

fn forbidden(what: &str) -> ApiError {
    ApiError::new(
        ErrorCode::PermissionDenied,
        format!("this key may not {what}"),
    )
}

fn invalid(e: FieldError) -> ApiError {
    ApiError::field(ErrorCode::ValidationFailed, e)
}

// --- organizations ---------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateOrg {
    name: String,
}

async fn create_org(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_org_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/orgs",
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_org_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<Org>)> {
    // Who may ask comes before what was asked: a caller without the scope learns nothing
    // about the body's rules.
    if !p.is_admin() {
        return Err(forbidden("create organizations (admin scope needed)"));
    }
    let req: CreateOrg = parse_json(body)?;
    validate_name("name", &req.name).map_err(invalid)?;
    let org = Org {
        id: OrgId::new(),
        name: req.name.trim().to_owned(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    state.store.create_org(&org, &p.actor()).await?;
    Ok((StatusCode::CREATED, Json(org)))
}

async fn load_org(state: &AppState, p: &Principal, raw: &str) -> ApiResult<Org> {
    let id = OrgId::parse(raw).map_err(|_| ApiError::not_found("organization"))?;
    match state.store.get_org(&id).await? {
        Some(o) if p.sees_org(&o.id) => Ok(o),
        _ => Err(ApiError::not_found("organization")),
    }
}

async fn list_orgs(
    State(state): State<AppState>,
    p: Principal,
    q: Result<Query<crate::page::RawPageQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<Org>>> {
    let q = PageQuery::from(q)?;
    if !p.is_admin() {
        let own = state.store.get_org(&p.org_id).await?;
        return Ok(Json(Page {
            items: own.into_iter().collect(),
            next_cursor: None,
        }));
    }
    let after = q.cursor_id(OrgId::parse)?;
    let rows = state.store.list_orgs(after.as_ref(), q.limit + 1).await?;
    Ok(Json(Page::from_rows(rows, q.limit, |o| o.id.to_string())))
}

async fn get_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Org>> {
    Ok(Json(load_org(&state, &p, &id).await?))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UpdateOrg {
    name: Option<String>,
    status: Option<OrgStatus>,
}

async fn update_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Org>> {
    let org = load_org(&state, &p, &id).await?;
    if !p.is_admin() {
        return Err(forbidden("change organizations (admin scope needed)"));
    }
    let req: UpdateOrg = parse_json(&body)?;
    if let Some(n) = &req.name {
        validate_name("name", n).map_err(invalid)?;
    }
    let updated = state
        .store
        .update_org(
            &org.id,
            req.name.as_deref().map(str::trim),
            req.status,
            &p.actor(),
        )
        .await?;
    state.auth_cache.forget_org(&org.id);
    Ok(Json(updated))
}

async fn delete_org(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let org = load_org(&state, &p, &id).await?;
    if !p.is_admin() {
        return Err(forbidden("delete organizations (admin scope needed)"));
    }
    if org.id == state.tenant.org.id {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the bootstrap organization cannot be deleted",
        ));
    }
    state.store.delete_org(&org.id, &p.actor()).await?;
    state.auth_cache.forget_org(&org.id);
    Ok(StatusCode::NO_CONTENT)
}

// --- projects --------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateProject {
    org_id: Option<OrgId>,
    name: String,
}

async fn create_project(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_project_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/projects",
        &body,
        Replay::Answer,
        create,
    )
    .await
}

async fn create_project_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<Project>)> {
    let req: CreateProject = parse_json(body)?;
    let org_id = req.org_id.unwrap_or_else(|| p.org_id.clone());
    let org = load_org(state, p, org_id.as_str()).await?;
    if !p.manages_org(&org.id) {
        return Err(forbidden("create projects in this organization"));
    }
    validate_name("name", &req.name).map_err(invalid)?;
    let project = Project {
        id: ProjectId::new(),
        org_id: org.id,
        name: req.name.trim().to_owned(),
        created_at: Utc::now(),
    };
    state.store.create_project(&project, &p.actor()).await?;
    Ok((StatusCode::CREATED, Json(project)))
}

/// Loads a project the key may see; anything else is the same 404.
pub async fn load_project(state: &AppState, p: &Principal, raw: &str) -> ApiResult<Project> {
    let id = ProjectId::parse(raw).map_err(|_| ApiError::not_found("project"))?;
    match state.store.get_project(&id).await? {
        Some(pr) if p.sees_project(&pr.org_id, &pr.id) => Ok(pr),
        _ => Err(ApiError::not_found("project")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListProjects {
    org_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_projects(
    State(state): State<AppState>,
    p: Principal,
    q: Result<Query<ListProjects>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<Project>>> {
    let Query(q) = q.map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.body_text()))?;
    let org = match q.org_id.as_deref() {
        Some(raw) => load_org(&state, &p, raw).await?.id,
        None => p.org_id.clone(),
    };
    let page = PageQuery {
        limit: crate::page::parse_limit(q.limit.as_deref())?,
        cursor: q.cursor,
    };
    let after = page.cursor_id(ProjectId::parse)?;
    let rows = state
        .store
        .list_projects(&org, after.as_ref(), page.limit + 1)
        .await?;
    let rows = rows
        .into_iter()
        .filter(|pr| p.sees_project(&pr.org_id, &pr.id))
        .collect();
    Ok(Json(Page::from_rows(rows, page.limit, |pr| {
        pr.id.to_string()
    })))
}

async fn get_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Project>> {
    Ok(Json(load_project(&state, &p, &id).await?))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UpdateProject {
    name: String,
}

async fn update_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Project>> {
    let project = load_project(&state, &p, &id).await?;
    if !p.manages_org(&project.org_id) {
        return Err(forbidden("change projects of this organization"));
    }
    let req: UpdateProject = parse_json(&body)?;
    validate_name("name", &req.name).map_err(invalid)?;
    Ok(Json(
        state
            .store
            .rename_project(&project.id, req.name.trim(), &p.actor())
            .await?,
    ))
}

async fn delete_project(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let project = load_project(&state, &p, &id).await?;
    if !p.manages_org(&project.org_id) {
        return Err(forbidden("delete projects of this organization"));
    }
    if project.id == state.tenant.project.id {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "the bootstrap project cannot be deleted",
        ));
    }
    state.store.delete_project(&project.id, &p.actor()).await?;
    Ok(StatusCode::NO_CONTENT)
}

// --- keys ------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateKey {
    org_id: Option<OrgId>,
    project_id: Option<ProjectId>,
    name: String,
    scopes: Vec<Scope>,
    expires_at: Option<DateTime<Utc>>,
}

/// A new key: the record plus the secret, shown this once.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CreatedKey {
    #[serde(flatten)]
    record: ApiKeyRecord,
    key: String,
}

async fn create_key(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_key_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/keys",
        &body,
        Replay::SecretShownOnce,
        create,
    )
    .await
}

async fn create_key_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<CreatedKey>)> {
    let req: CreateKey = parse_json(body)?;
    let org_id = req.org_id.unwrap_or_else(|| p.org_id.clone());
    let org = load_org(state, p, org_id.as_str()).await?;
    if !p.manages_org(&org.id) {
        return Err(forbidden("create keys in this organization"));
    }
    validate_name("name", &req.name).map_err(invalid)?;
    if req.scopes.is_empty() {
        return Err(invalid(FieldError::new(
            "scopes",
            "must name at least one scope",
        )));
    }
    if let Some(s) = req
        .scopes
        .iter()
        .find(|s| !p.has(**s) || (**s == Scope::Admin && !p.is_admin()))
    {
        return Err(forbidden(&format!("grant the {s} scope it does not hold")));
    }
    if let Some(project_id) = &req.project_id {
        match state.store.get_project(project_id).await? {
            Some(pr) if pr.org_id == org.id => {}
            _ => return Err(ApiError::not_found("project")),
        }
    }
    let now = Utc::now();
    if req.expires_at.is_some_and(|t| t <= now) {
        return Err(invalid(FieldError::new(
            "expiresAt",
            "must be in the future",
        )));
    }
    let mut scopes = req.scopes;
    scopes.sort();
    scopes.dedup();
    let id = KeyId::new();
    let secret = generate_key_for(&id);
    let record = ApiKeyRecord {
        id,
        org_id: org.id,
        project_id: req.project_id,
        name: req.name.trim().to_owned(),
        scopes,
        hash: hex(&hash_key(&secret)),
        created_at: now,
        expires_at: req.expires_at,
        revoked_at: None,
        last_used_at: None,
    };
    state.store.create_key(&record, &p.actor()).await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            record,
            key: secret,
        }),
    ))
}

/// A key whose public part is `id`.
fn generate_key_for(id: &KeyId) -> String {
    let random = generate_key();
    // generate_key makes `dly_<fresh id>_<secret>`: keep the secret, use our id.
    let secret = random
        .rsplit_once('_')
        .map(|(_, s)| s.to_owned())
        .unwrap_or_default();
    format!("dly_{id}_{secret}")
}

async fn load_key(state: &AppState, p: &Principal, raw: &str) -> ApiResult<ApiKeyRecord> {
    let id = KeyId::parse(raw).map_err(|_| ApiError::not_found("key"))?;
    match state.store.get_key(&id).await? {
        Some(k) if p.sees_org(&k.org_id) => Ok(k),
        _ => Err(ApiError::not_found("key")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListKeys {
    org_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_keys(
    State(state): State<AppState>,
    p: Principal,
    q: Result<Query<ListKeys>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Page<ApiKeyRecord>>> {
    let Query(q) = q.map_err(|e| ApiError::new(ErrorCode::InvalidArgument, e.body_text()))?;
    let org = match q.org_id.as_deref() {
        Some(raw) => load_org(&state, &p, raw).await?.id,
        None => p.org_id.clone(),
    };
    if !p.manages_org(&org) {
        return Err(forbidden("list keys of this organization"));
    }
    let page = PageQuery {
        limit: crate::page::parse_limit(q.limit.as_deref())?,
        cursor: q.cursor,
    };
    let after = page.cursor_id(KeyId::parse)?;
    let rows = state
        .store
        .list_keys(&org, after.as_ref(), page.limit + 1)
        .await?;
    Ok(Json(Page::from_rows(rows, page.limit, |k| {
        k.id.to_string()
    })))
}

async fn get_key(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ApiKeyRecord>> {
    let key = load_key(&state, &p, &id).await?;
    if !p.manages_org(&key.org_id) && key.id.as_str() != p.key_id {
        return Err(forbidden("read keys of this organization"));
    }
    Ok(Json(key))
}

async fn revoke_key(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<ApiKeyRecord>> {
    let key = load_key(&state, &p, &id).await?;
    if !p.manages_org(&key.org_id) {
        return Err(forbidden("revoke keys of this organization"));
    }
    let revoked = state
        .store
        .revoke_key(&key.id, Utc::now(), &p.actor())
        .await?;
    state.auth_cache.forget_key(&key.id);
    Ok(Json(revoked))
}

// --- quotas ----------------------------------------------------------------------------

/// A quota as served: what is stored at this level, what applies, and current usage.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct QuotaView {
    quota: Quota,
    effective: Quota,
    usage: Usage,
}

async fn quota_view(state: &AppState, scope: QuotaScope) -> ApiResult<QuotaView> {
    let stored = state.store.get_quota(&scope).await?.unwrap_or_default();
    let effective = match scope {
        QuotaScope::Org(_) => stored.or(&state.limits.quota_defaults),
        QuotaScope::Project(_) => stored,
    };
    let usage = state.store.usage(&scope).await?;
    Ok(QuotaView {
        quota: stored,
        effective,
        usage,
    })
}

async fn get_org_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<QuotaView>> {
    let org = load_org(&state, &p, &id).await?;
    Ok(Json(quota_view(&state, QuotaScope::Org(org.id)).await?))
}

async fn put_quota(
    state: &AppState,
    p: &Principal,
    scope: QuotaScope,
    body: &Bytes,
) -> ApiResult<QuotaView> {
    if !p.is_admin() {
        return Err(forbidden("change quotas (admin scope needed)"));
    }
    let quota: Quota = parse_json(body)?;
    quota.validate().map_err(invalid)?;
    state.store.put_quota(&scope, &quota, &p.actor()).await?;
    quota_view(state, scope).await
}

async fn put_org_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<QuotaView>> {
    let org = load_org(&state, &p, &id).await?;
    Ok(Json(
        put_quota(&state, &p, QuotaScope::Org(org.id), &body).await?,
    ))
}

async fn get_project_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<QuotaView>> {
    let project = load_project(&state, &p, &id).await?;
    Ok(Json(
        quota_view(&state, QuotaScope::Project(project.id)).await?,
    ))
}

async fn put_project_quota(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<QuotaView>> {
    let project = load_project(&state, &p, &id).await?;
    Ok(Json(
        put_quota(&state, &p, QuotaScope::Project(project.id), &body).await?,
    ))
}
