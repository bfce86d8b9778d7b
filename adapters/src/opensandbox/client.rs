//! What is OpenSandbox's own about talking to it: the key header it reads, how its and
//! execd's error bodies read and which codes mean what. The rest (the key attached only to
//! the server's own origin and read at send time, scrubbing, TLS, timeouts) is the shared
//! [`crate::http::HttpClient`].

use bytes::Bytes;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;

use super::config::Settings;
use crate::credentials::Credentials;
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::kit::ErrorAnswer;
use crate::AdapterError;

/// Header the OpenSandbox server reads its API key from.
pub(crate) const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";

/// HTTP client bound to one OpenSandbox server.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: HttpClient,
}

impl Client {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, HttpConfigError> {
        let http = HttpClientBuilder::new("OpenSandbox", settings.api_url.clone())
            .auth(
                API_KEY_HEADER,
                "API key",
                settings.credential.clone(),
                settings.initial_key.clone(),
            )
            .connect_timeout(std::time::Duration::from_secs(10))
            .request_timeout(settings.request_timeout)
            .ca_bundle(settings.ca_bundle.clone())
            .errors(map_answer)
            .build(credentials)?;
        Ok(Self { http })
    }

    /// Whether `url` is on the OpenSandbox server itself (so the key may be sent).
    pub(crate) fn is_server(&self, url: &str) -> bool {
        self.http.is_backend(url)
    }

    /// A lifecycle API request (`path` starts with `/`) with the request timeout; `send`
    /// adds the key.
    pub(crate) fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.api(method, path)
    }

    /// A request to any URL; `send` adds the key only if the URL is on the server (its proxy).
    /// No overall timeout: callers set one or watch the stream themselves.
    pub(crate) fn to(&self, method: Method, url: &str) -> RequestBuilder {
        self.http.to(method, url)
    }

    pub(crate) fn request_timeout(&self) -> std::time::Duration {
        self.http.request_timeout()
    }

    /// Sends and maps transport errors; `op` says what was being done (for messages). The
    /// key, read now, is attached only to the server's own origin; a key header on any
    /// other request (e.g. copied from an endpoint answer) is removed.
    pub(crate) async fn send(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        self.http.send(rb, op).await
    }

    /// Sends and requires a 2xx answer; an error answer goes through [`map_status`].
    pub(crate) async fn send_ok(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        self.http.send_ok(rb, op).await
    }

    /// Sends, requires 2xx and decodes a JSON body.
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        self.http.json(rb, op).await
    }

    /// Maps a transport failure: unreachable → Unavailable, everything else → Transient.
    pub(crate) fn transport_error(&self, op: &str, e: reqwest::Error) -> AdapterError {
        self.http.transport_error(op, e)
    }

    /// Maps an error answer already read (the kit client re-reads a refused key and
    /// scrubs the message).
    pub(crate) fn map(&self, op: &str, status: StatusCode, body: &[u8]) -> AdapterError {
        let answer = ErrorAnswer {
            status,
            retry_after: None,
            body: Bytes::copy_from_slice(body),
        };
        self.http.map_answer(op, &answer)
    }

    /// Reads an error answer and maps it.
    pub(crate) async fn status_error(&self, op: &str, resp: Response) -> AdapterError {
        self.http.error_of(op, resp).await
    }
}

/// An error answer through [`map_status`]; a 429's `Retry-After` rides on the (transient)
/// error, for the worker's back-off.
fn map_answer(op: &str, a: &ErrorAnswer) -> AdapterError {
    match (map_status(op, a.status, &a.body), a.retry_after) {
        (AdapterError::Transient(r), Some(w)) => AdapterError::Transient(r.with_retry_after(w)),
        (e, _) => e,
    }
}

/// Error bodies seen from OpenSandbox and execd.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    code: Option<String>,
    message: Option<String>,
    /// FastAPI: a string (unknown route) or validation items.
    detail: Option<serde_json::Value>,
    /// execd's 401 shape.
    error: Option<String>,
}

