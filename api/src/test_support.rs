//! Fixtures shared by the crate's unit tests.

use chrono::Utc;
use differently_core::{OrgId, ProjectId};
use differently_store::memory::MemoryStore;
use differently_store::prelude::*;
use differently_store::{Org, OrgStatus, Project};

/// A new org with one project in `store`.
pub(crate) async fn tenant(store: &MemoryStore) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    let p = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "default".into(),
        created_at: Utc::now(),
    };
    store.ensure_tenant(&org, &p).await.expect("tenant");
    (org.id, p.id)
}
