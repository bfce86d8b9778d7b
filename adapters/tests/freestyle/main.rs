//! The Freestyle adapter against a fake Freestyle v5 API (API.md plus what live accounts
//! showed), and an opt-in live run against a real account (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod fake_server;
mod live;

use std::collections::BTreeMap;
use std::io::Write;

use differently_adapters::freestyle::{FreestyleAdapter, FreestyleConfig};
use differently_adapters::{Adapter, CreateInstance, Instance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use fake_server::FakeFreestyle;

pub const KEY: &str = "fs_test_3c1d5e7f9a0b2c4d6e8f";

pub fn key_file(key: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{key}").unwrap();
    f
}

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
    let mut v = serde_json::json!({
        "apiURL": fake.api_url(),
        "apiKeyFile": key.path(),
        // Host paths in the fake: the env file goes to a temp dir instead of /etc.
        "envFile": etc.path().join("differently.env"),
        "timeouts": {"pollMillis": 20, "readySeconds": 10, "requestSeconds": 10},
    });
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, val) in extra {
            obj.insert(k.clone(), val.clone());
        }
    }
    v
}

pub async fn setup(extra: serde_json::Value) -> Setup {
    let fake = FakeFreestyle::start(KEY).await;
    let key = key_file(KEY);
    let etc = etc_dir();
    let cfg: FreestyleConfig = serde_json::from_value(settings(&fake, &key, &etc, extra)).unwrap();
    let adapter = FreestyleAdapter::new(cfg).unwrap();
    Setup {
        fake,
        adapter,
        key,
        etc,
    }
}

/// A directory for the env file outside /tmp (which the adapter refuses: Freestyle empties it).
pub fn etc_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    CreateInstance {
        sandbox_id: SandboxId::new(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources {
            cpu: 2,
            memory_mib: 4096,
            disk_gib: 16,
        },
        env: BTreeMap::from([
            ("SANDBOX_VAR".to_owned(), "from-create".to_owned()),
            ("SHADOWED".to_owned(), "sandbox".to_owned()),
        ]),
        ttl_seconds: 600,
        from_snapshot: None,
    }
}

pub fn at(i: &Instance) -> InstanceRef {
    InstanceRef {
        sandbox_id: i.sandbox_id.clone(),
        backend_ref: i.backend_ref.clone(),
    }
}

pub fn cmd(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        command: argv.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
