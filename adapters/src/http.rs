//! The HTTP layer every HTTP backend adapter shares: one client bound to one backend's base
//! URL, with its credential header attached only to requests for that backend's own origin,
//! read through its reference at send time (so a rotated key is used without a restart),
//! and scrubbed from every message it produces. TLS is rustls (with the OS's roots plus an
//! optional private CA bundle), redirects are never followed (one would carry the credential
//! wherever it points), idempotent requests may be retried on transient failures with
//! back-off, and transport failures and error statuses become `AdapterError`s.
//!
//! What differs per backend (how its error bodies read, which codes mean what) stays in the
//! adapter: it maps statuses itself or falls back on [`status_error`].

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Request, RequestBuilder, Response, StatusCode};

use crate::credentials::{CredentialRef, CredentialResolver, Credentials};
use crate::error::Reason;
use crate::kit::errors::ErrorAnswer;
use crate::AdapterError;

/// A credential sent in a header. Never printed: `Debug` shows `***` and there is no
/// `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Accepts a value a header can carry; the reason otherwise never quotes it.
    pub fn parse(value: &str) -> Result<Secret, &'static str> {
        if value.is_empty() {
            return Err("is empty");
        }
        // It goes into a header: visible ASCII only.
        if !value.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err("has characters a header cannot carry");
        }
        Ok(Secret(value.to_owned()))
    }

    /// The secret itself, for the request header only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces any occurrence of the secret in `text` (belt and braces for server messages).
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, "***")
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why an HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpConfigError {
    /// The auth header name is not a valid header name.
    #[error("invalid header name `{0}`")]
    HeaderName(String),
    /// The CA bundle cannot be read.
    #[error("cannot read CA bundle {path}: {source}")]
    ReadCaBundle {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The CA bundle holds no usable PEM certificate.
    #[error("CA bundle {path} holds no PEM certificate")]
    EmptyCaBundle { path: String },
    /// The CA bundle is not PEM.
    #[error("CA bundle {path} is not a PEM certificate bundle: {source}")]
    BadCaBundle {
        path: String,
        #[source]
        source: reqwest::Error,
    },
    /// reqwest refused the configuration (e.g. no TLS backend).
    #[error("cannot build HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

/// A backend's JSON answer decoded as `T`. An answer that does not decode is `Transient`
/// (a proxy's error page, a half-deployed backend), saying `op` and who answered (`from`).
pub(crate) fn decode_answer<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    op: &str,
    from: &str,
) -> Result<T, AdapterError> {
    serde_json::from_slice(bytes).map_err(|e| {
        AdapterError::Transient(Reason::caused_by(
            format!("{op}: unexpected answer from {from}: {e}"),
            e,
        ))
    })
}

/// The certificates of a PEM bundle, checked: at least one, all parseable.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<reqwest::Certificate>, HttpConfigError> {
    let shown = path.display().to_string();
    let pem = std::fs::read(path).map_err(|source| HttpConfigError::ReadCaBundle {
        path: shown.clone(),
        source,
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| {
        HttpConfigError::BadCaBundle {
            path: shown.clone(),
            source,
        }
    })?;
    if certs.is_empty() {
        return Err(HttpConfigError::EmptyCaBundle { path: shown });
    }
    Ok(certs)
}

/// How an [`HttpClient`] is set up.
pub struct HttpClientBuilder {
    service: String,
    base_url: String,
    auth: Option<(String, String, CredentialRef, Option<Secret>)>,
    connect_timeout: Duration,
    request_timeout: Duration,
    ca_bundle: Vec<reqwest::Certificate>,
    retries: usize,
    retry_delay: Duration,
    scheme: &'static str,
    errors: ErrorMapper,
}

impl HttpClientBuilder {
    /// A client for `base_url` (no trailing slash); `service` names the backend in messages
    /// (`OpenSandbox`).
    pub fn new(service: impl Into<String>, base_url: impl Into<String>) -> Self {
        HttpClientBuilder {
            service: service.into(),
            base_url: base_url.into(),
            auth: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            ca_bundle: Vec::new(),
            retries: 0,
            retry_delay: Duration::from_millis(200),
            scheme: "",
            errors: generic_error,
        }
    }

    /// How this backend's error answers become errors (see [`crate::kit::errors`]); the
    /// default is [`status_error`] with the body's message.
    pub fn errors(mut self, errors: ErrorMapper) -> Self {
        self.errors = errors;
        self
    }

    /// Sends the credential as `Authorization`-style `Bearer <key>` rather than the bare key
    /// (providers such as Daytona read a bearer token); set together with [`Self::auth`].
    pub fn bearer(mut self) -> Self {
        self.scheme = "Bearer ";
        self
    }

    /// Sends the credential `reference` in `header` on every request to the base URL's
    /// origin; `what` names it in messages (`API key`). `initial`, when already read, is
    /// used until the reference is re-read.
    pub fn auth(
        mut self,
        header: impl Into<String>,
        what: impl Into<String>,
        reference: CredentialRef,
        initial: Option<Secret>,
    ) -> Self {
        self.auth = Some((header.into(), what.into(), reference, initial));
        self
    }

    /// How long connecting may take (default 10 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Overall timeout of [`HttpClient::api`] requests (default 30 s).
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Trusts these CA certificates too (a private CA; see [`read_ca_bundle`]).
    pub fn ca_bundle(mut self, certs: Vec<reqwest::Certificate>) -> Self {
        self.ca_bundle = certs;
        self
    }

    /// Retries an idempotent request up to `times` more times when it could not connect or
    /// was answered 502, 503 or 504, waiting from `first_delay` on, doubling, with jitter.
    /// Default: no retries.
    pub fn retries(mut self, times: usize, first_delay: Duration) -> Self {
        self.retries = times;
        self.retry_delay = first_delay;
        self
    }

    /// Builds the client; the credential resolves through `credentials` at send time.
    pub fn build(self, credentials: &Credentials) -> Result<HttpClient, HttpConfigError> {
        let mut http = reqwest::Client::builder()
            // A redirect would carry the credential header to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.connect_timeout);
        for cert in self.ca_bundle {
            http = http.add_root_certificate(cert);
        }
        let http = http.build().map_err(HttpConfigError::Build)?;
        let auth = match self.auth {
            None => None,
            Some((header, what, reference, initial)) => {
                let header = HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| HttpConfigError::HeaderName(header.clone()))?;
                let credential = credentials.resolver(reference);
                let mut seen = Vec::new();
                if let Some(k) = initial {
                    credential.seed(k.expose());
                    seen.push(k);
                }
                Some(Auth {
                    header,
                    scheme: self.scheme,
                    what,
                    credential: Arc::new(credential),
                    seen: Arc::new(Mutex::new(seen)),
                })
            }
        };
        Ok(HttpClient {
            http,
            base_origin: origin(&self.base_url).unwrap_or_default(),
            base_url: self.base_url,
            service: self.service,
            auth,
            request_timeout: self.request_timeout,
            retries: self.retries,
            retry_delay: self.retry_delay,
            errors: self.errors,
        })
    }
}

