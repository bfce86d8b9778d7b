//! The one HTTP layer of the adapter: requests to the OpenSandbox server carry the API key;
//! requests anywhere else (execd reached directly, port endpoints) never do. The key is read
//! through its reference when a request is sent (so a rotated key is used without a restart)
//! and attached in one place, [`Client::send`]. Every failure is turned into an
//! `AdapterError` whose message cannot contain the key.

use std::sync::{Arc, Mutex};

use reqwest::header::HeaderValue;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;

use super::config::{ApiKey, Settings};
use crate::credentials::{CredentialResolver, Credentials};
use crate::AdapterError;

/// Header the OpenSandbox server reads its API key from.
pub(crate) const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";

/// HTTP client bound to one OpenSandbox server.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    /// `http://host:port/v1`
    api_url: String,
    /// `http://host:port`, normalised, to decide where the key may go.
    api_origin: String,
    /// The key's reference, read at call time.
    credential: Arc<CredentialResolver>,
    /// Keys used so far (the current and the one before), scrubbed from every message.
    seen: Arc<Mutex<Vec<ApiKey>>>,
    request_timeout: std::time::Duration,
}

impl Client {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, AdapterError> {
        let http = reqwest::Client::builder()
            // A redirect would carry the key header to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| AdapterError::Permanent(format!("cannot build HTTP client: {e}")))?;
        let credential = credentials.resolver(settings.credential.clone());
        let mut seen = Vec::new();
        if let Some(k) = &settings.initial_key {
            credential.seed(k.expose());
            seen.push(k.clone());
        }
        Ok(Self {
            http,
            api_origin: origin(&settings.api_url).unwrap_or_default(),
            api_url: settings.api_url.clone(),
            credential: Arc::new(credential),
            seen: Arc::new(Mutex::new(seen)),
            request_timeout: settings.request_timeout,
        })
    }

    /// The API key now, through its reference. A reference that does not resolve makes the
    /// pool unusable until it does: `Unavailable`, naming the reference, never a value.
    async fn key(&self) -> Result<ApiKey, AdapterError> {
        let reference = self.credential.reference();
        let raw = self.credential.get().await.map_err(|e| {
            AdapterError::Unavailable(format!("OpenSandbox API key ({reference}): {e}"))
        })?;
        let key = ApiKey::parse(&raw).map_err(|why| {
            AdapterError::Unavailable(format!("OpenSandbox API key ({reference}): the key {why}"))
        })?;
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.contains(&key) {
            seen.push(key.clone());
            let len = seen.len();
            seen.drain(..len.saturating_sub(2));
        }
        Ok(key)
    }

    /// Replaces every key used so far in `text` with `***`.
    fn scrub(&self, text: &str) -> String {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().fold(text.to_owned(), |t, k| k.scrub(&t))
    }

    /// Whether `url` is on the OpenSandbox server itself (so the key may be sent).
    pub(crate) fn is_server(&self, url: &str) -> bool {
        origin(url).is_some_and(|o| o == self.api_origin)
    }

