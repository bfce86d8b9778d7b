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

use differently_adapters::{Adapter, CreateInstance, Instance, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};

/// A provider's adapter on its fake, with the credential file (key or token) the adapter reads,
/// which must live as long as the adapter.
pub struct Setup<F, A> {
    pub fake: F,
    pub adapter: A,
    pub key: tempfile::NamedTempFile,
}

impl<F, A: Adapter> Setup<F, A> {
    /// `fake` with an adapter built by `build` from the settings `settings` gives for it and a
    /// fresh credential file holding `key`.
    pub fn new(
        fake: F,
        key: &str,
        settings: impl FnOnce(&F, &tempfile::NamedTempFile) -> serde_json::Value,
        build: impl FnOnce(serde_json::Value) -> A,
    ) -> Self {
        let key = key_file(key);
        let adapter = build(settings(&fake, &key));
        Setup { fake, adapter, key }
    }

    /// Creates `req`'s instance and returns the ref calls take for it.
    pub async fn running(&self, req: &CreateInstance) -> InstanceRef {
        at(&self.adapter.create(req).await.unwrap())
    }
}

/// The timeouts the fakes answer well within: short polls, and bounds that make a wait that
/// never ends fail in seconds rather than hang the run.
pub fn fake_timeouts() -> serde_json::Value {
    serde_json::json!({"pollMillis": 20, "readySeconds": 10, "requestSeconds": 10})
}

/// The adapter that a provider's config type `C` and constructor `new` make of `settings`;
/// either one refusing them fails the test.
pub fn built<C, A, E>(settings: serde_json::Value, new: impl FnOnce(C) -> Result<A, E>) -> A
where
    C: serde::de::DeserializeOwned,
    E: std::fmt::Debug,
{
    let cfg: C = serde_json::from_value(settings).unwrap();
    new(cfg).unwrap()
}

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