/// The credential side of a client.
#[derive(Debug, Clone)]
struct Auth {
    header: HeaderName,
    /// Put before the secret in the header (`Bearer `), or nothing.
    scheme: &'static str,
    what: String,
    /// The secret's reference, read at send time.
    credential: Arc<CredentialResolver>,
    /// Secrets used so far (the current and the one before), scrubbed from every message.
    seen: Arc<Mutex<Vec<Secret>>>,
}

/// HTTP client bound to one backend.
#[derive(Debug, Clone)]
pub struct HttpClient {
    http: reqwest::Client,
    /// e.g. `https://host:port/v1`
    base_url: String,
    /// `scheme://host:port`, normalised, to decide where the credential may go.
    base_origin: String,
    pub(crate) service: String,
    auth: Option<Auth>,
    request_timeout: Duration,
    retries: usize,
    retry_delay: Duration,
    pub(crate) errors: ErrorMapper,
}

/// How a backend's error answer becomes an [`AdapterError`]: `op` says what was being done.
/// The client scrubs the result and re-reads a refused credential; the mapper only decides.
pub type ErrorMapper = fn(op: &str, answer: &ErrorAnswer) -> AdapterError;

/// The mapper of a client that was given none: [`status_error`] on the body's message.
fn generic_error(op: &str, answer: &ErrorAnswer) -> AdapterError {
    status_error(op, answer.status, &answer.error().message)
}

