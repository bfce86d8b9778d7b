//! The Freestyle adapter against a fake Freestyle v5 API (API.md plus what live accounts
//! showed), and an opt-in live run against a real account (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod conformance;
mod fake_server;
mod live;
#[path = "../support/mod.rs"]
mod support;

use differently_adapters::freestyle::FreestyleAdapter;
use differently_adapters::{Adapter, CreateInstance, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::Resources;
use fake_server::FakeFreestyle;

pub const KEY: &str = "fs_test_3c1d5e7f9a0b2c4d6e8f";

pub use support::{at, cmd, key_file};

/// An adapter, its fake, the key file and the directory holding the env file.
pub struct Setup {
    pub fake: FakeFreestyle,
    pub adapter: FreestyleAdapter,
    pub key: tempfile::NamedTempFile,
    pub etc: tempfile::TempDir,
}

pub fn settings(
    fake: &FakeFreestyle,
    key: &tempfile::NamedTempFile,
    etc: &tempfile::TempDir,
    extra: serde_json::Value,
) -> serde_json::Value {
    support::merged(
        serde_json::json!({
            "apiURL": fake.api_url(),
            "apiKeyFile": key.path(),
            // Host paths in the fake: the env file goes to a temp dir instead of /etc.
            "envFile": etc.path().join("differently.env"),
            "timeouts": support::fake_timeouts(),
        }),
        extra,
    )
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeFreestyle::start(KEY).await;
    let key = key_file(KEY);
    let etc = etc_dir();
    let adapter = support::built(settings(&fake, &key, &etc, extra), FreestyleAdapter::new);
    Setup {
        fake,
        adapter,
        key,
        etc,
    }
}

/// A directory for the env file outside /tmp (which the adapter refuses: Freestyle empties it).
/// The fake writes the file there for real, so it must be a writable local directory. Cargo's
/// target tmpdir is under /tmp when the checkout is, so that case falls back to /var/tmp.
pub fn etc_dir() -> tempfile::TempDir {
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let parent = if target.starts_with("/tmp") {
        std::path::Path::new("/var/tmp")
    } else {
        target
    };
    tempfile::Builder::new()
        .prefix("freestyle-etc-")
        .tempdir_in(parent)
        .unwrap_or_else(|e| panic!("make the env file's directory in {}: {e}", parent.display()))
}

/// The shared request, plus `SHADOWED`, which the exec cases override per request.
pub fn create_req(installation: &InstallationId) -> CreateInstance {
    let mut req = support::create_req_of(
        installation,
        Resources {
            cpu: 2,
            memory_mib: 4096,
            disk_gib: 16,
        },
    );
    req.env.insert("SHADOWED".to_owned(), "sandbox".to_owned());
    req
}

pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
