//! The E2B-compatible facade (issue 43): E2B's control plane under `/e2b` and envd under
//! `/e2b/envd`, so the official E2B SDKs work against Differently by setting
//! `E2B_API_URL=http://HOST:PORT/e2b`, `E2B_SANDBOX_URL=http://HOST:PORT/e2b/envd` and
//! `E2B_API_KEY=<a Differently key>`.
//!
//! Every route translates its request into `/v1` requests answered in process by the `/v1`
//! handlers (the OpenSandbox facade's [`V1`]), under the caller's key (control plane,
//! `X-API-KEY`) or the key an envd access token names ([`token`]). docs/e2b-facade.md is
//! the user's description.

pub mod alias;
pub mod connect;
pub mod control;
pub mod dns;
pub mod envd;
pub mod error;
pub mod files;
pub mod filesystem;
pub mod home;
pub mod mapping;
pub mod port_proxy;
pub mod process;
pub mod process_calls;
pub mod signed;
pub mod snapshots;
pub mod token;
pub mod watch;
pub mod watchers;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::routing::{any, delete, get, post};
use axum::{Extension, Router};
use serde_json::Value;

use crate::facade::opensandbox::error::OsbError;
use crate::facade::opensandbox::inner::{read_all, Caller, V1};
use crate::AppState;

/// Where the control plane is mounted.
pub const PREFIX: &str = "/e2b";
/// Where envd is mounted.
pub const ENVD_PREFIX: &str = "/e2b/envd";

/// What the facade's handlers share.
pub struct Facade {
    pub v1: V1,
    pub tokens: token::Deriver,
    /// Tokens handed out or accepted lately, which signed file URLs are checked against.
    pub seen: signed::SeenTokens,
    /// The polling directory watchers of this process.
    pub watchers: watchers::Watchers,
    /// Derives the `trafficAccessToken`s, which open a sandbox's other ports but not envd.
    pub traffic: token::Deriver,
    /// The endpoints of sandbox ports other than envd's, and the client that reaches them.
    pub ports: port_proxy::Ports,
    /// The default user's homes this process is making.
    pub homes: home::Homes,
    /// The `domain` create, connect and `get_info` answer: the SDKs build `get_host(port)`
    /// (and, without `E2B_SANDBOX_URL`, envd's URL) from it, and fall back to E2B's own
    /// `e2b.app` on `null`, which would send a program's traffic, and the sandbox's envd
    /// token, to E2B's internet edge. The DNS mode's domain, else [`UNRESOLVABLE_DOMAIN`].
    pub domain: String,
}

/// The `domain` answered when no DNS mode's domain is configured: under `.invalid`
/// (RFC 6761), which never resolves, so a host built from it fails at once and reaches no one.
pub const UNRESOLVABLE_DOMAIN: &str = "e2b-facade.invalid";

/// Why an inner `/v1` call did not answer 2xx.
#[derive(Debug)]
pub enum InnerError {
    /// `/v1` answered this status and body.
    Answer(StatusCode, Bytes),
    /// The inner request could not be made.
    Facade(OsbError),
}

impl Facade {
    /// The envd access token of `key_id` for `sandbox`, remembered for signed URLs.
    pub fn token(&self, sandbox: &str, key_id: &str) -> String {
        let t = self.tokens.token(sandbox, key_id);
        self.seen.note(&t, sandbox, key_id);
        t
    }

    /// The traffic access token of `key_id` for `sandbox` (the SDKs send it to other ports).
    pub fn traffic_token(&self, sandbox: &str, key_id: &str) -> String {
        self.traffic.token(sandbox, key_id)
    }

