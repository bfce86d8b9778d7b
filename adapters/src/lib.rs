//! The adapter contract and the adapters. One adapter instance serves one pool.
//!
//! Contract (design doc §10): `create` is idempotent on the sandbox id (look the id up among
//! the backend's instances before creating); `delete` of a missing instance succeeds; every
//! instance is tagged with the sandbox id and the installation id; an operation the adapter
//! does not implement answers `AdapterError::Unsupported`, never a silent degrade.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use serde::{Deserialize, Serialize};

pub mod devhost;
pub mod error;
pub mod fake;
pub mod pools;
pub mod registry;

pub use error::AdapterError;

/// What the backend is asked to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateInstance {
    pub sandbox_id: SandboxId,
    pub installation_id: InstallationId,
    pub template: Option<String>,
    pub resources: Resources,
    pub env: BTreeMap<String, String>,
    /// Backend-side TTL backstop, if the backend supports one.
    pub ttl_seconds: u64,
}

/// State of a backend instance as the backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Pending,
    Running,
    Paused,
    Stopped,
    Failed,
}

/// A backend instance tagged with its sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The backend's own id for it.
    pub backend_ref: String,
    pub sandbox_id: SandboxId,
    pub state: InstanceState,
}

/// Where an existing instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRef {
    pub sandbox_id: SandboxId,
    pub backend_ref: String,
}

/// One pool's backend.
#[async_trait]
pub trait Adapter: Send + Sync + 'static {
    /// The adapter kind (`fake`, `devhost`, `opensandbox`, …).
    fn kind(&self) -> &'static str;

    /// Capabilities this adapter really implements (names from `core::sandbox::KNOWN_CAPABILITIES`).
    fn capabilities(&self) -> Vec<String>;

    /// Creates the instance for `req.sandbox_id`, or returns the one that already exists.
    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError>;

    /// Deletes the instance of `sandbox_id`; succeeds if there is none.
    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError>;

    /// The instance tagged with `sandbox_id`, if any.
    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError>;

    /// Every instance tagged with `installation`, for reconciliation.
    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError>;

    /// Runs a command to completion.
    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError>;

    /// Whether the backend answers at all; used for pool health.
    async fn health(&self) -> Result<(), AdapterError>;
}

/// Shared handle to an adapter.
pub type SharedAdapter = Arc<dyn Adapter>;
