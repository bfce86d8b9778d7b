//! Tenancy by intent: organizations, projects and API keys, each change audited.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{KeyId, OrgId, ProjectId};

use crate::{Actor, ApiKeyRecord, Org, OrgStatus, Project, StoreError};

/// Organizations, projects and API keys: the admin API's writes, each audited on the
/// organization's chain.
#[async_trait]
pub trait TenancyStore: Send + Sync {
    /// Creates the organization and project if they do not exist (bootstrap tenant).
    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError>;

    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError>;

    /// Inserts an organization; `AlreadyExists` if the name is taken.
    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError>;

    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError>;

    /// Organizations in id order after `after`.
    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError>;

    /// Renames and/or suspends/reactivates; audited.
    async fn update_org(
        &self,
        id: &OrgId,
        name: Option<&str>,
        status: Option<OrgStatus>,
        actor: &Actor,
    ) -> Result<Org, StoreError>;

    /// Deletes an organization with no projects (`HasDependents` otherwise); its keys and
    /// quota go with it.
    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError>;

    /// Inserts a project (`NotFound` if the org is missing, `AlreadyExists` for a taken name
    /// within the org).
    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError>;

    /// Projects of `org` in id order after `after`.
    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError>;

    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError>;

    /// Locks the org row; refuses (`HasDependents`) while the project has sandboxes that are
    /// not final. Finished sandboxes, keys and quota of the project go with it.
    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError>;

    /// Stores a key record (hash only); audited without the hash.
    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError>;

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError>;

    /// Keys of `org` in id order after `after`.
    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError>;

    /// Sets `revokedAt` (idempotent: a revoked key keeps its first revocation time).
    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError>;

    /// Records `lastUsedAt` (not audited; callers throttle it).
    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError>;
}
