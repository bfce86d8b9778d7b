//! The conformance kit against the cloudflare adapter over its fake bridge, with ports
//! published (so `ports.expose` is held to its word too) and without.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_over_the_fake() {
    let s = setup(serde_json::json!({"ports": "public"})).await;
    let report = support::conformance::passes(&s.adapter).await;
    assert!(report
        .check("ports.expose")
        .is_some_and(|c| c.detail.contains("http")));
    eprintln!("{}", report.table());
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    assert!(
        report.check("honesty.ports.expose").is_some(),
        "{}",
        report.table()
    );
}
