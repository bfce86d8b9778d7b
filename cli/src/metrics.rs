//! The Prometheus exporter: the `metrics` facade's recorder, rendered as text at `/metrics` on
//! its own listener (`[metrics] listen`), never on the API listener and without auth, so it
//! must be bound to an address only the scraper reaches.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

use crate::roles::AnyError;

/// Histogram buckets (seconds) for every `*_seconds` metric: 1 ms to 2 min.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

/// Installs the global recorder (once per process) and hands it to the API's
/// `GET /v1/admin/metrics/summary`, the dashboard's charts; no listener.
pub fn install() -> Result<PrometheusHandle, AnyError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let source = handle.clone();
    differently_api::routes::queue::set_metrics_source(move || source.render());
    Ok(handle)
}

/// Installs the global recorder, binds `addr` and serves `/metrics` until `shutdown`.
/// Returns the bound address (useful when `addr` asks for port 0).
pub async fn start(
    addr: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) -> Result<SocketAddr, AnyError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("metrics: cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let handle = install()?;
    let app = Router::new().route("/metrics", get(move || render(handle.clone())));
    tokio::spawn(async move {
        // The API's listener, for its header read timeout: a scrape endpoint is no more
        // entitled to hold a stalled connection than the API.
        let served =
            differently_api::server::serve(listener, app, METRICS_HEADER_TIMEOUT, async move {
                let _ = shutdown.changed().await;
            })
            .await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "metrics listener stopped");
        }
    });
    tracing::info!(listen = %local, "metrics listening");
    Ok(local)
}

/// How long a scraper may take to send its request headers.
const METRICS_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

async fn render(handle: PrometheusHandle) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4")],
        handle.render(),
    )
}
