//! What the Postgres and memory sides both use and neither owns: audit entries of changes,
//! refusals phrased the same way, document comparisons. Both sides import from here and
//! never from each other; the domain rules themselves live in `differently_core::accounting`.

pub(crate) mod audit_entry;
pub(crate) mod changes;
pub(crate) mod documents;
pub(crate) mod refusals;
pub(crate) mod storable;
pub(crate) mod tenancy;

/// The shared helpers under one name, as call sites read them (`rules::activate`, …).
pub(crate) mod rules {
    pub(crate) use super::audit_entry::AuditEntry;
    pub(crate) use super::changes::{
        activate, activate_direct, admit_entry, claim_warm, mark_running, requeue, transition,
        transition_entry,
    };
    pub(crate) use super::refusals::{
        name_taken, org_has_projects, project_has_live_sandboxes, project_has_snapshots,
    };
    pub(crate) use super::tenancy::{
        cascade_detail, key_detail, minting_key, tenancy_entry, update_org,
    };
}
