//! `E2bAdapter`: sandboxes on E2B (Firecracker microVMs run by a third party, so pools of
//! this kind are always `external`).
//!
//! The control plane (`api`) creates, finds (by metadata), pauses, resumes, snapshots and
//! kills sandboxes; envd inside each (`envd`) runs commands over Connect-RPC and moves files.
//! Every sandbox carries Differently's sandbox and installation ids in E2B metadata, which is
//! how `create` stays idempotent and `list` finds orphans.
//!
//! The API key, read through its reference at call time, goes only to the API; envd gets
//! the sandbox's own access token (sandboxes are created `secure`). Neither appears in an
//! error, an event or a port URL. See `docs/providers.md`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use tokio::sync::mpsc;

use crate::exec_output::{checked_stdin, timed_exit};
use crate::http::Secret;
use crate::kit::tags::{self, create_tags, of_installation, of_sandbox, Tagged};
use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, InstanceState, SnapshotInfo,
};

pub mod addressing;
mod api;
pub mod config;
pub mod connect;
mod envd;
pub mod envd_version;
mod target;

/// The metadata keys every sandbox carries (the kit's tags, under this module's names).
pub use crate::kit::tags::{INSTALLATION_TAG as META_INSTALLATION, SANDBOX_TAG as META_SANDBOX};
pub use crate::settings::ConfigError;
pub use config::{E2bConfig, Settings};
use config::{Egress, Ports};
use envd::{Failure, RunError, Target};

/// How long after Differently's own expiry E2B's timeout fires (so ours acts first).
const BACKSTOP_MARGIN: u64 = 300;

/// One E2B pool.
pub struct E2bAdapter {
    settings: Settings,
    api: api::Api,
    /// envd endpoints (with their access tokens) per E2B sandbox id.
    targets: Mutex<HashMap<String, Target>>,
    /// The envd version of the sandbox last looked up, for operators (`backend_version`).
    last_envd: Mutex<Option<envd_version::Version>>,
}

/// E2B's name for the snapshot of Differently's `snapshot_id` (`snp_01J…` →
/// `differently-snp-01j…`: template names are lower case).
pub fn snapshot_name(snapshot_id: &str) -> String {
    let body: String = snapshot_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("differently-{body}")
}

/// The template a snapshot id names (`team/name:tag` → `name`), for `DELETE /templates/{id}`.
fn snapshot_template(backend_ref: &str) -> &str {
    let no_ns = backend_ref.rsplit('/').next().unwrap_or(backend_ref);
    no_ns.split(':').next().unwrap_or(no_ns)
}

crate::kit::from_settings!(E2bAdapter, "e2b", E2bConfig => Settings, |settings, credentials| {
    let api = api::Api::new(&settings, credentials)
        .map_err(|e| crate::kit::client::config_error(e, "apiURL"))?;
    Ok(E2bAdapter {
        settings,
        api,
        targets: Mutex::new(HashMap::new()),
        last_envd: Mutex::new(None),
    })
});

impl E2bAdapter {
    fn state(s: Option<&str>) -> InstanceState {
        match s {
            Some("paused") => InstanceState::Paused,
            // The create answer has no state: it answers once the sandbox runs.
            Some("running") | None => InstanceState::Running,
            Some(_) => InstanceState::Pending,
        }
    }

    /// Keeps the envd target of `s`; refuses an envd version the adapter cannot speak to.
    fn remember(&self, s: &api::Sandbox) -> Result<Target, AdapterError> {
        let version = envd_version::Version::accept(s.envd_version.as_deref())?;
        if s.envd_version
            .as_deref()
            .is_some_and(|v| !v.trim().is_empty())
        {
            // Only a version the backend said (an absent one is assumed, not seen).
            *self.last_envd.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
        }
        let token = s
            .envd_access_token
            .as_deref()
            .and_then(|t| Secret::parse(t).ok());
        let domain = s
            .domain
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(&self.settings.domain);
        let t = Target::new(
            &self.settings.envd,
            &s.sandbox_id,
            domain,
            token,
            &self.settings.user,
            version,
        );
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(s.sandbox_id.clone(), t.clone());
        Ok(t)
    }

    fn forget(&self, id: &str) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// envd of sandbox `id`, from the cache or the control plane (which has its token).
    async fn target(&self, id: &str) -> Result<Target, AdapterError> {
        let cached = self
            .targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        match cached {
            Some(t) => Ok(t),
            None => {
                let s = self.api.get(id).await?;
                self.remember(&s)
            }
        }
    }

