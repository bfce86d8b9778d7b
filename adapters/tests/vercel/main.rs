//! The Vercel Sandbox adapter against a fake Vercel API (`fake_server`), plus an opt-in live
//! run against a real team (`live`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::vercel::{VercelAdapter, VercelConfig};
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::{FakeServer, PROJECT, TEAM};

pub const TOKEN: &str = "vcp_3f7a9c1e5b2d4f6a8c0e1d2c";

pub use support::key_file as token_file;
pub use support::{at, cmd};

pub struct Setup {
    pub fake: FakeServer,
    pub adapter: VercelAdapter,
    pub token: tempfile::NamedTempFile,
}

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
            "timeouts": {"pollMillis": 20, "readySeconds": 10, "requestSeconds": 10},
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeServer::start(TOKEN).await;
    let token = token_file(TOKEN);
    let cfg: VercelConfig = serde_json::from_value(settings(&fake, &token, extra)).unwrap();
    let adapter = VercelAdapter::new(cfg).unwrap();
    Setup {
        fake,
        adapter,
        token,
    }
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
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