    /// A JSON `/v1` call: the parsed answer on 2xx (`Null` for an empty body).
    pub async fn json(
        &self,
        caller: &Caller,
        method: Method,
        uri: &str,
        body: Option<&Value>,
        extra: &[(header::HeaderName, HeaderValue)],
    ) -> Result<(StatusCode, Value), InnerError> {
        let mut headers = extra.to_vec();
        let body = match body {
            Some(v) => {
                headers.push((
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ));
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        let resp = self
            .v1
            .call(caller, method, uri, &headers, body)
            .await
            .map_err(InnerError::Facade)?;
        let status = resp.status();
        let bytes = read_all(resp).await.map_err(InnerError::Facade)?;
        if !status.is_success() {
            return Err(InnerError::Answer(status, bytes));
        }
        if bytes.is_empty() {
            return Ok((status, Value::Null));
        }
        serde_json::from_slice(&bytes)
            .map(|v| (status, v))
            .map_err(|e| {
                InnerError::Facade(OsbError::internal(format!("inner answer of {uri}: {e}")))
            })
    }
}

/// The facade's routes; `v1` is the `/v1` router with its state, `state` gives the key the
/// envd access tokens are derived with.
pub fn router(state: &AppState, v1: Router) -> Router<AppState> {
    let facade = Arc::new(Facade {
        v1: V1::new(v1),
        tokens: token::Deriver::new(
            state
                .bootstrap_key
                .derive("differently/e2b-facade/envd-access-token/v1"),
        ),
        seen: signed::SeenTokens::default(),
        watchers: watchers::Watchers::default(),
        traffic: token::Deriver::new(
            state
                .bootstrap_key
                .derive("differently/e2b-facade/traffic-access-token/v1"),
        ),
        ports: port_proxy::Ports::default(),
        homes: home::Homes::default(),
        domain: dns::Domain::new(state.limits.e2b_domain.as_deref())
            .0
            .unwrap_or_else(|| UNRESOLVABLE_DOMAIN.to_owned()),
    });
    let p = |path: &str| format!("{PREFIX}{path}");
    let e = |path: &str| format!("{ENVD_PREFIX}{path}");
    // A served path called with another method answers as an unserved route does.
    let ns = control::not_served;
    Router::new()
        .route(
            &p("/v2/sandboxes"),
            post(control::create).get(control::list).fallback(ns),
        )
        .route(
            &p("/sandboxes"),
            post(control::create).get(control::list).fallback(ns),
        )
        // E2B's metrics of several sandboxes, not a sandbox named `metrics`.
        .route(&p("/sandboxes/metrics"), any(ns))
        .route(
            &p("/sandboxes/{id}"),
            get(control::get).delete(control::kill).fallback(ns),
        )
        .route(
            &p("/v2/sandboxes/{id}/connect"),
            post(control::connect).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/connect"),
            post(control::connect).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/resume"),
            post(control::connect).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/timeout"),
            post(control::set_timeout).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/pause"),
            post(control::pause).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/metrics"),
            get(control::metrics).fallback(ns),
        )
        .route(
            &p("/sandboxes/{id}/snapshots"),
            post(snapshots::create).fallback(ns),
        )
        .route(&p("/snapshots"), get(snapshots::list).fallback(ns))
        .route(
            &p("/templates/{id}"),
            delete(snapshots::delete).fallback(ns),
        )
        .route(&e("/health"), get(envd::health))
        .route(&e("/files"), get(files::download).post(files::upload))
        // Signed URLs with `E2B_SANDBOX_URL` set: the SDKs join `/files` to its origin,
        // dropping the `/e2b/envd` prefix.
        .route("/files", get(files::download).post(files::upload))
        .route(&e("/process.Process/Start"), post(process::start))
        .route(&e("/process.Process/Connect"), post(process::connect))
        .route(
            &e("/process.Process/StreamInput"),
            post(process_calls::stream_input),
        )
        .route(&e("/process.Process/{method}"), post(process_calls::call))
        .route(
            &e("/filesystem.Filesystem/WatchDir"),
            post(watch::watch_dir),
        )
        .route(
            &e("/filesystem.Filesystem/{method}"),
            post(filesystem::call),
        )
        .route(ENVD_PREFIX, any(envd::not_served))
        .route(&e("/"), any(envd::not_served))
        .route(&e("/{*rest}"), any(envd::not_served))
        .route(&p("/{*rest}"), any(control::not_served))
        // Other ports of a sandbox (`E2b-Sandbox-Port`), before the envd routes.
        .layer(axum::middleware::from_fn(port_proxy::route))
        .layer(Extension(facade))
}
