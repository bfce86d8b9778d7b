//! The session pool management API (data plane, `2025-10-02-preview`): one origin, an Entra
//! bearer token, `api-version` and the session `identifier` as query parameters, and Azure
//! Core error bodies (`{"error": {"code", "message"}}`). The rest (the token attached only to
//! the pool's origin and read at send time, scrubbing, TLS, retries) is the kit's client.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, RequestBuilder, Response};
use serde::{Deserialize, Serialize};

use super::config::Settings;
use crate::kit::{build_client, ClientSettings, ConfigError, Credentials, ErrorAnswer, HttpClient};
use crate::kit::{KeyHeader, Statuses};
use crate::AdapterError;

/// Pages of `/listSessions` read at most (a pool holds at most 600 sessions).
const MAX_PAGES: usize = 100;

/// HTTP client bound to one session pool.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    http: HttpClient,
    api_version: String,
}

/// A session as `/session` and `/listSessions` answer it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionInfo {
    pub identifier: String,
}

#[derive(Debug, Deserialize)]
struct SessionPage {
    #[serde(default)]
    sessions: Vec<SessionInfo>,
    #[serde(default, rename = "nextLink")]
    next_link: Option<String>,
}

/// The body of `POST /executions` for a Shell pool.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecutionRequest {
    pub code_input_type: &'static str,
    pub execution_type: &'static str,
    pub shell_command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    pub timeout_in_seconds: u64,
    pub output_streams_max_length: u64,
}

/// `Azure.Core.Foundations.ErrorResponse`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorResponse {
    #[serde(default)]
    pub error: ErrorObject,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorObject {
    #[serde(default)]
    pub code: String,
    #[serde(default)]
    pub message: String,
}

/// The result part of an execution.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecutionResult {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
}

/// `SessionCodeExecutionResource`, plus the `exitCode`/`errorName` the shell executor itself
/// reports (read when present).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Execution {
    #[serde(default)]
    pub status: String,
    pub error: Option<ErrorResponse>,
    pub result: Option<ExecutionResult>,
    pub exit_code: Option<i64>,
    pub error_name: Option<String>,
}

impl Client {
    pub(crate) fn new(settings: &Settings, credentials: &Credentials) -> Result<Self, ConfigError> {
        let http = build_client(
            &ClientSettings {
                service: "Azure dynamic sessions",
                base_url: &settings.endpoint,
                ca_bundle: &settings.ca_bundle,
                request_timeout: settings.request_timeout,
                credential: &settings.credential,
                initial: settings.initial_token.as_ref(),
                what: "access token",
                header: KeyHeader::Bearer,
                errors: map_error,
                retries: 2,
            },
            credentials,
        )
        .map_err(|e| e.renamed("apiURL", "poolManagementEndpoint"))?;
        Ok(Client {
            http,
            api_version: settings.api_version.clone(),
        })
    }

    /// A request to `path` with `api-version` (and the session's `identifier`, when given).
    fn req(&self, method: Method, path: &str, identifier: Option<&str>) -> RequestBuilder {
        let rb = self
            .http
            .api(method, path)
            .query(&[("api-version", self.api_version.as_str())]);
        match identifier {
            Some(id) => rb.query(&[("identifier", id)]),
            None => rb,
        }
    }

    pub(crate) fn transport_error(&self, op: &str, e: reqwest::Error) -> AdapterError {
        self.http.transport_error(op, e)
    }

