//! Middleware every request passes through.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use differently_bus_schema::TraceContext;
use differently_store::audit;

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
    let run = audit::with_request_id(id.clone(), next.run(req));
    let mut resp = differently_bus::trace::scope("request", trace, run).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    if let Some(v) = traceparent.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("traceparent", v);
    }
    resp
}
