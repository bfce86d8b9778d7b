//! What is Daytona's own about talking to it: two origins (the main API and the toolbox
//! proxy), both reading the API key as a bearer token, and two error body shapes. The
//! control plane answers NestJS errors (`statusCode`, `error`, `message`, no code); the toolbox
//! answers `code` and `source` too (seen live, seeds 002 POC 7). The rest (the key attached
//! only to the configured origins and read at send time, scrubbing, TLS, retries) is the
//! shared [`crate::http::HttpClient`].

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;

use super::config::Settings;
use crate::credentials::Credentials;
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::AdapterError;

/// The organization header (keys of several organizations, JWTs).
const ORG_HEADER: &str = "X-Daytona-Organization-ID";

/// HTTP clients bound to one Daytona installation.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    api: HttpClient,
    toolbox: HttpClient,
    organization_id: Option<String>,
}

/// Which of the two APIs answered (for messages and 404 meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Api,
    Toolbox,
}

impl Client {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, HttpConfigError> {
        let build = |service: &str, url: &str| {
            HttpClientBuilder::new(service, url)
                .auth(
                    "Authorization",
                    "API key",
                    settings.credential.clone(),
                    settings.initial_key.clone(),
                )
                .bearer()
                .request_timeout(settings.request_timeout)
                .ca_bundle(settings.ca_bundle.clone())
                .retries(2, Duration::from_millis(100))
                .build(credentials)
        };
        Ok(Client {
            api: build("Daytona", &settings.api_url)?,
            toolbox: build("Daytona toolbox", &settings.toolbox_url)?,
            organization_id: settings.organization_id.clone(),
        })
    }

    fn with_org(&self, rb: RequestBuilder) -> RequestBuilder {
        match &self.organization_id {
            Some(org) => rb.header(ORG_HEADER, org),
            None => rb,
        }
    }

    /// A main-API request (`path` starts with `/`).
    pub(crate) fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.with_org(self.api.api(method, path))
    }

    /// A toolbox request for sandbox `backend_ref` (`path` starts with `/`).
    pub(crate) fn toolbox(&self, method: Method, backend_ref: &str, path: &str) -> RequestBuilder {
        let full = format!("/{}{path}", segment(backend_ref));
        self.with_org(self.toolbox.api(method, &full))
    }

    fn http(&self, side: Side) -> &HttpClient {
        match side {
            Side::Api => &self.api,
            Side::Toolbox => &self.toolbox,
        }
    }

    /// Sends and maps transport errors.
    pub(crate) async fn send(
        &self,
        side: Side,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        self.http(side).send(rb, op).await
    }

    /// Sends and requires a 2xx answer.
    pub(crate) async fn send_ok(
        &self,
        side: Side,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        let resp = self.send(side, rb, op).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(self.status_error(side, op, resp).await)
        }
    }

    /// Sends, requires 2xx and decodes a JSON body (a cut or garbled body is transient).
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        side: Side,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        let resp = self.send_ok(side, rb, op).await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error(side, op, e))?;
        crate::http::decode_answer(&bytes, op, "Daytona")
    }

    pub(crate) fn transport_error(&self, side: Side, op: &str, e: reqwest::Error) -> AdapterError {
        self.http(side).transport_error(op, e)
    }

    /// Maps an error answer already read. A refused key is read again on the next call.
    pub(crate) fn map(&self, side: Side, op: &str, err: &ServerError) -> AdapterError {
        if matches!(err.status, 401 | 403) {
            self.api.forget_credential();
            self.toolbox.forget_credential();
        }
        self.http(side).scrub_error(map_status(op, err))
    }

    /// Reads an error answer and maps it.
    pub(crate) async fn status_error(&self, side: Side, op: &str, resp: Response) -> AdapterError {
        let err = read_error(resp).await;
        self.map(side, op, &err)
    }
}

/// One path segment, percent-encoded (ids come from the provider; never trust them in a path).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Both error shapes, every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ErrorBody {
    /// A string, or NestJS validation's list of strings.
    message: Option<serde_json::Value>,
    error: Option<String>,
    code: Option<String>,
    source: Option<String>,
}

/// A parsed error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerError {
    pub status: u16,
    /// The toolbox's code (`PROCESS_EXECUTION_TIMEOUT`); empty from the control plane.
    pub code: String,
    pub source: String,
    pub message: String,
}

pub(crate) async fn read_error(resp: Response) -> ServerError {
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    parse_error(status, &body)
}

