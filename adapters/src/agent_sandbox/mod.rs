//! `AgentSandboxAdapter`: sandboxes on a Kubernetes cluster running kubernetes-sigs'
//! agent-sandbox controller. The operator runs the cluster, so its pools are private (the
//! registry makes the operator declare it, as for OpenSandbox).
//!
//! Lifecycle goes through the Kubernetes API (HTTPS and JSON with a bearer token, no client
//! library): a `SandboxClaim` on a `SandboxWarmPool` (claim mode, the default: the controller
//! adopts a Ready pod from the pool, or cold-starts one from the pool's template when the
//! claim carries env) or a `Sandbox` from the pool's own pod template (sandbox mode). The
//! object is named after Differently's sandbox id and labelled with it and the installation
//! id, so `create` finds what a redelivered create made (and a racing one gets 409
//! `AlreadyExists`), and `list` finds orphans by label. Exec and files go to the runtime in
//! the pod (the project's python runtime API) through the sandbox router or a per-pod URL.
//!
//! The bearer token, read through its reference at call time, goes only to the API server;
//! never to the runtime, into an error, an event or a URL.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::{json, Value};

use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, FileEntry,
    Instance, InstanceRef,
};

pub mod config;
mod exec;
mod files;
mod kube;
mod objects;
mod runtime;
mod script;

pub use crate::settings::ConfigError;
pub use config::{AgentSandboxConfig, Mode, Settings};
use kube::{Created, Kube, Res};
use objects::{Phase, Record, LABEL_INSTALLATION, LABEL_SANDBOX};
use runtime::{Call, Runtime};

/// The adapter kind.
pub const KIND: &str = "agent_sandbox";

/// One agent-sandbox pool: a namespace of one cluster.
pub struct AgentSandboxAdapter {
    settings: Settings,
    kube: Kube,
    runtime: Runtime,
}

crate::kit::from_settings!(AgentSandboxAdapter, KIND, AgentSandboxConfig => Settings, |settings, credentials| {
    let kube = Kube::new(&settings, credentials)?;
    let runtime = Runtime::new(&settings, credentials)
        .map_err(|e| crate::kit::client::config_error(e, "runtime"))?;
    Ok(Self {
        settings,
        kube,
        runtime,
    })
});

impl AgentSandboxAdapter {
    /// The resource a sandbox is made as.
    fn res(&self) -> Res {
        match self.settings.mode {
            Mode::Claim => Res::Claim,
            Mode::Sandbox => Res::Sandbox,
        }
    }

    /// The object of `id`, if it exists and carries `id`'s label.
    async fn lookup(&self, id: &SandboxId) -> Result<Option<Value>, AdapterError> {
        let name = objects::object_name(id);
        let found = self.kube.get(self.res(), &name, "find sandbox").await?;
        Ok(found.filter(|v| objects::sandbox_label(v) == Some(id.as_str())))
    }

    /// The warm pool a claim goes to: the sandbox's template, else the pool's setting.
    fn warm_pool(&self, req: &CreateInstance) -> Result<String, AdapterError> {
        if let Some(t) = req.template.as_deref().filter(|t| !t.is_empty()) {
            if !config::dns_subdomain(t) {
                return Err(AdapterError::invalid_field(
                    "template",
                    format!("`{t}` is not a SandboxWarmPool name"),
                ));
            }
            return Ok(t.to_owned());
        }
        self.settings.warm_pool.clone().ok_or_else(|| {
            AdapterError::invalid_field(
                "template",
                "this agent-sandbox pool has no `warmPool` setting: name a SandboxWarmPool as the template",
            )
        })
    }

    fn body(&self, req: &CreateInstance) -> Result<Value, AdapterError> {
        let now = chrono::Utc::now();
        match self.settings.mode {
            Mode::Claim => Ok(objects::claim_body(req, &self.warm_pool(req)?, now)),
            Mode::Sandbox => {
                let t = self.settings.pod_template.clone().unwrap_or(Value::Null);
                Ok(objects::sandbox_body(req, &t, now))
            }
        }
    }

