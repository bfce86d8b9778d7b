//! `OpenSandboxAdapter`: sandboxes on an OpenSandbox server (the default private backend).
//!
//! The lifecycle API (`config::Settings::api_url`) creates, finds, pauses and deletes
//! sandboxes; execd inside each sandbox runs commands and moves files, reached through the
//! server's proxy or directly. Every sandbox carries Differently's sandbox and installation ids
//! in OpenSandbox metadata, which is how `create` stays idempotent and `list` finds orphans.
//!
//! The server's API key, read through its reference (env, file or stored secret) at call
//! time, goes only to the server (its proxy included): never to execd reached
//! directly, never into an error, an event or a port URL. See `docs/opensandbox.md`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::exec_output::{millis, timed_exit};
use crate::go_ahead::GoAhead;
use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, InstanceState, PtyInput, PtyRequest,
    SnapshotInfo,
};

mod client;
pub mod config;
mod create;
mod exec;
mod execd;
mod execd_errors;
mod files;
mod lifecycle;
mod pty;
mod versions;

pub use crate::settings::ConfigError;
use config::{ExecdPath, Ports, Runtime};
pub use config::{OpenSandboxConfig, Settings};
use exec::{Channel, Collect};
/// execd's event-stream parser, public for the fuzzers (`fuzz/`): it reads bytes a backend
/// sends, so it must never panic on any of them.
pub use execd::{Event as ExecdEvent, EventError as ExecdEventError, FrameError, FrameParser};
use execd::{Target, EXECD_PORT};
use lifecycle::{EndpointMode, META_INSTALLATION, META_SANDBOX};

/// How long after Differently's own expiry the backend backstop fires on renew.
const BACKSTOP_MARGIN: Duration = Duration::from_secs(300);
/// What an image sandbox runs as its entry process (execd is started before it).
const ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];

/// One OpenSandbox pool.
pub struct OpenSandboxAdapter {
    settings: Settings,
    client: client::Client,
    /// Resolved execd endpoints per backend ref; dropped when a call cannot connect.
    targets: Mutex<HashMap<String, Target>>,
    /// The server's version (`GET /version`), asked once and again after an outage.
    version: versions::Detector,
}

crate::kit::from_settings!(OpenSandboxAdapter, "opensandbox", OpenSandboxConfig => Settings, |settings, credentials| {
    let client = client::Client::new(&settings, credentials).map_err(|e| ConfigError {
        field: "apiURL".to_owned(),
        message: AdapterError::permanent(e.to_string()).to_string(),
    })?;
    Ok(Self {
        settings,
        client,
        targets: Mutex::new(HashMap::new()),
        version: versions::Detector::default(),
    })
});

impl OpenSandboxAdapter {
    /// What the server's version changes (asked once; see `versions.rs`).
    async fn behaviour(&self) -> versions::Behaviour {
        self.version
            .get(&self.client, &self.settings.api_url)
            .await
            .behaviour()
    }

    /// Passes `res` on, forgetting the server's version after an error that suggests it
    /// changed (see [`versions::Detector::note`]).
    fn noting<T>(&self, res: Result<T, AdapterError>) -> Result<T, AdapterError> {
        if let Err(e) = &res {
            self.version.note(e);
        }
        res
    }

    fn require(&self, capability: Capability) -> Result<(), AdapterError> {
        if self.settings.capabilities.contains(&capability) {
            Ok(())
        } else {
            Err(AdapterError::Unsupported(format!(
                "{capability} is not offered by this OpenSandbox pool ({:?} runtime)",
                self.settings.runtime
            )))
        }
    }

    /// OpenSandbox state → ours; `None` for sandboxes that are gone or going.
    fn state(&self, s: &str) -> Option<InstanceState> {
        Some(match s {
            "Running" => InstanceState::Running,
            "Pausing" | "Paused" if self.settings.runtime == Runtime::Kubernetes => {
                InstanceState::Stopped
            }
            "Pausing" | "Paused" => InstanceState::Paused,
            "Failed" => InstanceState::Failed,
            "Stopping" | "Terminated" => return None,
            // Pending, Resuming, Unknown and states added later.
            _ => InstanceState::Pending,
        })
    }

