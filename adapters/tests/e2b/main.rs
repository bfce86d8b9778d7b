//! The E2B adapter against a fake E2B (control plane and envd, `fake_server`), plus an opt-in
//! live run against a real account (`live`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod hang_up;
mod live;
mod schemes;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::e2b::E2bAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakeServer;

pub const KEY: &str = "e2b_7f3a9c1e5b2d4f6a8c0e1d2c3b4a5968";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakeServer, E2bAdapter>;

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
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeServer::start(KEY).await;
    Setup::new(
        fake,
        KEY,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, E2bAdapter::new),
    )
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
    s.running(&create_req(&InstallationId::new())).await
}