    /// The session of `identifier`, if it is allocated (this call allocates nothing).
    pub(crate) async fn session(
        &self,
        identifier: &str,
    ) -> Result<Option<SessionInfo>, AdapterError> {
        let rb = self.req(Method::GET, "/session", Some(identifier));
        match self.http.json(rb, "get session").await {
            Ok(s) => Ok(Some(s)),
            Err(AdapterError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the session of `identifier`; one already gone is fine.
    pub(crate) async fn delete_session(&self, identifier: &str) -> Result<(), AdapterError> {
        let rb = self.req(Method::DELETE, "/session", Some(identifier));
        match self.http.send_ok(rb, "delete session").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every session of the pool, page by page (`skip` moved by what was read; `nextLink`
    /// only says whether there is more, so no URL from an answer is followed with the token).
    pub(crate) async fn list_sessions(&self) -> Result<Vec<SessionInfo>, AdapterError> {
        let mut all = Vec::new();
        for _ in 0..MAX_PAGES {
            let mut rb = self.req(Method::GET, "/listSessions", None);
            if !all.is_empty() {
                rb = rb.query(&[("skip", all.len())]);
            }
            let page: SessionPage = self.http.json(rb, "list sessions").await?;
            let got = page.sessions.len();
            all.extend(page.sessions);
            if page.next_link.is_none() || got == 0 {
                return Ok(all);
            }
        }
        Err(AdapterError::transient(format!(
            "list sessions: more than {MAX_PAGES} pages"
        )))
    }

    /// The first page of the session list: the pool answers and takes the token.
    pub(crate) async fn ping(&self) -> Result<(), AdapterError> {
        let rb = self.req(Method::GET, "/listSessions", None);
        self.http.json::<SessionPage>(rb, "health").await.map(drop)
    }

    /// Runs a synchronous execution in the session of `identifier` (allocating it if it is
    /// not: callers check first where that matters).
    pub(crate) async fn execute(
        &self,
        identifier: &str,
        body: &ExecutionRequest,
        timeout: Duration,
    ) -> Result<Execution, AdapterError> {
        let rb = self
            .req(Method::POST, "/executions", Some(identifier))
            .timeout(timeout)
            .json(body);
        self.http.json(rb, "execute").await
    }

    /// Uploads `bytes` as `name` in the session's data directory.
    pub(crate) async fn upload(
        &self,
        identifier: &str,
        name: &str,
        bytes: Bytes,
    ) -> Result<(), AdapterError> {
        let form = crate::kit::multipart::Multipart::new();
        let rb = self
            .req(Method::POST, "/files", Some(identifier))
            .header(reqwest::header::CONTENT_TYPE, form.content_type())
            .body(form.whole("file", name, &bytes));
        self.http.send_ok(rb, "upload file").await.map(drop)
    }

    /// The content of `name` in the session's data directory.
    pub(crate) async fn content(
        &self,
        identifier: &str,
        name: &str,
    ) -> Result<Response, AdapterError> {
        let path = format!("/files/{name}/content");
        let rb = self.req(Method::GET, &path, Some(identifier));
        self.http.send_ok(rb, "download file").await
    }

    /// Deletes `name` from the session's data directory; one already gone is fine.
    pub(crate) async fn delete_file(
        &self,
        identifier: &str,
        name: &str,
    ) -> Result<(), AdapterError> {
        let path = format!("/files/{name}");
        let rb = self.req(Method::DELETE, &path, Some(identifier));
        match self.http.send_ok(rb, "delete file").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The status table of the pool management API. A 404 is [`AdapterError::NotFound`]: on a
/// call that allocates (an execution for a new session) the caller reads it as the pool being
/// full, which is how Azure answers a request past `maxConcurrentSessions`. A 429 is a passing
/// request throttle (transient, its `Retry-After` kept), not a plan limit.
const STATUSES: Statuses = Statuses {
    provider: "Azure",
    credential: "access token",
    credential_settings: "tokenEnv, tokenFile or tokenSecret (a current Entra token for \
         https://dynamicsessions.io of an identity with the Azure ContainerApps Session \
         Executor role)",
    conflict_settles: true,
    rate_limit_is_capacity: false,
};

/// Maps an Azure Core error answer (`{"error": {"code", "message"}}`).
fn map_error(op: &str, answer: &ErrorAnswer) -> AdapterError {
    STATUSES.map(op, &answer.error(), answer.retry_after)
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::*;

    fn answer(status: u16, retry: Option<u64>) -> ErrorAnswer {
        ErrorAnswer {
            status: StatusCode::from_u16(status).unwrap(),
            retry_after: retry.map(Duration::from_secs),
            body: Bytes::from_static(br#"{"error":{"code":"C","message":"m"}}"#),
        }
    }

    #[test]
    fn statuses_map_to_kinds() {
        let m = |s: u16| map_error("op", &answer(s, None));
        assert_eq!(m(404), AdapterError::NotFound);
        assert!(matches!(m(401), AdapterError::Permanent(r) if r.contains("dynamicsessions.io")));
        let e = map_error("op", &answer(429, Some(4)));
        assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        assert!(m(503).is_retryable());
        assert!(matches!(m(400), AdapterError::Permanent(r) if r.contains("HTTP 400 C: m")));
    }
}