    fn instance(&self, s: &lifecycle::Sandbox) -> Option<Instance> {
        let sandbox_id = SandboxId::parse(s.metadata.get(META_SANDBOX)?).ok()?;
        Some(Instance {
            backend_ref: s.id.clone(),
            sandbox_id,
            state: self.state(&s.status.state)?,
        })
    }

    /// The live OpenSandbox sandboxes tagged with `id` (normally one).
    async fn lookup(&self, id: &SandboxId) -> Result<Vec<lifecycle::Sandbox>, AdapterError> {
        let all = lifecycle::list_by_metadata(&self.client, META_SANDBOX, id.as_str()).await?;
        Ok(all
            .into_iter()
            .filter(|s| self.state(&s.status.state).is_some())
            .collect())
    }

    /// Polls until the sandbox is in `want`; `Failed` (or disappearing) ends the wait.
    async fn wait_state(
        &self,
        backend_ref: &str,
        want: &str,
        timeout: Duration,
        image: Option<&str>,
    ) -> Result<(), AdapterError> {
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let sbx = lifecycle::get(&self.client, backend_ref).await?;
            let st = &sbx.status;
            if st.state == want {
                return Ok(());
            }
            if matches!(st.state.as_str(), "Failed" | "Terminated" | "Stopping") {
                let reason = st.reason.clone().unwrap_or_default();
                let message = st.message.clone().unwrap_or_default();
                if let Some(image) = image {
                    if let Some(e) = lifecycle::image_failure(image, &reason, &message) {
                        return Err(e);
                    }
                }
                return Err(AdapterError::permanent(format!(
                    "sandbox is {} ({reason}): {message}",
                    st.state
                )));
            }
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "sandbox still {} after {} s (waiting for {want})",
                    st.state,
                    timeout.as_secs()
                )));
            }
            poll.pause().await;
        }
    }

    /// Resolves execd's endpoint (through the server proxy unless configured otherwise).
    async fn target(&self, backend_ref: &str) -> Result<Target, AdapterError> {
        if let Some(t) = self.cached(backend_ref) {
            return Ok(t);
        }
        let direct = match self.settings.execd_path {
            ExecdPath::ServerProxy => false,
            ExecdPath::Direct => true,
            ExecdPath::ByVersion => self.behaviour().await.direct_execd_by_default,
        };
        let mode = if direct {
            EndpointMode::Direct
        } else {
            EndpointMode::ServerProxy
        };
        let ans =
            self.noting(lifecycle::endpoint(&self.client, backend_ref, EXECD_PORT, mode).await)?;
        // Plain HTTP to execd, whatever the API's scheme (docs/opensandbox.md).
        let scheme = "http";
        let base = with_scheme(&ans.endpoint, scheme);
        let mut headers = ans.headers.unwrap_or_default();
        headers.retain(|k, _| !k.eq_ignore_ascii_case(client::API_KEY_HEADER));
        let t = Target {
            base: base.trim_end_matches('/').to_owned(),
            headers,
        };
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(backend_ref.to_owned(), t.clone());
        Ok(t)
    }

    fn cached(&self, backend_ref: &str) -> Option<Target> {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(backend_ref)
            .cloned()
    }

    fn forget(&self, backend_ref: &str) {
        self.targets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(backend_ref);
    }

    /// Waits for execd to answer `/ping`.
    async fn wait_execd(&self, backend_ref: &str, timeout: Duration) -> Result<(), AdapterError> {
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let res = match self.target(backend_ref).await {
                Ok(t) => execd::ping(&self.client, &t).await,
                Err(e) => Err(e),
            };
            match res {
                Ok(()) => return Ok(()),
                Err(e @ AdapterError::Permanent(_)) if !execd::token_refused(&e) => return Err(e),
                Err(e) => {
                    self.forget(backend_ref);
                    if poll.expired() {
                        return Err(AdapterError::transient(format!(
                            "execd did not answer within {} s: {e}",
                            timeout.as_secs()
                        )));
                    }
                }
            }
            poll.pause().await;
        }
    }

    /// Running and execd answering, then (Fast Sandbox) the guest clock set.
    async fn ready(&self, backend_ref: &str, image: Option<&str>) -> Result<(), AdapterError> {
        let timeout = self.settings.ready_timeout;
        let started = Instant::now();
        self.wait_state(backend_ref, "Running", timeout, image)
            .await?;
        self.wait_execd(backend_ref, timeout.saturating_sub(started.elapsed()))
            .await?;
        if self.settings.runtime == Runtime::Fastsandbox {
            self.set_clock(backend_ref).await;
        }
        Ok(())
    }

    /// OpenSandbox's pause (memory kept on Docker and Fast Sandbox; disk committed on Kubernetes).
    async fn freeze(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let accepted = lifecycle::transition(&self.client, &at.backend_ref, "pause").await?;
        if !accepted {
            // 409: fine if it is already paused or pausing.
            let sbx = lifecycle::get(&self.client, &at.backend_ref).await?;
            if !matches!(sbx.status.state.as_str(), "Paused" | "Pausing") {
                return Err(AdapterError::permanent(format!(
                    "cannot pause a sandbox that is {}",
                    sbx.status.state
                )));
            }
        }
        self.forget(&at.backend_ref);
        self.wait_state(
            &at.backend_ref,
            "Paused",
            self.settings.checkpoint_timeout,
            None,
        )
        .await
    }

    async fn thaw(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let accepted = lifecycle::transition(&self.client, &at.backend_ref, "resume").await?;
        if !accepted {
            let sbx = lifecycle::get(&self.client, &at.backend_ref).await?;
            if !matches!(sbx.status.state.as_str(), "Running" | "Resuming") {
                return Err(AdapterError::permanent(format!(
                    "cannot resume a sandbox that is {}",
                    sbx.status.state
                )));
            }
        }
        self.forget(&at.backend_ref);
        let timeout = self
            .settings
            .checkpoint_timeout
            .max(self.settings.ready_timeout);
        self.wait_state(&at.backend_ref, "Running", timeout, None)
            .await?;
        self.wait_execd(&at.backend_ref, self.settings.ready_timeout)
            .await?;
        if self.settings.runtime == Runtime::Fastsandbox {
            self.set_clock(&at.backend_ref).await;
        }
        Ok(())
    }
}

