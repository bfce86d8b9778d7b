//! E2B's control plane (`openapi.yml`): sandboxes created, found by metadata, paused,
//! resumed (`/connect`), killed, snapshotted; and how its errors read. The API key goes in
//! `X-API-Key` (or the pool's `authHeader`/`authScheme`) to the API's origin only (the shared [`HttpClient`]).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::config::{AuthScheme, Settings};
use crate::credentials::Credentials;
use crate::error::Reason;
use crate::http::{HttpClient, HttpClientBuilder, HttpConfigError};
use crate::kit::paths::segment;
use crate::AdapterError;

/// The body of `POST /sandboxes` (`NewSandbox`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until E2B kills it: the TTL backstop.
    pub timeout: u64,
    pub auto_pause: bool,
    /// envd then requires the sandbox's access token.
    pub secure: bool,
    #[serde(
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env_vars: BTreeMap<String, String>,
}

/// `SandboxNetworkConfig`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Network {
    pub allow_public_traffic: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_out: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_out: Vec<String>,
}

/// What create, connect and get answer (`Sandbox`, `SandboxDetail`, `ListedSandbox` share
/// these fields; the token is absent from list answers).
#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// `running` or `paused` (absent from the create answer, which is always running).
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
    /// envd's version (see `envd_version.rs`); absent from some backends' list answers.
    #[serde(default)]
    pub envd_version: Option<String>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("sandbox_id", &self.sandbox_id)
            .field("state", &self.state)
            .field("metadata", &self.metadata)
            .field(
                "envd_access_token",
                &self.envd_access_token.as_ref().map(|_| "***"),
            )
            .field("domain", &self.domain)
            .field("envd_version", &self.envd_version)
            .finish()
    }
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Snapshot {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
}

/// HTTP client bound to one E2B control plane.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    pub(crate) http: HttpClient,
}

impl Api {
    pub(crate) fn new(
        settings: &Settings,
        credentials: &Credentials,
    ) -> Result<Self, HttpConfigError> {
        let mut http = HttpClientBuilder::new("E2B", settings.api_url.clone()).auth(
            settings.auth_header.clone(),
            "API key",
            settings.credential.clone(),
            settings.initial_key.clone(),
        );
        if settings.auth_scheme == AuthScheme::Bearer {
            http = http.bearer();
        }
        let http = http
            .errors(|op, a| map_status(op, a.status, &a.body, a.retry_after))
            .request_timeout(settings.request_timeout)
            .retries(2, std::time::Duration::from_millis(200))
            .build(credentials)?;
        Ok(Api { http })
    }

    /// Maps an error answer; a refused key is read again on the next call.
    pub(crate) async fn status_error(&self, op: &str, resp: Response) -> AdapterError {
        self.http.error_of(op, resp).await
    }

    /// `POST /sandboxes`: answers once the sandbox runs. Never retried: a lost answer is
    /// found by its metadata on the next attempt.
    pub(crate) async fn create(
        &self,
        body: &NewSandbox,
        timeout: std::time::Duration,
    ) -> Result<Sandbox, AdapterError> {
        let rb = self
            .http
            .api(Method::POST, "/sandboxes")
            .json(body)
            .timeout(timeout);
        match self.http.json(rb, "create sandbox").await {
            // Nothing to find yet: a 404 here is the template (or snapshot) named.
            Err(AdapterError::NotFound) => Err(AdapterError::invalid_field(
                "template",
                format!(
                    "create sandbox: E2B has no template or snapshot `{}`",
                    body.template_id
                ),
            )),
            other => other,
        }
    }

    /// `GET /sandboxes/{id}` (its state, metadata and envd token).
    pub(crate) async fn get(&self, id: &str) -> Result<Sandbox, AdapterError> {
        let rb = self
            .http
            .api(Method::GET, &format!("/sandboxes/{}", segment(id)));
        self.http.json(rb, "get sandbox").await
    }

