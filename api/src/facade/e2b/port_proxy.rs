//! Ports of a sandbox other than envd's, reached through the facade: what E2B's edge does for
//! `E2b-Sandbox-Port: <port>` (or `<port>-<id>.<domain>` in DNS mode). The code interpreter
//! SDK (`e2b-code-interpreter`) needs it: its `/execute` and `/contexts` calls go to the envd
//! URL with `E2b-Sandbox-Port: 49999`, and a server in the sandbox (E2B's code-interpreter
//! template) answers them.
//!
//! A request is authenticated as envd's are, by the `X-Access-Token` the SDK sends on
//! `/execute`, or by the `E2B-Traffic-Access-Token` it sends on every port call (the facade
//! hands one out in create and connect answers, as E2B does for sandboxes without public
//! traffic). It is forwarded only to the endpoint the sandbox's pool gave for that port
//! (`POST /v1/sandboxes/{id}/ports`, run as the key the token names), never to a host the
//! caller chooses. The endpoint is remembered per sandbox, port and key until it expires, and
//! for [`RECHECK`] at most, so a call costs no worker round trip and a revoked key or an
//! ended sandbox stops reaching the port within that time.
//!
//! Both bodies stream, and the upstream connection is HTTP/1.1 only, one per request in
//! flight: when the client goes away the answer is dropped and that connection closes, which
//! is how the code interpreter learns that an execution was cancelled. WebSocket upgrades are
//! not forwarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::TryStreamExt;
use serde_json::{json, Value};

use crate::facade::opensandbox::inner::{q, Caller};

use super::envd::{named_sandbox, EnvdError, ENVD_PORT};
use super::{token, Facade, InnerError, ENVD_PREFIX};

/// The code interpreter's port (E2B's `JUPYTER_PORT`), named in its errors.
pub const CODE_INTERPRETER_PORT: u16 = 49999;
/// The header the SDKs send the traffic access token in.
pub const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";
/// Longest time an endpoint is used without asking `/v1` again.
pub const RECHECK: Duration = Duration::from_secs(60);
/// An endpoint is asked for again this long before the pool says it expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// Remembered endpoints at most (expired ones are dropped first).
const MAX_ENDPOINTS: usize = 4096;
/// How long connecting to an endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Headers never forwarded either way: hop-by-hop ones, and the facade's own (its tokens
/// would let the sandbox's code call envd as the key).
const DROPPED: [&str; 13] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    token::HEADER,
    TRAFFIC_HEADER,
    "e2b-sandbox-id",
];

/// The HTTP client and the remembered endpoints.
pub struct Ports {
    client: reqwest::Client,
    endpoints: Mutex<HashMap<(String, u16, String), Remembered>>,
}

#[derive(Clone)]
struct Remembered {
    url: String,
    until: Instant,
}

impl Default for Ports {
    fn default() -> Ports {
        let client = reqwest::Client::builder()
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .no_proxy()
            .build()
            .unwrap_or_default();
        Ports {
            client,
            endpoints: Mutex::new(HashMap::new()),
        }
    }
}

/// Why a port request was not forwarded, as the answer says it: `{code, message}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct PortError {
    pub status: StatusCode,
    pub message: String,
}

impl PortError {
    fn new(status: StatusCode, message: impl Into<String>) -> PortError {
        PortError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for PortError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "code": self.status.as_u16(), "message": self.message })),
        )
            .into_response()
    }
}

/// Middleware on the facade's routes: an envd-URL request for another port is forwarded to
/// it; everything else goes on to the envd and control-plane routes.
pub async fn route(Extension(f): Extension<Arc<Facade>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let under_envd = path
        .strip_prefix(ENVD_PREFIX)
        .is_some_and(|r| r.is_empty() || r.starts_with('/'));
    let Some(port) = req.headers().get("e2b-sandbox-port").filter(|_| under_envd) else {
        return next.run(req).await;
    };
    let port = port.to_str().unwrap_or("").trim();
    if port == ENVD_PORT {
        return next.run(req).await;
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => match forward(&f, p, req).await {
            Ok(resp) => resp,
            Err(e) => e.into_response(),
        },
        _ => PortError::new(
            StatusCode::BAD_REQUEST,
            "E2b-Sandbox-Port must be a port number, 1-65535",
        )
        .into_response(),
    }
}