fn with_scheme(endpoint: &str, scheme: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("{scheme}://{endpoint}")
    }
}

#[async_trait]
impl Adapter for OpenSandboxAdapter {
    fn kind(&self) -> &'static str {
        "opensandbox"
    }

    fn snapshot_timeout(&self) -> Duration {
        self.settings.checkpoint_timeout
    }

    /// execd sends output as JSON text events, so bytes that are not UTF-8 cannot arrive
    /// exact; execd 1.1 (`lineEndings: stripped`) sends one event per line without its
    /// terminator, which the adapter puts back, so a final fragment gains a newline.
    fn exec_fidelity(&self) -> crate::ExecFidelity {
        crate::ExecFidelity {
            binary_output: false,
            buffered_stderr: true,
            exact_line_endings: self.settings.line_endings == config::LineEndings::Kept,
        }
    }

    /// What `GET /version` last answered (asked at the first call that needs it).
    fn backend_version(&self) -> Option<String> {
        self.version.said()
    }

    /// By the detected version and the runtime (`versions::verification`).
    fn verification(&self) -> crate::Verification {
        let docker = self.settings.runtime == config::Runtime::Docker;
        versions::verification(self.version.said().as_deref(), docker)
    }

    /// The runtime's capabilities, and `warm` on every runtime: an instance created with no
    /// env and tagged with its id is an ordinary sandbox whose expiry [`Adapter::claim`]
    /// moves to the tenant's TTL.
    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = self.settings.capabilities.clone();
        caps.push(Capability::Warm);
        caps
    }

    /// A warm instance was created with the warm class's expiry (its max age); the claimer's
    /// TTL must replace it before the sandbox runs, or the backend would end it early.
    fn claim_call(&self) -> bool {
        true
    }

    async fn claim(&self, at: &InstanceRef, ttl_seconds: u64) -> Result<(), AdapterError> {
        self.renew(at, Duration::from_secs(ttl_seconds)).await
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        let image = self.image_for(req);
        // Idempotency: the sandbox id is in the metadata of whatever an earlier call made.
        for existing in self.lookup(&req.sandbox_id).await? {
            if existing.status.state == "Failed" {
                // A failed earlier attempt: clear it so this one can succeed.
                lifecycle::delete(&self.client, &existing.id).await?;
                continue;
            }
            let mut inst = self
                .instance(&existing)
                .ok_or_else(|| AdapterError::transient("sandbox found but not usable"))?;
            if inst.state == InstanceState::Pending {
                self.ready(&existing.id, Some(&image)).await?;
                inst.state = InstanceState::Running;
            }
            return Ok(inst);
        }
        let body = self.create_body(req)?;
        let behaviour = self.behaviour().await;
        let created = self.noting(
            lifecycle::create(
                &self.client,
                &body,
                &image,
                self.settings.create_timeout,
                &behaviour,
            )
            .await,
        )?;
        if let Err(e) = self.ready(&created.id, Some(&image)).await {
            // A sandbox that failed to start is of no use to a retry: remove it. One still
            // starting is left for the retry to find and wait on.
            let failed = match lifecycle::get(&self.client, &created.id).await {
                Ok(s) => s.status.state == "Failed",
                Err(_) => matches!(e, AdapterError::Permanent(_)),
            };
            if failed {
                if let Err(d) = lifecycle::delete(&self.client, &created.id).await {
                    tracing::warn!(error = %d, "cleaning up a failed sandbox");
                }
            }
            return Err(e);
        }
        Ok(req.running(created.id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        // Every instance tagged with the id: a create race can leave two.
        for sbx in self.lookup(sandbox_id).await? {
            lifecycle::delete(&self.client, &sbx.id).await?;
            self.forget(&sbx.id);
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        let found = self.lookup(sandbox_id).await?;
        Ok(found.iter().find_map(|s| self.instance(s)))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let all =
            lifecycle::list_by_metadata(&self.client, META_INSTALLATION, installation.as_str())
                .await?;
        let mut out: Vec<Instance> = all.iter().filter_map(|s| self.instance(s)).collect();
        out.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        Ok(out)
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.require(Capability::Exec)?;
        let started = Instant::now();
        let mut sink = Collect::default();
        let exit_code = self.run(at, req, &mut sink, None).await?;
        Ok(sink.0.into_result(exit_code, millis(started.elapsed())))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.noting(lifecycle::probe(&self.client).await)?;
        // Learn the version with the first good probe, so operators see it before any
        // sandbox is made (asked once; see `versions.rs`).
        self.behaviour().await;
        Ok(())
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        self.require(Capability::ExecStream)?;
        timed_exit(self.run(at, req, &mut Channel(out), None)).await
    }

    async fn exec_stream_after(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
        go: GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        self.require(Capability::ExecStream)?;
        timed_exit(self.run(at, req, &mut Channel(out), Some(&go))).await
    }

    async fn pty(
        &self,
        at: &InstanceRef,
        req: &PtyRequest,
        input: tokio::sync::mpsc::Receiver<PtyInput>,
        out: tokio::sync::mpsc::Sender<bytes::Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        self.require(Capability::ExecPty)?;
        timed_exit(async {
            let target = self.target(&at.backend_ref).await?;
            let res = pty::run(&self.client, &target, req, input, out).await;
            if matches!(res, Err(AdapterError::Unavailable(_))) {
                self.forget(&at.backend_ref);
            }
            res
        })
        .await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        self.require(Capability::Files)?;
        let target = self.target(&at.backend_ref).await?;
        let res = files::upload(&self.client, &target, path, mode, body).await;
        if matches!(&res, Err(e) if matches!(e, AdapterError::Unavailable(_)) || execd::token_refused(e))
        {
            // The body is spent: the caller's retry resolves the endpoint (and token) anew.
            self.forget(&at.backend_ref);
        }
        res
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        self.require(Capability::Files)?;
        self.on_execd(at, |t| async move {
            files::download(&self.client, &t, path, range).await
        })
        .await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        self.require(Capability::Files)?;
        self.on_execd(at, |t| async move {
            files::list(&self.client, &t, path, depth).await
        })
        .await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        self.require(Capability::Files)?;
        self.on_execd(at, |t| async move {
            files::delete(&self.client, &t, path).await
        })
        .await
    }

    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        self.require(Capability::Files)?;
        self.on_execd(at, |t| async move {
            files::make_dir(&self.client, &t, path, mode).await
        })
        .await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.require(Capability::LifecyclePause)?;
        self.freeze(at).await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.require(Capability::LifecyclePause)?;
        self.thaw(at).await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.require(Capability::LifecycleStop)?;
        self.freeze(at).await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.require(Capability::LifecycleStop)?;
        self.thaw(at).await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        self.require(Capability::Snapshots)?;
        // Idempotent on Differently's snapshot id, which is the OpenSandbox snapshot's name.
        for snap in lifecycle::list_snapshots(&self.client, &at.backend_ref).await? {
            if snap.name.as_deref() != Some(snapshot_id) {
                continue;
            }
            match snap.status.state.as_str() {
                "Failed" => {
                    // Clear the failed one; a new attempt follows.
                    lifecycle::delete_snapshot(&self.client, &snap.id).await?;
                }
                "Deleting" => {}
                state => {
                    return Ok(SnapshotInfo {
                        ready: state == "Ready",
                        backend_ref: snap.id,
                    })
                }
            }
        }
        let behaviour = self.behaviour().await;
        // Fast Sandbox checkpoints memory too; a disk snapshot is all `snapshots` promises,
        // and 1.3 offers one that is smaller and faster to restore.
        let mode = (behaviour.rootfs_only_snapshots
            && self.settings.runtime == Runtime::Fastsandbox)
            .then_some("rootfsOnly");
        let snap = self.noting(
            lifecycle::create_snapshot(
                &self.client,
                &at.backend_ref,
                snapshot_id,
                mode,
                &behaviour,
            )
            .await,
        )?;
        if snap.status.state == "Failed" {
            return Err(AdapterError::permanent(format!(
                "snapshot failed: {}",
                snap.status.message.unwrap_or_default()
            )));
        }
        Ok(SnapshotInfo {
            ready: snap.status.state == "Ready",
            backend_ref: snap.id,
        })
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        self.require(Capability::Snapshots)?;
        lifecycle::delete_snapshot(&self.client, backend_ref)
            .await
            .map(drop)
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        self.require(Capability::PortsExpose)?;
        if port == 0 {
            return Err(AdapterError::permanent("port must be 1-65535"));
        }
        let (mode, expires_at) = match self.settings.ports {
            Ports::Signed => {
                let life = expires.unwrap_or(Duration::from_secs(self.settings.port_url_seconds));
                let at = chrono::Utc::now()
                    + chrono::Duration::from_std(life).unwrap_or(chrono::Duration::hours(1));
                (
                    EndpointMode::Signed {
                        expires_epoch: at.timestamp(),
                    },
                    Some(at),
                )
            }
            Ports::None => (EndpointMode::Direct, None),
        };
        let ans = lifecycle::endpoint(&self.client, &at.backend_ref, port, mode).await?;
        if ans.headers.as_ref().is_some_and(|h| !h.is_empty()) {
            return Err(AdapterError::permanent(
                "this endpoint needs request headers, which would hand out a credential; refused"
                    .to_owned(),
            ));
        }
        let scheme = match self.settings.port_scheme {
            config::PortScheme::Http => "http",
            config::PortScheme::Https => "https",
        };
        let url = with_scheme(&ans.endpoint, scheme);
        if self.client.is_server(&url) || self.client.is_server(&with_scheme(&ans.endpoint, "http"))
        {
            return Err(AdapterError::permanent(
                "this endpoint is the OpenSandbox server's own proxy, which takes the server's API key; refused"
                    .to_owned(),
            ));
        }
        Ok(Endpoint { url, expires_at })
    }

    async fn renew(&self, at: &InstanceRef, ttl: Duration) -> Result<(), AdapterError> {
        let until = ttl + BACKSTOP_MARGIN;
        let expires_at = chrono::Utc::now()
            + chrono::Duration::from_std(until).unwrap_or(chrono::Duration::days(30));
        lifecycle::renew(&self.client, &at.backend_ref, expires_at).await
    }
}