/// The error code without its runtime prefix (`DOCKER::SANDBOX_NOT_FOUND` → `SANDBOX_NOT_FOUND`).
pub(crate) fn code_suffix(code: &str) -> &str {
    code.rsplit("::").next().unwrap_or(code)
}

/// A parsed error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

pub(crate) fn parse_error(status: StatusCode, body: &[u8]) -> ServerError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let mut message = parsed.message.or(parsed.error).unwrap_or_default();
    let mut code = parsed.code.unwrap_or_default();
    match parsed.detail {
        Some(serde_json::Value::String(s)) if message.is_empty() => message = s,
        Some(serde_json::Value::Array(items)) => {
            // FastAPI validation: name where and what, never echo `input`.
            let parts: Vec<String> = items
                .iter()
                .map(|i| {
                    let loc = i
                        .get("loc")
                        .and_then(|l| l.as_array())
                        .map(|l| {
                            l.iter()
                                .map(|p| match p {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    let msg = i.get("msg").and_then(|m| m.as_str()).unwrap_or("invalid");
                    format!("{loc}: {msg}")
                })
                .collect();
            if code.is_empty() {
                code = "VALIDATION_ERROR".to_owned();
            }
            message = parts.join("; ");
        }
        _ => {}
    }
    if message.is_empty() && code.is_empty() {
        message = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    }
    ServerError {
        status: status.as_u16(),
        code,
        message,
    }
}

/// Status and code → `AdapterError`. Unknown codes fall back to the status. Messages may
/// quote the server: the client scrubs them.
fn map_status(op: &str, status: StatusCode, body: &[u8]) -> AdapterError {
    let err = parse_error(status, body);
    let suffix = code_suffix(&err.code);
    let text = if err.code.is_empty() {
        format!("{op}: HTTP {}: {}", err.status, err.message)
    } else {
        format!("{op}: HTTP {} {}: {}", err.status, err.code, err.message)
    };
    if suffix.contains("REGISTRY_NOT_CONFIGURED") || err.message.contains("RegistryNotConfigured") {
        return AdapterError::Unsupported(format!(
            "{op}: the OpenSandbox runtime has no snapshot registry"
        ));
    }
    match status.as_u16() {
        401 | 403 => AdapterError::permanent(format!(
            "{op}: OpenSandbox refused the credentials (HTTP {} {})",
            err.status, err.code
        )),
        // An unknown route is a wrong apiURL, not a missing sandbox.
        404 if err.code.is_empty() && err.message == "Not Found" => AdapterError::permanent(
            format!("{op}: OpenSandbox has no such route (check apiURL ends in /v1)"),
        ),
        404 => AdapterError::NotFound,
        // `SNAPSHOT::NOT_READY` (a restore from a snapshot still being written, recorded on
        // the real server): it will be ready; try again.
        409 if suffix == "NOT_READY" => AdapterError::transient(text),
        408 | 429 => AdapterError::transient(text),
        501 => AdapterError::Unsupported(text),
        500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_not_ready_yet_is_worth_retrying() {
        let body = br#"{"code":"SNAPSHOT::NOT_READY","message":"snapshot is not ready"}"#;
        let e = map_status("create sandbox", StatusCode::CONFLICT, body);
        assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
        let other = br#"{"code":"SANDBOX::CONFLICT","message":"no"}"#;
        let e = map_status("create sandbox", StatusCode::CONFLICT, other);
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    }

    #[test]
    fn codes_lose_their_runtime_prefix() {
        assert_eq!(
            code_suffix("DOCKER::SANDBOX_NOT_FOUND"),
            "SANDBOX_NOT_FOUND"
        );
        assert_eq!(code_suffix("MISSING_API_KEY"), "MISSING_API_KEY");
    }

    #[test]
    fn validation_details_name_the_location_not_the_input() {
        let body = br#"{"detail":[{"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should be greater than or equal to 60","input":5}]}"#;
        let e = parse_error(StatusCode::UNPROCESSABLE_ENTITY, body);
        assert_eq!(e.code, "VALIDATION_ERROR");
        assert!(e.message.contains("body.timeout"), "{}", e.message);
        assert!(!e.message.contains('5'), "{}", e.message);
    }
}
