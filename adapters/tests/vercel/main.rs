//! The Vercel Sandbox adapter against a fake Vercel API (`fake_server`), plus an opt-in live
//! run against a real team (`live`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod hang_up;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::vercel::VercelAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::{FakeServer, PROJECT, TEAM};

pub const TOKEN: &str = "vcp_3f7a9c1e5b2d4f6a8c0e1d2c";

pub use support::key_file as token_file;
pub use support::{at, cmd};

/// An adapter, its fake and the credential file it reads (kept alive with it).
pub type Setup = support::Setup<FakeServer, VercelAdapter>;

pub fn settings(
    fake: &FakeServer,
    token: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": fake.api_url(),
            "teamId": TEAM,
            "projectId": PROJECT,
            "tokenFile": token.path(),
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeServer::start(TOKEN).await;
    Setup::new(
        fake,
        TOKEN,
        |fake, key| settings(fake, key, extra),
        |v| support::built(v, VercelAdapter::new),
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

pub async fn running(s: &Setup) -> InstanceRef {
    s.running(&create_req(&InstallationId::new())).await
}
