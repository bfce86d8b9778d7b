//! `/v1/webhooks`: a project's endpoints for public events, signed as Standard Webhooks does.
//! Reading takes `sandboxes:read`, changing `sandboxes:write`; a webhook is visible to the
//! keys that own its project (a project-bound key sees its project's only), and another
//! tenant's is the same 404 as an absent one. The signing secret is shown once, on create
//! and on rotation, and never again.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use differently_bus_schema::public::EventType;
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError, ProjectId};
use differently_store::webhooks::{
    valid_delivery_id, valid_webhook_id, Delivery, Webhook, WebhookPatch,
};
use differently_webhooks::{Secret, UrlError, UrlPolicy};
use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::auth::access::load_project;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::body::{invalid, parse_json};
use crate::requests::idempotency::{self, json_answer, Replay};
use crate::requests::page::{Page, PageQuery};
use crate::requests::query::parse_query;
use crate::AppState;

/// Most event-type filters of one webhook.
pub(crate) const MAX_EVENT_TYPES: usize = 50;
/// Most characters of a description.
pub(crate) const MAX_DESCRIPTION: usize = 256;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/webhooks", post(create_webhook).get(list_webhooks))
        .route(
            "/v1/webhooks/{id}",
            get(get_webhook)
                .patch(update_webhook)
                .delete(delete_webhook),
        )
        .route("/v1/webhooks/{id}/rotate-secret", post(rotate_secret))
        .route("/v1/webhooks/{id}/deliveries", get(list_deliveries))
        .route(
            "/v1/webhooks/{id}/deliveries/{deliveryId}/redeliver",
            post(redeliver),
        )
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateWebhook {
    project_id: Option<ProjectId>,
    url: String,
    #[serde(default)]
    event_types: Vec<String>,
    description: Option<String>,
}

/// A webhook with its secret: the answer of create and rotate, the only times it is shown
/// (the document's `WebhookWithSecret`).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct WithSecret {
    #[serde(flatten)]
    webhook: Webhook,
    secret: String,
}

fn secrets_enabled() -> ApiResult<()> {
    if differently_store::sealed::process_key().is_none() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "webhooks are not enabled: the server has no secrets key to seal their signing \
             secrets with; set DIFFERENTLY_SECRETS_KEY (or the variable [audit] \
             secrets_key_env names) to 64 hex characters from `differently key generate \
             --secrets`, the same on every api and worker process",
        ));
    }
    Ok(())
}

fn check_url(state: &AppState, url: &str) -> ApiResult<String> {
    let policy = &state.limits.webhooks.url_policy;
    let url = url.trim();
    policy
        .check(url)
        .map(|u| u.to_string())
        .map_err(|e| invalid(FieldError::new("url", url_refusal(policy, url, e))))
}

/// What a refusal of `raw` by `policy` says: every switch that would allow the URL
/// (docs/webhooks.md), or none when no switch would. The policy stops at its first rule, so
/// on its own a plain-http URL to a private address named only `allow_http`, and a scheme
/// no switch allows (`ftp`) was told to ask for `allow_http`.
fn url_refusal(policy: &UrlPolicy, raw: &str, refused: UrlError) -> String {
    if refused != UrlError::Scheme {
        return refused.to_string();
    }
    if !Url::parse(raw).is_ok_and(|u| u.scheme() == "http") {
        return "must use https".to_owned();
    }
    // Plain http: what else refuses the URL once http is allowed.
    let with_http = UrlPolicy {
        allow_http: true,
        ..*policy
    };
    match with_http.check(raw) {
        Ok(_) => refused.to_string(),
        Err(UrlError::Forbidden(ip, range)) => format!(
            "must use https, and {ip} is a {range} address, which webhooks may not reach (the \
             operator allows both with DIFFERENTLY_WEBHOOKS_ALLOW_HTTP=true and \
             DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE=true, [webhooks] allow_http and allow_private)"
        ),
        // A rule no switch lifts (a user name in the URL): that one, alone.
        Err(other) => other.to_string(),
    }
}

