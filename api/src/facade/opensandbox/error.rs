//! OpenSandbox's error body, `{code, message}`, and the mapping of `/v1` errors onto it.
//! Codes keep OpenSandbox's names where one exists (clients match suffixes such as
//! `SANDBOX_NOT_FOUND`), namespaced `DIFFERENTLY::` like the real server's `DOCKER::`.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use differently_core::ErrorCode;
use serde_json::{json, Value};

use super::inner::Caller;
use super::mapping::{self, Asked};
use crate::requests::body::JsonError;
use crate::requests::middleware::Refusal;

/// An error as the facade serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsbError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub retry_after: Option<String>,
    /// The `/v1` field a mapped `/v1` refusal named (`details.field`), so
    /// [`OsbError::named_for`] can name it as the OpenSandbox request spelled it.
    pub field: Option<String>,
}

impl OsbError {
    /// An error with an explicit status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> OsbError {
        OsbError {
            status,
            code: code.to_owned(),
            message: message.into(),
            retry_after: None,
            field: None,
        }
    }

    /// 400 naming the request field that cannot be mapped or is malformed.
    pub fn field(field: &str, why: impl std::fmt::Display) -> OsbError {
        OsbError::new(
            StatusCode::BAD_REQUEST,
            "SANDBOX::INVALID_PARAMETER",
            format!("{field}: {why}"),
        )
    }

    /// 400 for a `/v1` check run here (a path's), named as the client's `field`: the check's
    /// own error already starts with its field, which is not repeated.
    pub fn checked(field: &str, e: differently_core::FieldError) -> OsbError {
        OsbError::field(field, e.message)
    }

    /// 400 `code` for a body (or part) that is not the JSON asked for, as execd answers it;
    /// a key named twice is named by its path.
    pub fn json(code: &str, e: JsonError) -> OsbError {
        let message = match e {
            JsonError::DuplicateKey { path } => format!("{path}: duplicate key"),
            other => other.to_string(),
        };
        OsbError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 400 for a request field Differently has no equivalent of.
    pub fn unsupported_field(field: &str, why: &str) -> OsbError {
        OsbError::new(
            StatusCode::BAD_REQUEST,
            "SANDBOX::INVALID_PARAMETER",
            format!("{field} is not supported by the Differently facade: {why}"),
        )
    }

    /// 501 for an execd feature the facade does not serve.
    pub fn not_supported(what: &str) -> OsbError {
        OsbError::new(
            StatusCode::NOT_IMPLEMENTED,
            "NOT_SUPPORTED",
            format!("{what} is not supported by the Differently facade"),
        )
    }

    /// 401 for a key that is not a Differently key at all.
    pub fn invalid_key() -> OsbError {
        OsbError::new(
            StatusCode::UNAUTHORIZED,
            "INVALID_API_KEY",
            "missing or invalid API key",
        )
    }

    /// 500 whose cause is logged, not served.
    pub fn internal(cause: impl std::fmt::Display) -> OsbError {
        tracing::error!(error = %cause, "opensandbox facade: internal error");
        OsbError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "DIFFERENTLY::INTERNAL",
            "internal error",
        )
    }

    /// The mapping of a `/v1` error answer (`{"error": {code, message, details}}`).
    pub fn from_v1(status: StatusCode, body: &[u8], caller: &Caller) -> OsbError {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().unwrap_or("");
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or("request failed")
            .to_owned();
        let details = &v["error"]["details"];
        let field = details["field"].as_str().map(str::to_owned);
        // A killed sandbox is gone for OpenSandbox clients on every route (the real server
        // has no such sandbox any more): `/v1`'s "needs a running sandbox" conflict of a
        // terminating or terminated one is the 404 a lifecycle `GET` answers.
        if code == "conflict" {
            if let Some(gone) = details["status"].as_str().filter(|s| mapping::is_gone(s)) {
                return OsbError::new(
                    StatusCode::NOT_FOUND,
                    "DIFFERENTLY::SANDBOX_NOT_FOUND",
                    format!("sandbox not found (it is {gone})"),
                );
            }
        }
        let mapped = match (code, caller) {
            ("unauthenticated", Caller::Anonymous) => "MISSING_API_KEY".to_owned(),
            ("unauthenticated", _) => "INVALID_API_KEY".to_owned(),
            ("not_found", _) if message.starts_with("no such file") => "FILE_NOT_FOUND".into(),
            ("not_found", _) if message.contains("snapshot") => {
                "DIFFERENTLY::SNAPSHOT_NOT_FOUND".into()
            }
            ("not_found", _) => "DIFFERENTLY::SANDBOX_NOT_FOUND".into(),
            ("invalid_argument" | "validation_failed", _) => "SANDBOX::INVALID_PARAMETER".into(),
            ("", _) => format!("DIFFERENTLY::HTTP_{}", status.as_u16()),
            (other, _) => format!("DIFFERENTLY::{}", other.to_ascii_uppercase()),
        };
        // OpenSandbox answers bad input with 400 (its FastAPI 422s carry another shape).
        let status = if code == "validation_failed" {
            StatusCode::BAD_REQUEST
        } else {
            status
        };
        OsbError {
            status,
            code: mapped,
            message,
            retry_after: None,
            field,
        }
    }

    /// This error with the `/v1` field it names (see [`mapping::V1_FIELDS`]) renamed to the
    /// field of the OpenSandbox request `asked` that the facade filled it from, in the
    /// message too, and the `/v1` unit added where the client's differs.
    pub fn named_for(mut self, asked: Asked) -> OsbError {
        let Some(v1) = self.field.take() else {
            return self;
        };
        let Some((osb, unit)) = mapping::client_field(asked, &v1) else {
            self.field = Some(v1);
            return self;
        };
        if let Some(rest) = self.message.strip_prefix(v1.as_str()) {
            if rest.starts_with(':') || rest.starts_with(' ') {
                let mut m = format!("{osb}{rest}");
                if !unit.is_empty() && !m.contains(unit) {
                    m.push_str(&format!(" ({unit})"));
                }
                self.message = m;
            }
        }
        self.field = Some(osb);
        self
    }
}

