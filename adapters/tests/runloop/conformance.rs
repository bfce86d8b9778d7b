//! The conformance kit against the runloop adapter over its fake server.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_over_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{}", report.table());
    // process.signal ends its quiet `sleep 30` by hanging up on the streamed exec: the
    // adapter must have killed the execution through Runloop's API.
    let killed = s.fake.record().killed.clone();
    assert!(
        killed
            .iter()
            .any(|c| c.contains("sleep") && c.contains("30")),
        "the signalled `sleep 30` was not killed through the API: {killed:?}"
    );
}
