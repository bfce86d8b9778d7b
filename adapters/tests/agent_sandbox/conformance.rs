//! The conformance kit against the agent_sandbox adapter over its fake cluster, in claim mode
//! through the router and in sandbox mode through per-pod URLs.

use crate::{setup, support};

#[tokio::test]
async fn the_conformance_kit_passes_in_claim_mode_through_the_router() {
    let s = setup(serde_json::json!({})).await;
    let report = support::conformance::passes(&s.adapter).await;
    eprintln!("{}", report.table());
}

#[tokio::test]
async fn the_conformance_kit_passes_in_sandbox_mode_through_pod_urls() {
    let fake = crate::fake_k8s::FakeCluster::start(crate::TOKEN).await;
    let token = crate::key_file(crate::TOKEN);
    let v = crate::settings(
        &fake,
        &token,
        serde_json::json!({
            "mode": "sandbox",
            "warmPool": null,
            "podTemplate": {"spec": {"containers": [{"name": "runtime", "image": "python-runtime-sandbox:latest"}]}},
            "runtime": {"urlPattern": fake.direct_pattern(), "baseDir": "/"},
        }),
    );
    let cfg = serde_json::from_value(v).unwrap();
    let adapter = differently_adapters::agent_sandbox::AgentSandboxAdapter::new(cfg).unwrap();
    let report = support::conformance::passes(&adapter).await;
    eprintln!("{}", report.table());
    drop(token);
}
