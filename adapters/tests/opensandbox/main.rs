//! The OpenSandbox adapter against a fake OpenSandbox (both the real server's behaviour and the
//! spec's, where they differ), plus an opt-in live run against a real server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_pty;
mod fake_server;
mod fake_versions;
mod live;
mod pty;
mod recorded_streams;
mod replay;
#[path = "../support/mod.rs"]
mod support;
mod versions;

use differently_adapters::opensandbox::config::Runtime;
use differently_adapters::opensandbox::OpenSandboxAdapter;
use differently_adapters::{CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::{FakeRuntime, FakeServer, Variant};

pub const KEY: &str = "sk-test-7f3a9c1e5b2d4f6a8c0e";

pub use support::{at, cmd, key_file};

/// An adapter, its fake server and the key file it reads (kept alive with it).
pub type Setup = support::Setup<FakeServer, OpenSandboxAdapter>;

/// Settings for `fake` with the key by file, merged with `extra`.
pub fn settings(
    api_url: &str,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": api_url,
            "trust": "private",
            "apiKeyFile": key.path(),
            "timeouts": {"pollMillis": 20, "readySeconds": 20, "requestSeconds": 10},
        }),
        extra,
    )
}

pub async fn setup(variant: Variant, runtime: FakeRuntime, extra: serde_json::Value) -> Setup {
    let fake = FakeServer::start(variant, runtime, KEY).await;
    Setup::new(
        fake,
        KEY,
        |fake, key| settings(&fake.api_url(), key, extra),
        |v| support::built(v, OpenSandboxAdapter::new),
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
    let mut req = create_req(&InstallationId::new());
    if s.adapter.settings().runtime == Runtime::Fastsandbox {
        // Templates fix the environment.
        req.env.clear();
    }
    s.running(&req).await
}
