//! `/v1/admin/secrets`: credentials stored sealed. A value is accepted once and never served
//! back, only its fingerprint.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, put};
use axum::{Json, Router};
use differently_core::tenancy::Scope;
use differently_core::ErrorCode;
use differently_store::secrets::{validate_secret_name, SecretInfo};
use serde::Deserialize;
use serde_json::json;

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::requests::page::Page;
use crate::AppState;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/secrets", get(list_secrets))
        .route("/v1/admin/secrets/{name}", put(put_secret))
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

/// `PUT`'s body: the document's `SecretRequest` (the value is never served back).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretRequest {
    value: String,
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
    let required = || bad("value: a non-empty string is required");
    let req: SecretRequest = serde_json::from_value(v).map_err(|_| required())?;
    if req.value.is_empty() {
        return Err(required());
    }
    Ok(req.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str) -> Result<String, String> {
        secret_value(&Bytes::from(body.to_owned())).map_err(|e| e.message)
    }

    /// The body is read into `SecretRequest`; every refusal is one of three fixed messages,
    /// none quoting what was sent.
    #[test]
    fn a_secret_body_is_one_non_empty_string_value() {
        assert_eq!(message(r#"{"value":"s3cr3t"}"#), Ok("s3cr3t".to_owned()));
        let required = Err("value: a non-empty string is required".to_owned());
        for body in [
            r#"{"value":""}"#,
            r#"{"value":7}"#,
            "{}",
            r#"{"value":null}"#,
        ] {
            assert_eq!(message(body), required, "{body}");
        }
        assert_eq!(
            message(r#"{"value":"s3cr3t","extra":1}"#),
            Err("only the field value is accepted".to_owned())
        );
        assert_eq!(
            message(r#"["s3cr3t"]"#),
            Err("expected a JSON body {\"value\": \"…\"}".to_owned())
        );
    }
}
