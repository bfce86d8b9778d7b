//! The dashboard at `/ui` (docs/dashboard.md): static HTML, CSS and plain ES modules, embedded
//! in the binary at compile time so `differently dev` serves it with no build step and no Node.
//!
//! The page is a client of `/v1` like any other: it holds the API key in the browser's session
//! storage and sends it as a bearer header, so these routes need no authentication of their own
//! (they serve the same bytes to everyone) and there is no cookie a cross-site request could
//! ride on. Every answer carries a strict CSP (scripts and styles from this origin only, no
//! inline script, no framing) and `nosniff`.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

use crate::AppState;

/// One embedded file: its path under `/ui/`, media type and bytes.
pub struct Asset {
    /// Relative to `api/ui/` and to `/ui/`.
    pub path: &'static str,
    /// The `Content-Type` it is served with (`nosniff`: the browser takes it as given).
    pub content_type: &'static str,
    /// The file as it was when the binary was built.
    pub bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $ty:expr) => {
        Asset {
            path: $path,
            content_type: $ty,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of `api/ui/`; a test checks that none is missing from this list.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/api.js", JS),
    asset!("js/app.js", JS),
    asset!("js/chart.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/live.js", JS),
    asset!("js/operator.js", JS),
    asset!("js/sandbox.js", JS),
    asset!("js/tenant.js", JS),
    asset!("js/terminal.js", JS),
];

/// The Content-Security-Policy of every `/ui` answer. `connect-src 'self'` covers the API's
/// fetches, the event stream and the terminal's WebSocket (same origin, `ws:`/`wss:` included).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Routes of the dashboard.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/{*path}", get(file))
}

/// The strong ETag of each asset, computed once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let d = Sha256::digest(a.bytes);
                let hex = hex::encode(&d[..12]);
                format!("\"{hex}\"")
            })
            .collect()
    })
}

/// Headers every dashboard answer carries, errors included.
fn secure(resp: &mut Response) {
    let h = resp.headers_mut();
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("permissions-policy"),
            "camera=(), microphone=(), geolocation=(), payment=()",
        ),
    ];
    for (name, value) in fixed {
        h.insert(name, HeaderValue::from_static(value));
    }
}

fn serve(index: usize, headers: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    let tag = &etags()[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.bytes).into_response()
    };
    secure(&mut resp);
    let h = resp.headers_mut();
    // Revalidated on every load (a 304 costs one round trip): a new binary's assets are
    // never mixed with an old one's.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    resp
}

async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.path == path) {
        // Views are addressed by the fragment (`/ui/#/sandboxes`), so any other path is a
        // mistyped link: a plain 404 with the same headers.
        Some(i) => serve(i, &headers),
        None => {
            let mut resp = crate::error::ApiError::not_found("dashboard file").into_response();
            secure(&mut resp);
            resp
        }
    }
}

#[cfg(test)]
mod tests;
