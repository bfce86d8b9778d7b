//! The conformance kit against the runloop adapter over its fake server.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_over_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{}", report.table());
}
