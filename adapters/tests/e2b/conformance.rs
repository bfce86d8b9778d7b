//! The conformance kit against the e2b adapter over its fake server.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_over_the_fake() {
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{}", report.table());
    // process.signal ends its quiet `sleep 30` by hanging up on the streamed exec: envd keeps
    // a process whose client went away, so the adapter must have killed it by pid.
    let signalled = s.fake.record().signalled.clone();
    assert!(
        signalled.iter().any(|c| c == "sleep 30"),
        "the signalled `sleep 30` was not killed on envd: {signalled:?}"
    );
}
