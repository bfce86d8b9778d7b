//! The Daytona adapter against a fake Daytona (the spec plus what live accounts showed), and
//! an opt-in live run against a real account (`live.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod fake_server;
mod live;

use std::collections::BTreeMap;
use std::io::Write;

use differently_adapters::daytona::{DaytonaAdapter, DaytonaConfig};
use differently_adapters::{Adapter, CreateInstance, Instance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use fake_server::FakeDaytona;

pub const KEY: &str = "dtn_test_5f2b9c7e1a3d4b6c8e0f";

/// A key file the adapter reads its credential from.
pub fn key_file(key: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{key}").unwrap();
    f
}

/// An adapter, its fake and the key file it reads (kept alive with it).
pub struct Setup {
    pub fake: FakeDaytona,
    pub adapter: DaytonaAdapter,
    pub key: tempfile::NamedTempFile,
}

/// Settings pointing at `fake`, merged with `extra`.
pub fn settings(
    fake: &FakeDaytona,
    key: &tempfile::NamedTempFile,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "apiURL": fake.api_url(),
        "toolboxURL": fake.toolbox_url(),
        "apiKeyFile": key.path(),
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
    let fake = FakeDaytona::start(KEY).await;
    let key = key_file(KEY);
    let cfg: DaytonaConfig = serde_json::from_value(settings(&fake, &key, extra)).unwrap();
    let adapter = DaytonaAdapter::new(cfg).unwrap();
    Setup { fake, adapter, key }
}

pub fn create_req(installation: &InstallationId) -> CreateInstance {
    CreateInstance {
        sandbox_id: SandboxId::new(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources {
            cpu: 2,
            memory_mib: 2048,
            disk_gib: 10,
        },
        env: BTreeMap::from([("SANDBOX_VAR".to_owned(), "from-create".to_owned())]),
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

/// Creates one sandbox and returns its ref.
pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
