//! The HTTP scaffolding every fake provider has: a request read whole, query decoding, JSON
//! answers and the poisoned-lock rule. Routing, auth and each provider's error shapes stay in
//! the fakes.

use std::sync::{Mutex, MutexGuard};

use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use serde_json::Value;

/// A lock that a panicking test thread left poisoned is still usable: the fake keeps serving
/// the other tests' assertions.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A listener on a free loopback port.
pub async fn bind() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap()
}

/// Serves `app` on `listener` for the rest of the test process.
pub fn serve(listener: tokio::net::TcpListener, app: Router) {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
}

/// One request as a fake's handler reads it: the body whole, the query decoded.
pub struct Req {
    pub method: Method,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Req {
    /// Reads `req`, its body up to `limit` bytes (a longer one reads as empty).
    pub async fn read(req: Request, limit: usize) -> Req {
        let (parts, body) = req.into_parts();
        let body = axum::body::to_bytes(body, limit).await.unwrap_or_default();
        Req {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parse_query(parts.uri.query().unwrap_or("")),
            headers: parts.headers,
            body,
        }
    }

    /// The first value of query parameter `k`.
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of query parameter `k`, in order.
    pub fn qs(&self, k: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as JSON; `null` when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Header `k` as text.
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers.get(k).and_then(|v| v.to_str().ok())
    }
}

/// Percent-decoding as form encoding does it (`+` is a space); a bad escape is kept as is.
pub fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            (b'+', _) => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=1&b=%20` as decoded pairs, in order, repeats kept.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (pct_decode(k), pct_decode(v))
        })
        .collect()
}

/// A JSON answer with `status`.
pub fn json_resp(status: u16, v: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}