/// The key id the request's token names for `sandbox`.
fn authorize(f: &Facade, h: &HeaderMap, sandbox: &str) -> Result<String, PortError> {
    let get = |name: &str| {
        h.get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let envd = get(token::HEADER);
    let traffic = get(TRAFFIC_HEADER);
    if envd.is_none() && traffic.is_none() {
        return Err(PortError::new(
            StatusCode::UNAUTHORIZED,
            "missing X-Access-Token or E2B-Traffic-Access-Token: use the envdAccessToken or \
             trafficAccessToken of the create or connect answer",
        ));
    }
    let opened = [(envd, &f.tokens), (traffic, &f.traffic)]
        .into_iter()
        .find_map(|(t, d)| t.and_then(|t| d.open(t, sandbox).ok()));
    opened.ok_or_else(|| gone(sandbox))
}

async fn forward(f: &Facade, port: u16, req: Request) -> Result<Response, PortError> {
    let (parts, body) = req.into_parts();
    let sandbox = named_sandbox(&parts.headers)
        .ok_or_else(|| {
            PortError::new(
                StatusCode::BAD_REQUEST,
                "E2b-Sandbox-Id is required: the sandbox this call is for",
            )
        })?
        .to_owned();
    let key_id = authorize(f, &parts.headers, &sandbox)?;
    let base = f.ports.endpoint(f, &sandbox, port, &key_id).await?;
    let rest = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .strip_prefix(ENVD_PREFIX)
        .unwrap_or("/");
    let rest = if rest.starts_with('/') {
        rest.to_owned()
    } else {
        format!("/{rest}")
    };
    let url = format!("{}{rest}", base.trim_end_matches('/'));
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes())
        .map_err(|_| PortError::new(StatusCode::METHOD_NOT_ALLOWED, "not an HTTP method"))?;
    let mut upstream = f
        .ports
        .client
        .request(method, &url)
        .headers(forwarded(&parts.headers));
    if parts.method != Method::GET && parts.method != Method::HEAD {
        upstream = upstream.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    }
    let resp = match upstream.send().await {
        Ok(r) => r,
        Err(e) => {
            // Perhaps the sandbox moved (resumed elsewhere): the next call asks the pool again.
            f.ports.forget(&sandbox, port, &key_id);
            return Err(unreachable(&sandbox, port, &e));
        }
    };
    let mut out = Response::builder().status(resp.status().as_u16());
    if let Some(h) = out.headers_mut() {
        *h = forwarded(resp.headers());
    }
    let stream = resp.bytes_stream().map_err(std::io::Error::other);
    let mut resp = out
        .body(Body::from_stream(stream))
        .map_err(|e| PortError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    // The sandbox's answer as it is: not rewritten into the API's error envelope.
    resp.extensions_mut()
        .insert(crate::requests::middleware::Verbatim);
    Ok(resp)
}

/// `h` less [`DROPPED`] and the headers its `Connection` names.
fn forwarded(h: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::new();
    for (name, value) in h {
        let n = name.as_str();
        if DROPPED.contains(&n) || n == "e2b-sandbox-port" || named.iter().any(|c| c == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The answer when the endpoint did not answer: 503 (not E2B's 502, which the code
/// interpreter SDK reports as a sandbox timeout), naming what is missing.
fn unreachable(sandbox: &str, port: u16, e: &reqwest::Error) -> PortError {
    let what = if e.is_connect() {
        "nothing listens there"
    } else if e.is_timeout() {
        "it did not answer in time"
    } else {
        "the connection failed"
    };
    let message = if port == CODE_INTERPRETER_PORT {
        format!(
            "the sandbox {sandbox}'s template serves no code interpreter on port {port} \
             ({what}): the code interpreter needs a template running E2B's code-interpreter \
             server (docs/e2b-facade.md)"
        )
    } else {
        format!("port {port} of sandbox {sandbox} cannot be reached: {what}")
    };
    PortError::new(StatusCode::SERVICE_UNAVAILABLE, message)
}

impl Ports {
    /// The URL the pool gave for `port` of `sandbox`, asked for as `key_id` unless
    /// remembered.
    async fn endpoint(
        &self,
        f: &Facade,
        sandbox: &str,
        port: u16,
        key_id: &str,
    ) -> Result<String, PortError> {
        let k = (sandbox.to_owned(), port, key_id.to_owned());
        if let Some(r) = self.lock().get(&k).filter(|r| r.until > Instant::now()) {
            return Ok(r.url.clone());
        }
        let caller = Caller::Delegated(key_id.to_owned());
        let uri = format!("/v1/sandboxes/{}/ports", q(sandbox));
        let body = json!({ "port": port });
        let (status, v) = f
            .json(&caller, Method::POST, &uri, Some(&body), &[])
            .await
            .map_err(|e| exposed_error(sandbox, port, e))?;
        let url = match v["url"].as_str() {
            Some(u) if status == StatusCode::OK && !u.is_empty() => u.to_owned(),
            _ => {
                return Err(PortError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("the pool did not expose port {port} of sandbox {sandbox} in time"),
                ))
            }
        };
        let left = v["expiresAt"]
            .as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .map(|t| (t.with_timezone(&chrono::Utc) - chrono::Utc::now()).to_std());
        let keep = match left {
            None => Some(RECHECK),
            Some(Ok(d)) => d.checked_sub(EXPIRY_MARGIN).map(|d| d.min(RECHECK)),
            Some(Err(_)) => None,
        };
        if let Some(keep) = keep {
            let mut m = self.lock();
            if m.len() >= MAX_ENDPOINTS {
                let now = Instant::now();
                m.retain(|_, r| r.until > now);
                if m.len() >= MAX_ENDPOINTS {
                    m.clear();
                }
            }
            m.insert(
                k,
                Remembered {
                    url: url.clone(),
                    until: Instant::now() + keep,
                },
            );
        }
        Ok(url)
    }

    fn forget(&self, sandbox: &str, port: u16, key_id: &str) {
        self.lock()
            .remove(&(sandbox.to_owned(), port, key_id.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16, String), Remembered>> {
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The answer when `/v1` would not expose the port: E2B's 502 for a sandbox the caller
/// cannot reach, else `/v1`'s status with what is missing.
fn exposed_error(sandbox: &str, port: u16, e: InnerError) -> PortError {
    let (status, body) = match e {
        InnerError::Answer(status, body) => (status, body),
        InnerError::Facade(e) => {
            return PortError::new(StatusCode::INTERNAL_SERVER_ERROR, e.message)
        }
    };
    if let EnvdError::SandboxGone(_) = EnvdError::from_v1(sandbox, status, &body) {
        return gone(sandbox);
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let why = v["error"]["message"].as_str().unwrap_or("refused");
    let message = if port == CODE_INTERPRETER_PORT {
        format!(
            "the sandbox {sandbox} has no code interpreter: its pool cannot expose port {port} \
             ({why}); the code interpreter needs a pool that exposes ports and a template \
             running E2B's code-interpreter server (docs/e2b-facade.md)"
        )
    } else {
        format!("port {port} of sandbox {sandbox} cannot be exposed: {why}")
    };
    PortError::new(status, message)
}

/// E2B's answer for a sandbox the caller cannot reach (as envd's: [`EnvdError::rest`]).
fn gone(sandbox: &str) -> PortError {
    PortError::new(
        StatusCode::BAD_GATEWAY,
        format!("The sandbox {sandbox} was not found"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_and_hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("x-access-token", "ea1.k.t"),
            ("e2b-traffic-access-token", "ea1.k.u"),
            ("e2b-sandbox-id", "sbx_1"),
            ("e2b-sandbox-port", "49999"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("host", "127.0.0.1"),
            ("content-type", "application/json"),
            ("authorization", "Bearer app"),
        ] {
            h.append(n, HeaderValue::from_static(v));
        }
        let out = forwarded(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "authorization"]);
    }

    #[test]
    fn exposure_refusals_name_what_is_missing() {
        let body = br#"{"error":{"code":"unsupported_operation","message":"ports.expose (devhost runs commands under bubblewrap with no network)"}}"#;
        let e = InnerError::Answer(StatusCode::NOT_IMPLEMENTED, body.as_slice().into());
        let resp = exposed_error("sbx_1", CODE_INTERPRETER_PORT, e);
        assert_eq!(resp.status, StatusCode::NOT_IMPLEMENTED);
        assert!(resp.message.contains("has no code interpreter"), "{resp}");
        let gone = br#"{"error":{"code":"not_found","message":"sandbox not found"}}"#;
        let e = InnerError::Answer(StatusCode::NOT_FOUND, gone.as_slice().into());
        assert_eq!(
            exposed_error("sbx_1", 8080, e).status,
            StatusCode::BAD_GATEWAY
        );
    }
}