fn check_types(types: Vec<String>) -> ApiResult<Vec<String>> {
    if types.len() > MAX_EVENT_TYPES {
        return Err(invalid(FieldError::new(
            "eventTypes",
            format!("at most {MAX_EVENT_TYPES} filters"),
        )));
    }
    let mut out = Vec::with_capacity(types.len());
    for t in types {
        if !EventType::ALL.iter().any(|k| k.matches(&t)) {
            return Err(invalid(FieldError::new(
                "eventTypes",
                format!(
                    "{t:?} matches no event type (use a type such as \"sandbox.status.changed\", \
                     a prefix such as \"sandbox.exec.*\", or \"*\")"
                ),
            )));
        }
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

fn check_description(d: Option<String>) -> ApiResult<Option<String>> {
    let d = d.map(|d| d.trim().to_owned()).filter(|d| !d.is_empty());
    if d.as_ref()
        .is_some_and(|d| d.chars().count() > MAX_DESCRIPTION)
    {
        return Err(invalid(FieldError::new(
            "description",
            format!("at most {MAX_DESCRIPTION} characters"),
        )));
    }
    Ok(d)
}

async fn create_webhook(
    State(state): State<AppState>,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let create = || async { json_answer(create_now(&state, &p, &body).await?) };
    idempotency::once(
        &state,
        &p,
        &headers,
        "POST /v1/webhooks",
        &body,
        Replay::SecretShownOnce("a webhook"),
        create,
    )
    .await
}

async fn create_now(
    state: &AppState,
    p: &Principal,
    body: &Bytes,
) -> ApiResult<(StatusCode, Json<WithSecret>)> {
    p.require(Scope::SandboxesWrite)?;
    let req: CreateWebhook = parse_json(body)?;
    let project_id = req
        .project_id
        .or_else(|| p.project_id.clone())
        .ok_or_else(|| {
            invalid(FieldError::new(
                "projectId",
                "required for a key that is not bound to a project",
            ))
        })?;
    let project = load_project(state, p, project_id.as_str()).await?;
    if !p.owns(&project.org_id, &project.id) {
        return Err(ApiError::not_found("project"));
    }
    let url = check_url(state, &req.url)?;
    let event_types = check_types(req.event_types)?;
    let description = check_description(req.description)?;
    secrets_enabled()?;
    let secret = Secret::generate().map_err(ApiError::internal)?;
    let now = Utc::now();
    let hook = Webhook {
        id: format!("whk_{}", ulid::Ulid::new()),
        org_id: project.org_id,
        project_id: project.id,
        url,
        event_types,
        description,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        failing_since: None,
        previous_secret_expires_at: None,
        created_at: now,
        updated_at: now,
    };
    let webhook = state
        .store
        .create_webhook(&hook, secret.as_bytes(), &p.actor())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(WithSecret {
            webhook,
            secret: secret.reveal(),
        }),
    ))
}

