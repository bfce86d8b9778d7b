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

use differently_adapters::agent_sandbox::{AgentSandboxAdapter, AgentSandboxConfig};
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_k8s::FakeCluster;

pub const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.fake-service-account-token.c2lnbmF0dXJl";
pub const NS: &str = "sandboxes";
/// The warm pool (and template) the fake cluster has, with env injection allowed.
pub const POOL: &str = "python-pool";

pub use support::{at, cmd, key_file};

/// An adapter, its fake cluster and the token file it reads (kept alive with it).
pub struct Setup {
    pub fake: FakeCluster,
    pub adapter: AgentSandboxAdapter,
    pub token: tempfile::NamedTempFile,
}

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
            "timeouts": {"pollMillis": 20, "readySeconds": 10, "requestSeconds": 10},
        }),
        extra,
    )
}

/// A fake cluster with the pool (2 warm replicas, env injection `Overrides`) and an adapter
/// on it.
pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeCluster::start(TOKEN).await;
    fake.add_template_and_pool(NS, POOL, 2, Some("Overrides"), &[("FROM_TEMPLATE", "yes")]);
    let token = key_file(TOKEN);
    let cfg: AgentSandboxConfig = serde_json::from_value(settings(&fake, &token, extra)).unwrap();
    let adapter = AgentSandboxAdapter::new(cfg).unwrap();
    Setup {
        fake,
        adapter,
        token,
    }
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(installation, Resources::DEFAULT)
}

/// Creates one sandbox (with env, so cold-started) and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
