//! The Azure dynamic sessions adapter against a fake Shell session pool (the 2025-10-02-preview
//! data-plane spec and Azure's docs), and an opt-in live run against a real pool (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::azure_sessions::{AzureSessionsAdapter, AzureSessionsConfig};
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakePool;

/// An Entra-token-shaped bearer token (never a real one).
pub const TOKEN: &str = "eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJodHRwczovL2R5bmFtaWNzZXNzaW9ucy5pbyJ9.c2ln";

pub use support::{at, cmd, key_file};

/// An adapter, its fake pool and the token file it reads (kept alive with it).
pub struct Setup {
    pub fake: FakePool,
    pub adapter: AzureSessionsAdapter,
    pub token: tempfile::NamedTempFile,
}

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
    let token = key_file(TOKEN);
    let cfg: AzureSessionsConfig = serde_json::from_value(settings(&fake, &token, extra)).unwrap();
    let adapter = AzureSessionsAdapter::new(cfg).unwrap();
    Setup {
        fake,
        adapter,
        token,
    }
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    support::create_req_of(installation, Resources::DEFAULT)
}

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