    /// What a `502` from the edge in front of envd meant, asked of the control plane.
    async fn explain(&self, id: &str, edge: String) -> AdapterError {
        self.forget(id);
        match self.api.get(id).await {
            Err(AdapterError::NotFound) => AdapterError::NotFound,
            Ok(s) if s.state.as_deref() == Some("paused") => {
                AdapterError::permanent("the E2B sandbox is paused; resume it first".to_owned())
            }
            Ok(_) => AdapterError::transient(edge),
            Err(e) => e,
        }
    }

    async fn failure(&self, id: &str, f: Failure) -> AdapterError {
        match f {
            Failure::Proxy(edge) => self.explain(id, edge).await,
            Failure::Error(e) => {
                if matches!(e, AdapterError::Unavailable(_)) {
                    self.forget(id);
                }
                e
            }
        }
    }

    /// Runs one envd call, once more with a fresh endpoint if it could not connect.
    async fn on_envd<T, F, Fut>(&self, at: &InstanceRef, f: F) -> Result<T, AdapterError>
    where
        F: Fn(Target) -> Fut,
        Fut: std::future::Future<Output = Result<T, Failure>>,
    {
        let t = self.target(&at.backend_ref).await?;
        match f(t).await {
            Ok(v) => Ok(v),
            Err(Failure::Error(AdapterError::Unavailable(_))) => {
                self.forget(&at.backend_ref);
                let t = self.target(&at.backend_ref).await?;
                match f(t).await {
                    Ok(v) => Ok(v),
                    Err(e) => Err(self.failure(&at.backend_ref, e).await),
                }
            }
            Err(e) => Err(self.failure(&at.backend_ref, e).await),
        }
    }

    /// Polls envd's `/health` until it answers.
    async fn wait_ready(&self, id: &str) -> Result<(), AdapterError> {
        let timeout = self.settings.ready_timeout;
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let t = self.target(id).await?;
            let per_try = self.settings.request_timeout.min(Duration::from_secs(10));
            let last = match envd::health(&self.api.http, &t, per_try).await {
                Ok(()) => return Ok(()),
                Err(Failure::Error(e @ AdapterError::Permanent(_))) => return Err(e),
                Err(Failure::Error(e)) => e.to_string(),
                Err(Failure::Proxy(m)) => m,
            };
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "envd did not answer within {} s: {last}",
                    timeout.as_secs()
                )));
            }
            poll.pause().await;
        }
    }

    /// E2B's timeout for a Differently TTL: past ours by a margin, never past the plan's.
    fn backstop(&self, ttl_seconds: u64) -> Result<u64, AdapterError> {
        let max = self.settings.max_timeout_seconds;
        if ttl_seconds > max {
            return Err(AdapterError::invalid_field(
                "ttlSeconds",
                format!(
                    "this E2B pool keeps sandboxes at most {max} s (its plan's limit, maxTimeoutSeconds); ask for a shorter TTL"
                ),
            ));
        }
        Ok(if ttl_seconds == 0 {
            max
        } else {
            (ttl_seconds + BACKSTOP_MARGIN).min(max)
        })
    }

    fn create_body(&self, req: &CreateInstance) -> Result<api::NewSandbox, AdapterError> {
        let s = &self.settings;
        let template = match (&req.from_snapshot, &req.template) {
            (Some(snap), _) => snap.clone(),
            (None, Some(t)) if !t.is_empty() => t.clone(),
            _ => s.template.clone(),
        };
        let mut body = api::NewSandbox {
            template_id: template,
            timeout: self.backstop(req.ttl_seconds)?,
            auto_pause: false,
            secure: true,
            metadata: create_tags(req),
            env_vars: req.env.clone(),
            ..Default::default()
        };
        let mut network = api::Network {
            allow_public_traffic: s.ports == Ports::Public,
            ..Default::default()
        };
        match s.egress {
            Egress::Public => {}
            Egress::None => body.allow_internet_access = Some(false),
            Egress::Allowlist => {
                network.allow_out = s.egress_allow.clone();
                network.deny_out = vec!["0.0.0.0/0".to_owned()];
            }
        }
        body.network = Some(network);
        Ok(body)
    }

    /// The live sandboxes tagged with `id` (normally one).
    async fn lookup(&self, id: &SandboxId) -> Result<Vec<api::Sandbox>, AdapterError> {
        let all = self
            .api
            .list_by_metadata(tags::SANDBOX_TAG, id.as_str())
            .await?;
        Ok(of_sandbox(all, id))
    }

    /// Resumes (or just reaches) a sandbox and waits for envd.
    async fn thaw(&self, id: &str) -> Result<(), AdapterError> {
        let s = self
            .api
            .connect(id, self.settings.max_timeout_seconds)
            .await?;
        self.remember(&s)?;
        self.wait_ready(id).await
    }

    /// Runs `req`, feeding `out`; returns the exit code.
    async fn run(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: &mpsc::Sender<ExecEvent>,
    ) -> Result<i32, AdapterError> {
        let stdin = checked_stdin(req)?;
        let cmd = envd::Command {
            argv: req.command.clone(),
            env: req.env.clone(),
            cwd: req.cwd.clone(),
            stdin,
            deadline: req.timeout(),
            idle: self.settings.stream_idle,
        };
        let mut retried = false;
        loop {
            let t = self.target(&at.backend_ref).await?;
            t.version.check_exec(cmd.stdin.is_some())?;
            match envd::run(&self.api.http, &t, &cmd, out).await {
                Ok(code) => return Ok(code),
                Err(RunError::Started(e)) => return Err(e),
                // envd never took the command: sending it again cannot run it twice.
                Err(RunError::NotStarted(Failure::Error(AdapterError::Unavailable(_))))
                    if !retried =>
                {
                    retried = true;
                    self.forget(&at.backend_ref);
                }
                Err(RunError::NotStarted(f)) => return Err(self.failure(&at.backend_ref, f).await),
            }
        }
    }

    fn require(&self, capability: Capability) -> Result<(), AdapterError> {
        if self.offers(capability) {
            Ok(())
        } else {
            Err(AdapterError::Unsupported(format!(
                "{capability} is not offered by this E2B pool"
            )))
        }
    }
}

