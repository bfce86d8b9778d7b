//! Middleware every request passes through.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use differently_bus_schema::TraceContext;
use differently_core::request_id::with_request_id;
use differently_core::ErrorCode;
use http_body::{Frame, SizeHint};
use serde_json::json;

use crate::error::ApiError;
use crate::AppState;

/// Longest request id accepted from a client's `X-Request-Id`.
const MAX_REQUEST_ID: usize = 64;

/// Middleware: every request gets a request id (the client's `X-Request-Id` if it is short
/// and plain, a new ULID otherwise), served back in `X-Request-Id` and written into every
/// audit record the request causes.
pub async fn request_id(req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= MAX_REQUEST_ID
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(str::to_owned);
    let id = given.unwrap_or_else(|| ulid::Ulid::new().to_string());
    // W3C trace context: the caller's valid `traceparent`, else a new root. It is on the
    // request's span (so on every log line) and in every envelope published while serving it.
    let trace = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceContext::from_header)
        .unwrap_or_else(|| TraceContext::from_random(rand::random(), rand::random()));
    let traceparent = trace.traceparent.clone();
    let run = with_request_id(id.clone(), next.run(req));
    let mut resp = differently_bus::trace::scope("request", trace, run).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if let Some(v) = traceparent.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("traceparent", v);
    }
    resp
}

/// Longest request target (path and query) served; longer ones get 414 `uri_too_long`. (The
/// HTTP layer itself refuses targets over 64 KiB before any route is asked; `bare_errors`
/// makes that answer the same envelope.)
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Largest JSON request body; file uploads stream and have their own limit (`routes::files`).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Longest error text of an inner layer read back to put in the envelope's message.
const MAX_REWRITTEN_TEXT: usize = 1024;

/// Middleware (inside `request_id`): what the router's own layers and extractors answer is
/// served as the error envelope too, and request bodies are read against a deadline.
///
/// Rewriting responses here, once, rather than mapping each extractor's rejection is the
/// robust choice: it covers every source of a non-envelope error (path, query and body
/// rejections, the body limit, 405 from a method router, any layer added later) without each
/// handler having to remember, and a response that already is JSON (every `ApiError`, a 416
/// with its envelope) is left untouched.
pub async fn guard(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > MAX_URI_BYTES {
        let error = ApiError::new(
            ErrorCode::UriTooLong,
            format!(
                "the request target is {target_len} bytes; at most {MAX_URI_BYTES} are accepted"
            ),
        )
        .with_details(json!({ "limitBytes": MAX_URI_BYTES }));
        return Refusal::of(error).render(&method, &path);
    }
    // A streamed upload may take long but must keep moving; any other body arrives whole
    // within the timeout.
    let streamed = method == Method::PUT && path.ends_with("/files");
    let window = state.limits.body_read_timeout;
    let fired = Arc::new(AtomicBool::new(false));
    let req = req.map(|b| Body::new(TimedBody::new(b, window, streamed, fired.clone())));
    let resp = next.run(req).await;
    if fired.load(Ordering::Relaxed) && resp.status().as_u16() >= 400 {
        let error = ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "the request body did not arrive within {} s",
                window.as_secs_f64()
            ),
        );
        let mut resp = Refusal::of(error).render(&method, &path);
        // The rest of the body may still be on its way: this connection is not reused.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    as_envelope(&method, &path, resp).await
}

/// Marks a response passed on as it came (a sandbox port's answer through the E2B facade's
/// port proxy): never rewritten into the envelope, whatever its status and type.
#[derive(Debug, Clone, Copy)]
pub struct Verbatim;

/// `resp` itself when it is a success, already JSON or [`Verbatim`]; else the refusal for
/// its status in the error shape of `path` ([`Dialect`]), with its headers (`Allow`,
/// `Retry-After`, …) kept.
async fn as_envelope(method: &Method, path: &str, resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json || resp.extensions().get::<Verbatim>().is_some() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_REWRITTEN_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let refusal = Refusal::of_plain(method, status, &parts.headers, text);
    let mut out = refusal.render(method, path);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// Whose error body a refusal made outside the handlers (by axum, a layer, or the checks
/// before routing) is served in, by the path it was made on: each facade's SDKs read only
/// their own shape, and fail on `/v1`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `/v1`'s envelope, `{"error": {code, message, details, requestId}}`: every path not
    /// named below.
    V1,
    /// OpenSandbox's `{code, message}`, under `/opensandbox`.
    OpenSandbox,
    /// E2B's `{code: <status>, message}`, under `/e2b` (its control plane and envd's HTTP
    /// routes) and on `/files` (signed URLs).
    E2b,
    /// A Connect error, `{code: "<connect code>", message}`, for envd's RPCs
    /// (`/e2b/envd/<package.Service>/<Method>`).
    E2bRpc,
}

