//! The Runloop adapter against a fake Runloop API written from its published OpenAPI
//! description (`fake/`), and an opt-in live run against a real account (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake;
mod hang_up;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::runloop::RunloopAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake::FakeRunloop;

pub const KEY: &str = "ak_test_3c9d1e7f5a2b4c6d8e0f";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakeRunloop, RunloopAdapter>;

/// Settings pointing at `fake`, merged with `extra`.
pub fn settings(
    fake: &FakeRunloop,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": fake.url(),
            "apiKeyFile": key.path(),
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeRunloop::start(KEY).await;
    Setup::new(
        fake,
        KEY,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, RunloopAdapter::new),
    )
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(
        installation,
        Resources {
            cpu: 2,
            memory_mib: 4096,
            disk_gib: 10,
        },
    )
}

/// Creates one devbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
