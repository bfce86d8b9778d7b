//! The conformance kit against the azure_sessions adapter over its fake pool.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_over_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{}", report.table());
}