    /// Every running or paused sandbox whose metadata has `key=value` (`GET /v2/sandboxes`,
    /// all pages).
    pub(crate) async fn list_by_metadata(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<Sandbox>, AdapterError> {
        let filter = format!("{}={}", segment(key), segment(value));
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..1000 {
            let mut q: Vec<(&str, &str)> = vec![
                ("metadata", &filter),
                ("state", "running,paused"),
                ("limit", "100"),
            ];
            if let Some(t) = &next {
                q.push(("nextToken", t));
            }
            let rb = self.http.api(Method::GET, "/v2/sandboxes").query(&q);
            let resp = self.http.send_ok(rb, "list sandboxes").await?;
            next = resp
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| self.http.transport_error("list sandboxes", e))?;
            let page: Vec<Sandbox> = crate::http::decode_answer(&bytes, "list sandboxes", "E2B")?;
            // E2B filters by metadata already; the adapter checks the tags again
            // (`kit::tags`), so a server that ignored the filter cannot make it adopt or
            // delete someone else's sandbox.
            out.extend(page);
            if next.is_none() {
                return Ok(out);
            }
        }
        Err(AdapterError::transient(
            "list sandboxes: E2B kept answering with more pages",
        ))
    }

    /// `GET /v2/sandboxes?limit=1`: the API answers and takes the key.
    pub(crate) async fn probe(&self) -> Result<(), AdapterError> {
        let rb = self
            .http
            .api(Method::GET, "/v2/sandboxes")
            .query(&[("limit", "1")]);
        self.http.send_ok(rb, "list sandboxes").await.map(drop)
    }

