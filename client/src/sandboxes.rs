//! Sandboxes: create, read, list (a stream over every page), wait, update (TTL, labels, idle
//! timeout), keepalive, the lifecycle operations, placement and its dry run, ports.

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{
    query, sandbox_path, Client, CreateSandbox, Error, Page, PortExposure, Result, Sandbox,
    SandboxFilter, UpdateSandbox,
};

/// The longest one `GET …/wait` may last (the API's bound); longer waits are several calls.
pub const MAX_WAIT_PER_CALL: Duration = Duration::from_secs(300);

/// A lifecycle operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Pause,
    Resume,
    Stop,
    Start,
}

impl Lifecycle {
    fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Pause => "pause",
            Lifecycle::Resume => "resume",
            Lifecycle::Stop => "stop",
            Lifecycle::Start => "start",
        }
    }
}

fn list_path(f: &SandboxFilter) -> String {
    format!(
        "/v1/sandboxes{}",
        query(&[
            ("status", f.status.clone()),
            ("label", f.label.clone()),
            ("projectId", f.project_id.clone()),
            ("limit", f.limit.map(|l| l.to_string())),
        ])
    )
}

impl Client {
    /// `POST /v1/sandboxes`: admits it (`queued`, or `provisioning` when placed at once).
    /// With `idempotency_key`, a retry answers the same sandbox instead of a second one.
    pub async fn create_sandbox(
        &self,
        req: &CreateSandbox,
        idempotency_key: Option<&str>,
    ) -> Result<Sandbox> {
        let headers: Vec<(&str, &str)> = idempotency_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        self.json(Method::POST, "/v1/sandboxes", Some(req), &headers)
            .await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox> {
        self.json::<_, ()>(Method::GET, &sandbox_path(id, ""), None, &[])
            .await
    }

    /// One page of `GET /v1/sandboxes`.
    pub async fn list_sandboxes_page(
        &self,
        filter: &SandboxFilter,
        cursor: Option<&str>,
    ) -> Result<Page<Sandbox>> {
        self.page(&list_path(filter), cursor).await
    }

    /// Every sandbox matching `filter`, across pages.
    pub fn list_sandboxes(&self, filter: &SandboxFilter) -> BoxStream<'static, Result<Sandbox>> {
        self.paginate(list_path(filter))
    }

    /// Waits until the sandbox has `status` or a final one, or `timeout` passed; answers it
    /// as it is then (read `status`). Waits longer than the API's bound are several calls.
    pub async fn wait_sandbox(&self, id: &str, status: &str, timeout: Duration) -> Result<Sandbox> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(MAX_WAIT_PER_CALL)
                .as_secs()
                .max(1);
            let path = sandbox_path(
                id,
                &format!(
                    "/wait{}",
                    query(&[
                        ("status", Some(status.to_owned())),
                        ("timeoutSeconds", Some(left.to_string())),
                    ])
                ),
            );
            let s: Sandbox = self.json::<_, ()>(Method::GET, &path, None, &[]).await?;
            if s.status == status || s.is_final() || Instant::now() >= deadline {
                return Ok(s);
            }
        }
    }

    /// `PATCH /v1/sandboxes/{id}`: renew the TTL, replace labels, set the idle timeout.
    pub async fn update_sandbox(&self, id: &str, update: &UpdateSandbox) -> Result<Sandbox> {
        if update == &UpdateSandbox::default() {
            return Err(Error::invalid(
                "update",
                "nothing to change: give ttlSeconds, labels or idleTimeoutSeconds",
            ));
        }
        self.json(Method::PATCH, &sandbox_path(id, ""), Some(update), &[])
            .await
    }

    /// `DELETE /v1/sandboxes/{id}`: `terminating` (a worker deletes the instance), or as it
    /// was if it had already ended.
    pub async fn delete_sandbox(&self, id: &str) -> Result<Sandbox> {
        self.json::<_, ()>(Method::DELETE, &sandbox_path(id, ""), None, &[])
            .await
    }

    /// Pause, resume, stop or start; answers the sandbox (202: still in progress).
    pub async fn lifecycle(&self, id: &str, op: Lifecycle) -> Result<Sandbox> {
        let path = sandbox_path(id, &format!("/{}", op.as_str()));
        self.json::<_, ()>(Method::POST, &path, None, &[]).await
    }

    /// `POST …/keepalive`: counts as activity (resets the idle clock).
    pub async fn keepalive(&self, id: &str) -> Result<()> {
        self.empty::<()>(Method::POST, &sandbox_path(id, "/keepalive"), None)
            .await
    }

    /// `GET …/placement`: why it runs where it runs (decision, pool, every pool considered).
    pub async fn placement(&self, id: &str) -> Result<Value> {
        self.json::<_, ()>(Method::GET, &sandbox_path(id, "/placement"), None, &[])
            .await
    }

    /// `POST /v1/placement/dry-run`: where this create would go, admitting nothing.
    pub async fn placement_dry_run(&self, req: &CreateSandbox) -> Result<Value> {
        self.json(Method::POST, "/v1/placement/dry-run", Some(req), &[])
            .await
    }

    /// `POST …/ports`: a URL for `port` of the sandbox, valid `expires_seconds` if given.
    pub async fn expose_port(
        &self,
        id: &str,
        port: u16,
        expires_seconds: Option<u64>,
    ) -> Result<PortExposure> {
        let mut body = json!({ "port": port });
        if let Some(s) = expires_seconds {
            body["expiresSeconds"] = json!(s);
        }
        self.json(Method::POST, &sandbox_path(id, "/ports"), Some(&body), &[])
            .await
    }
}