impl Tagged for api::Sandbox {
    fn backend_ref(&self) -> &str {
        &self.sandbox_id
    }
    fn tag(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.get(key).map(String::as_str)
    }
    fn state(&self) -> Option<InstanceState> {
        Some(E2bAdapter::state(self.state.as_deref()))
    }
}

#[async_trait]
impl Adapter for E2bAdapter {
    fn kind(&self) -> &'static str {
        "e2b"
    }

    /// envd's version in the sandbox last looked up (`envd 0.5.7`): the control API has no
    /// version of its own, and envd's is what the adapter gates features on.
    fn backend_version(&self) -> Option<String> {
        let v = *self.last_envd.lock().unwrap_or_else(|p| p.into_inner());
        v.map(|v| format!("envd {v}"))
    }

    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = vec![
            Capability::Exec,
            Capability::Files,
            Capability::ExecStream,
            Capability::LifecyclePause,
            Capability::Snapshots,
        ];
        if self.settings.ports == Ports::Public {
            caps.push(Capability::PortsExpose);
        }
        if self.settings.egress != Egress::Public {
            caps.push(Capability::NetworkEgressControl);
        }
        caps
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        // Idempotency: whatever an earlier attempt made carries the sandbox id.
        if let Some(existing) = self.lookup(&req.sandbox_id).await?.first() {
            let id = existing.sandbox_id.clone();
            if existing.state.as_deref() == Some("paused") {
                self.thaw(&id).await?;
            } else {
                self.wait_ready(&id).await?;
            }
            return Ok(req.running(id));
        }
        let body = self.create_body(req)?;
        let created = self.api.create(&body, self.settings.create_timeout).await?;
        let ready = match self.remember(&created) {
            Ok(_) => self.wait_ready(&created.sandbox_id).await,
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            if matches!(e, AdapterError::Permanent(_)) {
                // Of no use to a retry; one still starting is left for the retry to find.
                if let Err(d) = self.api.kill(&created.sandbox_id).await {
                    tracing::warn!(error = %d, "e2b: removing a sandbox that did not start");
                }
            }
            return Err(e);
        }
        Ok(req.running(created.sandbox_id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        // Every sandbox tagged with the id: a create race can leave two.
        for s in self.lookup(sandbox_id).await? {
            self.api.kill(&s.sandbox_id).await?;
            self.forget(&s.sandbox_id);
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(tags::first(&self.lookup(sandbox_id).await?))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let all = self
            .api
            .list_by_metadata(tags::INSTALLATION_TAG, installation.as_str())
            .await?;
        Ok(of_installation(&all, installation))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.api.probe().await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        timed_exit(self.run(at, req, &out)).await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        envd::check_path(path)?;
        // A body stream cannot be sent twice: no reconnecting retry here.
        let t = self.target(&at.backend_ref).await?;
        t.version.check_upload()?;
        let timeout = self.settings.request_timeout.max(Duration::from_secs(300));
        if let Err(f) =
            envd::upload(&self.api.http, &t, &self.settings.user, path, body, timeout).await
        {
            return Err(self.failure(&at.backend_ref, f).await);
        }
        if let Some(mode) = mode {
            // envd's upload takes no mode: set it as a command would.
            let req = ExecRequest {
                command: vec![
                    "chmod".to_owned(),
                    format!("{:o}", mode & 0o7777),
                    "--".to_owned(),
                    path.to_owned(),
                ],
                timeout_seconds: Some(30),
                ..Default::default()
            };
            let r = self.exec(at, &req).await?;
            if r.exit_code != 0 {
                return Err(AdapterError::permanent(format!(
                    "upload: setting mode {:o} failed: {}",
                    mode & 0o7777,
                    r.stderr.trim()
                )));
            }
        }
        Ok(())
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        envd::check_path(path)?;
        let user = self.settings.user.as_str();
        self.on_envd(at, |t| async move {
            envd::download(&self.api.http, &t, user, path, range).await
        })
        .await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        envd::check_path(path)?;
        self.on_envd(at, |t| async move {
            envd::list(&self.api.http, &t, path, depth).await
        })
        .await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        envd::check_path(path)?;
        self.on_envd(at, |t| async move {
            envd::remove(&self.api.http, &t, path).await
        })
        .await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        if !self.api.pause(&at.backend_ref).await? {
            // 409: fine when it is paused already.
            let s = self.api.get(&at.backend_ref).await?;
            if s.state.as_deref() != Some("paused") {
                return Err(AdapterError::permanent(format!(
                    "cannot pause an E2B sandbox that is {}",
                    s.state.as_deref().unwrap_or("in an unknown state")
                )));
            }
        }
        Ok(())
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.thaw(&at.backend_ref).await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        let name = snapshot_name(snapshot_id);
        // Idempotent on Differently's snapshot id, which names the E2B snapshot: a second
        // create with the name would add a build to it, not find it.
        if let Some(s) = self
            .api
            .find_snapshots(&at.backend_ref, &name)
            .await?
            .into_iter()
            .next()
        {
            return Ok(SnapshotInfo {
                backend_ref: s.snapshot_id,
                ready: true,
            });
        }
        let s = self
            .api
            .create_snapshot(&at.backend_ref, &name, self.snapshot_timeout())
            .await?;
        Ok(SnapshotInfo {
            backend_ref: s.snapshot_id,
            ready: true,
        })
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        self.api
            .delete_template(snapshot_template(backend_ref))
            .await
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        _expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        self.require(Capability::PortsExpose)?;
        if port == 0 {
            return Err(AdapterError::invalid_field("port", "port must be 1-65535"));
        }
        let s = self.api.get(&at.backend_ref).await?;
        let domain = s
            .domain
            .as_deref()
            .filter(|d| !d.is_empty())
            .unwrap_or(&self.settings.domain);
        // E2B's sandbox URLs neither expire nor take a signature.
        Ok(Endpoint {
            url: format!("https://{port}-{}.{domain}", s.sandbox_id),
            expires_at: None,
        })
    }

    async fn renew(&self, at: &InstanceRef, ttl: Duration) -> Result<(), AdapterError> {
        let timeout = self.backstop(ttl.as_secs().max(1))?;
        self.api.set_timeout(&at.backend_ref, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_are_lower_case_templates() {
        assert_eq!(snapshot_name("snp_01JABCDEF"), "differently-snp-01jabcdef");
        assert_eq!(
            snapshot_template("team-x/differently-snp-01j:default"),
            "differently-snp-01j"
        );
        assert_eq!(snapshot_template("abc123:default"), "abc123");
    }
}
