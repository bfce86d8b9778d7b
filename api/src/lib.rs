//! The `/v1` HTTP API (axum). Handlers authenticate, validate at the boundary, run one store
//! transaction, and announce the change on the bus; errors map to HTTP in `error` only.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use differently_adapters::pools::PoolSet;
use differently_bus::Announcer;
use differently_core::faults::Faults;
use differently_core::ErrorCode;
use differently_store::Store;
use serde_json::json;

pub mod auth;
pub mod caches;
pub mod control;
pub mod data_plane;
pub mod error;
pub mod facade;
mod locks;
pub mod mcp;
pub mod openapi;
pub mod processes;
pub mod requests;
pub mod routes;
pub mod server;
#[cfg(test)]
pub(crate) mod test_support;
pub mod ui;

pub use auth::bootstrap::{ensure_bootstrap_tenant, Tenant};
pub use auth::{generate_key, BootstrapKey};

/// Limits applied by the API.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Installation-wide quota defaults; an org's stored quota overrides them per field.
    pub quota_defaults: differently_core::tenancy::Quota,
    /// Requests per API key.
    pub key_rate: requests::ratelimit::Rate,
    /// Failed authentications per presented key id, and per client address for malformed
    /// keys (`auth::throttle`).
    pub auth_failure_rate: requests::ratelimit::Rate,
    /// Proxies (`api.trusted_proxies`) whose `X-Forwarded-For` names the client; from any
    /// other peer the header is ignored.
    pub trusted_proxies: Vec<auth::throttle::IpNet>,
    /// Whether a create may be placed in its own admission when nothing of its org waits
    /// (`DirectPlacement`); off, every create goes through the placement leader.
    pub direct_placement: bool,
    /// How long a client may take to send a request's headers (the listener's, `server`).
    pub header_read_timeout: std::time::Duration,
    /// How long a request body may take to arrive (a streamed upload: between two chunks).
    pub body_read_timeout: std::time::Duration,
    /// How long a terminal outlives its dropped WebSocket, waiting for a reattach
    /// (`data_plane::pty_sessions`).
    pub pty_grace: std::time::Duration,
    /// Where webhooks may point and how long a rotated secret keeps signing (`[webhooks]`).
    pub webhooks: differently_webhooks::ApiSettings,
    /// The E2B facade's DNS mode (`facade::e2b::dns`): requests for `api.<domain>`,
    /// `sandbox.<domain>` and `<port>-<id>.<domain>` are served by the facade; `None`: off.
    pub e2b_domain: Option<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            quota_defaults: Default::default(),
            key_rate: requests::ratelimit::Rate {
                per_second: 100.0,
                burst: 200.0,
            },
            auth_failure_rate: requests::ratelimit::Rate {
                per_second: 0.5,
                burst: 20.0,
            },
            trusted_proxies: Vec::new(),
            direct_placement: true,
            header_read_timeout: std::time::Duration::from_secs(10),
            body_read_timeout: std::time::Duration::from_secs(30),
            pty_grace: data_plane::pty_sessions::DEFAULT_PTY_GRACE,
            webhooks: differently_webhooks::ApiSettings::default(),
            e2b_domain: None,
        }
    }
}

/// Everything a handler needs, shared by all requests.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// The parts of `AppState`.
pub struct Inner {
    pub store: Arc<dyn Store>,
    pub announcer: Announcer,
    pub pools: PoolSet,
    pub bootstrap_key: BootstrapKey,
    pub tenant: Tenant,
    pub faults: Faults,
    pub events: control::event_hub::EventHub,
    pub limits: Limits,
    pub key_requests: requests::ratelimit::Buckets<String>,
    /// Failed authentications, per presented key id or client address (`auth::throttle`).
    pub auth_failures: auth::throttle::AuthFailures,
    /// Key and organization records read in the last second (`auth::cache`).
    pub auth_cache: auth::cache::AuthCache,
    /// Data-plane activity not yet written (`data_plane::activity`).
    pub activity: data_plane::activity::ActivityBuffer,
    /// Effective placement policies read in the last second, for the create's fail-fast
    /// check (`caches::policy`).
    pub policies: caches::policy::PolicyCache,
    /// Every pool's warm classes and ready counts read in the last second, for the create's
    /// class and warm ranking (`caches::warm`).
    pub warm: caches::warm::WarmCache,
    /// Terminal sessions this process runs (`data_plane::pty_sessions`).
    pub ptys: data_plane::pty_sessions::PtySessions,
    /// Background processes this process supervises (`processes`).
    pub processes: processes::Supervisor,
    /// Issues tenant NATS credentials for public events (`POST /v1/events/credentials`);
    /// `None` without a NATS server running Differently's auth callout (then 501).
    pub event_auth: Option<differently_bus::callout::EventAuth>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// Wraps the parts.
    pub fn new(inner: Inner) -> AppState {
        AppState(Arc::new(inner))
    }
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    // The OpenSandbox facade answers through the `/v1` handlers (in process, below these
    // layers, which the facade request itself already passed).
    let v1 = routes::router().with_state(state.clone());
    let routes = Router::new()
        .merge(routes::router())
        .merge(facade::opensandbox::router(&state, v1.clone()))
        .merge(facade::e2b::router(&state, v1.clone()))
        .merge(mcp::http::router(&state, v1))
        .merge(ui::router())
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/openapi.json", get(openapi::serve))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(
            requests::middleware::MAX_BODY_BYTES,
        ))
        .with_state(state.clone());
    // The routes as one service under the middleware, not the middleware under each route:
    // a method router adds `Allow` to its 405 outside any layer of its own, so only from
    // out here can `guard` read it into the envelope's message.
    let e2b_domain = facade::e2b::dns::Domain::new(state.limits.e2b_domain.as_deref());
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            requests::middleware::guard,
        ))
        .layer(axum::middleware::from_fn(requests::nul::refuse_in_query))
        // Before routing, and before the checks whose refusals take the error shape of the
        // path (`requests::middleware::Dialect`): the E2B facade's host names become its paths.
        .layer(axum::middleware::from_fn_with_state(
            e2b_domain,
            facade::e2b::dns::route_by_host,
        ))
        .layer(axum::middleware::from_fn(requests::middleware::request_id))
        .with_state(state)
}

/// What `/healthz` and a ready `/readyz` answer: the document's `Health`.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    status: &'static str,
}

async fn healthz() -> impl IntoResponse {
    Json(Health { status: "ok" })
}

/// Ready when the store answers; the bus connection is held by the process and reconnects.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store.installation_id().await {
        Ok(_) => (StatusCode::OK, Json(Health { status: "ready" })).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "not ready: store");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "unavailable", "store": "unreachable" })),
            )
                .into_response()
        }
    }
}

async fn not_found() -> error::ApiError {
    error::ApiError::new(ErrorCode::NotFound, "no such route")
}
