//! `RemoteAdapter`: a pool whose backend is a plugin speaking the `/adapter/v1` protocol
//! (HTTP + JSON, exec streamed as NDJSON; see `docs/plugins.md` and
//! `docs/plugin-protocol.yaml`), so a backend written in any language plugs in as a pool of
//! kind `remote`.
//!
//! Each contract method is one route. The bearer token is read through its reference at
//! send time (a rotated token is used without a restart), sent only to the plugin's URL
//! (redirects are never followed) and scrubbed from every message. Capabilities are what
//! the plugin's `GET /info` declares, refreshed on every health probe; a call needing one it
//! did not declare answers `Unsupported` without reaching the plugin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;
use reqwest::Method;

use crate::credentials::{CredentialResolver, Credentials};
use crate::error::Reason;
use crate::exec_output::millis;
use crate::http::{HttpClient, HttpClientBuilder, Secret};
use crate::kit::AdapterConfigError;
use crate::settings::ConfigError;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, SnapshotInfo,
};

mod client;
pub mod config;
pub mod wire;

pub use config::{RemoteConfig, Settings};
use wire::{segment, ExecFrame, FileQuery, Info};

/// Longest NDJSON line accepted from a plugin (a 1 MiB chunk is ~1.4 MB of base64).
const MAX_FRAME: usize = 8 * 1024 * 1024;
/// Longest error body read from a plugin.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// One `remote` pool: a plugin at a URL.
pub struct RemoteAdapter {
    inner: Arc<Inner>,
    /// Whether undeclared capabilities are refused here (always, except for the
    /// conformance kit, which must see what the plugin itself answers).
    gate: bool,
}

/// How often a process that never probes the pool (an API or scheduler process) reads
/// `/info` again, so its capabilities follow the plugin's.
const INFO_STALE_AFTER: Duration = Duration::from_secs(30);

/// The client side, shared with background `/info` reads.
struct Inner {
    settings: Settings,
    http: HttpClient,
    token: CredentialResolver,
    /// Tokens used so far (the current and the one before), scrubbed from every message.
    seen: Mutex<Vec<Secret>>,
    /// The plugin's last `/info`, and when it was read.
    info: RwLock<Option<(Info, Instant)>>,
    /// A background `/info` read is under way.
    refreshing: AtomicBool,
}

impl std::fmt::Debug for RemoteAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAdapter")
            .field("url", &self.inner.settings.base_url)
            .field("token", &self.inner.settings.token.to_string())
            .finish_non_exhaustive()
    }
}

impl crate::kit::FromSettings for RemoteAdapter {
    const KIND: &'static str = "remote";
    type Config = RemoteConfig;

    fn from_config(config: RemoteConfig, credentials: &Credentials) -> Result<Self, ConfigError> {
        Self::from_settings(config.validate()?, credentials)
    }
}

impl RemoteAdapter {
    /// Validates `config` and builds the adapter; nothing is sent until the first call.
    pub fn new(
        config: &RemoteConfig,
        credentials: &Credentials,
    ) -> Result<RemoteAdapter, AdapterConfigError> {
        let settings = config.validate().map_err(|e| e.for_kind("remote"))?;
        Self::from_settings(settings, credentials).map_err(|e| e.for_kind("remote"))
    }

    /// Builds the adapter from validated settings.
    pub fn from_settings(
        settings: Settings,
        credentials: &Credentials,
    ) -> Result<RemoteAdapter, ConfigError> {
        let http = HttpClientBuilder::new("plugin", settings.base_url.clone())
            .connect_timeout(settings.connect_timeout)
            .request_timeout(settings.request_timeout)
            .ca_bundle(settings.ca_bundle.clone())
            .retries(2, Duration::from_millis(200))
            .build(credentials)
            .map_err(|e| crate::kit::client::config_error(e, "url"))?;
        let adapter = RemoteAdapter {
            inner: Arc::new(Inner {
                token: credentials.resolver(settings.token.clone()),
                settings,
                http,
                seen: Mutex::new(Vec::new()),
                info: RwLock::new(None),
                refreshing: AtomicBool::new(false),
            }),
            gate: true,
        };
        // Processes that never probe the pool learn its capabilities without waiting for a
        // call; without a runtime (a settings check) nothing is sent.
        adapter.refresh_in_background();
        Ok(adapter)
    }

    /// Reads `/info` in a background task if none is under way and a runtime is there.
    fn refresh_in_background(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.clone();
        rt.spawn(async move {
            if let Err(e) = inner.refresh_info().await {
                tracing::debug!(error = %e, "plugin info not read");
            }
            inner.refreshing.store(false, Ordering::Release);
        });
    }