    /// Polls the object of `id` until Ready, then the runtime until it answers; the name of
    /// the Sandbox the runtime is reached by.
    async fn ready(&self, id: &SandboxId) -> Result<String, AdapterError> {
        let timeout = self.settings.ready_timeout;
        let started = Instant::now();
        let name = objects::object_name(id);
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        let sandbox = loop {
            let v = self
                .kube
                .get(self.res(), &name, "wait for Ready")
                .await?
                .ok_or(AdapterError::NotFound)?;
            match objects::phase(self.res(), &v) {
                Phase::Ready(s) => break s,
                Phase::Failed(why) => {
                    return Err(AdapterError::permanent(format!(
                        "agent-sandbox {} {name} will not become Ready: {why}",
                        self.res().plural()
                    )))
                }
                Phase::Gone => return Err(AdapterError::NotFound),
                Phase::Pending(why) if poll.expired() => {
                    return Err(AdapterError::transient(format!(
                        "{name} not Ready after {} s ({why})",
                        timeout.as_secs()
                    )))
                }
                Phase::Pending(_) => poll.pause().await,
            }
        };
        let left = timeout.saturating_sub(started.elapsed());
        let mut poll = Poll::new(self.settings.poll_interval, left);
        loop {
            let e = match self.runtime.health(&sandbox).await {
                Ok(()) => return Ok(sandbox),
                Err(Call::Unreachable(m)) => AdapterError::transient(m),
                Err(Call::Failed(e @ AdapterError::Permanent(_))) => return Err(e),
                Err(Call::Failed(e)) => e,
            };
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "the runtime of {sandbox} did not answer within {} s: {e}",
                    timeout.as_secs()
                )));
            }
            poll.pause().await;
        }
    }

    /// What an unreachable runtime means: the Sandbox is gone (`NotFound`) or not up.
    async fn unreachable(&self, sandbox: &str, why: String) -> AdapterError {
        match self.kube.get(Res::Sandbox, sandbox, "find sandbox").await {
            Ok(None) => AdapterError::NotFound,
            Ok(Some(v)) if objects::phase(Res::Sandbox, &v) == Phase::Gone => {
                AdapterError::NotFound
            }
            Ok(Some(_)) => AdapterError::transient(format!(
                "the runtime of {sandbox} cannot be reached: {why}"
            )),
            Err(e) => e,
        }
    }

    /// A runtime call's error, with unreachable pods told apart.
    async fn call_error(&self, sandbox: &str, c: Call) -> AdapterError {
        match c {
            Call::Unreachable(why) => self.unreachable(sandbox, why).await,
            Call::Failed(e) => e,
        }
    }
}

#[async_trait]
impl Adapter for AgentSandboxAdapter {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// The runtime answers output as JSON text decoded strictly: output that is not UTF-8
    /// fails the call (see docs/providers.md); stderr comes apart.
    fn exec_fidelity(&self) -> crate::ExecFidelity {
        crate::ExecFidelity::TEXT
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::Exec, Capability::Files]
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if req.from_snapshot.is_some() {
            return Err(AdapterError::Unsupported(
                "snapshots: agent-sandbox has no portable snapshots".to_owned(),
            ));
        }
        let found = match self.lookup(&req.sandbox_id).await? {
            Some(v) => Some(v),
            None => {
                let body = self.body(req)?;
                match self.kube.create(self.res(), &body, "create sandbox").await? {
                    Created::Made => None,
                    // A racing create of the same sandbox, or a name taken by someone else.
                    Created::Exists => Some(self.lookup(&req.sandbox_id).await?.ok_or_else(|| {
                        AdapterError::permanent(format!(
                            "create sandbox: the name {} is taken by an object without this sandbox's label",
                            objects::object_name(&req.sandbox_id)
                        ))
                    })?),
                }
            }
        };
        if let Some(v) = &found {
            if objects::phase(self.res(), v) == Phase::Gone {
                return Err(AdapterError::transient(
                    "create sandbox: the previous object of this sandbox is still being deleted",
                ));
            }
        }
        let backend_ref = self.ready(&req.sandbox_id).await?;
        Ok(req.running(backend_ref))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        // Deleting the claim deletes the Sandbox it owns (and so the pod).
        let name = objects::object_name(sandbox_id);
        self.kube.delete(self.res(), &name, "delete sandbox").await
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(self
            .lookup(sandbox_id)
            .await?
            .and_then(|v| crate::kit::tags::instance(&Record::new(self.res(), v))))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let selector = format!(
            "{LABEL_INSTALLATION}={},{LABEL_SANDBOX}",
            installation.as_str()
        );
        let all = self
            .kube
            .list(self.res(), &selector, "list sandboxes")
            .await?;
        let records: Vec<Record> = all
            .into_iter()
            .map(|v| Record::new(self.res(), v))
            .collect();
        Ok(crate::kit::tags::of_installation(&records, installation))
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.run_exec(at, req).await
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.kube.probe(self.res(), "health").await?;
        if let Some(pool) = self.settings.warm_pool.as_deref() {
            if self
                .kube
                .get(Res::WarmPool, pool, "health")
                .await?
                .is_none()
            {
                return Err(AdapterError::permanent(format!(
                    "health: the SandboxWarmPool {pool} does not exist in namespace {}",
                    self.settings.namespace
                )));
            }
        }
        Ok(())
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        self.put_file(at, path, mode, body).await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        self.get_file(at, path, range).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        self.list_dir(at, path, depth).await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        self.remove_file(at, path).await
    }

    /// Moves the object's `shutdownTime` (the controller deletes it then).
    async fn renew(&self, at: &InstanceRef, ttl: Duration) -> Result<(), AdapterError> {
        let Some(when) = objects::shutdown_time(ttl.as_secs().max(1), chrono::Utc::now()) else {
            return Ok(());
        };
        let patch = match self.settings.mode {
            Mode::Claim => {
                json!({"spec": {"lifecycle": {"shutdownTime": when, "shutdownPolicy": "Delete"}}})
            }
            Mode::Sandbox => json!({"spec": {"shutdownTime": when, "shutdownPolicy": "Delete"}}),
        };
        let name = objects::object_name(&at.sandbox_id);
        self.kube
            .merge_patch(self.res(), &name, &patch, "renew")
            .await
    }
}