/// Why one attempt did not give an answer worth returning.
enum Attempt {
    Transport(reqwest::Error),
    /// A 502/503/504 answer, kept to return if no retry is left.
    Busy(Response),
    /// The request could not be copied for another attempt.
    Uncopyable,
}

impl HttpClient {
    /// The credential now, through its reference. A reference that does not resolve makes
    /// the backend unusable until it does: `Unavailable`, naming the reference, never a value.
    async fn secret(&self, auth: &Auth) -> Result<Secret, AdapterError> {
        let reference = auth.credential.reference();
        let label = format!("{} {}", self.service, auth.what);
        let raw = auth.credential.get().await.map_err(|e| {
            AdapterError::Unavailable(Reason::caused_by(format!("{label} ({reference}): {e}"), e))
        })?;
        let secret = Secret::parse(&raw).map_err(|why| {
            AdapterError::unavailable(format!("{label} ({reference}): the key {why}"))
        })?;
        let mut seen = auth.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.contains(&secret) {
            seen.push(secret.clone());
            let len = seen.len();
            seen.drain(..len.saturating_sub(2));
        }
        Ok(secret)
    }

    /// Replaces every secret used so far in `text` with `***`.
    pub fn scrub(&self, text: &str) -> String {
        match &self.auth {
            None => text.to_owned(),
            Some(auth) => {
                let seen = auth.seen.lock().unwrap_or_else(|p| p.into_inner());
                seen.iter().fold(text.to_owned(), |t, k| k.scrub(&t))
            }
        }
    }

    /// Scrubs the message of an error (its kind and cause kept).
    pub fn scrub_error(&self, e: AdapterError) -> AdapterError {
        match e {
            AdapterError::Transient(m) => AdapterError::Transient(m.map_message(|t| self.scrub(t))),
            AdapterError::Permanent(m) => AdapterError::Permanent(m.map_message(|t| self.scrub(t))),
            AdapterError::Unsupported(m) => AdapterError::Unsupported(self.scrub(&m)),
            AdapterError::Unavailable(m) => {
                AdapterError::Unavailable(m.map_message(|t| self.scrub(t)))
            }
            AdapterError::Capacity(m) => AdapterError::Capacity(m.map_message(|t| self.scrub(t))),
            AdapterError::PathNotFound(m) => AdapterError::PathNotFound(self.scrub(&m)),
            AdapterError::BadPath(mut p) => {
                p.path = self.scrub(&p.path);
                AdapterError::BadPath(p)
            }
            AdapterError::NotFound => AdapterError::NotFound,
        }
    }

    /// Forgets the credential read so far, so the next request reads it again (after the
    /// backend refused it: a replaced key is picked up at once).
    pub fn forget_credential(&self) {
        if let Some(auth) = &self.auth {
            auth.credential.forget();
        }
    }

    /// Whether `url` is on the backend itself (so the credential may be sent).
    pub fn is_backend(&self, url: &str) -> bool {
        origin(url).is_some_and(|o| o == self.base_origin)
    }

    /// The credential header's name, if the client has one.
    pub fn auth_header(&self) -> Option<&HeaderName> {
        self.auth.as_ref().map(|a| &a.header)
    }

