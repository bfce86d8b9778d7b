//! The fan-out's lag gauge (`differently_webhook_fan_out_lag_events`) as a Prometheus scrape
//! serves it: set by the leading fan-out to what it has not yet fanned out, so it reads 0
//! once every event is delivered. A test binary of its own: the gauge is process-wide, and
//! another test's fan-out would set it too.

#![allow(clippy::unwrap_used)]

// The delivery suite's world; this test uses part of it.
#[allow(dead_code)]
#[path = "delivery/world.rs"]
mod world;

use metrics_exporter_prometheus::PrometheusBuilder;
use world::*;

/// The gauge's value in a scrape, if it is served.
fn lag(scrape: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix("differently_webhook_fan_out_lag_events "))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_reports_what_it_has_not_fanned_out() {
    let prometheus = PrometheusBuilder::new().install_recorder().unwrap();
    let w = world().await;
    let (o, p) = w.tenant().await;
    w.hook(&o, &p, "lag", &[]).await;
    assert_eq!(
        lag(&prometheus.render()),
        None,
        "not served before a fan-out leads"
    );
    // Published before any fan-out: the first reading after it starts has them behind it
    // or, if it already caught up, none; either way it then reads 0.
    for version in 1..=5 {
        w.status_event(&p, version).await;
    }
    w.start(fast_config());
    eventually("five events delivered", || async {
        w.ids_at("lag").len() >= 5
    })
    .await;
    eventually("the gauge served, at 0 once all is fanned out", || async {
        lag(&prometheus.render()) == Some(0.0)
    })
    .await;
    let _ = w.stop.send(true);
}
