//! Stable error codes of the `/v1` API and their HTTP status, defined once.

use serde::{Deserialize, Serialize};

/// Every error code a client can receive. The string form is the contract; never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    Conflict,
    PayloadTooLarge,
    ValidationFailed,
    NoEligiblePool,
    UnsupportedCapability,
    RateLimited,
    QuotaExceeded,
    Internal,
    UnsupportedOperation,
    ProviderUnavailable,
    InsufficientCapacity,
    /// The route exists but not with this method (the `Allow` header lists those it has).
    MethodNotAllowed,
    /// The request's body did not arrive within the server's body read timeout.
    RequestTimeout,
    /// The request target is longer than the server accepts.
    UriTooLong,
}

impl ErrorCode {
    /// Every code, for documents that list them (the served OpenAPI document).
    pub const ALL: [ErrorCode; 18] = [
        Self::InvalidArgument,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::NotFound,
        Self::Conflict,
        Self::PayloadTooLarge,
        Self::ValidationFailed,
        Self::NoEligiblePool,
        Self::UnsupportedCapability,
        Self::RateLimited,
        Self::QuotaExceeded,
        Self::Internal,
        Self::UnsupportedOperation,
        Self::ProviderUnavailable,
        Self::InsufficientCapacity,
        Self::MethodNotAllowed,
        Self::RequestTimeout,
        Self::UriTooLong,
    ];

    /// The wire form, e.g. `invalid_argument`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::PayloadTooLarge => "payload_too_large",
            Self::ValidationFailed => "validation_failed",
            Self::NoEligiblePool => "no_eligible_pool",
            Self::UnsupportedCapability => "unsupported_capability",
            Self::RateLimited => "rate_limited",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Internal => "internal",
            Self::UnsupportedOperation => "unsupported_operation",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::InsufficientCapacity => "insufficient_capacity",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RequestTimeout => "request_timeout",
            Self::UriTooLong => "uri_too_long",
        }
    }

    /// The HTTP status this code is always served with.
    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidArgument => 400,
            Self::Unauthenticated => 401,
            Self::PermissionDenied => 403,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::RequestTimeout => 408,
            Self::Conflict => 409,
            Self::PayloadTooLarge => 413,
            Self::UriTooLong => 414,
            Self::ValidationFailed | Self::NoEligiblePool | Self::UnsupportedCapability => 422,
            Self::RateLimited | Self::QuotaExceeded => 429,
            Self::Internal => 500,
            Self::UnsupportedOperation => 501,
            Self::ProviderUnavailable | Self::InsufficientCapacity => 503,
        }
    }
}

/// A validation failure that names the offending field (JSON path such as `resources.cpu`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Dotted path of the field in the request body or query.
    pub field: String,
    /// What is wrong with it, for a person.
    pub message: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn all_lists_every_code_once_in_declaration_order() {
        // A new variant stops this match from compiling until it has its place in `ALL`.
        let index = |c: ErrorCode| match c {
            ErrorCode::InvalidArgument => 0,
            ErrorCode::Unauthenticated => 1,
            ErrorCode::PermissionDenied => 2,
            ErrorCode::NotFound => 3,
            ErrorCode::Conflict => 4,
            ErrorCode::PayloadTooLarge => 5,
            ErrorCode::ValidationFailed => 6,
            ErrorCode::NoEligiblePool => 7,
            ErrorCode::UnsupportedCapability => 8,
            ErrorCode::RateLimited => 9,
            ErrorCode::QuotaExceeded => 10,
            ErrorCode::Internal => 11,
            ErrorCode::UnsupportedOperation => 12,
            ErrorCode::ProviderUnavailable => 13,
            ErrorCode::InsufficientCapacity => 14,
            ErrorCode::MethodNotAllowed => 15,
            ErrorCode::RequestTimeout => 16,
            ErrorCode::UriTooLong => 17,
        };
        for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(index(code), i, "{} is out of place in ALL", code.as_str());
        }
    }
}
