//! Snapshots of a sandbox, and new sandboxes from one (restore or fork: the same call, a
//! create with `fromSnapshot`).

use futures::stream::BoxStream;
use reqwest::Method;
use serde_json::json;

use crate::{
    encode, query, sandbox_path, Client, CreateSandbox, Result, Sandbox, Snapshot, SnapshotDeletion,
};

impl Client {
    /// `POST …/snapshots`: answers it `creating` or, if it finished within the API's 10 s,
    /// `ready`. With `idempotency_key`, a retry answers the same snapshot.
    pub async fn create_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<&str>,
        idempotency_key: Option<&str>,
    ) -> Result<Snapshot> {
        let body = match name {
            Some(n) => json!({ "name": n }),
            None => json!({}),
        };
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(
            Method::POST,
            &sandbox_path(sandbox_id, "/snapshots"),
            Some(&body),
            &headers,
        )
        .await
    }

    /// Every snapshot of one sandbox.
    pub fn list_sandbox_snapshots(&self, sandbox_id: &str) -> BoxStream<'static, Result<Snapshot>> {
        self.paginate(sandbox_path(sandbox_id, "/snapshots"))
    }

    /// Every snapshot the key can see (of `project_id` only, when given).
    pub fn list_snapshots(&self, project_id: Option<&str>) -> BoxStream<'static, Result<Snapshot>> {
        self.paginate(format!(
            "/v1/snapshots{}",
            query(&[("projectId", project_id.map(str::to_owned))])
        ))
    }

    /// `GET /v1/snapshots/{id}`.
    pub async fn get_snapshot(&self, id: &str) -> Result<Snapshot> {
        self.json::<_, ()>(
            Method::GET,
            &format!("/v1/snapshots/{}", encode(id)),
            None,
            &[],
        )
        .await
    }

    /// `DELETE /v1/snapshots/{id}`: gone (204), or still being deleted (202).
    pub async fn delete_snapshot(&self, id: &str) -> Result<SnapshotDeletion> {
        let path = format!("/v1/snapshots/{}", encode(id));
        Ok(
            match self
                .json_or_empty::<Snapshot, ()>(Method::DELETE, &path, None)
                .await?
            {
                None => SnapshotDeletion::Deleted,
                Some(s) => SnapshotDeletion::Pending(Box::new(s)),
            },
        )
    }

    /// A new sandbox from a ready snapshot (restore or fork), with `req`'s other settings.
    pub async fn fork(
        &self,
        snapshot_id: &str,
        mut req: CreateSandbox,
        idempotency_key: Option<&str>,
    ) -> Result<Sandbox> {
        req.from_snapshot = Some(snapshot_id.to_owned());
        self.create_sandbox(&req, idempotency_key).await
    }
}
