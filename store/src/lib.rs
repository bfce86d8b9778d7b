//! The `Store`: Postgres is the truth. Every method is one transaction named by its intent;
//! every sandbox status change is compare-and-set on status and writes its audit record in
//! the same transaction. Postgres (`pg`, public as `postgres`) and in-memory (`memory`)
//! implementations pass one conformance suite (`tests/conformance`).
//!
//! The contract is split by intent (`TenancyStore`, `AdmissionStore`, `ActivationStore`, …);
//! `Store` is all of them, so `Arc<dyn Store>` is the whole store. Callers bring the methods
//! into scope with `use differently_store::prelude::*`.

pub mod activation;
pub mod admission;
pub mod audit;
pub mod error;
pub mod idempotency;
pub mod installation;
pub mod lifecycle;
pub mod memory;
mod pg;
pub mod placement;
pub mod sandboxes;
pub mod sealed;
pub mod secrets;
mod shared;
pub mod tenancy;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod transition;
pub mod usage;
pub mod warm;
pub mod webhooks;
pub mod work_claims;

/// The Postgres store under its public path.
pub mod postgres {
    pub use crate::pg::{
        AdmissionSwaps, PgStore, StatusSwaps, LEADER_IDLE_TIMEOUT_SECONDS, MIGRATIONS,
    };
}

pub use activation::{Activation, ActivationItem, ActivationStore, PoolSlot};
pub use admission::{Admission, AdmissionStore, Admitted, DirectPlacement};
pub use differently_core::accounting::Wall;
pub use differently_core::tenancy::{ApiKeyRecord, Org, OrgStatus, Project, Quota, Usage};
pub use error::StoreError;
pub use installation::{InstallationStore, Lead, Leadership};
pub use sandboxes::{SandboxBrief, SandboxFilter, SandboxReadStore};
pub use tenancy::TenancyStore;
pub use transition::{SeenRow, Transition, TransitionStore};
pub use usage::{QuotaScope, UsageDrift, UsageStore};

use chrono::{DateTime, Utc};
use differently_core::OrgId;

/// Every intent trait, for callers of the store's methods: `use differently_store::prelude::*`.
pub mod prelude {
    pub use crate::audit::AuditStore;
    pub use crate::idempotency::IdempotencyStore;
    pub use crate::lifecycle::LifecycleStore;
    pub use crate::placement::PlacementStore;
    pub use crate::secrets::SecretStore;
    pub use crate::warm::WarmStore;
    pub use crate::webhooks::WebhookStore;
    pub use crate::work_claims::WorkClaimStore;
    pub use crate::{
        ActivationStore, AdmissionStore, InstallationStore, Lead, Leadership, SandboxReadStore,
        Store, TenancyStore, TransitionStore, UsageStore,
    };
}

/// Who did something, for the audit record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// An API key (its public id only).
    Key(String),
    /// The control plane itself (scheduler, worker, sweep).
    System(&'static str),
}

impl Actor {
    /// The audit form, e.g. `key:key_01…` or `system:scheduler`.
    pub fn as_audit(&self) -> String {
        match self {
            Actor::Key(k) => format!("key:{k}"),
            Actor::System(s) => format!("system:{s}"),
        }
    }
}

/// An audit record as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub seq: i64,
    pub org_id: Option<OrgId>,
    pub actor: String,
    pub action: String,
    pub resource: String,
    pub at: DateTime<Utc>,
    pub detail: serde_json::Value,
}

/// The whole store contract shared by Postgres and memory: every intent trait, so
/// `Arc<dyn Store>` carries every method. Each store states that it is one (`pg`, `memory`).
pub trait Store:
    tenancy::TenancyStore
    + usage::UsageStore
    + admission::AdmissionStore
    + activation::ActivationStore
    + transition::TransitionStore
    + sandboxes::SandboxReadStore
    + installation::InstallationStore
    + placement::PlacementStore
    + lifecycle::LifecycleStore
    + audit::AuditStore
    + secrets::SecretStore
    + webhooks::WebhookStore
    + idempotency::IdempotencyStore
    + work_claims::WorkClaimStore
    + warm::WarmStore
    + Send
    + Sync
    + 'static
{
}
