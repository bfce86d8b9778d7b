//! `differently-client`: a typed, async client of the Differently `/v1` API.
//!
//! One [`Client`] per API and key; it is cheap to clone (one connection pool). Calls are grouped
//! by what they act on, each in its own module: sandboxes and their lifecycle
//! ([`sandboxes`]), commands ([`exec`], buffered or streamed as SSE or binary frames), files
//! ([`files`]), processes that outlive a connection ([`processes`]: start, attach to the
//! output from any offset, stdin, signals, kill), snapshots and ports ([`snapshots`]),
//! status and public events with resume ([`events`]), the public events' schemas and NATS credentials ([`public_events`]),
//! webhooks and their deliveries ([`webhooks`]), tenancy — organizations, projects, keys,
//! quotas, policies — ([`tenancy`]), and the operators' routes — pools, secrets, audit, trust
//! report — ([`admin`]).
//!
//! Errors are [`Error`]: the API's envelope (status, stable code, field, request id) or a
//! transport failure that says what to check. The key is never in a `Debug` or `Display`, and
//! neither are the secrets the API shows once (new keys, webhook secrets, event tokens).
//!
//! The interactive terminal (`GET /v1/sandboxes/{id}/pty`, a WebSocket) is [`pty`]:
//! [`Client::pty`] opens or reattaches one; input, resizes and signals go in, output and the
//! exit code come out.

pub mod admin;
mod error;
pub mod events;
pub mod exec;
pub mod files;
pub mod frames;
pub mod models;
mod page;
pub mod processes;
pub mod pty;
pub mod public_events;
pub mod sandboxes;
pub mod snapshots;
mod sse;
pub mod tenancy;
pub mod webhooks;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use error::{ApiError, Error, Result, TransportError, TransportKind};
pub use models::*;
pub use page::Page;

/// The address of the API on a developer's machine (`differently dev`).
pub const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// An API key. Kept out of every `Debug` and `Display`.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key (`dly_…`).
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for storing it (a config file) — never for printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(…)")
    }
}

/// Builds a [`Client`] with options beyond the URL and key.
#[derive(Debug)]
pub struct ClientBuilder {
    base: String,
    key: ApiKey,
    timeout: Option<Duration>,
    connect_timeout: Duration,
    user_agent: String,
    http: Option<reqwest::Client>,
}

impl ClientBuilder {
    /// A timeout for whole requests (none by default: waits and streams are long by nature;
    /// the API bounds its own waits).
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// How long to wait for a connection (default 10 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// The `User-Agent` sent.
    pub fn user_agent(mut self, ua: impl Into<String>) -> Self {
        self.user_agent = ua.into();
        self
    }

    /// Uses this `reqwest` client (its pool and settings) instead of building one.
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// The client; fails only on an unusable URL or TLS setup.
    pub fn build(self) -> Result<Client> {
        let base = self.base.trim_end_matches('/').to_owned();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|e| Error::invalid("url", format!("{base:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Error::invalid("url", format!("{base:?} is not http(s)")));
        }
        let http = match self.http {
            Some(h) => h,
            None => {
                let mut b = reqwest::Client::builder()
                    .connect_timeout(self.connect_timeout)
                    .user_agent(self.user_agent);
                if let Some(t) = self.timeout {
                    b = b.timeout(t);
                }
                b.build()
                    .map_err(|e| Error::invalid("http client", e.to_string()))?
            }
        };
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base,
                key: self.key,
            }),
        })
    }
}

struct Inner {
    http: reqwest::Client,
    base: String,
    key: ApiKey,
}

/// A client of one API with one key.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.inner.base)
            .field("key", &self.inner.key)
            .finish()
    }
}

impl Client {
    /// A client of the API at `base_url` (e.g. `http://127.0.0.1:7070`) with `key`.
    pub fn new(base_url: impl Into<String>, key: impl Into<String>) -> Result<Client> {
        Client::builder(base_url, key).build()
    }

