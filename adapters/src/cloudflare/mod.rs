//! Kind `cloudflare`: Cloudflare Sandbox through the Sandbox Bridge Worker, the HTTP API
//! (`/v1/sandbox/{id}/…`, bearer `SANDBOX_API_KEY`) that `@cloudflare/sandbox/bridge`
//! serves from a Worker the operator deploys. Each sandbox is a Durable Object plus a
//! container, named by the caller; the bridge starts a container for any name it is asked
//! about and a container sleeps, losing its files, after its idle time. How that maps onto
//! the contract is in `instances` (existence, the index), `run` (exec) and `files`; the
//! whole story, and what is not offered, in `docs/providers.md`.

mod bridge;
mod config;
mod files;
mod ids;
mod instances;
mod run;
mod script;
mod sse;

use std::sync::Mutex;

use async_trait::async_trait;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use tokio::sync::mpsc;

pub use config::{CloudflareConfig, Ports, Settings, TimeoutsConfig};

use crate::credentials::Credentials;
use crate::exec_output::timed_exit;
use crate::kit::FromSettings;
use crate::settings::ConfigError;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, ExecFidelity, FileEntry, Instance, InstanceRef,
};
use bridge::Bridge;

/// The kind's name in pool documents.
pub const KIND: &str = "cloudflare";

/// A pool of sandboxes behind one bridge Worker.
#[derive(Debug)]
pub struct CloudflareAdapter {
    bridge: Bridge,
    ports: Ports,
    /// The bridge API's version, as its OpenAPI document last said.
    version: Mutex<Option<String>>,
}

impl CloudflareAdapter {
    /// Builds the adapter from validated settings; the key resolves through `credentials`
    /// at call time.
    pub fn new(settings: &Settings, credentials: &Credentials) -> Result<Self, ConfigError> {
        Ok(CloudflareAdapter {
            bridge: Bridge::new(settings, credentials)?,
            ports: settings.ports,
            version: Mutex::new(None),
        })
    }
}

impl FromSettings for CloudflareAdapter {
    const KIND: &'static str = KIND;
    type Config = CloudflareConfig;

    fn from_config(
        config: CloudflareConfig,
        credentials: &Credentials,
    ) -> Result<Self, ConfigError> {
        CloudflareAdapter::new(&config.validate()?, credentials)
    }
}

#[async_trait]
impl Adapter for CloudflareAdapter {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = vec![Capability::Exec, Capability::Files, Capability::ExecStream];
        if self.ports == Ports::Public {
            caps.push(Capability::PortsExpose);
        }
        caps
    }

    /// The container decodes command output as UTF-8 text before the bridge encodes it, so
    /// bytes that are not UTF-8 arrive replaced; the streams stay apart and unframed.
    fn exec_fidelity(&self) -> ExecFidelity {
        ExecFidelity::TEXT
    }

    fn backend_version(&self) -> Option<String> {
        self.version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if req.from_snapshot.is_some() {
            return Err(AdapterError::Unsupported("snapshots".to_owned()));
        }
        if req.template.is_some() {
            return Err(AdapterError::invalid_field(
                "template",
                "a Cloudflare bridge runs the one image its Worker was deployed with",
            ));
        }
        run::check_env(&req.env)?;
        instances::create(&self.bridge, req).await
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        instances::delete(&self.bridge, sandbox_id).await
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        instances::find(&self.bridge, sandbox_id).await
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        instances::list(&self.bridge, installation).await
    }

    async fn health(&self) -> Result<(), AdapterError> {
        let version = self.bridge.api_version().await?;
        *self.version.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
        Ok(())
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        timed_exit(run::run(&self.bridge, at, req, &out)).await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        files::upload(&self.bridge, at, path, mode, body).await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        files::download(&self.bridge, at, path, range).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        files::list(&self.bridge, at, path, depth).await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        files::delete(&self.bridge, at, path).await
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        _expires: Option<std::time::Duration>,
    ) -> Result<Endpoint, AdapterError> {
        if self.ports != Ports::Public {
            return Err(AdapterError::Unsupported("ports.expose".to_owned()));
        }
        // The bridge's rule: no system ports, and 3000 is its control port.
        if port < 1024 || port == 3000 {
            return Err(AdapterError::invalid_field(
                "port",
                "the bridge tunnels ports 1024-65535 except 3000",
            ));
        }
        instances::ensure(&self.bridge, at).await?;
        let t = self.bridge.tunnel(&at.backend_ref, port).await?;
        if !t.url.starts_with("https://") {
            return Err(AdapterError::transient(format!(
                "expose port: the bridge answered a tunnel URL that is not https: {}",
                t.url
            )));
        }
        // Quick tunnels have no expiry and no signature; they end with the container.
        Ok(Endpoint {
            url: t.url,
            expires_at: None,
        })
    }
}
