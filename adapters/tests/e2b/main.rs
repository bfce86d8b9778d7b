//! The E2B adapter against a fake E2B (control plane and envd, `fake_server`), plus an opt-in
//! live run against a real account (`live`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
mod schemes;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::e2b::{E2bAdapter, E2bConfig};
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakeServer;

pub const KEY: &str = "e2b_7f3a9c1e5b2d4f6a8c0e1d2c3b4a5968";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the key file it reads (kept alive with it).
pub struct Setup {
    pub fake: FakeServer,
    pub adapter: E2bAdapter,
    pub key: tempfile::NamedTempFile,
}

/// Settings for `fake` with the key by file, merged with `extra`.
pub fn settings(
    fake: &FakeServer,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": fake.api_url(),
            "envdURL": fake.envd_url(),
            "apiKeyFile": key.path(),
            "timeouts": {"pollMillis": 20, "readySeconds": 10, "requestSeconds": 10},
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeServer::start(KEY).await;
    let key = key_file(KEY);
    let cfg: E2bConfig = serde_json::from_value(settings(&fake, &key, extra)).unwrap();
    let adapter = E2bAdapter::new(cfg).unwrap();
    Setup { fake, adapter, key }
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(
        installation,
        Resources {
            cpu: 2,
            memory_mib: 512,
            disk_gib: 1,
        },
    )
}

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
