//! Organizations, projects and API keys under the store's one lock.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{KeyId, OrgId, ProjectId};
use serde_json::json;

use super::{MemoryStore, State};
use crate::prelude::*;
use crate::shared::rules;
use crate::shared::storable;
use crate::{Actor, ApiKeyRecord, Org, OrgStatus, Project, QuotaScope, StoreError};

#[async_trait]
impl TenancyStore for MemoryStore {
    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError> {
        storable::org(org)?;
        storable::project(project)?;
        let mut st = self.lock();
        st.orgs.entry(org.id.clone()).or_insert_with(|| org.clone());
        st.projects
            .entry(project.id.clone())
            .or_insert_with(|| project.clone());
        Ok(())
    }

    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError> {
        Ok(self.lock().projects.get(id).cloned())
    }

    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError> {
        storable::org(org)?;
        let mut st = self.lock();
        if st.orgs.contains_key(&org.id) {
            return Err(StoreError::AlreadyExists(format!(
                "organization {}",
                org.id
            )));
        }
        st.check_org_name(&org.name, &org.id)?;
        st.orgs.insert(org.id.clone(), org.clone());
        let e = rules::tenancy_entry(
            actor,
            "org.create",
            json!({ "name": org.name, "status": org.status }),
        );
        st.audit(&org.id, org.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError> {
        Ok(self.lock().orgs.get(id).cloned())
    }

    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError> {
        let st = self.lock();
        Ok(st
            .orgs
            .values()
            .filter(|o| after.is_none_or(|a| &o.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn update_org(
        &self,
        id: &OrgId,
        name: Option<&str>,
        status: Option<OrgStatus>,
        actor: &Actor,
    ) -> Result<Org, StoreError> {
        if let Some(n) = name {
            storable::text("name", n)?;
        }
        let mut st = self.lock();
        let mut org = st.orgs.get(id).cloned().ok_or(StoreError::NotFound)?;
        if let Some(n) = name {
            st.check_org_name(n, id)?;
        }
        let detail = rules::update_org(&mut org, name, status);
        st.orgs.insert(id.clone(), org.clone());
        let e = rules::tenancy_entry(actor, "org.update", detail);
        st.audit(id, id.as_str(), e, Utc::now());
        Ok(org)
    }

    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        let org = st.orgs.get(id).cloned().ok_or(StoreError::NotFound)?;
        let projects = st.projects.values().filter(|p| &p.org_id == id).count();
        if projects > 0 {
            return Err(rules::org_has_projects(projects as u64));
        }
        st.orgs.remove(id);
        st.keys.retain(|_, k| &k.org_id != id);
        st.forget_removed_key_parents();
        st.quotas.remove(&QuotaScope::Org(id.clone()).key());
        let e = rules::tenancy_entry(actor, "org.delete", json!({ "name": org.name }));
        st.audit(id, id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError> {
        storable::project(project)?;
        let mut st = self.lock();
        if !st.orgs.contains_key(&project.org_id) {
            return Err(StoreError::NotFound);
        }
        if st.projects.contains_key(&project.id) {
            return Err(StoreError::AlreadyExists(format!("project {}", project.id)));
        }
        st.check_project_name(&project.org_id, &project.name, &project.id)?;
        st.projects.insert(project.id.clone(), project.clone());
        let e = rules::tenancy_entry(actor, "project.create", json!({ "name": project.name }));
        st.audit(&project.org_id, project.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError> {
        let st = self.lock();
        Ok(st
            .projects
            .values()
            .filter(|p| &p.org_id == org && after.is_none_or(|a| &p.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError> {
        storable::text("name", name)?;
        let mut st = self.lock();
        let mut p = st.projects.get(id).cloned().ok_or(StoreError::NotFound)?;
        st.check_project_name(&p.org_id, name, id)?;
        let old = std::mem::replace(&mut p.name, name.to_owned());
        st.projects.insert(id.clone(), p.clone());
        let e = rules::tenancy_entry(
            actor,
            "project.rename",
            json!({ "old": old, "new": p.name }),
        );
        st.audit(&p.org_id, id.as_str(), e, Utc::now());
        Ok(p)
    }

    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        let p = st.projects.get(id).cloned().ok_or(StoreError::NotFound)?;
        let live = st
            .sandboxes
            .values()
            .filter(|r| &r.sandbox.project_id == id && !r.sandbox.status.is_final())
            .count();
        if live > 0 {
            return Err(rules::project_has_live_sandboxes(live as u64));
        }
        // Lock order: state, then lifecycle (as `insert_snapshot`).
        let snapshots = self.snapshots_of_project(id);
        if snapshots > 0 {
            return Err(rules::project_has_snapshots(snapshots));
        }
        let before = st.sandboxes.len();
        st.sandboxes.retain(|_, r| &r.sandbox.project_id != id);
        let removed = before - st.sandboxes.len();
        st.projects.remove(id);
        st.keys.retain(|_, k| k.project_id.as_ref() != Some(id));
        st.forget_removed_key_parents();
        st.quotas.remove(&QuotaScope::Project(id.clone()).key());
        // As Postgres's `ON DELETE CASCADE`: a project's webhooks go with it.
        st.webhooks.forget_project(id);
        let e = rules::tenancy_entry(
            actor,
            "project.delete",
            json!({ "name": p.name, "deletedSandboxes": removed }),
        );
        st.audit(&p.org_id, id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError> {
        let mut st = self.lock();
        if !st.orgs.contains_key(&key.org_id) {
            return Err(StoreError::NotFound);
        }
        if let Some(p) = &key.project_id {
            if st.projects.get(p).is_none_or(|p| p.org_id != key.org_id) {
                return Err(StoreError::NotFound);
            }
        }
        if st.keys.contains_key(&key.id) {
            return Err(StoreError::AlreadyExists(format!("key {}", key.id)));
        }
        let mut key = key.clone();
        if let Some(parent) = rules::minting_key(actor) {
            // A key minted by a key already revoked (in another process's cache) is born so.
            let revoked = KeyId::parse(parent)
                .ok()
                .and_then(|p| st.keys.get(&p))
                .and_then(|p| p.revoked_at);
            if let Some(at) = revoked {
                key.revoked_at = Some(key.revoked_at.map_or(at, |own| own.min(at)));
            }
            st.key_parents.insert(key.id.clone(), parent.to_owned());
        }
        let key = &key;
        st.keys.insert(key.id.clone(), key.clone());
        let e = rules::tenancy_entry(actor, "key.create", rules::key_detail(key));
        st.audit(&key.org_id, key.id.as_str(), e, Utc::now());
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        Ok(self.lock().keys.get(id).cloned())
    }

    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let st = self.lock();
        Ok(st
            .keys
            .values()
            .filter(|k| &k.org_id == org && after.is_none_or(|a| &k.id > a))
            .take(accounting::effective_limit(limit))
            .cloned()
            .collect())
    }

    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError> {
        let mut st = self.lock();
        let key = st.keys.get_mut(id).ok_or(StoreError::NotFound)?;
        let first = key.revoked_at.is_none();
        key.revoked_at.get_or_insert(at);
        let key = key.clone();
        if first {
            let e = rules::tenancy_entry(actor, "key.revoke", json!({ "revokedAt": at }));
            st.audit(&key.org_id, id.as_str(), e, at);
        }
        // Every key below it that is still valid, also when this key was revoked before.
        let mut below: Vec<KeyId> = Vec::new();
        let mut frontier = vec![id.to_string()];
        while let Some(parent) = frontier.pop() {
            for (child, p) in &st.key_parents {
                if *p == parent && !below.contains(child) {
                    below.push(child.clone());
                    frontier.push(child.to_string());
                }
            }
        }
        below.sort();
        for child in below {
            let Some(k) = st.keys.get_mut(&child) else {
                continue;
            };
            if k.revoked_at.is_some() {
                continue;
            }
            k.revoked_at = Some(at);
            let org = k.org_id.clone();
            let e = rules::tenancy_entry(actor, "key.revoke", rules::cascade_detail(at, id));
            st.audit(&org, child.as_str(), e, at);
        }
        Ok(key)
    }

    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError> {
        let mut st = self.lock();
        let key = st.keys.get_mut(id).ok_or(StoreError::NotFound)?;
        key.last_used_at = Some(at);
        Ok(())
    }
}

impl State {
    /// `AlreadyExists` if another organization than `except` has `name`.
    fn check_org_name(&self, name: &str, except: &OrgId) -> Result<(), StoreError> {
        if self
            .orgs
            .values()
            .any(|o| o.name == name && &o.id != except)
        {
            return Err(rules::name_taken("organization", name));
        }
        Ok(())
    }

    /// `AlreadyExists` if another project of `org` than `except` has `name`.
    fn check_project_name(
        &self,
        org: &OrgId,
        name: &str,
        except: &ProjectId,
    ) -> Result<(), StoreError> {
        let taken = self
            .projects
            .values()
            .any(|p| &p.org_id == org && p.name == name && &p.id != except);
        if taken {
            return Err(rules::name_taken("project", name));
        }
        Ok(())
    }
}
