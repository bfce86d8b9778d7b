//! The agent-sandbox adapter against a fake cluster (a Kubernetes API server with the four
//! agent-sandbox resources and stand-in controllers, the sandbox router and the python
//! runtime in each pod), and an opt-in live run against a real cluster (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_controller;
mod fake_k8s;
mod fake_runtime;
mod fake_verbs;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::agent_sandbox::AgentSandboxAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_k8s::FakeCluster;

pub const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.fake-service-account-token.c2lnbmF0dXJl";
pub const NS: &str = "sandboxes";
/// The warm pool (and template) the fake cluster has, with env injection allowed.
pub const POOL: &str = "python-pool";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakeCluster, AgentSandboxAdapter>;

/// Settings pointing at `fake` (claim mode, through the router), merged with `extra`.
pub fn settings(
    fake: &FakeCluster,
    token: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiServerURL": fake.api_url(),
            "namespace": NS,
            "warmPool": POOL,
            "runtime": {"routerURL": fake.router_url(), "baseDir": "/"},
            "tokenFile": token.path(),
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

/// A fake cluster with the pool (2 warm replicas, env injection `Overrides`) and an adapter
/// on it.
pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeCluster::start(TOKEN).await;
    fake.add_template_and_pool(NS, POOL, 2, Some("Overrides"), &[("FROM_TEMPLATE", "yes")]);
    Setup::new(
        fake,
        TOKEN,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, AgentSandboxAdapter::new),
    )
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(installation, Resources::DEFAULT)
}

/// Creates one sandbox (with env, so cold-started) and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
