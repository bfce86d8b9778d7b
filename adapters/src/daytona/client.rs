//! What is Daytona's own about talking to it: two origins (the main API and the toolbox
//! proxy), both reading the API key as a bearer token, an organization header, and what its
//! error answers mean. The control plane answers NestJS errors (`statusCode`, `error`,
//! `message`, no code); the toolbox answers `code` and `source` too (seen live, seeds 002
//! POC 7). The rest (the key attached only to the configured origins and read at send time,
//! scrubbing, TLS, retries, reading error answers) is the kit's.

use reqwest::{Method, RequestBuilder, Response};

use super::config::Settings;
use crate::credentials::Credentials;
use crate::http::HttpClient;
use crate::kit::paths::segment;
use crate::kit::{self, ConfigError, ErrorAnswer, ProviderError, Statuses};
use crate::AdapterError;

/// The organization header (keys of several organizations, JWTs).
const ORG_HEADER: &str = "X-Daytona-Organization-ID";

/// Daytona's statuses: a 409 is a change under way (seen live: it settles), a 429 the
/// organization's limits.
const STATUSES: Statuses = Statuses::api_key("Daytona");

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
    pub(crate) fn new(settings: &Settings, credentials: &Credentials) -> Result<Self, ConfigError> {
        let build = |service: &str, url: &str| {
            kit::bearer_key_client!(settings, credentials, service, url, map_answer)
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

    pub(crate) fn http(&self, side: Side) -> &HttpClient {
        match side {
            Side::Api => &self.api,
            Side::Toolbox => &self.toolbox,
        }
    }

    /// Sends and requires a 2xx answer.
    pub(crate) async fn send_ok(
        &self,
        side: Side,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<Response, AdapterError> {
        self.http(side).send_ok(rb, op).await
    }

    /// Sends, requires 2xx and decodes a JSON body (a cut or garbled body is transient).
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        side: Side,
        rb: RequestBuilder,
        op: &str,
    ) -> Result<T, AdapterError> {
        self.http(side).json(rb, op).await
    }
}

/// Whether an answer says the plan's limits are reached (the messages Daytona's API uses for
/// its organization quotas: "… quota exceeded", "… limit exceeded").
fn is_plan_limit(err: &ProviderError) -> bool {
    let m = err.message.to_ascii_lowercase();
    matches!(err.status, 400 | 403) && (m.contains("quota") || m.contains("limit exceeded"))
}

/// An error answer → `AdapterError`: a plan limit is [`AdapterError::Capacity`] (the worker
/// marks the pool refused for a while and placement tries the next ranked pool), the rest
/// goes by the common table.
pub(crate) fn map_answer(op: &str, a: &ErrorAnswer) -> AdapterError {
    let err = a.error();
    if is_plan_limit(&err) {
        return STATUSES.capacity(op, &err, a.retry_after);
    }
    STATUSES.map(op, &err, a.retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;

    fn err(status: u16, body: &str) -> AdapterError {
        map_answer(
            "op",
            &ErrorAnswer {
                status: StatusCode::from_u16(status).unwrap(),
                retry_after: None,
                body: bytes::Bytes::from(body.to_owned()),
            },
        )
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
        let toolbox = ErrorAnswer {
            status: StatusCode::REQUEST_TIMEOUT,
            retry_after: None,
            body: bytes::Bytes::from_static(
                br#"{"statusCode":408,"message":"command timed out","code":"PROCESS_EXECUTION_TIMEOUT","source":"daemon"}"#,
            ),
        }
        .error();
        assert_eq!(toolbox.code, "PROCESS_EXECUTION_TIMEOUT");
    }
}