    /// A builder, for timeouts or a shared `reqwest` client.
    pub fn builder(base_url: impl Into<String>, key: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base_url.into(),
            key: ApiKey::new(key),
            timeout: None,
            connect_timeout: Duration::from_secs(10),
            user_agent: format!("differently-client/{}", env!("CARGO_PKG_VERSION")),
            http: None,
        }
    }

    /// The API's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The underlying `reqwest` client (its connection pool), for callers that time raw
    /// requests themselves.
    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    /// A request to `path` (starting `/`) carrying the key: for routes this crate does not
    /// wrap yet.
    pub fn authorized(&self, method: Method, path: &str) -> RequestBuilder {
        self.inner
            .http
            .request(method, format!("{}{path}", self.inner.base))
            .bearer_auth(self.inner.key.expose())
    }

    /// Sends `rb` and answers the response if its status is a success, else the API's
    /// error. `context` is `METHOD path`, for messages.
    pub(crate) async fn send(
        &self,
        method: &Method,
        path: &str,
        rb: RequestBuilder,
    ) -> Result<Response> {
        let url = format!("{}{path}", self.inner.base);
        let resp = rb
            .send()
            .await
            .map_err(|e| TransportError::new(method.as_str(), &url, &self.inner.base, e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let request_id = resp
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .bytes()
            .await
            .map_err(|e| TransportError::new(method.as_str(), &url, &self.inner.base, e))?;
        Err(ApiError::from_body(status.as_u16(), &body, request_id).into())
    }

    /// Sends a request with an optional JSON body and extra headers; the response.
    pub(crate) async fn call<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
    ) -> Result<Response> {
        let mut rb = self.authorized(method.clone(), path);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        self.send(&method, path, rb).await
    }

    /// A call whose answer is JSON of type `T`.
    pub(crate) async fn json<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
    ) -> Result<T> {
        let context = format!("{method} {path}");
        let resp = self.call(method, path, body, headers).await?;
        decode(&context, &self.inner.base, resp).await
    }

    /// A call whose answer is JSON of type `T` or no body (`None`: a 204).
    pub(crate) async fn json_or_empty<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Option<T>> {
        let context = format!("{method} {path}");
        let resp = self.call(method, path, body, &[]).await?;
        if resp.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        decode(&context, &self.inner.base, resp).await.map(Some)
    }

    /// A call answered with no body (204).
    pub(crate) async fn empty<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<()> {
        let url = format!("{}{path}", self.inner.base);
        let m = method.clone();
        let resp = self.call(method, path, body, &[]).await?;
        resp.bytes()
            .await
            .map_err(|e| TransportError::new(m.as_str(), &url, &self.inner.base, e))?;
        Ok(())
    }

    /// `GET /healthz`: the process is up (no key needed).
    pub async fn health(&self) -> Result<serde_json::Value> {
        self.json::<_, ()>(Method::GET, "/healthz", None, &[]).await
    }

    /// `GET /readyz`: the store answers (an error with status 503 while it does not).
    pub async fn ready(&self) -> Result<serde_json::Value> {
        self.json::<_, ()>(Method::GET, "/readyz", None, &[]).await
    }

    /// `GET /v1/openapi.json`: the API's own description.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.json::<_, ()>(Method::GET, "/v1/openapi.json", None, &[])
            .await
    }
}

/// Reads a success answer's body as JSON of type `T`.
async fn decode<T: DeserializeOwned>(context: &str, base: &str, resp: Response) -> Result<T> {
    let status = resp.status();
    let url = resp.url().to_string();
    let body = resp
        .bytes()
        .await
        .map_err(|e| TransportError::new(context.split(' ').next().unwrap_or(""), &url, base, e))?;
    serde_json::from_slice(&body).map_err(|e| {
        Error::protocol(
            context,
            format!(
                "{status} with a body that is not the expected JSON ({e}); is this a Differently API?"
            ),
        )
    })
}

