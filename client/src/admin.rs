//! Operators' routes (an admin key): pools, stored backend secrets, the audit log
//! (list, verify, export, checkpoints, segments) and the trust report.

use futures::stream::BoxStream;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{encode, query, AuditFilter, Client, Error, Pool, Result, TransportError, WarmClasses};

fn audit_path(f: &AuditFilter) -> String {
    format!(
        "/v1/audit{}",
        query(&[
            ("orgId", f.org_id.clone()),
            ("projectId", f.project_id.clone()),
            ("action", f.action.clone()),
            ("actor", f.actor.clone()),
            ("resource", f.resource.clone()),
            ("since", f.since.clone()),
            ("until", f.until.clone()),
            ("limit", f.limit.map(|l| l.to_string())),
        ])
    )
}

impl Client {
    /// Every pool, with health, capabilities and source.
    pub fn list_pools(&self) -> BoxStream<'static, Result<Pool>> {
        self.paginate("/v1/admin/pools".to_owned())
    }

    /// `GET /v1/admin/pools/{name}`.
    pub async fn get_pool(&self, name: &str) -> Result<Pool> {
        self.json::<_, ()>(
            Method::GET,
            &format!("/v1/admin/pools/{}", encode(name)),
            None,
            &[],
        )
        .await
    }

    /// `POST /v1/admin/pools`: registers a pool (its record). `req` is a [`crate::PoolRequest`] or a
    /// document of that shape.
    pub async fn create_pool<P: serde::Serialize + ?Sized>(&self, req: &P) -> Result<Value> {
        self.json(Method::POST, "/v1/admin/pools", Some(req), &[])
            .await
    }

    /// `PATCH /v1/admin/pools/{name}`.
    pub async fn update_pool<P: serde::Serialize + ?Sized>(
        &self,
        name: &str,
        req: &P,
    ) -> Result<Value> {
        self.json(
            Method::PATCH,
            &format!("/v1/admin/pools/{}", encode(name)),
            Some(req),
            &[],
        )
        .await
    }

    /// `DELETE /v1/admin/pools/{name}`: only a pool that runs nothing.
    pub async fn delete_pool(&self, name: &str) -> Result<()> {
        self.empty::<()>(
            Method::DELETE,
            &format!("/v1/admin/pools/{}", encode(name)),
            None,
        )
        .await
    }

    /// `GET /v1/admin/pools/{name}/warm`: the pool's warm classes with their counts.
    pub async fn warm_classes(&self, pool: &str) -> Result<WarmClasses> {
        self.json::<_, ()>(
            Method::GET,
            &format!("/v1/admin/pools/{}/warm", encode(pool)),
            None,
            &[],
        )
        .await
    }

    /// `PUT /v1/admin/pools/{name}/warm`: replaces the pool's warm classes (`[]` removes
    /// them all); answers them as `warm_classes` does. Each class is a
    /// [`WarmClass`](crate::WarmClass) or a document of that shape (sent as it is: the API
    /// names a field it refuses).
    pub async fn put_warm_classes<C: serde::Serialize>(
        &self,
        pool: &str,
        classes: &[C],
    ) -> Result<WarmClasses> {
        self.json(
            Method::PUT,
            &format!("/v1/admin/pools/{}/warm", encode(pool)),
            Some(&json!({ "classes": classes })),
            &[],
        )
        .await
    }

    /// Stored backend secrets: names and fingerprints only.
    pub fn list_secrets(&self) -> BoxStream<'static, Result<Value>> {
        self.paginate("/v1/admin/secrets".to_owned())
    }

    /// `PUT /v1/admin/secrets/{name}`: stores or replaces a secret (never served back).
    pub async fn put_secret(&self, name: &str, value: &str) -> Result<Value> {
        self.json(
            Method::PUT,
            &format!("/v1/admin/secrets/{}", encode(name)),
            Some(&json!({ "value": value })),
            &[],
        )
        .await
    }

    /// Audit records matching `filter`, across pages.
    pub fn list_audit(&self, filter: &AuditFilter) -> BoxStream<'static, Result<Value>> {
        self.paginate(audit_path(filter))
    }

    /// `GET /v1/admin/audit/verify`: whether every chain holds (`ok`), and the first record
    /// that does not.
    pub async fn verify_audit(&self) -> Result<Value> {
        self.json::<_, ()>(Method::GET, "/v1/admin/audit/verify", None, &[])
            .await
    }

    /// `GET /v1/admin/audit/export`: every record as JSON lines, streamed into `w` as they
    /// arrive (for `differently audit verify-export`); the bytes written.
    pub async fn export_audit(&self, w: &mut impl std::io::Write) -> Result<u64> {
        let path = "/v1/admin/audit/export";
        let mut resp = self.call::<()>(Method::GET, path, None, &[]).await?;
        let url = resp.url().to_string();
        let mut n = 0u64;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| TransportError::new("GET", &url, self.base_url(), e))?
        {
            w.write_all(&chunk).map_err(|e| {
                Error::invalid("destination", format!("cannot write the export: {e}"))
            })?;
            n += chunk.len() as u64;
        }
        Ok(n)
    }

    /// `POST /v1/admin/audit/checkpoints`: signs every chain's head now; `None` when nothing
    /// changed since the last checkpoint.
    pub async fn checkpoint_audit(&self) -> Result<Option<Value>> {
        self.json_or_empty::<Value, ()>(Method::POST, "/v1/admin/audit/checkpoints", None)
            .await
    }

    /// `POST /v1/admin/audit/segments`: after a lost audit key, starts a new segment
    /// (docs/audit.md); `reason` is recorded in it.
    pub async fn segment_audit(&self, reason: &str) -> Result<Value> {
        self.json(
            Method::POST,
            "/v1/admin/audit/segments",
            Some(&json!({ "reason": reason })),
            &[],
        )
        .await
    }

    /// `GET /v1/admin/trust-report`: where work may go and why.
    pub async fn trust_report(&self) -> Result<Value> {
        self.json::<_, ()>(Method::GET, "/v1/admin/trust-report", None, &[])
            .await
    }
}
