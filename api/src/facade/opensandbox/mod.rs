//! The OpenSandbox-compatible facade (issue 23): OpenSandbox's lifecycle API under
//! `/opensandbox/v1` and its execd API per sandbox under `/opensandbox/execd/{id}`, so the
//! official SDKs, CLI and integrations work against Differently by setting
//! `OPEN_SANDBOX_DOMAIN=host:port/opensandbox` and a Differently key.
//!
//! Every route translates its request into `/v1` requests answered in process by the `/v1`
//! handlers ([`inner`]), and translates the answers back ([`mapping`], [`error`]). execd calls
//! carry a per-sandbox token from the endpoint answer ([`token`]). docs/opensandbox-facade.md
//! is the user's description.

pub mod commands;
pub mod error;
pub mod execd;
pub mod files;
pub mod inner;
pub mod lifecycle;
pub mod mapping;
pub mod multipart;
pub mod pty;
pub mod sessions;
pub mod token;

use std::sync::Arc;

use axum::extract::Path;
use axum::routing::{any, get, post};
use axum::{Extension, Router};

use crate::AppState;

/// Where the facade is mounted.
pub const PREFIX: &str = "/opensandbox";

/// What the facade's handlers share.
pub struct Facade {
    pub v1: inner::V1,
    pub sealer: token::Sealer,
    pub sessions: sessions::KnownSessions,
    pub ptys: pty::PtyRecords,
}

/// The facade's routes; `v1` is the `/v1` router with its state, `state` gives the key the
/// execd tokens are sealed with.
pub fn router(state: &AppState, v1: Router) -> Router<AppState> {
    let facade = Arc::new(Facade {
        v1: inner::V1::new(v1),
        sealer: token::Sealer::new(
            state
                .bootstrap_key
                .derive("differently/opensandbox-facade/execd-token/v1"),
        ),
        sessions: sessions::KnownSessions::default(),
        ptys: pty::PtyRecords::default(),
    });
    let p = |path: &str| format!("{PREFIX}{path}");
    let x = |path: &str| format!("{PREFIX}/execd/{{id}}{path}");
    Router::new()
        .route(&p("/health"), get(lifecycle::health))
        .route(&p("/v1/health"), get(lifecycle::health))
        .route(&p("/version"), get(lifecycle::version))
        .route(&p("/v1/version"), get(lifecycle::version))
        .route(&p("/v1/metrics/events"), post(lifecycle::metrics_events))
        .route(
            &p("/v1/sandboxes"),
            post(lifecycle::create).get(lifecycle::list),
        )
        .route(
            &p("/v1/sandboxes/{id}"),
            get(lifecycle::get).delete(lifecycle::delete),
        )
        .route(&p("/v1/sandboxes/{id}/pause"), post(lifecycle::pause))
        .route(&p("/v1/sandboxes/{id}/resume"), post(lifecycle::resume))
        .route(
            &p("/v1/sandboxes/{id}/renew-expiration"),
            post(lifecycle::renew),
        )
        .route(
            &p("/v1/sandboxes/{id}/endpoints/{port}"),
            get(lifecycle::endpoint),
        )
        .route(
            &p("/v1/sandboxes/{id}/snapshots"),
            post(lifecycle::create_snapshot),
        )
        .route(&p("/v1/snapshots"), get(lifecycle::list_snapshots))
        .route(
            &p("/v1/snapshots/{sid}"),
            get(lifecycle::get_snapshot).delete(lifecycle::delete_snapshot),
        )
        .route(&x("/ping"), get(execd::ping))
        .route(
            &x("/command"),
            post(execd::run_command).delete(execd::interrupt),
        )
        .route(&x("/command/status/{cmd}"), get(execd::status))
        .route(&x("/command/{cmd}/logs"), get(execd::logs))
        .route(&x("/session"), post(sessions::create))
        .route(&x("/session/{sid}/run"), post(sessions::run))
        .route(
            &x("/session/{sid}"),
            axum::routing::delete(sessions::delete),
        )
        .route(&x("/pty"), post(pty::create))
        .route(&x("/pty/{sid}"), get(pty::status).delete(pty::delete))
        .route(&x("/pty/{sid}/ws"), get(pty::ws))
        .route(&x("/files/upload"), post(files::upload))
        .route(&x("/files/download"), get(files::download))
        .route(&x("/files/info"), get(files::info))
        .route(&x("/files/search"), get(files::search))
        .route(&x("/files"), axum::routing::delete(files::delete_files))
        .route(&x("/files/mv"), post(files::move_files))
        .route(&x("/files/permissions"), post(files::permissions))
        .route(&x("/directories/list"), get(files::list))
        .route(
            &x("/directories"),
            post(files::make_dirs).delete(files::remove_dirs),
        )
        .route(&x("/{*rest}"), any(execd::unsupported))
        .route(&p("/egress/{id}/{*rest}"), any(egress))
        // Everything else under the prefix is the facade's too: its 404 in its envelope.
        .route(PREFIX, any(error::unknown_route))
        .route(&p("/"), any(error::unknown_route))
        .route(&p("/{*rest}"), any(error::unknown_route))
        .layer(Extension(facade))
}

/// The egress sidecar endpoint the SDKs insist on looking up: Differently has no per-sandbox
/// egress API (egress is the operator's policy).
async fn egress(Path(_): Path<(String, String)>) -> error::OsbError {
    error::OsbError::not_supported("the egress sidecar API")
}
