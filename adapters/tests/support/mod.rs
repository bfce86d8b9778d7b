//! What the provider test binaries (`daytona`, `e2b`, `freestyle`, `opensandbox`, `vercel`)
//! share, included by each with `#[path = "../support/mod.rs"] mod support;`: the setup
//! helpers of their `main.rs`, the HTTP scaffolding of their fakes (`http`), the case
//! bodies that are the same against every provider (`cases`) and the live runs' environment
//! reading (`live`). What a provider does its own
//! way stays in its fake.
//!
//! Each binary uses part of it, so unused items are allowed here rather than per binary.
#![allow(dead_code)]

pub mod cases;
pub mod conformance;
pub mod http;
pub mod live;

use std::collections::BTreeMap;
use std::io::Write;

use differently_adapters::{CreateInstance, Instance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};

/// A credential file the adapter reads its key or token from (with a trailing newline, as
/// an editor or a mounted secret leaves it).
pub fn key_file(key: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "{key}").unwrap();
    f
}

/// `base` with the keys of `extra` set over it (both JSON objects).
pub fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(obj), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        for (k, val) in extra {
            obj.insert(k.clone(), val.clone());
        }
    }
    base
}

/// A create request of `installation` at `resources`, with one environment variable
/// (`SANDBOX_VAR=from-create`) the exec cases look for, a 600 s TTL and no template.
pub fn create_req_of(installation: &InstallationId, resources: Resources) -> CreateInstance {
    CreateInstance {
        sandbox_id: SandboxId::new(),
        installation_id: installation.clone(),
        template: None,
        resources,
        env: BTreeMap::from([("SANDBOX_VAR".to_owned(), "from-create".to_owned())]),
        ttl_seconds: 600,
        from_snapshot: None,
    }
}

/// The ref calls take for a created instance.
pub fn at(i: &Instance) -> InstanceRef {
    InstanceRef {
        sandbox_id: i.sandbox_id.clone(),
        backend_ref: i.backend_ref.clone(),
    }
}

/// An exec request of `argv`, everything else defaulted.
pub fn cmd(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        command: argv.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}
