//! `dly.admit.<org>`: a sandbox was admitted and waits for placement.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use differently_core::policy::{ExternalMode, Strategy};
use differently_core::sandbox::SandboxSpec;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde::{Deserialize, Serialize};

use super::WireResources;
use crate::Message;

/// Body on `dly.admit.<org>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Admitted {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    /// What placement needs of the queued row, so it can decide without a read. A hint:
    /// the activation re-reads and re-checks under locks. Absent from older publishers and
    /// for a row that is no longer queued; then placement reads the row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Box<QueuedSandbox>>,
}

impl Message for Admitted {
    const KIND: &'static str = "admitted";
}

/// The placement-relevant part of a queued row. Its field names match the row's own JSON,
/// so the full rows that older publishers sent decode into it (their extra fields, env
/// values among them, are dropped on read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedSandbox {
    pub id: SandboxId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub status: SandboxStatus,
    pub status_reason: Option<String>,
    pub status_version: i64,
    pub spec: QueuedSpec,
    pub attempts: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// The spec of a queued row without env values (placement never needs them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedSpec {
    pub template: Option<String>,
    pub resources: WireResources,
    /// Env variable names only; absent from older publishers.
    #[serde(default)]
    pub env_keys: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub ttl_seconds: u64,
    pub idle_timeout_seconds: Option<u64>,
    pub capabilities: Vec<String>,
    pub classification: String,
    pub region: Option<String>,
    pub priority: i32,
    #[serde(default)]
    pub strategy: Option<Strategy>,
    #[serde(default)]
    pub external: ExternalMode,
    #[serde(default)]
    pub pinned_pool: Option<String>,
}

impl QueuedSandbox {
    /// The wire form of queued row `s`.
    pub fn of(s: &Sandbox) -> QueuedSandbox {
        let spec = &s.spec;
        QueuedSandbox {
            id: s.id.clone(),
            org_id: s.org_id.clone(),
            project_id: s.project_id.clone(),
            status: s.status,
            status_reason: s.status_reason.clone(),
            status_version: s.status_version,
            spec: QueuedSpec {
                template: spec.template.clone(),
                resources: spec.resources.into(),
                env_keys: spec.env.keys().cloned().collect(),
                labels: spec.labels.clone(),
                ttl_seconds: spec.ttl_seconds,
                idle_timeout_seconds: spec.idle_timeout_seconds,
                capabilities: spec.capabilities.clone(),
                classification: spec.classification.clone(),
                region: spec.region.clone(),
                priority: spec.priority,
                strategy: spec.strategy,
                external: spec.external,
                pinned_pool: spec.pinned_pool.clone(),
            },
            attempts: s.attempts,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }

    /// A row for placement to decide with. It has no env (values never travel on the bus),
    /// no idempotency key and no backend fields: nothing may create from it; activation
    /// re-reads the stored row.
    pub fn into_placement_row(self) -> Sandbox {
        let spec = self.spec;
        Sandbox {
            id: self.id,
            org_id: self.org_id,
            project_id: self.project_id,
            status: self.status,
            status_reason: self.status_reason,
            status_version: self.status_version,
            pool: None,
            backend_ref: None,
            spec: SandboxSpec {
                template: spec.template,
                resources: spec.resources.into(),
                env: BTreeMap::new(),
                labels: spec.labels,
                ttl_seconds: spec.ttl_seconds,
                idle_timeout_seconds: spec.idle_timeout_seconds,
                capabilities: spec.capabilities,
                classification: spec.classification,
                region: spec.region,
                priority: spec.priority,
                strategy: spec.strategy,
                external: spec.external,
                pinned_pool: spec.pinned_pool,
            },
            attempts: self.attempts,
            idempotency_key: None,
            created_at: self.created_at,
            updated_at: self.updated_at,
            started_at: None,
            expires_at: None,
            ended_at: None,
            warm_class: None,
        }
    }
}