    /// `DELETE /sandboxes/{id}`; a missing sandbox is success.
    pub(crate) async fn kill(&self, id: &str) -> Result<(), AdapterError> {
        let rb = self
            .http
            .api(Method::DELETE, &format!("/sandboxes/{}", segment(id)));
        match self.http.send_ok(rb, "kill sandbox").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `POST /sandboxes/{id}/pause` with its memory; `false` on 409 (already paused, or
    /// pausing).
    pub(crate) async fn pause(&self, id: &str) -> Result<bool, AdapterError> {
        let rb = self
            .http
            .api(Method::POST, &format!("/sandboxes/{}/pause", segment(id)))
            .json(&serde_json::json!({"memory": true}));
        let resp = self.http.send(rb, "pause sandbox").await?;
        match resp.status().as_u16() {
            200..=299 => Ok(true),
            409 => Ok(false),
            _ => Err(self.status_error("pause sandbox", resp).await),
        }
    }

    /// `POST /sandboxes/{id}/connect`: resumes a paused sandbox (201) or just answers for a
    /// running one (200); its timeout is only ever extended.
    pub(crate) async fn connect(&self, id: &str, timeout_s: u64) -> Result<Sandbox, AdapterError> {
        let rb = self
            .http
            .api(Method::POST, &format!("/sandboxes/{}/connect", segment(id)))
            .json(&serde_json::json!({ "timeout": timeout_s }));
        self.http.json(rb, "resume sandbox").await
    }

    /// `POST /sandboxes/{id}/timeout`: E2B kills the sandbox `timeout_s` from now.
    pub(crate) async fn set_timeout(&self, id: &str, timeout_s: u64) -> Result<(), AdapterError> {
        let rb = self
            .http
            .api(Method::POST, &format!("/sandboxes/{}/timeout", segment(id)))
            .json(&serde_json::json!({ "timeout": timeout_s }));
        self.http.send_ok(rb, "set sandbox timeout").await.map(drop)
    }

    /// `GET /snapshots?sandboxID=&name=`: the snapshots of a sandbox with that name.
    pub(crate) async fn find_snapshots(
        &self,
        sandbox: &str,
        name: &str,
    ) -> Result<Vec<Snapshot>, AdapterError> {
        let rb = self.http.api(Method::GET, "/snapshots").query(&[
            ("sandboxID", sandbox),
            ("name", name),
            ("limit", "100"),
        ]);
        self.http.json(rb, "list snapshots").await
    }

    /// `POST /sandboxes/{id}/snapshots {name}`: answers once the snapshot is written.
    pub(crate) async fn create_snapshot(
        &self,
        sandbox: &str,
        name: &str,
        timeout: std::time::Duration,
    ) -> Result<Snapshot, AdapterError> {
        let rb = self
            .http
            .api(
                Method::POST,
                &format!("/sandboxes/{}/snapshots", segment(sandbox)),
            )
            .json(&serde_json::json!({ "name": name }))
            .timeout(timeout);
        self.http.json(rb, "create snapshot").await
    }

    /// `DELETE /templates/{id}`: a snapshot is a template; a missing one is success.
    pub(crate) async fn delete_template(&self, template: &str) -> Result<(), AdapterError> {
        let rb = self
            .http
            .api(Method::DELETE, &format!("/templates/{}", segment(template)));
        match self.http.send_ok(rb, "delete snapshot").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// E2B's `Error` body.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    error_code: Option<String>,
}

/// Semantic codes that mean "no room now": a capacity answer, so placement tries the next pool.
const CAPACITY_CODES: [&str; 3] = [
    "sandbox_capacity_unavailable",
    "sandbox_placement_timeout",
    "sandbox_no_compatible_node",
];

/// [`AdapterError::Capacity`], with E2B's `Retry-After` when it sent one: the worker gives the
/// create back to placement, which tries the next ranked pool.
pub(crate) fn capacity(op: &str, detail: &str, retry_after: Option<Duration>) -> AdapterError {
    AdapterError::capacity(format!("{op}: {detail}"), retry_after)
}

/// Status and body → `AdapterError`. Messages may quote the server: the caller scrubs them.
/// `retry_after` is the answer's `Retry-After`, kept on capacity errors.
pub(crate) fn map_status(
    op: &str,
    status: StatusCode,
    body: &[u8],
    retry_after: Option<Duration>,
) -> AdapterError {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let message = parsed
        .message
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    let code = parsed.error_code.unwrap_or_default();
    let text = format!("{op}: HTTP {}: {message}", status.as_u16());
    if CAPACITY_CODES.contains(&code.as_str()) {
        return capacity(
            op,
            &format!("E2B has no room ({code}): {message}"),
            retry_after,
        );
    }
    match status.as_u16() {
        401 => AdapterError::permanent(format!(
            "{op}: E2B refused the API key (HTTP 401); check the pool's apiKey reference"
        )),
        403 => AdapterError::permanent(format!(
            "{op}: E2B does not allow this API key to do that (HTTP 403)"
        )),
        404 => AdapterError::NotFound,
        // The plan's concurrent-sandbox limit or the rate limit.
        429 => capacity(
            op,
            &format!("E2B plan limit (HTTP 429): {message}"),
            retry_after,
        ),
        400 if message.to_ascii_lowercase().contains("timeout") => AdapterError::Permanent(
            Reason::from(format!(
                "{text} (the TTL is longer than this E2B plan allows; see maxTimeoutSeconds)"
            ))
            .on_field("ttlSeconds"),
        ),
        // 408, 501, 5xx and other 4xx: the generic table.
        _ => crate::http::status_error(op, status, &message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_limits_are_capacity_and_keys_never_quoted() {
        let body = br#"{"code":429,"message":"You have reached the maximum number of concurrent E2B sandboxes (20)."}"#;
        let wait = Some(Duration::from_secs(9));
        let e = map_status("create sandbox", StatusCode::TOO_MANY_REQUESTS, body, wait);
        assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
        assert!(e.is_retryable(), "{e:?}");
        assert_eq!(e.retry_after(), wait);
        assert!(e.to_string().contains("insufficient capacity"), "{e}");
        let body =
            br#"{"code":503,"message":"no node","error_code":"sandbox_capacity_unavailable"}"#;
        let e = map_status(
            "create sandbox",
            StatusCode::SERVICE_UNAVAILABLE,
            body,
            None,
        );
        assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
        assert_eq!(e.retry_after(), None);
        let body =
            br#"{"code":401,"message":"Invalid API key, it must start with e2b_: e2b_secret"}"#;
        let e = map_status("create sandbox", StatusCode::UNAUTHORIZED, body, None);
        assert!(matches!(e, AdapterError::Permanent(_)));
        assert!(!e.to_string().contains("e2b_secret"), "{e}");
        let body = br#"{"code":400,"message":"Timeout cannot be greater than 1 hours"}"#;
        match map_status("create sandbox", StatusCode::BAD_REQUEST, body, None) {
            AdapterError::Permanent(r) => assert_eq!(r.field(), Some("ttlSeconds")),
            e => panic!("{e:?}"),
        }
        assert_eq!(
            map_status("x", StatusCode::NOT_FOUND, b"{}", None),
            AdapterError::NotFound
        );
        assert_eq!(segment("a b=c/d"), "a%20b%3Dc%2Fd");
    }
}
