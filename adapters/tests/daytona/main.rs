//! The Daytona adapter against a fake Daytona (the spec plus what live accounts showed), and
//! an opt-in live run against a real account (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::daytona::DaytonaAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakeDaytona;

pub const KEY: &str = "dtn_test_5f2b9c7e1a3d4b6c8e0f";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakeDaytona, DaytonaAdapter>;

/// Settings pointing at `fake`, merged with `extra`.
pub fn settings(
    fake: &FakeDaytona,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": fake.api_url(),
            "toolboxURL": fake.toolbox_url(),
            "apiKeyFile": key.path(),
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeDaytona::start(KEY).await;
    Setup::new(
        fake,
        KEY,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, DaytonaAdapter::new),
    )
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(
        installation,
        Resources {
            cpu: 2,
            memory_mib: 2048,
            disk_gib: 10,
        },
    )
}

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
