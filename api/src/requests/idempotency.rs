//! `Idempotency-Key` on the creating POSTs whose rows do not carry one (organizations,
//! projects, keys, snapshots, pools): the first request claims the key in the store, its
//! answer is kept, and a retry with the same key and body gets that answer (with
//! `Idempotent-Replayed: true`) instead of creating a second one. Sandbox create keeps its
//! key on the row itself (`sandboxes.rs`), replayed inside its admission transaction.

use std::future::Future;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use differently_core::ErrorCode;
use differently_store::idempotency::{Claim, IdemKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::auth::{hex, Principal};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Longest `Idempotency-Key` accepted.
const MAX_KEY_LEN: usize = 255;

/// The request's `Idempotency-Key`, if it sent one; 400 if it is empty, too long or not
/// visible ASCII.
pub fn header_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_LEN)
        .map(|k| Some(k.to_owned()))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                "Idempotency-Key: must be 1-255 visible ASCII characters",
            )
        })
}

/// How a finished request's answer is given to a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// As it was.
    Answer,
    /// Never: the answer held a secret that is shown once (a new API key's `key`, a new
    /// webhook's `secret`), named here for the 409 (`"an API key"`, `"a webhook"`). The kept
    /// answer drops the secret, and a retry is told what was created and its id.
    SecretShownOnce(&'static str),
}

/// Runs `create` once per `Idempotency-Key` (when the request has one) of this API key on
/// `route`, for a request with `body`. `route` is the method and the CONCRETE path
/// (`POST /v1/sandboxes/sbx_…/snapshots`), never the route template: a key is scoped to the
/// resource it was sent to, so one key sent to two sandboxes makes two snapshots.
pub async fn once<F, Fut>(
    state: &AppState,
    principal: &Principal,
    headers: &HeaderMap,
    route: &str,
    body: &[u8],
    replay: Replay,
    create: F,
) -> ApiResult<Response>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ApiResult<(StatusCode, Value)>>,
{
    let Some(key) = header_key(headers)? else {
        let (status, value) = create().await?;
        return Ok((status, Json(value)).into_response());
    };
    let k = IdemKey {
        owner: principal.key_id.clone(),
        route: route.to_owned(),
        key,
    };
    let mut digest = Sha256::new();
    digest.update(route.as_bytes());
    digest.update(b"\n");
    digest.update(body);
    let request_hash = hex(&digest.finalize());
    match state
        .store
        .claim_idempotency(&k, &request_hash, Utc::now())
        .await?
    {
        Claim::Fresh => {}
        Claim::Replay { status, body } => return replayed(replay, status, body),
        Claim::Mismatch => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                "Idempotency-Key was already used with a different request body",
            ))
        }
        Claim::InFlight => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                "a request with this Idempotency-Key is still in progress; retry shortly",
            ))
        }
    }
    match create().await {
        Ok((status, value)) => {
            let mut kept = value.clone();
            if matches!(replay, Replay::SecretShownOnce(_)) {
                if let Some(o) = kept.as_object_mut() {
                    // An API key's `key`, a webhook's signing `secret`.
                    o.remove("key");
                    o.remove("secret");
                }
            }
            if let Err(e) = state
                .store
                .finish_idempotency(&k, status.as_u16(), &kept)
                .await
            {
                // Created all the same: this caller gets its answer; a retry is told the
                // key is in progress until the claim lapses.
                tracing::warn!(route, error = %e, "recording an idempotent answer failed");
            }
            Ok((status, Json(value)).into_response())
        }
        Err(e) => {
            if let Err(re) = state.store.release_idempotency(&k).await {
                tracing::warn!(route, error = %re, "releasing an Idempotency-Key failed");
            }
            Err(e)
        }
    }
}

fn replayed(replay: Replay, status: u16, body: Value) -> ApiResult<Response> {
    if let Replay::SecretShownOnce(what) = replay {
        let id = body.get("id").cloned().unwrap_or(Value::Null);
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!(
                "this Idempotency-Key already created {what}; its secret was shown once and \
                 cannot be shown again (delete it and create another if it was lost)"
            ),
        )
        .with_details(json!({ "id": id })));
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut resp = (status, Json(body)).into_response();
    resp.headers_mut()
        .insert("idempotent-replayed", HeaderValue::from_static("true"));
    Ok(resp)
}

/// A typed answer as the JSON `once` keeps.
pub fn json_answer<T: serde::Serialize>(
    (status, Json(body)): (StatusCode, Json<T>),
) -> ApiResult<(StatusCode, Value)> {
    Ok((
        status,
        serde_json::to_value(body).map_err(ApiError::internal)?,
    ))
}