    /// A request to the base URL plus `path` (starting with `/`), with the request timeout;
    /// `send` adds the credential.
    pub fn api(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base_url, path))
            .timeout(self.request_timeout)
    }

    /// A request to any URL; `send` adds the credential only if the URL is on the backend.
    /// No overall timeout: callers set one or watch the stream themselves.
    pub fn to(&self, method: Method, url: &str) -> RequestBuilder {
        self.http.request(method, url)
    }

    /// The timeout of [`HttpClient::api`] requests.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Attaches the credential to a request for the backend's origin and removes a
    /// credential header from any other (e.g. copied from an answer).
    async fn authorize(&self, req: &mut Request) -> Result<(), AdapterError> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        if self.is_backend(req.url().as_str()) {
            let secret = self.secret(auth).await?;
            let raw = format!("{}{}", auth.scheme, secret.expose());
            let mut value = HeaderValue::from_str(&raw).map_err(|_| {
                AdapterError::unavailable(format!(
                    "{} {} ({}): the key has characters a header cannot carry",
                    self.service,
                    auth.what,
                    auth.credential.reference()
                ))
            })?;
            value.set_sensitive(true);
            req.headers_mut().insert(auth.header.clone(), value);
        } else {
            req.headers_mut().remove(&auth.header);
        }
        Ok(())
    }

    /// Sends and maps transport errors; `op` says what was being done (for messages).
    /// Retries as configured ([`HttpClientBuilder::retries`]).
    pub async fn send(&self, rb: RequestBuilder, op: &str) -> Result<Response, AdapterError> {
        let (http, req) = rb.build_split();
        let mut req = req.map_err(|e| self.transport_error(op, e))?;
        self.authorize(&mut req).await?;
        if self.retries == 0 || !is_idempotent(req.method()) || req.try_clone().is_none() {
            return http
                .execute(req)
                .await
                .map_err(|e| self.transport_error(op, e));
        }
        let attempt = || async {
            let copy = req.try_clone().ok_or(Attempt::Uncopyable)?;
            match http.execute(copy).await {
                Ok(resp) if is_busy(resp.status()) => Err(Attempt::Busy(resp)),
                Ok(resp) => Ok(resp),
                Err(e) => Err(Attempt::Transport(e)),
            }
        };
        let policy = ExponentialBuilder::default()
            .with_min_delay(self.retry_delay)
            .with_max_times(self.retries)
            .with_jitter();
        let result = attempt
            .retry(policy)
            .sleep(tokio::time::sleep)
            .when(|a| match a {
                Attempt::Transport(e) => e.is_connect(),
                Attempt::Busy(_) => true,
                Attempt::Uncopyable => false,
            })
            .await;
        match result {
            Ok(resp) | Err(Attempt::Busy(resp)) => Ok(resp),
            Err(Attempt::Transport(e)) => Err(self.transport_error(op, e)),
            Err(Attempt::Uncopyable) => Err(AdapterError::permanent(format!(
                "{op}: the request cannot be sent again"
            ))),
        }
    }

    /// Maps a transport failure: unreachable → Unavailable, everything else → Transient.
    /// The message follows the error's causes (TLS failures say why) and is scrubbed.
    pub fn transport_error(&self, op: &str, e: reqwest::Error) -> AdapterError {
        let mut text = String::new();
        let mut source: Option<&dyn std::error::Error> = Some(&e);
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
        let scrubbed = self.scrub(&text);
        let (connect, timeout) = (e.is_connect(), e.is_timeout());
        let message = if connect {
            format!("{op}: cannot connect: {scrubbed}")
        } else if timeout {
            format!("{op}: timed out")
        } else {
            format!("{op}: {scrubbed}")
        };
        // The cause is kept only when no secret shows anywhere in its chain.
        let reason = if scrubbed == text {
            Reason::caused_by(message, e)
        } else {
            Reason::from(message)
        };
        if connect {
            AdapterError::Unavailable(reason)
        } else {
            AdapterError::Transient(reason)
        }
    }
}

