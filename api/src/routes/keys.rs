//! `/v1/keys`: API keys. An org-wide key with `sandboxes:write` manages its own
//! organization's keys and can grant at most its own scopes and its own lifetime (a key it
//! makes expires when it does, or sooner); the secret is served once. Revoking a key revokes
//! every key it made, and theirs.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::tenancy::{validate_name, ApiKeyRecord, Scope};
use differently_core::{ErrorCode, FieldError, KeyId, OrgId, ProjectId};
use serde::{Deserialize, Serialize};

use crate::auth::access::{forbidden, load_org};
use crate::auth::{generate_key, hash_key, hex, Principal};
use crate::error::{ApiError, ApiResult};
use crate::requests::body::{invalid, parse_json};
use crate::requests::idempotency::{self, json_answer, Replay};
use crate::requests::page::{Page, PageQuery};
use crate::requests::query::StrictQuery;

use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/keys", post(create_key).get(list_keys))
        .route("/v1/keys/{id}", get(get_key).delete(revoke_key))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateKey {
    org_id: Option<OrgId>,
    project_id: Option<ProjectId>,
    name: String,
    scopes: Vec<Scope>,
    expires_at: Option<DateTime<Utc>>,
}

/// A new key: the record plus the secret, shown this once.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreatedKey {
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
        Replay::SecretShownOnce("an API key"),
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
    let expires_at = child_expiry(req.expires_at, caller_expiry(state, p).await?)?;
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
        expires_at,
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

/// When the calling key expires (`None`: never, or not a stored key, as the bootstrap key).
/// Read from the store, not the auth cache: a limit must not come from a stale record.
async fn caller_expiry(state: &AppState, p: &Principal) -> ApiResult<Option<DateTime<Utc>>> {
    let Ok(id) = KeyId::parse(&p.key_id) else {
        return Ok(None);
    };
    Ok(state.store.get_key(&id).await?.and_then(|k| k.expires_at))
}

/// A new key's expiry: what was asked, never later than the creating key's; the creating
/// key's when none was asked, so an expiring key cannot mint a key that outlives it.
fn child_expiry(
    asked: Option<DateTime<Utc>>,
    parent: Option<DateTime<Utc>>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    match (asked, parent) {
        (Some(t), Some(limit)) if t > limit => Err(invalid(FieldError::new(
            "expiresAt",
            format!(
                "must be no later than the expiry of the key making it ({})",
                limit.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        ))),
        (Some(t), _) => Ok(Some(t)),
        (None, limit) => Ok(limit),
    }
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
    StrictQuery(q): StrictQuery<ListKeys>,
) -> ApiResult<Json<Page<ApiKeyRecord>>> {
    // The whole query is checked before the organization is looked up, so a bad query gets
    // its 400 whoever's organization it names.
    let page = PageQuery {
        limit: crate::requests::page::parse_limit(q.limit.as_deref())?,
        cursor: q.cursor,
    };
    let after = page.cursor_id(KeyId::parse)?;
    let org = match q.org_id.as_deref() {
        Some(raw) => load_org(&state, &p, raw).await?.id,
        None => p.org_id.clone(),
    };
    if !p.manages_org(&org) {
        return Err(forbidden("list keys of this organization"));
    }
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
    let key = match load_key(&state, &p, &id).await {
        // Authenticated, yet not stored: the bootstrap key, asking for itself.
        Err(e)
            if e.code == ErrorCode::NotFound
                && id == p.key_id
                && p.is_admin()
                && p.org_id == state.tenant.org.id =>
        {
            return Ok(Json(bootstrap_record(&state, &p).await?));
        }
        other => other?,
    };
    if !p.manages_org(&key.org_id) && key.id.as_str() != p.key_id {
        return Err(forbidden("read keys of this organization"));
    }
    Ok(Json(key))
}

/// The bootstrap key's own record, from what it authenticated as. It is configuration, not a
/// stored row, but every key may read its own record, and a client (the dashboard) learns from
/// it which organization and project the key acts in without a request that has to fail first.
async fn bootstrap_record(state: &AppState, p: &Principal) -> ApiResult<ApiKeyRecord> {
    let id = KeyId::parse(&p.key_id)
        .map_err(|e| ApiError::internal(format!("bootstrap key id: {e}")))?;
    // The key dates from its installation: the stored organization's creation time.
    let created_at = match state.store.get_org(&p.org_id).await? {
        Some(org) => org.created_at,
        None => state.tenant.org.created_at,
    };
    Ok(ApiKeyRecord {
        id,
        org_id: p.org_id.clone(),
        project_id: p.project_id.clone(),
        name: "bootstrap key".into(),
        scopes: p.scopes.clone(),
        hash: String::new(),
        created_at,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    })
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
    // Keys below it were revoked with it; which ones is the store's to know, so every cached
    // key record is dropped and read again (revocations are rare).
    state.auth_cache.forget_all_keys();
    Ok(Json(revoked))
}
