//! The bootstrap tenant: one organization and project every process of an installation
//! agrees on without coordination, because their ids derive from the installation id.

use chrono::Utc;
use differently_core::ids::InstallationId;
use differently_core::{OrgId, ProjectId};
use differently_store::{Org, OrgStatus, Project, Store, StoreError};
use sha2::{Digest, Sha256};

/// The organization and project the bootstrap key acts in.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub org: Org,
    pub project: Project,
}

fn derived_ulid(inst: &InstallationId, what: &str) -> String {
    let digest = Sha256::digest(format!("{inst}/{what}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    // Keep the top (timestamp) bits small so the text stays a valid 26-character ULID.
    bytes[0] &= 0x3f;
    ulid::Ulid::from_bytes(bytes).to_string()
}

/// Creates (if needed) and returns the bootstrap tenant.
pub async fn ensure_bootstrap_tenant(store: &dyn Store) -> Result<Tenant, StoreError> {
    let inst = store.installation_id().await?;
    let bad = |e| StoreError::Internal(format!("derived id: {e}"));
    let org_id = OrgId::parse(&format!("org_{}", derived_ulid(&inst, "org"))).map_err(bad)?;
    let project_id =
        ProjectId::parse(&format!("prj_{}", derived_ulid(&inst, "project"))).map_err(bad)?;
    let now = Utc::now();
    let org = Org {
        id: org_id.clone(),
        name: "default".into(),
        status: OrgStatus::Active,
        created_at: now,
    };
    let project = Project {
        id: project_id,
        org_id,
        name: "default".into(),
        created_at: now,
    };
    store.ensure_tenant(&org, &project).await?;
    Ok(Tenant { org, project })
}
