//! The one mapping from every internal error to an HTTP response. Internal details are
//! logged with the request id and never echoed to clients.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use differently_adapters::AdapterError;
use differently_core::request_id::current_request_id;
use differently_core::{ErrorCode, FieldError};
use differently_store::StoreError;
use serde::Serialize;
use serde_json::{json, Value};

/// `Retry-After` of a 503 for a database that cannot be reached: a pool timeout or a
/// restart is usually over in a few seconds.
pub const DATABASE_RETRY_AFTER_SECONDS: u64 = 2;

/// An error as served: `{"error": {code, message, details, requestId}}`. `requestId` is read
/// when the response is made, inside the request-id middleware's scope.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with a code and a message for the client.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// Attaches machine-readable details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Asks the client to retry after `secs` (`Retry-After`).
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 404 that does not reveal whether the thing exists for someone else.
    pub fn not_found(what: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("{what} not found"))
    }

    /// 500 whose cause is logged with the request's id (the one its body and `X-Request-Id`
    /// carry, so an operator finds the cause from what the client saw), not served.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        let request_id = current_request_id();
        tracing::error!(request_id = request_id.as_deref().unwrap_or("-"), error = %cause, "internal error");
        Self::new(ErrorCode::Internal, "internal error")
    }

    /// 400/422 naming the offending field.
    pub fn field(code: ErrorCode, e: FieldError) -> Self {
        Self::new(code, e.to_string()).with_details(json!({ "field": e.field }))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::not_found("resource"),
            StoreError::StatusConflict { current } => ApiError::new(
                ErrorCode::Conflict,
                format!("the sandbox changed concurrently; it is now {current}"),
            )
            .with_details(json!({ "status": current })),
            StoreError::IllegalTransition { from, to } => ApiError::new(
                ErrorCode::Conflict,
                format!("a {from} sandbox cannot become {to}"),
            ),
            StoreError::IdempotencyMismatch => ApiError::new(
                ErrorCode::Conflict,
                "Idempotency-Key was already used with a different request body",
            ),
            StoreError::AlreadyExists(m) => {
                ApiError::new(ErrorCode::Conflict, format!("{m} already exists"))
            }
            StoreError::HasDependents(m) => ApiError::new(ErrorCode::Conflict, m),
            StoreError::QuotaExceeded(m) => ApiError::new(ErrorCode::QuotaExceeded, m),
            StoreError::NeverFits(f) => ApiError::new(ErrorCode::QuotaExceeded, f.message)
                .with_details(json!({ "field": f.field })),
            e if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                ApiError::new(
                    ErrorCode::ProviderUnavailable,
                    "the database is unavailable; retry shortly",
                )
                .with_retry_after(DATABASE_RETRY_AFTER_SECONDS)
            }
            StoreError::InvalidValue(field) => ApiError::field(ErrorCode::ValidationFailed, field),
            StoreError::Database(e) => ApiError::internal(e),
            StoreError::Internal(m) => ApiError::internal(m),
        }
    }
}

impl From<AdapterError> for ApiError {
    fn from(e: AdapterError) -> Self {
        match e {
            AdapterError::Unsupported(m) => ApiError::new(ErrorCode::UnsupportedOperation, m),
            AdapterError::Unavailable(m) | AdapterError::Transient(m) => {
                tracing::warn!(error = %m, "backend call failed");
                ApiError::new(
                    ErrorCode::ProviderUnavailable,
                    "the sandbox's backend is unavailable",
                )
            }
            AdapterError::Capacity(m) => {
                tracing::warn!(error = %m, "backend has no capacity");
                let e = ApiError::new(
                    ErrorCode::InsufficientCapacity,
                    "the sandbox's backend has no capacity for this now; retry later",
                );
                // The provider's own wait, rounded up to whole seconds, when it gave one.
                match m.retry_after() {
                    Some(d) => e.with_retry_after(d.as_secs_f64().ceil().max(1.0) as u64),
                    None => e,
                }
            }
            AdapterError::NotFound => ApiError::new(
                ErrorCode::ProviderUnavailable,
                "the sandbox's backend instance is missing",
            ),
            AdapterError::Permanent(m) => match m.field() {
                Some(field) => ApiError::new(ErrorCode::ValidationFailed, m.message())
                    .with_details(json!({ "field": field })),
                None => ApiError::new(ErrorCode::ValidationFailed, m),
            },
            AdapterError::PathNotFound(p) => ApiError::new(
                ErrorCode::NotFound,
                format!("{p}: no such file or directory"),
            ),
            // The sandbox's filesystem as it stands refuses the path: the caller's to change.
            AdapterError::BadPath(p) => ApiError::new(ErrorCode::Conflict, p.to_string())
                .with_details(json!({ "field": "path", "reason": p.problem.code() })),
        }
    }
}

/// An error's body as served: the document's `Error`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorObject,
}

/// The error inside [`ErrorBody`].
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ErrorObject {
    #[schema(value_type = String)]
    code: ErrorCode,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, nullable = false)]
    details: Option<Value>,
    /// The id the request-id middleware gave this request (`X-Request-Id`, audit records).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    request_id: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: ErrorObject {
                code: self.code,
                message: self.message,
                details: self.details,
                request_id: current_request_id(),
            },
        };
        let mut resp = (status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

/// Handler result.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_database_is_a_503_with_retry_after_and_a_failed_query_a_500() {
        let lost = ApiError::from(StoreError::from(sqlx::Error::PoolTimedOut));
        assert_eq!(lost.code, ErrorCode::ProviderUnavailable);
        let resp = lost.into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            resp.headers()["retry-after"],
            DATABASE_RETRY_AFTER_SECONDS.to_string().as_str()
        );
        let failed = ApiError::from(StoreError::from(sqlx::Error::ColumnNotFound("x".into())));
        assert_eq!(failed.code, ErrorCode::Internal);
        assert!(failed.retry_after.is_none());
    }

    #[test]
    fn a_path_the_sandbox_refuses_is_a_409_naming_the_path_never_a_503() {
        use differently_adapters::PathProblem;
        for (problem, reason) in [
            (PathProblem::IsADirectory, "is_a_directory"),
            (PathProblem::NotADirectory, "not_a_directory"),
            (PathProblem::ReadOnly, "read_only_path"),
            (PathProblem::NotADirectoryHere, "exists_not_directory"),
        ] {
            let api = ApiError::from(AdapterError::bad_path("/work/d", problem));
            assert_eq!(api.code, ErrorCode::Conflict);
            assert!(api.message.starts_with("/work/d: "), "{}", api.message);
            assert_eq!(
                api.details,
                Some(json!({ "field": "path", "reason": reason }))
            );
            assert_eq!(api.into_response().status(), StatusCode::CONFLICT);
        }
    }

    #[test]
    fn a_backend_without_capacity_is_insufficient_capacity_with_its_wait() {
        let e = AdapterError::capacity(
            "create: HTTP 429: plan limit, key e2b_x",
            Some(std::time::Duration::from_millis(2500)),
        );
        let api = ApiError::from(e);
        assert_eq!(api.code, ErrorCode::InsufficientCapacity);
        assert!(!api.message.contains("e2b_x"), "{}", api.message);
        let resp = api.into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()["retry-after"], "3");
        let api = ApiError::from(AdapterError::capacity("full", None));
        assert_eq!(api.code, ErrorCode::InsufficientCapacity);
        assert!(api.retry_after.is_none());
    }
}
