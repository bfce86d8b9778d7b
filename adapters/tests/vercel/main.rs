//! The Vercel Sandbox adapter against a fake Vercel API (`fake_server`), plus an opt-in live
//! run against a real team (`live`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cases;
mod fake_server;
mod live;

use std::collections::BTreeMap;
use std::io::Write;

use differently_adapters::vercel::{VercelAdapter, VercelConfig};
use differently_adapters::{Adapter, CreateInstance, Instance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use fake_server::{FakeServer, PROJECT, TEAM};

pub const TOKEN: &str = "vcp_3f7a9c1e5b2d4f6a8c0e1d2c";

pub fn token_file(t: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{t}").unwrap();
    f
}

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
    let mut v = serde_json::json!({
        "apiURL": fake.api_url(),
        "teamId": TEAM,
        "projectId": PROJECT,
        "tokenFile": token.path(),
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
    CreateInstance {
        sandbox_id: SandboxId::new(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources {
            cpu: 2,
            memory_mib: 4096,
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

pub async fn running(s: &Setup) -> InstanceRef {
    at(&s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap())
}