    /// A lifecycle API request (`path` starts with `/`) with the request timeout; `send`
    /// adds the key.
    pub(crate) fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.api_url, path))
            .timeout(self.request_timeout)
    }

    /// A request to any URL; `send` adds the key only if the URL is on the server (its proxy).
    /// No overall timeout: callers set one or watch the stream themselves.
    pub(crate) fn to(&self, method: Method, url: &str) -> RequestBuilder {
        self.http.request(method, url)
    }

    pub(crate) fn request_timeout(&self) -> std::time::Duration {
        self.request_timeout
    }

    /// Sends and maps transport errors; `op` says what was being done (for messages). The
    /// key, read now, is attached here and only to the server's own origin; a key header on
    /// any other request (e.g. copied from an endpoint answer) is removed.
    pub(crate) async fn send(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        let (http, req) = rb.build_split();
        let mut req = req.map_err(|e| self.transport_error(op, &e))?;
        if self.is_server(req.url().as_str()) {
            let key = self.key().await?;
            let mut value = HeaderValue::from_str(key.expose()).map_err(|_| {
                AdapterError::Unavailable(format!(
                    "OpenSandbox API key ({}): the key has characters a header cannot carry",
                    self.credential.reference()
                ))
            })?;
            value.set_sensitive(true);
            req.headers_mut().insert(API_KEY_HEADER, value);
        } else {
            req.headers_mut().remove(API_KEY_HEADER);
        }
        http.execute(req)
            .await
            .map_err(|e| self.transport_error(op, &e))
    }

    /// Sends and requires a 2xx answer.
    pub(crate) async fn send_ok(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        let resp = self.send(rb, op).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.status_error(op, resp).await)
        }
    }

    /// Sends, requires 2xx and decodes a JSON body.
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        let resp = self.send_ok(rb, op).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error(op, &e))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            AdapterError::Transient(format!("{op}: unexpected answer from OpenSandbox: {e}"))
        })
    }

    /// Maps a transport failure: unreachable → Unavailable, everything else → Transient.
    pub(crate) fn transport_error(&self, op: &str, e: &reqwest::Error) -> AdapterError {
        let mut text = String::new();
        let mut source: Option<&dyn std::error::Error> = Some(e);
        while let Some(s) = source {
            let part = s.to_string();
            if !text.contains(&part) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&part);
            }
            source = s.source();
        }
        let text = self.scrub(&text);
        if e.is_connect() {
            AdapterError::Unavailable(format!("{op}: cannot connect: {text}"))
        } else if e.is_timeout() {
            AdapterError::Transient(format!("{op}: timed out"))
        } else {
            AdapterError::Transient(format!("{op}: {text}"))
        }
    }

    /// Maps an error answer already read. A refused key is read again on the next call, so
    /// a key replaced after the server stopped accepting the old one is picked up at once.
    pub(crate) fn map(&self, op: &str, status: StatusCode, body: &[u8]) -> AdapterError {
        if matches!(status.as_u16(), 401 | 403) {
            self.credential.forget();
        }
        let e = map_status(op, status, body);
        match e {
            AdapterError::Transient(m) => AdapterError::Transient(self.scrub(&m)),
            AdapterError::Permanent(m) => AdapterError::Permanent(self.scrub(&m)),
            AdapterError::Unsupported(m) => AdapterError::Unsupported(self.scrub(&m)),
            AdapterError::Unavailable(m) => AdapterError::Unavailable(self.scrub(&m)),
            AdapterError::PathNotFound(m) => AdapterError::PathNotFound(self.scrub(&m)),
            AdapterError::NotFound => AdapterError::NotFound,
        }
    }

    /// Reads an error answer and maps it by status and error code.
    pub(crate) async fn status_error(&self, op: &str, resp: Response) -> AdapterError {
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        self.map(op, status, &body)
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
/// quote the server: callers scrub them (`Client::map`).
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
        401 | 403 => AdapterError::Permanent(format!(
            "{op}: OpenSandbox refused the credentials (HTTP {} {})",
            err.status, err.code
        )),
        // An unknown route is a wrong apiURL, not a missing sandbox.
        404 if err.code.is_empty() && err.message == "Not Found" => AdapterError::Permanent(
            format!("{op}: OpenSandbox has no such route (check apiURL ends in /v1)"),
        ),
        404 => AdapterError::NotFound,
        408 | 429 => AdapterError::Transient(text),
        501 => AdapterError::Unsupported(text),
        500..=599 => AdapterError::Transient(text),
        _ => AdapterError::Permanent(text),
    }
}

/// `scheme://host:port` of a URL, lower-cased, default port filled in.
pub(crate) fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?.to_ascii_lowercase();
    let authority = authority.rsplit('@').next()?.to_owned();
    let has_port = match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    };
    let authority = if has_port {
        authority
    } else {
        let port = if scheme == "https" { 443 } else { 80 };
        format!("{authority}:{port}")
    };
    Some(format!("{scheme}://{authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_compare_with_default_ports() {
        assert_eq!(origin("http://H:80/v1"), origin("http://h/x"));
        assert_ne!(origin("http://h:8080/v1"), origin("http://h:8081/v1"));
        assert_eq!(origin("http://[::1]/a").as_deref(), Some("http://[::1]:80"));
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
