//! The Cloudflare Sandbox adapter against a fake Sandbox Bridge Worker (the bridge's
//! published OpenAPI document and sources), and an opt-in live run against a deployed
//! bridge (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_bridge;
mod fake_exec;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::cloudflare::{CloudflareAdapter, CloudflareConfig};
use differently_adapters::credentials::Credentials;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_bridge::FakeBridge;

pub const KEY: &str = "4f1c9a2be07d5e8836a1c0f2d9b4e7a6";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the key file it reads (kept alive with it).
pub type Setup = support::Setup<FakeBridge, CloudflareAdapter>;

/// Settings pointing at `fake`, merged with `extra`.
pub fn settings(
    fake: &FakeBridge,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "bridgeURL": fake.url(),
            "apiKeyFile": key.path(),
            "timeouts": {"requestSeconds": 20},
        }),
        extra,
    )
}

pub fn adapter_of(v: serde_json::Value) -> CloudflareAdapter {
    let cfg: CloudflareConfig = serde_json::from_value(v).unwrap();
    CloudflareAdapter::new(&cfg.validate().unwrap(), &Credentials::default()).unwrap()
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeBridge::start(KEY).await;
    Setup::new(
        fake,
        KEY,
        |fake, key| settings(fake, key, extra),
        adapter_of,
    )
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(installation, Resources::DEFAULT)
}

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