    /// The same adapter passing every call to the plugin whatever it declared: the
    /// conformance kit checks that the plugin itself refuses what it does not declare.
    pub fn ungated(mut self) -> RemoteAdapter {
        self.gate = false;
        self
    }

    /// The plugin's `/info` as last read, if it was.
    pub fn info(&self) -> Option<Info> {
        self.inner.info()
    }

    /// Reads `/info` now, checks the protocol and version, and keeps it (capabilities
    /// change with it).
    pub async fn refresh_info(&self) -> Result<Info, AdapterError> {
        self.inner.refresh_info().await
    }

    async fn ensure_info(&self) -> Result<(), AdapterError> {
        if self.info().is_none() {
            self.refresh_info().await?;
        }
        Ok(())
    }

    /// `Unsupported` unless the plugin declared `capability` (ungated: always fine).
    async fn require(&self, capability: Capability) -> Result<(), AdapterError> {
        if !self.gate {
            return Ok(());
        }
        self.ensure_info().await?;
        if self.offers(capability) {
            Ok(())
        } else {
            Err(AdapterError::Unsupported(capability.name().to_owned()))
        }
    }
}

/// The declared capabilities the protocol can carry, in order; names this build does not
/// know are left out.
fn ordered(declared: &[String]) -> Vec<Capability> {
    let mut out: Vec<Capability> = declared
        .iter()
        .filter(|d| wire::PROTOCOL_CAPABILITIES.contains(&d.as_str()))
        .filter_map(|d| Capability::parse(d))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[async_trait]
impl Adapter for RemoteAdapter {
    fn kind(&self) -> &'static str {
        "remote"
    }

    /// What the plugin's last `/info` declared (none before the first probe reached it).
    fn capabilities(&self) -> Vec<Capability> {
        if self
            .inner
            .info_age()
            .is_none_or(|age| age > INFO_STALE_AFTER)
        {
            self.refresh_in_background();
        }
        self.info()
            .map(|i| ordered(&i.capabilities))
            .unwrap_or_default()
    }

    fn snapshot_timeout(&self) -> Duration {
        self.info()
            .and_then(|i| i.snapshot_timeout_seconds)
            .map_or(crate::DEFAULT_SNAPSHOT_TIMEOUT, Duration::from_secs)
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        let op = "plugin create";
        self.ensure_info().await?;
        let rb = self
            .inner
            .http
            .api(Method::PUT, &Inner::instance_path(&req.sandbox_id))
            .timeout(self.inner.settings.create_timeout)
            .json(req);
        let got = self.inner.json(rb, op).await?;
        self.inner.checked(op, &req.sandbox_id, got)
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        let rb = self
            .inner
            .http
            .api(Method::DELETE, &Inner::instance_path(sandbox_id))
            .timeout(self.inner.settings.create_timeout);
        match self.inner.empty(rb, "plugin delete").await {
            Err(AdapterError::NotFound) => Ok(()),
            r => r,
        }
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        let op = "plugin find";
        let rb = self
            .inner
            .http
            .api(Method::GET, &Inner::instance_path(sandbox_id));
        match self.inner.json(rb, op).await {
            Ok(i) => self.inner.checked(op, sandbox_id, i).map(Some),
            Err(AdapterError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let rb = self
            .inner
            .http
            .api(Method::GET, "/instances")
            .query(&wire::ListQuery {
                installation_id: installation.to_string(),
            });
        let list: wire::InstanceList = self.inner.json(rb, "plugin list").await?;
        Ok(list.instances)
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.require(Capability::Exec).await?;
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, "/exec"))
            .query(&Inner::at_query(at))
            .timeout(req.timeout() + self.inner.settings.exec_grace)
            .json(req);
        self.inner.json(rb, "plugin exec").await
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.refresh_info().await?;
        self.inner
            .empty(self.inner.http.api(Method::GET, "/health"), "plugin health")
            .await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        let op = "plugin exec stream";
        self.require(Capability::ExecStream).await?;
        let started = Instant::now();
        let url = format!(
            "{}{}",
            self.inner.settings.base_url,
            Inner::at_path(at, "/exec/stream")
        );
        let rb = self
            .inner
            .http
            .to(Method::POST, &url)
            .query(&Inner::at_query(at))
            .json(req);
        let resp = self.inner.send_ok(rb, op).await?;
        let mut body = resp.bytes_stream();
        let mut buf = BytesMut::new();
        loop {
            // A frame per line; whatever is complete is handled before reading more.
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line = buf.split_to(nl + 1);
                let line = &line[..nl];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let frame: ExecFrame = serde_json::from_slice(line).map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(
                        format!("{op}: the plugin sent a frame that is not one: {e}"),
                        e,
                    ))
                })?;
                let (stderr, data) = match frame {
                    ExecFrame::Exit {
                        exit_code,
                        duration_ms,
                    } => {
                        return Ok(ExecExit {
                            exit_code,
                            duration_ms,
                        })
                    }
                    ExecFrame::Error { error } => {
                        return Err(self.inner.scrub_error(error.into_error(op)))
                    }
                    ExecFrame::Stdout { data } => (false, data),
                    ExecFrame::Stderr { data } => (true, data),
                };
                let bytes = wire::decode_output(&data).map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(
                        format!("{op}: output that is not base64: {e}"),
                        e,
                    ))
                })?;
                let ev = if stderr {
                    ExecEvent::Stderr(Bytes::from(bytes))
                } else {
                    ExecEvent::Stdout(Bytes::from(bytes))
                };
                if out.send(ev).await.is_err() {
                    // The reader went away: dropping the answer hangs up, which cancels the
                    // command on the plugin.
                    return Ok(ExecExit {
                        exit_code: 128 + 9,
                        duration_ms: millis(started.elapsed()),
                    });
                }
            }
            if buf.len() > MAX_FRAME {
                return Err(AdapterError::transient(format!(
                    "{op}: a frame longer than {MAX_FRAME} bytes"
                )));
            }
            let chunk = tokio::select! {
                c = self.inner.next_chunk(&mut body, op) => c?,
                _ = out.closed() => {
                    return Ok(ExecExit {
                        exit_code: 128 + 9,
                        duration_ms: millis(started.elapsed()),
                    });
                }
            };
            match chunk {
                Some(c) => buf.extend_from_slice(&c),
                None => {
                    return Err(AdapterError::transient(format!(
                        "{op}: the stream ended without an exit frame"
                    )))
                }
            }
        }
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        self.require(Capability::Files).await?;
        let url = format!(
            "{}{}",
            self.inner.settings.base_url,
            Inner::at_path(at, "/files")
        );
        let rb = self
            .inner
            .http
            .to(Method::PUT, &url)
            .query(&FileQuery {
                backend_ref: at.backend_ref.clone(),
                path: path.to_owned(),
                mode,
                depth: None,
            })
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(body));
        self.inner.empty(rb, "plugin upload").await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        let op = "plugin download";
        self.require(Capability::Files).await?;
        let url = format!(
            "{}{}",
            self.inner.settings.base_url,
            Inner::at_path(at, "/files")
        );
        let mut rb = self.inner.http.to(Method::GET, &url).query(&FileQuery {
            backend_ref: at.backend_ref.clone(),
            path: path.to_owned(),
            mode: None,
            depth: None,
        });
        if let Some(r) = range {
            let end = r.end.map(|e| e.to_string()).unwrap_or_default();
            rb = rb.header(reqwest::header::RANGE, format!("bytes={}-{end}", r.start));
        }
        let resp = self.inner.send_ok(rb, op).await?;
        let total_size = resp
            .headers()
            .get(wire::TOTAL_SIZE_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let idle = self.inner.settings.stream_idle;
        let body = resp.bytes_stream();
        let stream = futures::stream::unfold(Some(body), move |state| async move {
            let mut body = state?;
            match tokio::time::timeout(idle, body.next()).await {
                Err(_) => Some((
                    Err(AdapterError::transient(format!(
                        "{op}: the plugin sent nothing for {} s",
                        idle.as_secs()
                    ))),
                    None,
                )),
                Ok(None) => None,
                Ok(Some(Ok(b))) => Some((Ok(b), Some(body))),
                Ok(Some(Err(e))) => Some((
                    Err(AdapterError::Transient(Reason::caused_by(
                        format!("{op}: the body broke off: {e}"),
                        e,
                    ))),
                    None,
                )),
            }
        });
        Ok(Download {
            total_size,
            body: stream.boxed(),
        })
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        self.require(Capability::Files).await?;
        let rb = self
            .inner
            .http
            .api(Method::GET, &Inner::at_path(at, "/files/list"))
            .query(&FileQuery {
                backend_ref: at.backend_ref.clone(),
                path: path.to_owned(),
                mode: None,
                depth: Some(depth),
            });
        let list: wire::FileList = self.inner.json(rb, "plugin list files").await?;
        Ok(list.entries)
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        self.require(Capability::Files).await?;
        let rb = self
            .inner
            .http
            .api(Method::DELETE, &Inner::at_path(at, "/files"))
            .query(&FileQuery {
                backend_ref: at.backend_ref.clone(),
                path: path.to_owned(),
                mode: None,
                depth: None,
            });
        self.inner.empty(rb, "plugin delete file").await
    }

    /// `POST …/files/directories`; a plugin older than that route (`unsupported_operation`,
    /// or a bare 404 or 405) gets the `mkdir` through its exec instead, as any backend would.
    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        const OP: &str = "plugin make directory";
        self.require(Capability::Files).await?;
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, "/files/directories"))
            .query(&FileQuery {
                backend_ref: at.backend_ref.clone(),
                path: path.to_owned(),
                mode,
                depth: None,
            });
        let resp = self.inner.send(rb, OP).await?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| {
            self.inner
                .scrub_error(self.inner.http.transport_error(OP, e))
        })?;
        if status.is_success() {
            let made: wire::MadeDir = crate::http::decode_answer(&body, OP, "the plugin")?;
            return Ok(made.created);
        }
        // The protocol's answer for a route a plugin does not have, or a bare 404/405 from
        // one that does not follow it there.
        let older = match serde_json::from_slice::<wire::ErrorBody>(&body) {
            Ok(b) => b.code == wire::ErrorCode::UnsupportedOperation,
            Err(_) => matches!(status.as_u16(), 404 | 405),
        };
        if older {
            return crate::files::make_dir_by_exec(self, at, path, mode).await;
        }
        Err(self.inner.error_of_body(OP, status, &body))
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.lifecycle(at, Capability::LifecyclePause, "pause")
            .await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.lifecycle(at, Capability::LifecyclePause, "resume")
            .await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.lifecycle(at, Capability::LifecycleStop, "stop").await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.lifecycle(at, Capability::LifecycleStop, "start").await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        self.require(Capability::Snapshots).await?;
        let rb = self
            .inner
            .http
            .api(
                Method::PUT,
                &Inner::at_path(at, &format!("/snapshots/{}", segment(snapshot_id))),
            )
            .query(&Inner::at_query(at))
            .timeout(self.inner.settings.create_timeout);
        self.inner.json(rb, "plugin snapshot").await
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        self.require(Capability::Snapshots).await?;
        let rb = self.inner.http.api(
            Method::DELETE,
            &format!("/snapshots/{}", segment(backend_ref)),
        );
        match self.inner.empty(rb, "plugin delete snapshot").await {
            Err(AdapterError::NotFound) => Ok(()),
            r => r,
        }
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        self.require(Capability::PortsExpose).await?;
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, &format!("/ports/{port}")))
            .query(&Inner::at_query(at))
            .json(&wire::ExposeBody {
                expires_seconds: expires.map(|d| d.as_secs().max(1)),
            });
        self.inner.json(rb, "plugin expose port").await
    }

    async fn renew(&self, at: &InstanceRef, ttl: Duration) -> Result<(), AdapterError> {
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, "/renew"))
            .query(&Inner::at_query(at))
            .json(&wire::RenewBody {
                ttl_seconds: ttl.as_secs(),
            });
        match self.inner.empty(rb, "plugin renew").await {
            // A plugin without a backend-side backstop has nothing to move.
            Err(AdapterError::Unsupported(_)) => Ok(()),
            r => r,
        }
    }

    /// A plugin that declares `warm` gets the claim call (`POST …/claim`); one that has
    /// nothing to do on a claim answers 204 or `unsupported_operation`, which is then a
    /// renew to the tenant's TTL (what a claim means for a backend with an expiry).
    fn claim_call(&self) -> bool {
        self.offers(Capability::Warm)
    }

    async fn claim(&self, at: &InstanceRef, ttl_seconds: u64) -> Result<(), AdapterError> {
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, "/claim"))
            .query(&Inner::at_query(at))
            .json(&wire::RenewBody { ttl_seconds });
        match self.inner.empty(rb, "plugin claim").await {
            Err(AdapterError::Unsupported(_)) => {
                self.renew(at, Duration::from_secs(ttl_seconds)).await
            }
            r => r,
        }
    }
}

impl RemoteAdapter {
    async fn lifecycle(
        &self,
        at: &InstanceRef,
        capability: Capability,
        verb: &str,
    ) -> Result<(), AdapterError> {
        self.require(capability).await?;
        let rb = self
            .inner
            .http
            .api(Method::POST, &Inner::at_path(at, &format!("/{verb}")))
            .query(&Inner::at_query(at))
            .timeout(self.inner.settings.create_timeout);
        self.inner.empty(rb, &format!("plugin {verb}")).await
    }
}