/// Percent-encodes a path segment or a query value (RFC 3986 unreserved characters pass).
pub(crate) fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string (`?a=1&b=2`, or empty) from the pairs that are set.
pub(crate) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// `/v1/sandboxes/{id}{rest}`.
pub(crate) fn sandbox_path(id: &str, rest: &str) -> String {
    format!("/v1/sandboxes/{}{rest}", encode(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_stays_out_of_debug() {
        let c = Client::new("http://127.0.0.1:1", "dly_key_x_supersecret").expect("client");
        let shown = format!("{c:?}");
        assert!(!shown.contains("supersecret"), "{shown}");
        assert!(shown.contains("127.0.0.1:1"), "{shown}");
    }

    #[test]
    fn a_url_that_is_not_http_is_refused_naming_the_field() {
        let e = Client::new("ftp://x", "k").expect_err("ftp");
        assert!(
            matches!(&e, Error::Invalid { field, .. } if field == "url"),
            "{e}"
        );
        assert!(Client::new("not a url", "k").is_err());
    }

    #[test]
    fn secrets_shown_once_stay_out_of_debug() {
        let hook: WebhookWithSecret = serde_json::from_value(serde_json::json!({
            "secret": "whsec_c3VwZXJzZWNyZXQ=", "id": "whk_1", "orgId": "org_1",
            "projectId": "prj_1", "url": "https://h.example/x", "eventTypes": [],
            "description": null, "enabled": true, "disabledReason": null,
            "consecutiveFailures": 0, "failingSince": null, "previousSecretExpiresAt": null,
            "createdAt": "t", "updatedAt": "t"
        }))
        .expect("a webhook with its secret");
        assert_eq!(hook.secret, "whsec_c3VwZXJzZWNyZXQ=");
        assert!(hook.webhook.extra.is_empty(), "{:?}", hook.webhook.extra);
        let shown = format!("{hook:?}");
        assert!(!shown.contains("c3VwZXJzZWNyZXQ"), "{shown}");
        let cred: EventCredentials = serde_json::from_value(serde_json::json!({
            "id": "evc_1", "token": "evc_1.tokensecret", "expiresAt": "t", "orgId": "org_1",
            "projectId": null, "subscribe": "dly.pub.org_1.>", "inboxPrefix": "_INBOX_org_1",
            "stream": "DLY_PUB", "consumerCreate": "$JS.API.CONSUMER.CREATE.DLY_PUB.*.x"
        }))
        .expect("credentials");
        let shown = format!("{cred:?}");
        assert!(!shown.contains("tokensecret"), "{shown}");
        assert!(shown.contains("evc_1"), "{shown}");
    }

    #[test]
    fn a_webhook_update_sends_only_what_changes_and_null_to_clear() {
        let clear = UpdateWebhook {
            description: Some(None),
            ..UpdateWebhook::default()
        };
        assert_eq!(
            serde_json::to_value(&clear).expect("json"),
            serde_json::json!({ "description": null })
        );
        assert!(UpdateWebhook::default().is_empty());
        assert!(!clear.is_empty());
    }

    #[test]
    fn query_values_and_segments_are_encoded() {
        assert_eq!(encode("a b/c=d"), "a%20b%2Fc%3Dd");
        assert_eq!(
            query(&[("label", Some("team=x".into())), ("cursor", None)]),
            "?label=team%3Dx"
        );
        assert_eq!(query(&[("a", None)]), "");
    }

    #[test]
    fn an_error_envelope_keeps_code_field_and_request_id() {
        let body = br#"{"error":{"code":"invalid_argument","details":{"field":"ttlSeconds"},"message":"ttlSeconds: bad","requestId":"01R"}}"#;
        let e = ApiError::from_body(400, body, None);
        assert_eq!(
            (e.code.as_str(), e.field.as_deref(), e.request_id.as_deref()),
            ("invalid_argument", Some("ttlSeconds"), Some("01R"))
        );
        assert_eq!(
            e.to_string(),
            "400 invalid_argument: ttlSeconds: bad (field ttlSeconds) [request 01R]"
        );
        let e = ApiError::from_body(502, b"<html>bad gateway</html>", Some("h1".into()));
        assert_eq!(
            (e.code.as_str(), e.request_id.as_deref()),
            ("unknown", Some("h1"))
        );
        assert!(e.message.contains("bad gateway"), "{e}");
    }
}
