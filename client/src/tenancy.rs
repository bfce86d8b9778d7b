//! Organizations, projects, API keys, their quotas and placement policies. Creating an
//! organization, changing quotas and policies needs an admin key; an organization's key
//! manages its own projects and keys.

use futures::stream::BoxStream;
use reqwest::Method;
use serde_json::json;

use crate::{
    encode, query, Client, CreateKey, CreatedKey, Key, Org, Policy, Project, Quota, QuotaView,
    Result, UpdateOrg,
};

/// Where a quota or policy applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// The installation (policies only).
    Global,
    /// One organization.
    Org(&'a str),
    /// One project.
    Project(&'a str),
}

impl Scope<'_> {
    fn path(self, what: &str) -> String {
        match self {
            Scope::Global => format!("/v1/admin/{what}/global"),
            Scope::Org(id) => format!("/v1/orgs/{}/{what}", encode(id)),
            Scope::Project(id) => format!("/v1/projects/{}/{what}", encode(id)),
        }
    }
}

fn tenant_list(what: &str, org_id: Option<&str>) -> String {
    format!(
        "/v1/{what}{}",
        query(&[("orgId", org_id.map(str::to_owned))])
    )
}

impl Client {
    /// `POST /v1/orgs` (admin).
    pub async fn create_org(&self, name: &str, idempotency_key: Option<&str>) -> Result<Org> {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(
            Method::POST,
            "/v1/orgs",
            Some(&json!({ "name": name })),
            &headers,
        )
        .await
    }

    /// Every organization the key can see (its own, for an organization's key).
    pub fn list_orgs(&self) -> BoxStream<'static, Result<Org>> {
        self.paginate("/v1/orgs".to_owned())
    }

    /// `GET /v1/orgs/{id}`.
    pub async fn get_org(&self, id: &str) -> Result<Org> {
        self.json::<_, ()>(Method::GET, &format!("/v1/orgs/{}", encode(id)), None, &[])
            .await
    }

    /// `PATCH /v1/orgs/{id}`: rename, suspend or reactivate (admin).
    pub async fn update_org(&self, id: &str, update: &UpdateOrg) -> Result<Org> {
        self.json(
            Method::PATCH,
            &format!("/v1/orgs/{}", encode(id)),
            Some(update),
            &[],
        )
        .await
    }

    /// `DELETE /v1/orgs/{id}`: only once nothing is left in it (admin).
    pub async fn delete_org(&self, id: &str) -> Result<()> {
        self.empty::<()>(Method::DELETE, &format!("/v1/orgs/{}", encode(id)), None)
            .await
    }

    /// `POST /v1/projects` (in `org_id`, or the key's own organization).
    pub async fn create_project(
        &self,
        org_id: Option<&str>,
        name: &str,
        idempotency_key: Option<&str>,
    ) -> Result<Project> {
        let mut body = json!({ "name": name });
        if let Some(o) = org_id {
            body["orgId"] = json!(o);
        }
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(Method::POST, "/v1/projects", Some(&body), &headers)
            .await
    }

    /// Every project of `org_id` (default: the key's organization).
    pub fn list_projects(&self, org_id: Option<&str>) -> BoxStream<'static, Result<Project>> {
        self.paginate(tenant_list("projects", org_id))
    }

    /// `GET /v1/projects/{id}`.
    pub async fn get_project(&self, id: &str) -> Result<Project> {
        self.json::<_, ()>(
            Method::GET,
            &format!("/v1/projects/{}", encode(id)),
            None,
            &[],
        )
        .await
    }

    /// `PATCH /v1/projects/{id}`: rename.
    pub async fn rename_project(&self, id: &str, name: &str) -> Result<Project> {
        self.json(
            Method::PATCH,
            &format!("/v1/projects/{}", encode(id)),
            Some(&json!({ "name": name })),
            &[],
        )
        .await
    }

    /// `DELETE /v1/projects/{id}`: only once nothing is left in it.
    pub async fn delete_project(&self, id: &str) -> Result<()> {
        self.empty::<()>(
            Method::DELETE,
            &format!("/v1/projects/{}", encode(id)),
            None,
        )
        .await
    }

    /// `POST /v1/keys`: the answer is the only time the secret is shown.
    pub async fn create_key(
        &self,
        req: &CreateKey,
        idempotency_key: Option<&str>,
    ) -> Result<CreatedKey> {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(Method::POST, "/v1/keys", Some(req), &headers)
            .await
    }

    /// Every key of `org_id` (default: the key's organization); records, never secrets.
    pub fn list_keys(&self, org_id: Option<&str>) -> BoxStream<'static, Result<Key>> {
        self.paginate(tenant_list("keys", org_id))
    }

    /// `GET /v1/keys/{id}`.
    pub async fn get_key(&self, id: &str) -> Result<Key> {
        self.json::<_, ()>(Method::GET, &format!("/v1/keys/{}", encode(id)), None, &[])
            .await
    }

    /// `DELETE /v1/keys/{id}`: revokes it; its record with `revokedAt`.
    pub async fn revoke_key(&self, id: &str) -> Result<Key> {
        self.json::<_, ()>(
            Method::DELETE,
            &format!("/v1/keys/{}", encode(id)),
            None,
            &[],
        )
        .await
    }

    /// An organization's or project's quota, the limits in force, and usage.
    pub async fn quota(&self, scope: Scope<'_>) -> Result<QuotaView> {
        self.json::<_, ()>(Method::GET, &scope.path("quota"), None, &[])
            .await
    }

    /// Replaces an organization's or project's quota (admin).
    pub async fn put_quota(&self, scope: Scope<'_>, quota: &Quota) -> Result<QuotaView> {
        self.json(Method::PUT, &scope.path("quota"), Some(quota), &[])
            .await
    }

    /// The placement policy at `scope`.
    pub async fn policy(&self, scope: Scope<'_>) -> Result<Policy> {
        let what = if scope == Scope::Global {
            "policies"
        } else {
            "policy"
        };
        self.json::<_, ()>(Method::GET, &scope.path(what), None, &[])
            .await
    }

    /// Replaces the placement policy at `scope` (admin; a lower level can only narrow).
    /// `policy` is a [`Policy`], or any document of that shape (a file's JSON as it is, so
    /// the API, not this crate, judges a field it does not know).
    pub async fn put_policy<P: serde::Serialize + ?Sized>(
        &self,
        scope: Scope<'_>,
        policy: &P,
    ) -> Result<Policy> {
        let what = if scope == Scope::Global {
            "policies"
        } else {
            "policy"
        };
        self.json(Method::PUT, &scope.path(what), Some(policy), &[])
            .await
    }
}
