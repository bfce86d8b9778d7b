//! Connect-RPC over HTTP/1.1 with the JSON codec, as envd speaks it and the E2B SDKs expect:
//! unary calls are a JSON body answered `200 application/json` (errors: the Connect status
//! and `{"code": "<connect code>", "message"}`); server streams take one enveloped request
//! and answer `200 application/connect+json` with enveloped messages (flag 0) and one end
//! envelope (flag 2) carrying `{}` or `{"error": …}`. An envelope is a flag byte, a 4-byte
//! big-endian length and the JSON.

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::requests::body::JsonError;

/// Content type of a Connect stream.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
const END_STREAM: u8 = 0x02;

/// A Connect error: one of Connect's code names and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

impl ConnectError {
    /// An error with a Connect code.
    pub fn new(code: &'static str, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// `invalid_argument` naming the field.
    pub fn field(field: &str, why: impl std::fmt::Display) -> ConnectError {
        ConnectError::new("invalid_argument", format!("{field}: {why}"))
    }

    /// `invalid_argument` for a `what` (the body, a stream message) that is not the JSON asked
    /// for; a key named twice is named by its path.
    pub fn malformed(what: &str, e: JsonError) -> ConnectError {
        match e {
            JsonError::DuplicateKey { path } => ConnectError::field(&path, "duplicate key"),
            other => ConnectError::field(what, other),
        }
    }

    /// `unimplemented` for an RPC the facade does not serve yet, saying why.
    pub fn unimplemented(what: &str, why: &str) -> ConnectError {
        ConnectError::new(
            "unimplemented",
            format!("{what} is not supported by the Differently E2B facade yet: {why}"),
        )
    }

    /// `internal`, with the cause logged and not served.
    pub fn internal(cause: impl std::fmt::Display) -> ConnectError {
        tracing::error!(error = %cause, "e2b facade: envd internal error");
        ConnectError::new("internal", "internal error")
    }

    /// The HTTP status of a unary answer carrying this code (Connect's table).
    pub fn status(&self) -> StatusCode {
        match self.code {
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "permission_denied" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "canceled" => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The JSON of this error.
    pub fn json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }

    /// The Connect code of a `/v1` error code.
    pub fn code_of_v1(v1_code: &str) -> &'static str {
        match v1_code {
            "not_found" => "not_found",
            "unauthenticated" => "unauthenticated",
            "permission_denied" => "permission_denied",
            "invalid_argument" | "validation_failed" => "invalid_argument",
            "conflict" => "failed_precondition",
            "rate_limited" | "quota_exceeded" | "payload_too_large" => "resource_exhausted",
            "unsupported_operation" | "unsupported_capability" => "unimplemented",
            "provider_unavailable" | "insufficient_capacity" => "unavailable",
            "request_timeout" => "deadline_exceeded",
            _ => "unknown",
        }
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), self.json().to_string()).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

/// A unary success answer.
pub fn unary(v: Value) -> Response {
    let mut r = (StatusCode::OK, v.to_string()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// One envelope.
pub fn envelope(flags: u8, msg: &Value) -> Bytes {
    let json = msg.to_string();
    let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
    let mut v = Vec::with_capacity(5 + json.len());
    v.push(flags);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(json.as_bytes());
    Bytes::from(v)
}

/// A stream message.
pub fn message(msg: &Value) -> Bytes {
    envelope(0, msg)
}

/// The end envelope: `{}`, or the error.
pub fn end(error: Option<&ConnectError>) -> Bytes {
    match error {
        None => envelope(END_STREAM, &json!({})),
        Some(e) => envelope(END_STREAM, &json!({ "error": e.json() })),
    }
}

/// The request message of a call: the first enveloped message of a streaming request
/// (`application/connect+json`), else the body as JSON (unary). An empty unary body is `{}`.
pub fn request(content_type: Option<&str>, body: &[u8]) -> Result<Value, ConnectError> {
    let streaming = content_type.is_some_and(|c| c.starts_with(STREAM_CONTENT_TYPE));
    let json: &[u8] = if streaming {
        if body.len() < 5 {
            return Err(ConnectError::field("body", "expected an enveloped message"));
        }
        if body[0] & 0x01 != 0 {
            return Err(ConnectError::new(
                "unimplemented",
                "compressed messages are not supported (send identity encoding)",
            ));
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        body.get(5..5 + len)
            .ok_or_else(|| ConnectError::field("body", "the envelope is shorter than its length"))?
    } else {
        body
    };
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    crate::requests::body::read_value(json).map_err(|e| ConnectError::malformed("body", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_the_end_carries_the_error() {
        let m = message(&json!({"a": 1}));
        assert_eq!(&m[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(
            request(Some("application/connect+json"), &m).unwrap(),
            json!({"a": 1})
        );
        let e = end(Some(&ConnectError::new("not_found", "x")));
        assert_eq!(e[0], 2);
        let v: Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(request(Some("application/json"), b"").unwrap(), json!({}));
        assert!(request(Some("application/connect+json"), &[0, 0, 0, 0, 9, b'{']).is_err());
    }

    #[test]
    fn a_key_named_twice_is_invalid_argument_naming_it() {
        let twice = br#"{"path":"/a","watch":{"path":"/b","path":"/c"}}"#;
        for e in [
            request(Some("application/json"), twice),
            request(Some("application/connect+json"), &message_bytes(twice)),
        ] {
            let e = e.expect_err("refused");
            assert_eq!(e.code, "invalid_argument");
            assert_eq!(e.message, "watch.path: duplicate key");
        }
    }

    fn message_bytes(json: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&u32::try_from(json.len()).unwrap_or(0).to_be_bytes());
        m.extend_from_slice(json);
        m
    }
}