/// Methods whose repetition does no harm (RFC 9110 §9.2.2).
fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    )
}

/// Answers that say "not now" rather than "no".
fn is_busy(s: StatusCode) -> bool {
    matches!(s.as_u16(), 502..=504)
}

/// The generic status → error mapping, for a backend without its own codes: 401/403 the
/// credentials were refused, 404 not found, 408/429/5xx transient, 501 unsupported, other
/// 4xx permanent. `text` describes the answer (already scrubbed by the caller). A generic
/// 429 stays transient (a rate limit passes); an adapter whose backend says a 429 means
/// "plan or capacity limit" maps it with [`capacity_error`] instead.
pub fn status_error(op: &str, status: StatusCode, text: &str) -> AdapterError {
    let text = format!("{op}: HTTP {}: {text}", status.as_u16());
    match status.as_u16() {
        401 | 403 => AdapterError::permanent(text),
        404 => AdapterError::NotFound,
        408 | 429 => AdapterError::transient(text),
        501 => AdapterError::Unsupported(text),
        500..=599 => AdapterError::transient(text),
        _ => AdapterError::permanent(text),
    }
}

/// Longest `Retry-After` honoured: a provider asking for more is asked again after this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The `Retry-After` of an answer (RFC 9110 §10.2.3: delta-seconds or an HTTP date), capped
/// at [`MAX_RETRY_AFTER`]; `None` when absent or unreadable. A date in the past is zero.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
        (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// An [`AdapterError::Capacity`] for an answer the adapter knows means "no room now" (a 429
/// at a plan limit, a capacity error code): `op: HTTP <status>: text`, with the answer's
/// `Retry-After` (read it with [`retry_after`]). `text` is already scrubbed by the caller.
pub fn capacity_error(
    op: &str,
    status: StatusCode,
    text: &str,
    retry_after: Option<Duration>,
) -> AdapterError {
    AdapterError::capacity(
        format!("{op}: HTTP {}: {text}", status.as_u16()),
        retry_after,
    )
}

/// `scheme://host:port` of a URL, lower-cased, default port filled in.
pub fn origin(url: &str) -> Option<String> {
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
        assert_eq!(origin("https://h/v1"), origin("https://h:443"));
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::parse("k3y").unwrap();
        assert_eq!(format!("{s:?}"), "***");
        assert_eq!(s.scrub("a k3y b"), "a *** b");
        assert!(Secret::parse("").is_err());
        assert!(Secret::parse("a b").is_err());
    }

    #[test]
    fn generic_statuses_map_to_kinds() {
        let e = |s: u16| status_error("op", StatusCode::from_u16(s).unwrap(), "x");
        assert_eq!(e(404), AdapterError::NotFound);
        assert!(matches!(e(503), AdapterError::Transient(_)));
        assert!(matches!(e(429), AdapterError::Transient(_)));
        assert!(matches!(e(501), AdapterError::Unsupported(_)));
        assert!(matches!(e(401), AdapterError::Permanent(_)));
        assert!(matches!(e(400), AdapterError::Permanent(_)));
        assert!(is_idempotent(&Method::PUT) && !is_idempotent(&Method::POST));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_capacity_keeps_it() {
        use reqwest::header::{HeaderMap, RETRY_AFTER};
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
            retry_after(&h)
        };
        assert_eq!(with("12"), Some(Duration::from_secs(12)));
        assert_eq!(with(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(with("99999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(with("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(120)).to_rfc2822();
        let wait = with(&soon).expect("a date in the future");
        assert!((110..=120).contains(&wait.as_secs()), "{wait:?}");
        assert_eq!(with("soon"), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);

        let e = capacity_error(
            "create",
            StatusCode::TOO_MANY_REQUESTS,
            "plan limit",
            Some(Duration::from_secs(5)),
        );
        assert!(
            matches!(&e, AdapterError::Capacity(r) if r.contains("HTTP 429")),
            "{e:?}"
        );
        assert!(e.is_retryable());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(5)));
    }
}