/// Loads a webhook the key owns; anything else is the same 404.
async fn load_webhook(state: &AppState, p: &Principal, raw: &str) -> ApiResult<Webhook> {
    if !valid_webhook_id(raw) {
        return Err(ApiError::not_found("webhook"));
    }
    match state.store.get_webhook(raw).await? {
        Some(w) if p.owns(&w.org_id, &w.project_id) => Ok(w),
        _ => Err(ApiError::not_found("webhook")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ListWebhooks {
    project_id: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_webhooks(
    State(state): State<AppState>,
    p: Principal,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Page<Webhook>>> {
    p.require(Scope::SandboxesRead)?;
    // Who may ask comes before what was asked.
    let q: ListWebhooks = parse_query(raw.as_deref())?;
    let page = PageQuery {
        limit: crate::requests::page::parse_limit(q.limit.as_deref())?,
        cursor: q.cursor,
    };
    let after = page.cursor_id(|c| {
        if valid_webhook_id(c) {
            Ok(c.to_owned())
        } else {
            Err(())
        }
    })?;
    let project = match p.list_project(q.project_id.as_deref())? {
        crate::auth::ListProject::Only(project) => project,
        crate::auth::ListProject::Nothing => {
            return Ok(Json(Page {
                items: vec![],
                next_cursor: None,
            }))
        }
    };
    let rows = state
        .store
        .list_webhooks(
            &p.org_id,
            project.as_ref(),
            after.as_deref(),
            page.limit as usize + 1,
        )
        .await?;
    Ok(Json(Page::from_rows(rows, page.limit, |w| w.id.clone())))
}

async fn get_webhook(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<Webhook>> {
    p.require(Scope::SandboxesRead)?;
    Ok(Json(load_webhook(&state, &p, &id).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct PatchWebhook {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    /// `null` clears it; absent leaves it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    description: Option<Option<String>>,
    enabled: Option<bool>,
}

/// Tells a `null` field (`Some(None)`) from an absent one (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

async fn update_webhook(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<Webhook>> {
    p.require(Scope::SandboxesWrite)?;
    let hook = load_webhook(&state, &p, &id).await?;
    let req: PatchWebhook = parse_json(&body)?;
    let patch = WebhookPatch {
        url: req.url.map(|u| check_url(&state, &u)).transpose()?,
        event_types: req.event_types.map(check_types).transpose()?,
        description: req.description.map(check_description).transpose()?,
        enabled: req.enabled,
    };
    Ok(Json(
        state
            .store
            .update_webhook(&hook.id, &patch, &p.actor())
            .await?,
    ))
}

async fn delete_webhook(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    p.require(Scope::SandboxesWrite)?;
    let hook = load_webhook(&state, &p, &id).await?;
    state.store.delete_webhook(&hook.id, &p.actor()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/webhooks/{id}/rotate-secret`: a new secret, shown once; the replaced one keeps
/// signing next to it (two signatures per delivery) for the configured overlap.
async fn rotate_secret(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<WithSecret>> {
    p.require(Scope::SandboxesWrite)?;
    let hook = load_webhook(&state, &p, &id).await?;
    secrets_enabled()?;
    let secret = Secret::generate().map_err(ApiError::internal)?;
    let overlap = chrono::Duration::from_std(state.limits.webhooks.rotation_overlap)
        .unwrap_or(chrono::Duration::days(1));
    let webhook = state
        .store
        .rotate_webhook_secret(
            &hook.id,
            secret.as_bytes(),
            Utc::now() + overlap,
            &p.actor(),
        )
        .await?;
    Ok(Json(WithSecret {
        webhook,
        secret: secret.reveal(),
    }))
}

async fn list_deliveries(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Page<Delivery>>> {
    p.require(Scope::SandboxesRead)?;
    let page = PageQuery::parse(raw.as_deref())?;
    let hook = load_webhook(&state, &p, &id).await?;
    let after = page.cursor_id(|c| {
        if valid_delivery_id(c) {
            Ok(c.to_owned())
        } else {
            Err(())
        }
    })?;
    let rows = state
        .store
        .list_deliveries(&hook.id, after.as_deref(), page.limit as usize + 1)
        .await?;
    Ok(Json(Page::from_rows(rows, page.limit, |d| d.id.clone())))
}

/// `POST …/deliveries/{deliveryId}/redeliver`: due again now, with the same `webhook-id`.
async fn redeliver(
    State(state): State<AppState>,
    p: Principal,
    Path((id, delivery_id)): Path<(String, String)>,
) -> ApiResult<(StatusCode, Json<Delivery>)> {
    p.require(Scope::SandboxesWrite)?;
    let hook = load_webhook(&state, &p, &id).await?;
    if !valid_delivery_id(&delivery_id) {
        return Err(ApiError::not_found("delivery"));
    }
    match state.store.get_delivery(&delivery_id).await? {
        Some(d) if d.webhook_id == hook.id => {}
        _ => return Err(ApiError::not_found("delivery")),
    }
    let d = state
        .store
        .redeliver(&delivery_id, Utc::now(), &p.actor())
        .await?;
    Ok((StatusCode::ACCEPTED, Json(d)))
}