impl Dialect {
    /// The dialect of a request for `path`.
    pub fn of(path: &str) -> Dialect {
        use crate::facade::{e2b, opensandbox};
        if under(path, opensandbox::PREFIX).is_some() {
            Dialect::OpenSandbox
        } else if let Some(rest) = under(path, e2b::ENVD_PREFIX) {
            let service = rest.trim_start_matches('/').split('/').next();
            if service.is_some_and(|s| s.contains('.')) {
                Dialect::E2bRpc
            } else {
                Dialect::E2b
            }
        } else if under(path, e2b::PREFIX).is_some() || path == "/files" {
            Dialect::E2b
        } else {
            Dialect::V1
        }
    }
}

/// What follows `prefix` in `path` when `path` is `prefix` or below it.
fn under<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// A refusal made outside any handler, described once as `/v1` describes it (code, message,
/// details) and served in whichever [`Dialect`] the request's path speaks.
#[derive(Debug)]
pub struct Refusal {
    /// The status served (a plain-text refusal's own, which no code of ours may change).
    pub status: StatusCode,
    pub error: ApiError,
    /// The code was only inferred from the status of a plain-text answer (no check of ours
    /// named it); the OpenSandbox facade then names the status (`DIFFERENTLY::HTTP_415`).
    pub by_status: bool,
}

impl Refusal {
    /// A refusal of ours, served with its code's status.
    pub fn of(error: ApiError) -> Refusal {
        let status =
            StatusCode::from_u16(error.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        Refusal {
            status,
            error,
            by_status: false,
        }
    }

    /// The refusal for a plain-text answer of `status` to `method` (`text` its body,
    /// `headers` its headers) made by axum or a layer.
    fn of_plain(method: &Method, status: StatusCode, headers: &HeaderMap, text: String) -> Refusal {
        let (error, by_status) = match status {
            StatusCode::METHOD_NOT_ALLOWED => {
                let allow = headers
                    .get(header::ALLOW)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let message = if allow.trim().is_empty() {
                    format!("{method} is not allowed on this route")
                } else {
                    format!("{method} is not allowed on this route (allowed: {allow})")
                };
                (ApiError::new(ErrorCode::MethodNotAllowed, message), false)
            }
            StatusCode::PAYLOAD_TOO_LARGE => (
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
                )
                .with_details(json!({ "limitBytes": MAX_BODY_BYTES })),
                false,
            ),
            _ => {
                let code = ErrorCode::ALL
                    .into_iter()
                    .find(|c| c.http_status() == status.as_u16())
                    .unwrap_or(if status.is_server_error() {
                        ErrorCode::Internal
                    } else {
                        ErrorCode::InvalidArgument
                    });
                let message = if text.is_empty() || code == ErrorCode::Internal {
                    status
                        .canonical_reason()
                        .unwrap_or("request refused")
                        .to_owned()
                } else {
                    text
                };
                (ApiError::new(code, message), true)
            }
        };
        Refusal {
            status,
            error,
            by_status,
        }
    }

    /// This refusal of `method path` in the error shape of the path's [`Dialect`].
    pub fn render(self, method: &Method, path: &str) -> Response {
        use crate::facade::e2b::connect::ConnectError;
        use crate::facade::e2b::error::E2bError;
        use crate::facade::opensandbox::error::OsbError;
        let status = self.status;
        let mut out = match Dialect::of(path) {
            Dialect::V1 => self.error.into_response(),
            Dialect::OpenSandbox => OsbError::refused(&self, method, path).into_response(),
            Dialect::E2b => E2bError::new(status, self.error.message).into_response(),
            Dialect::E2bRpc => ConnectError::new(
                ConnectError::code_of_v1(self.error.code.as_str()),
                self.error.message,
            )
            .into_response(),
        };
        *out.status_mut() = status;
        out
    }
}

/// A request body read against a clock: the whole body within `window` (or, `idle`, each
/// chunk within `window` of the one before, for streamed uploads). When the clock runs out
/// the read fails and `fired` says so, for `guard` to answer 408.
struct TimedBody {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    window: Duration,
    idle: bool,
    fired: Arc<AtomicBool>,
    done: bool,
}

impl TimedBody {
    fn new(inner: Body, window: Duration, idle: bool, fired: Arc<AtomicBool>) -> TimedBody {
        TimedBody {
            inner,
            sleep: Box::pin(tokio::time::sleep(window)),
            window,
            idle,
            fired,
            done: false,
        }
    }
}

/// The error a timed-out body read fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.idle {
                    let next = tokio::time::Instant::now() + this.window;
                    this.sleep.as_mut().reset(next);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.done = true;
                    this.fired.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))))
                }
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
