//! Organizations, projects and API keys; every change audited in its transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{KeyId, OrgId, ProjectId, SandboxStatus};
use serde_json::json;
use sqlx::types::Json;
use sqlx::{Postgres, Row, Transaction};

use super::audit_records::insert_audit_for;
use super::locks::lock_org;
use super::rows::{
    count_u64, json_of, key_of, limit_of, org_of, org_status_str, project_of, statuses_where, DOC,
};
use super::PgStore;
use crate::prelude::*;
use crate::shared::rules;
use crate::shared::storable;
use crate::{Actor, ApiKeyRecord, Org, OrgStatus, Project, QuotaScope, StoreError};

/// Transaction advisory lock serializing organization name checks (`dly_orgn`): names are
/// unique installation-wide, and there is no row to lock before the org exists.
const ORG_NAME_LOCK: i64 = 0x646c_795f_6f72_676e; // "dly_orgn"

#[async_trait]
impl TenancyStore for PgStore {
    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError> {
        storable::org(org)?;
        storable::project(project)?;
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO organizations (id, name, status, doc, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(org.id.as_str())
        .bind(&org.name)
        .bind(org_status_str(org.status))
        .bind(json_of(org)?)
        .bind(org.created_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO projects (id, org_id, name, doc, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(project.id.as_str())
        .bind(project.org_id.as_str())
        .bind(&project.name)
        .bind(json_of(project)?)
        .bind(project.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError> {
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            None => Ok(None),
            Some(r) => {
                let Json(p): Json<Project> = r.try_get(DOC)?;
                Ok(Some(p))
            }
        }
    }

    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError> {
        storable::org(org)?;
        let mut tx = self.begin().await?;
        check_org_name(&mut tx, &org.name, &org.id).await?;
        let inserted = sqlx::query(
            "INSERT INTO organizations (id, name, status, doc, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(org.id.as_str())
        .bind(&org.name)
        .bind(org_status_str(org.status))
        .bind(json_of(org)?)
        .bind(org.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!(
                "organization {}",
                org.id
            )));
        }
        let e = rules::tenancy_entry(
            actor,
            "org.create",
            json!({ "name": org.name, "status": org.status }),
        );
        insert_audit_for(&mut tx, &org.id, org.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError> {
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(org_of).transpose()
    }

    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError> {
        let rows = sqlx::query(
            r#"SELECT doc FROM organizations
               WHERE ($1::text IS NULL OR id COLLATE "C" > $1)
               ORDER BY id COLLATE "C" LIMIT $2"#,
        )
        .bind(after.map(OrgId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(org_of).collect()
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
        let mut tx = self.begin().await?;
        if let Some(n) = name {
            // The name lock comes before the row lock, as in `create_org`.
            check_org_name(&mut tx, n, id).await?;
        }
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut org = org_of(&row)?;
        let detail = rules::update_org(&mut org, name, status);
        sqlx::query("UPDATE organizations SET name = $2, status = $3, doc = $4 WHERE id = $1")
            .bind(id.as_str())
            .bind(&org.name)
            .bind(org_status_str(org.status))
            .bind(json_of(&org)?)
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(actor, "org.update", detail);
        insert_audit_for(&mut tx, id, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(org)
    }

    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let org = org_of(&row)?;
        let projects: i64 = sqlx::query_scalar("SELECT count(*) FROM projects WHERE org_id = $1")
            .bind(id.as_str())
            .fetch_one(&mut *tx)
            .await?;
        if projects > 0 {
            return Err(rules::org_has_projects(count_u64(projects)));
        }
        sqlx::query("DELETE FROM api_keys WHERE org_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM quotas WHERE scope = $1")
            .bind(QuotaScope::Org(id.clone()).key())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM organizations WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(actor, "org.delete", json!({ "name": org.name }));
        insert_audit_for(&mut tx, id, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError> {
        storable::project(project)?;
        let mut tx = self.begin().await?;
        lock_org(&mut tx, &project.org_id).await?;
        check_project_name(&mut tx, &project.org_id, &project.name, &project.id).await?;
        let inserted = sqlx::query(
            "INSERT INTO projects (id, org_id, name, doc, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(project.id.as_str())
        .bind(project.org_id.as_str())
        .bind(&project.name)
        .bind(json_of(project)?)
        .bind(project.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!("project {}", project.id)));
        }
        let e = rules::tenancy_entry(actor, "project.create", json!({ "name": project.name }));
        insert_audit_for(&mut tx, &project.org_id, project.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError> {
        let rows = sqlx::query(
            r#"SELECT doc FROM projects
               WHERE org_id = $1 AND ($2::text IS NULL OR id COLLATE "C" > $2)
               ORDER BY id COLLATE "C" LIMIT $3"#,
        )
        .bind(org.as_str())
        .bind(after.map(ProjectId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(project_of).collect()
    }

    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError> {
        storable::text("name", name)?;
        let mut tx = self.begin().await?;
        let org = project_org(&mut *tx, id).await?;
        lock_org(&mut tx, &org).await?;
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut p = project_of(&row)?;
        check_project_name(&mut tx, &org, name, id).await?;
        let old = std::mem::replace(&mut p.name, name.to_owned());
        sqlx::query("UPDATE projects SET name = $2, doc = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(&p.name)
            .bind(json_of(&p)?)
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(
            actor,
            "project.rename",
            json!({ "old": old, "new": p.name }),
        );
        insert_audit_for(&mut tx, &org, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(p)
    }

    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let org = project_org(&mut *tx, id).await?;
        // Lock order: organization first, so admission (which holds it) cannot insert a new
        // sandbox into the project while it is being deleted.
        lock_org(&mut tx, &org).await?;
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let p = project_of(&row)?;
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE project_id = $1 AND NOT (status = ANY($2))",
        )
        .bind(id.as_str())
        .bind(statuses_where(SandboxStatus::is_final))
        .fetch_one(&mut *tx)
        .await?;
        if live > 0 {
            return Err(rules::project_has_live_sandboxes(count_u64(live)));
        }
        // The project row is locked: a snapshot insert (which takes it FOR SHARE) either
        // committed before and is counted here, or waits and then finds no project.
        let snapshots: i64 =
            sqlx::query_scalar("SELECT count(*) FROM snapshots WHERE project_id = $1")
                .bind(id.as_str())
                .fetch_one(&mut *tx)
                .await?;
        if snapshots > 0 {
            return Err(rules::project_has_snapshots(count_u64(snapshots)));
        }
        let removed = sqlx::query("DELETE FROM sandboxes WHERE project_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM api_keys WHERE project_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM quotas WHERE scope = $1")
            .bind(QuotaScope::Project(id.clone()).key())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM projects WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(
            actor,
            "project.delete",
            json!({ "name": p.name, "deletedSandboxes": removed }),
        );
        insert_audit_for(&mut tx, &org, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        lock_org(&mut tx, &key.org_id).await?;
        if let Some(p) = &key.project_id {
            let org = project_org(&mut *tx, p).await?;
            if org != key.org_id {
                return Err(StoreError::NotFound);
            }
        }
        let parent = rules::minting_key(actor);
        let mut key = key.clone();
        if let Some(parent) = parent {
            // Shares the parent's row lock with its revocation: either this key exists when
            // the revocation looks for descendants, or the parent is revoked here already
            // (revoked in another process less than a key cache's life ago) and so is this key.
            let row = sqlx::query("SELECT doc, hash FROM api_keys WHERE id = $1 FOR SHARE")
                .bind(parent)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(at) = row
                .as_ref()
                .map(key_of)
                .transpose()?
                .and_then(|p| p.revoked_at)
            {
                key.revoked_at = Some(key.revoked_at.map_or(at, |own| own.min(at)));
            }
        }
        let key = &key;
        let inserted = sqlx::query(
            "INSERT INTO api_keys (id, org_id, project_id, doc, hash, revoked_at, expires_at,
                 created_at, parent_key_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(key.id.as_str())
        .bind(key.org_id.as_str())
        .bind(key.project_id.as_ref().map(ProjectId::as_str))
        .bind(json_of(key)?)
        .bind(&key.hash)
        .bind(key.revoked_at)
        .bind(key.expires_at)
        .bind(key.created_at)
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!("key {}", key.id)));
        }
        let e = rules::tenancy_entry(actor, "key.create", rules::key_detail(key));
        insert_audit_for(&mut tx, &key.org_id, key.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row = sqlx::query("SELECT doc, hash FROM api_keys WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(key_of).transpose()
    }

    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc, hash FROM api_keys
             WHERE org_id = $1 AND ($2::text IS NULL OR id > $2)
             ORDER BY id LIMIT $3",
        )
        .bind(org.as_str())
        .bind(after.map(KeyId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_of).collect()
    }

    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT doc, hash FROM api_keys WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut key = key_of(&row)?;
        if key.revoked_at.is_none() {
            key.revoked_at = Some(at);
            sqlx::query("UPDATE api_keys SET revoked_at = $2, doc = $3 WHERE id = $1")
                .bind(id.as_str())
                .bind(at)
                .bind(json_of(&key)?)
                .execute(&mut *tx)
                .await?;
            let e = rules::tenancy_entry(actor, "key.revoke", json!({ "revokedAt": at }));
            insert_audit_for(&mut tx, &key.org_id, id.as_str(), e, at).await?;
        }
        // Every key below it that is still valid, also when this key was revoked before (a
        // retry finishes what a revocation before this rule left).
        let below = sqlx::query(
            "WITH RECURSIVE below(id) AS (
                 SELECT id FROM api_keys WHERE parent_key_id = $1
                 UNION
                 SELECT k.id FROM api_keys k JOIN below b ON k.parent_key_id = b.id)
             SELECT k.doc, k.hash FROM api_keys k JOIN below b ON b.id = k.id
             WHERE k.revoked_at IS NULL
             ORDER BY k.id FOR UPDATE OF k",
        )
        .bind(id.as_str())
        .fetch_all(&mut *tx)
        .await?;
        for row in &below {
            let mut child = key_of(row)?;
            child.revoked_at = Some(at);
            sqlx::query("UPDATE api_keys SET revoked_at = $2, doc = $3 WHERE id = $1")
                .bind(child.id.as_str())
                .bind(at)
                .bind(json_of(&child)?)
                .execute(&mut *tx)
                .await?;
            let e = rules::tenancy_entry(actor, "key.revoke", rules::cascade_detail(at, id));
            insert_audit_for(&mut tx, &child.org_id, child.id.as_str(), e, at).await?;
        }
        tx.commit().await?;
        Ok(key)
    }

    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError> {
        // The doc is the serialized record: set the field as serde writes it.
        let res = sqlx::query(
            "UPDATE api_keys SET doc = jsonb_set(doc, '{lastUsedAt}', $2) WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(json_of(&at)?)
        .execute(&self.pool)
        .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}

/// Takes the organization-name lock and fails with `AlreadyExists` if an organization other
/// than `except` has `name`.
async fn check_org_name(
    tx: &mut Transaction<'static, Postgres>,
    name: &str,
    except: &OrgId,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ORG_NAME_LOCK)
        .execute(&mut **tx)
        .await?;
    let taken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM organizations WHERE name = $1 AND id <> $2)",
    )
    .bind(name)
    .bind(except.as_str())
    .fetch_one(&mut **tx)
    .await?;
    if taken {
        return Err(rules::name_taken("organization", name));
    }
    Ok(())
}

/// `AlreadyExists` if a project of `org` other than `except` has `name`. The caller holds
/// the organization row lock, which serializes project names within it.
async fn check_project_name(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    name: &str,
    except: &ProjectId,
) -> Result<(), StoreError> {
    let taken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM projects WHERE org_id = $1 AND name = $2 AND id <> $3)",
    )
    .bind(org.as_str())
    .bind(name)
    .bind(except.as_str())
    .fetch_one(&mut **tx)
    .await?;
    if taken {
        return Err(rules::name_taken("project", name));
    }
    Ok(())
}

/// The organization of a project (it never changes, so an unlocked read is safe).
pub(crate) async fn project_org<'e, E>(ex: E, id: &ProjectId) -> Result<OrgId, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let org: String = sqlx::query_scalar("SELECT org_id FROM projects WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(ex)
        .await?
        .ok_or(StoreError::NotFound)?;
    OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))
}