pub(crate) fn parse_error(status: StatusCode, body: &[u8]) -> ServerError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let mut message = match parsed.message {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join("; "),
        Some(other) => other.to_string(),
        None => parsed.error.clone().unwrap_or_default(),
    };
    if message.is_empty() {
        message = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    }
    ServerError {
        status: status.as_u16(),
        code: parsed.code.unwrap_or_default(),
        source: parsed.source.unwrap_or_default(),
        message,
    }
}

/// Whether an answer says the plan's limits are reached (the messages Daytona's API uses for
/// its organization quotas: "… quota exceeded", "… limit exceeded").
fn is_plan_limit(err: &ServerError) -> bool {
    let m = err.message.to_ascii_lowercase();
    matches!(err.status, 400 | 403) && (m.contains("quota") || m.contains("limit exceeded"))
}

/// The error of a full provider, [`AdapterError::Capacity`]: the worker marks the pool
/// refused for a while and gives the sandbox back to placement for the next ranked pool; the
/// API answers `insufficient_capacity`. Its message says `insufficient capacity: …`.
pub(crate) fn capacity(op: &str, provider: &str, err_status: u16, message: &str) -> AdapterError {
    AdapterError::capacity(
        format!("{op}: {provider} HTTP {err_status}: {message}"),
        None,
    )
}

/// Status and body → `AdapterError`. Messages may quote the server: callers scrub them
/// (`Client::map`).
pub(crate) fn map_status(op: &str, err: &ServerError) -> AdapterError {
    let text = if err.code.is_empty() {
        format!("{op}: Daytona HTTP {}: {}", err.status, err.message)
    } else {
        format!(
            "{op}: Daytona HTTP {} {}: {}",
            err.status, err.code, err.message
        )
    };
    if err.status == 429 || is_plan_limit(err) {
        return capacity(op, "Daytona", err.status, &err.message);
    }
    match err.status {
        401 | 403 => AdapterError::permanent(format!(
            "{op}: Daytona refused the API key (HTTP {}); check the pool's apiKeyEnv, apiKeyFile or apiKeySecret",
            err.status
        )),
        404 => AdapterError::NotFound,
        // A delete or action during another change (seen live): it settles; try again.
        408 | 409 => AdapterError::transient(text),
        501 => AdapterError::Unsupported(text),
        500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(status: u16, body: &str) -> AdapterError {
        map_status(
            "op",
            &parse_error(StatusCode::from_u16(status).unwrap(), body.as_bytes()),
        )
    }

    #[test]
    fn both_error_shapes_read() {
        let cp = parse_error(
            StatusCode::BAD_REQUEST,
            br#"{"statusCode":400,"error":"Bad Request","message":["cpu must be an integer","memory must be an integer"]}"#,
        );
        assert_eq!(
            cp.message,
            "cpu must be an integer; memory must be an integer"
        );
        assert!(cp.code.is_empty());
        let tb = parse_error(
            StatusCode::REQUEST_TIMEOUT,
            br#"{"statusCode":408,"message":"command timed out","code":"PROCESS_EXECUTION_TIMEOUT","source":"daemon"}"#,
        );
        assert_eq!(
            (tb.code.as_str(), tb.source.as_str()),
            ("PROCESS_EXECUTION_TIMEOUT", "daemon")
        );
        let raw = parse_error(StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>");
        assert_eq!(raw.message, "<html>bad gateway</html>");
    }

    #[test]
    fn limits_are_capacity_and_refused_keys_are_permanent() {
        let e = err(
            429,
            r#"{"statusCode":429,"message":"ThrottlerException: Too Many Requests"}"#,
        );
        assert!(
            matches!(e, AdapterError::Capacity(_))
                && e.is_retryable()
                && e.to_string().contains("insufficient capacity"),
            "{e}"
        );
        let e = err(
            403,
            r#"{"statusCode":403,"message":"Total CPU quota exceeded. Maximum allowed: 10"}"#,
        );
        assert!(
            matches!(e, AdapterError::Capacity(_))
                && e.is_retryable()
                && e.to_string().contains("insufficient capacity"),
            "{e}"
        );
        let e = err(401, r#"{"statusCode":401,"message":"Invalid API key"}"#);
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
        assert!(e.to_string().contains("refused the API key"), "{e}");
        assert_eq!(err(404, "{}"), AdapterError::NotFound);
        assert!(err(409, "{}").is_retryable());
        assert!(err(503, "{}").is_retryable());
        assert!(matches!(err(400, "{}"), AdapterError::Permanent(_)));
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