impl OsbError {
    /// [`OsbError::from_v1`] of an answer with these `headers`, keeping its `Retry-After`
    /// (a 503 or 429 says when to try again; the SDKs and proxies read it).
    pub fn from_v1_answer(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        caller: &Caller,
    ) -> OsbError {
        let mut e = OsbError::from_v1(status, body, caller);
        e.retry_after = headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        e
    }
}

impl IntoResponse for OsbError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({ "code": self.code, "message": self.message })),
        )
            .into_response();
        if let Some(v) = self
            .retry_after
            .and_then(|s| HeaderValue::from_str(&s).ok())
        {
            r.headers_mut().insert("retry-after", v);
        }
        r
    }
}

/// A facade handler's result.
pub type OsbResult<T> = Result<T, OsbError>;

impl OsbError {
    /// A refusal made outside the facade's handlers (axum's 405 and 413, a path or query it
    /// cannot read, and the checks before routing: a long target, a late body, a NUL in the
    /// query), as `crate::requests::middleware` serves it under the facade's prefix: the
    /// SDKs read only `{code, message}`. Codes follow [`OsbError::from_v1`]; a status axum
    /// answered on its own is named by its number.
    pub fn refused(r: &Refusal, method: &Method, path: &str) -> OsbError {
        let code = match r.error.code {
            _ if r.by_status && r.status != StatusCode::BAD_REQUEST => {
                format!("DIFFERENTLY::HTTP_{}", r.status.as_u16())
            }
            ErrorCode::InvalidArgument | ErrorCode::ValidationFailed => {
                "SANDBOX::INVALID_PARAMETER".to_owned()
            }
            other => format!("DIFFERENTLY::{}", other.as_str().to_ascii_uppercase()),
        };
        let message = if r.error.code == ErrorCode::MethodNotAllowed {
            format!("{method} is not allowed on {path} (the Allow header lists what is)")
        } else {
            r.error.message.clone()
        };
        OsbError::new(r.status, &code, message)
    }
}

/// Any path under the facade's prefix that no route serves (OpenSandbox's templates,
/// pools, diagnostics, `PATCH …/metadata`): 404 in the facade's envelope, naming what was
/// asked, where the router's own fallback would answer in `/v1`'s.
pub async fn unknown_route(method: Method, uri: axum::http::Uri) -> OsbError {
    OsbError::new(
        StatusCode::NOT_FOUND,
        "DIFFERENTLY::ROUTE_NOT_FOUND",
        format!(
            "{method} {} is not served by the Differently facade (docs/opensandbox-facade.md lists what is)",
            uri.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict(status: &str) -> OsbError {
        let body = json!({"error": {"code": "conflict",
            "message": format!("this call needs a running sandbox (the sandbox is {status})"),
            "details": {"status": status}}});
        OsbError::from_v1(
            StatusCode::CONFLICT,
            body.to_string().as_bytes(),
            &Caller::Anonymous,
        )
    }

    #[test]
    fn a_killed_sandboxs_conflict_is_not_found_and_a_paused_ones_stays() {
        for gone in ["terminating", "terminated"] {
            let e = conflict(gone);
            assert_eq!(e.status, StatusCode::NOT_FOUND);
            assert_eq!(e.code, "DIFFERENTLY::SANDBOX_NOT_FOUND");
        }
        let e = conflict("paused");
        assert_eq!(e.status, StatusCode::CONFLICT);
        assert_eq!(e.code, "DIFFERENTLY::CONFLICT");
        assert!(e.message.contains("paused"), "{}", e.message);
    }

    #[test]
    fn a_v1_field_is_named_as_the_client_sent_it() {
        let body = json!({"error": {"code": "validation_failed",
            "message": "labels.k: values at most 255", "details": {"field": "labels.k"}}});
        let e = OsbError::from_v1(
            StatusCode::UNPROCESSABLE_ENTITY,
            body.to_string().as_bytes(),
            &Caller::Anonymous,
        );
        let create = e.clone().named_for(Asked::Create);
        assert_eq!(create.message, "metadata.k: values at most 255");
        assert_eq!(create.field.as_deref(), Some("metadata.k"));
        // A field the request did not fill from another keeps its name.
        assert_eq!(
            e.named_for(Asked::Command).message,
            "labels.k: values at most 255"
        );
    }
}
