//! The Azure dynamic sessions adapter against a fake Shell session pool (the 2025-10-02-preview
//! data-plane spec and Azure's docs), and an opt-in live run against a real pool (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::azure_sessions::AzureSessionsAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakePool;

/// An Entra-token-shaped bearer token (never a real one).
pub const TOKEN: &str = "eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJodHRwczovL2R5bmFtaWNzZXNzaW9ucy5pbyJ9.c2ln";

pub use support::{at, cmd, key_file};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakePool, AzureSessionsAdapter>;

/// Settings pointing at `fake`, merged with `extra`.
pub fn settings(
    fake: &FakePool,
    token: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "poolManagementEndpoint": fake.endpoint(),
            "dataDir": fake.data_dir(),
            "tokenFile": token.path(),
            "timeouts": {"requestSeconds": 20},
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakePool::start(TOKEN).await;
    Setup::new(
        fake,
        TOKEN,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, AzureSessionsAdapter::new),
    )
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(installation, Resources::DEFAULT)
}

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
