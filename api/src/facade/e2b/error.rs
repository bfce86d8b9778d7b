//! The control plane's error answer, `{"code": <int>, "message": "…"}`, and the mapping of
//! `/v1` errors onto the statuses the E2B SDKs turn into their exception types (401
//! authentication, 404 not found, 409 on pause "already paused", 429 rate limit, 503 busy,
//! anything else a `SandboxException` carrying the status). The Python SDK decodes every
//! listed error status with that exact model and crashes on another shape, so every answer
//! under `/e2b` that is not a success is this body.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::facade::opensandbox::error::OsbError;
use crate::requests::body::JsonError;

/// An error as the control plane serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
    /// `Should-Retry`: `Some(false)` where a retry would duplicate work (the Python SDK
    /// retries 429/502/503/504 on every method, POST included, unless told not to).
    pub should_retry: Option<bool>,
    pub retry_after: Option<String>,
}

impl E2bError {
    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
            should_retry: None,
            retry_after: None,
        }
    }

    /// 400 naming the request field.
    pub fn field(field: &str, why: impl std::fmt::Display) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, format!("{field}: {why}"))
    }

    /// 400 for a body that is not the JSON asked for; a key named twice is named by its path.
    pub fn json(e: JsonError) -> E2bError {
        match e {
            JsonError::DuplicateKey { path } => E2bError::field(&path, "duplicate key"),
            other => E2bError::field("body", other),
        }
    }

    /// 401 without a key.
    pub fn missing_key() -> E2bError {
        E2bError::new(
            StatusCode::UNAUTHORIZED,
            "missing X-API-KEY: use a Differently API key (dly_…) as E2B_API_KEY",
        )
    }

    /// 404 for a sandbox the caller cannot see (absent, ended, or another tenant's).
    pub fn sandbox_not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    /// 500 whose cause is logged, not served.
    pub fn internal(cause: impl std::fmt::Display) -> E2bError {
        tracing::error!(error = %cause, "e2b facade: internal error");
        E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }

    /// Marks the error as one the SDK must not retry.
    pub fn no_retry(mut self) -> E2bError {
        self.should_retry = Some(false);
        self
    }

    /// The mapping of a `/v1` error answer (`{"error": {code, message}}`).
    pub fn from_v1(status: StatusCode, body: &[u8]) -> E2bError {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("");
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or("request failed")
            .to_owned();
        let status = match code {
            // E2B answers bad input with 400.
            "validation_failed" | "invalid_argument" => StatusCode::BAD_REQUEST,
            _ => status,
        };
        E2bError {
            status,
            message,
            should_retry: None,
            retry_after: None,
        }
    }

    /// The facade's own failures reaching `/v1` (a key that is not a header value, an
    /// inner request that could not be built).
    pub fn from_osb(e: OsbError) -> E2bError {
        E2bError::new(e.status, e.message)
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({ "code": self.status.as_u16(), "message": self.message })),
        )
            .into_response();
        if let Some(retry) = self.should_retry {
            r.headers_mut().insert(
                "should-retry",
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        if let Some(v) = self
            .retry_after
            .and_then(|s| HeaderValue::from_str(&s).ok())
        {
            r.headers_mut().insert("retry-after", v);
        }
        r
    }
}

/// A control-plane handler's result.
pub type E2bResult<T> = Result<T, E2bError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_errors_keep_their_status_and_message_and_bad_input_is_400() {
        let body = br#"{"error":{"code":"validation_failed","message":"env: bad name"}}"#;
        let e = E2bError::from_v1(StatusCode::UNPROCESSABLE_ENTITY, body);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.message, "env: bad name");
        let e = E2bError::from_v1(StatusCode::NOT_FOUND, b"not json");
        assert_eq!(
            (e.status, e.message.as_str()),
            (StatusCode::NOT_FOUND, "request failed")
        );
    }
}
