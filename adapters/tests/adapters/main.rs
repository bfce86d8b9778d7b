//! Integration tests of the adapters: one binary, one module per adapter.

mod conformance;
mod devhost;
mod devhost_pty;
mod fake;
mod http;
mod plugin;
mod process;
mod registry;

use std::collections::BTreeMap;

use differently_adapters::CreateInstance;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};

/// A create request for `sandbox_id` in `installation`.
pub fn create_req(sandbox_id: &SandboxId, installation: &InstallationId) -> CreateInstance {
    CreateInstance {
        sandbox_id: sandbox_id.clone(),
        installation_id: installation.clone(),
        template: None,
        resources: Resources::DEFAULT,
        env: BTreeMap::new(),
        ttl_seconds: 3600,
        from_snapshot: None,
    }
}

/// An exec request running `command`.
pub fn exec_req(command: &[&str]) -> ExecRequest {
    ExecRequest {
        command: command.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    }
}
