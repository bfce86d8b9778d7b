//! `RunloopAdapter`: sandboxes as Runloop devboxes, always an external pool (third-party
//! infrastructure; the registry forces `trust: external`).
//!
//! Every devbox carries Differently's sandbox and installation ids as Runloop metadata. The
//! list call filters by one status and not by metadata, and shut-down devboxes stay listed,
//! so lookups list each live status side by side and match the metadata here; a create looks
//! its sandbox up first, and after creating looks again: two creates that raced keep the
//! older devbox and shut the newer down. Commands run through `execute_async`, their output
//! read from the two server-sent-event tails as it comes; files move through the upload and
//! download calls, and what the API has no call for (listing, delete, directories, modes) is
//! a short script on the devbox. Suspend and resume keep the disk but not the processes, so
//! they are `lifecycle.stop`; disk snapshots restore into new devboxes; an open tunnel gives
//! a port's URL.
//!
//! The API key, read through its reference at call time, goes only to the configured API
//! origin as a bearer token; never into an error, an event or a URL.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::exec_output::{check_command, stdin_of, timed_exit};
use crate::files::cut_to_range;
use crate::http::HttpClient;
use crate::kit::errors::{ErrorAnswer, Statuses};
use crate::kit::paths::check_path;
use crate::kit::tags::{self, create_tags, instance, of_installation, of_sandbox};
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, ExecFidelity, FileEntry, Instance, InstanceRef, InstanceState,
    SnapshotInfo,
};

mod api;
pub mod config;
mod exec;
mod files;
mod launch;
mod script;
mod sse;

pub use config::{RunloopConfig, Settings};

/// Metadata key carrying Differently's snapshot id on a disk snapshot.
const SNAPSHOT_TAG: &str = "differently-snapshot-id";

/// The status table Runloop's errors go through. A 409 is a change under way (a shutdown
/// while a snapshot is written); a 429 is the account's limit.
const STATUSES: Statuses = Statuses::api_key("Runloop");

fn errors(op: &str, answer: &ErrorAnswer) -> AdapterError {
    STATUSES.map(op, &answer.error(), answer.retry_after)
}

/// One Runloop pool.
pub struct RunloopAdapter {
    settings: Settings,
    client: HttpClient,
}

crate::kit::from_settings!(RunloopAdapter, "runloop", RunloopConfig => Settings, |settings, credentials| {
    let client =
        crate::kit::bearer_key_client!(settings, credentials, "Runloop", &settings.api_url, errors)?;
    Ok(Self { settings, client })
});

impl RunloopAdapter {
    /// The live devboxes tagged with `id`, oldest first (normally one).
    async fn lookup(&self, id: &SandboxId) -> Result<Vec<api::Devbox>, AdapterError> {
        let mut found = of_sandbox(api::list_live(&self.client).await?, id);
        found.sort_by(|a, b| (a.create_time_ms, &a.id).cmp(&(b.create_time_ms, &b.id)));
        Ok(found)
    }

    /// Waits until devbox `id` is in one of `want`: server long polls, each as long as the
    /// server holds; `failure` and `shutdown` end the wait unless wanted.
    async fn wait(&self, id: &str, want: &[&str]) -> Result<api::Devbox, AdapterError> {
        let timeout = self.settings.ready_timeout;
        let deadline = Instant::now() + timeout;
        let mut statuses = want.to_vec();
        statuses.extend(["failure", "shutdown"].iter().filter(|s| !want.contains(s)));
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let now = api::get(&self.client, id).await?;
                return Err(AdapterError::transient(format!(
                    "Runloop devbox still {} after {} s (waiting for {})",
                    now.status,
                    timeout.as_secs(),
                    want.join(" or ")
                )));
            }
            let Some(d) = api::wait_status(&self.client, id, &statuses, left).await? else {
                continue;
            };
            if want.contains(&d.status.as_str()) {
                return Ok(d);
            }
            return Err(match d.status.as_str() {
                "failure" => AdapterError::permanent(format!(
                    "Runloop devbox {id} failed: {}",
                    d.failure_reason
                        .unwrap_or_else(|| "no reason given".to_owned())
                )),
                _ => AdapterError::NotFound,
            });
        }
    }

    /// The error to answer for devbox `id` when it is past use (shut down, failed, gone);
    /// `None` while it lives (or when that cannot be told).
    async fn gone(&self, id: &str) -> Option<AdapterError> {
        match api::get(&self.client, id).await {
            Err(AdapterError::NotFound) => Some(AdapterError::NotFound),
            Ok(d) if d.status == "shutdown" => Some(AdapterError::NotFound),
            Ok(d) if d.status == "failure" => Some(AdapterError::permanent(format!(
                "Runloop devbox {id} failed: {}",
                d.failure_reason
                    .unwrap_or_else(|| "no reason given".to_owned())
            ))),
            _ => None,
        }
    }

    /// What an error of a call on devbox `id` means: a devbox that is shut down, failed or
    /// gone answers calls with a 400 or 404, which is the instance not being there.
    async fn gone_or(&self, id: &str, e: AdapterError) -> AdapterError {
        if !matches!(e, AdapterError::Permanent(_) | AdapterError::NotFound) {
            return e;
        }
        self.gone(id).await.unwrap_or(e)
    }

    fn create_body(&self, req: &CreateInstance) -> Result<api::CreateBody, AdapterError> {
        let mut body = api::CreateBody {
            name: req.sandbox_id.as_str().to_owned(),
            metadata: create_tags(req),
            environment_variables: req.env.clone(),
            launch_parameters: launch::parameters(&self.settings, &req.resources)?,
            ..api::CreateBody::default()
        };
        // Runloop takes one source: a snapshot, or a blueprint by id or by name.
        if let Some(snap) = &req.from_snapshot {
            body.snapshot_id = Some(snap.clone());
            return Ok(body);
        }
        let blueprint = req
            .template
            .clone()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| self.settings.blueprint.clone());
        match blueprint {
            Some(b) if b.starts_with("bpt_") => body.blueprint_id = Some(b),
            Some(b) => body.blueprint_name = Some(b),
            None => {}
        }
        Ok(body)
    }

    /// The instance of a devbox found for a create: running once it runs, failed ones
    /// refused, suspended ones as they are.
    async fn adopt(&self, found: api::Devbox) -> Result<Instance, AdapterError> {
        let inst = instance(&found).ok_or(AdapterError::NotFound)?;
        match inst.state {
            InstanceState::Failed => Err(AdapterError::permanent(format!(
                "Runloop devbox {} failed: {}",
                found.id,
                found.failure_reason.unwrap_or_default()
            ))),
            InstanceState::Pending => {
                let now = self.wait(&found.id, &["running", "suspended"]).await?;
                Ok(Instance {
                    state: api::Devbox::our_state(&now.status).unwrap_or(InstanceState::Running),
                    ..inst
                })
            }
            _ => Ok(inst),
        }
    }

    /// Shuts devbox `id` down; one already shut down, failed (nothing runs) or gone is fine.
    async fn shutdown(&self, id: &str) -> Result<(), AdapterError> {
        match api::action(&self.client, id, "shutdown").await {
            Ok(_) | Err(AdapterError::NotFound) => Ok(()),
            Err(e @ AdapterError::Permanent(_)) => match api::get(&self.client, id).await {
                Err(AdapterError::NotFound) => Ok(()),
                Ok(d) if is_gone(&d) => Ok(()),
                _ => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// The devbox's status, waiting out a passing one (`queued`, `resuming`, …) until it is
    /// one of `settled`.
    async fn settled(&self, id: &str, settled: &[&str]) -> Result<api::Devbox, AdapterError> {
        let d = api::get(&self.client, id).await?;
        match d.status.as_str() {
            s if settled.contains(&s) => Ok(d),
            "failure" | "shutdown" => Err(self.gone_or(id, AdapterError::NotFound).await),
            _ => self.wait(id, settled).await,
        }
    }

    async fn stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: &tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<i32, AdapterError> {
        check_command(req)?;
        if let Some(bad) = req.env.keys().find(|k| !script::env_name_ok(k)) {
            return Err(AdapterError::invalid_field(
                "env",
                format!("`{bad}` is not a variable name a shell can export"),
            ));
        }
        let stdin = stdin_of(req)?;
        let c = &self.client;
        let id = &at.backend_ref;
        let scripts = self.settings.request_timeout;
        if let Some(cwd) = &req.cwd {
            check_path("cwd", cwd)?;
            let ran = exec::script(c, id, &script::is_dir(cwd), scripts).await?;
            if ran.exit_code != 0 {
                return Err(AdapterError::invalid_field(
                    "cwd",
                    "exec: the cwd is not a directory in the sandbox",
                ));
            }
        }
        // Stdin travels as a file the command reads and removes (bytes exact; the API's
        // stdin call takes text).
        let stdin_file = match stdin {
            Some(input) => {
                let path = format!("/tmp/.differently-stdin-{}", crate::kit::paths::unique());
                let body: ByteStream = Box::pin(futures::stream::once(async move {
                    Ok::<_, AdapterError>(Bytes::from(input))
                }));
                files::put(c, id, &path, body).await?;
                Some(path)
            }
            None => None,
        };
        let command = script::command(
            &req.command,
            &req.env,
            req.cwd.as_deref(),
            stdin_file.as_deref(),
        );
        exec::run(c, id, &command, req.timeout(), out).await
    }
}

#[async_trait]
impl Adapter for RunloopAdapter {
    fn kind(&self) -> &'static str {
        "runloop"
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![
            Capability::Exec,
            Capability::ExecStream,
            Capability::Files,
            Capability::LifecycleStop,
            Capability::Snapshots,
            Capability::PortsExpose,
        ]
    }

    fn exec_fidelity(&self) -> ExecFidelity {
        // Output arrives in JSON strings: bytes that are not UTF-8 are replaced.
        ExecFidelity::TEXT
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if let Some(found) = self.lookup(&req.sandbox_id).await?.into_iter().next() {
            return self.adopt(found).await;
        }
        let body = self.create_body(req)?;
        let made = api::create(&self.client, &body).await?;
        // A create that raced ours: the oldest devbox wins, the others are shut down.
        let all = self.lookup(&req.sandbox_id).await?;
        if let Some(oldest) = all.first().filter(|o| o.id != made.id) {
            self.shutdown(&made.id).await?;
            return self.adopt(oldest.clone()).await;
        }
        self.wait(&made.id, &["running"]).await?;
        Ok(req.running(made.id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        for d in self.lookup(sandbox_id).await? {
            self.shutdown(&d.id).await?;
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(self
            .lookup(sandbox_id)
            .await?
            .first()
            .and_then(tags::instance))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let all = api::list_live(&self.client).await?;
        Ok(of_installation(&all, installation))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        api::ping(&self.client).await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        match timed_exit(self.stream(at, req, &out)).await {
            Ok(exit) => Ok(exit),
            Err(e) => Err(self.gone_or(&at.backend_ref, e).await),
        }
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        check_path("path", path)?;
        let t = self.settings.request_timeout;
        match files::upload(&self.client, &at.backend_ref, path, mode, body, t).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.gone_or(&at.backend_ref, e).await),
        }
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        check_path("path", path)?;
        let c = &self.client;
        let id = &at.backend_ref;
        let resp = match files::get(c, id, path).await {
            Ok(r) => r,
            Err(e) => {
                // A 404 here may be the file or the devbox: ask the devbox which.
                if let Some(gone) = self.gone(id).await {
                    return Err(gone);
                }
                return Err(files::explain(c, id, path, e, self.settings.request_timeout).await);
            }
        };
        let total_size = resp.content_length();
        let client = c.clone();
        let op = "download";
        let body = futures::StreamExt::map(resp.bytes_stream(), move |r| {
            r.map_err(|e| client.transport_error(op, e))
        });
        Ok(Download {
            total_size,
            body: cut_to_range(body, range),
        })
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        check_path("path", path)?;
        let t = self.settings.request_timeout;
        match files::list(&self.client, &at.backend_ref, path, depth, t).await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.gone_or(&at.backend_ref, e).await),
        }
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        check_path("path", path)?;
        let t = self.settings.request_timeout;
        match files::delete(&self.client, &at.backend_ref, path, t).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.gone_or(&at.backend_ref, e).await),
        }
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let id = &at.backend_ref;
        let d = self.settled(id, &["running", "suspended"]).await?;
        if d.status == "running" {
            api::action(&self.client, id, "suspend").await?;
        }
        self.wait(id, &["suspended"]).await.map(drop)
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let id = &at.backend_ref;
        let d = self.settled(id, &["running", "suspended"]).await?;
        if d.status == "suspended" {
            api::action(&self.client, id, "resume").await?;
        }
        self.wait(id, &["running"]).await.map(drop)
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        let c = &self.client;
        for s in api::snapshots_tagged(c, SNAPSHOT_TAG, snapshot_id).await? {
            let st = api::snapshot_status(c, &s.id).await?;
            match st.status.as_str() {
                "complete" => {
                    return Ok(SnapshotInfo {
                        backend_ref: s.id,
                        ready: true,
                    })
                }
                "in_progress" => {
                    return Ok(SnapshotInfo {
                        backend_ref: s.id,
                        ready: false,
                    })
                }
                "error" => {
                    return Err(AdapterError::permanent(format!(
                        "Runloop snapshot {} failed: {}",
                        s.id,
                        st.error_message.unwrap_or_default()
                    )))
                }
                // `deleted`: as if there were none; a new one is taken.
                _ => {}
            }
        }
        let mut metadata =
            std::collections::BTreeMap::from([(SNAPSHOT_TAG.to_owned(), snapshot_id.to_owned())]);
        metadata.insert(
            tags::SANDBOX_TAG.to_owned(),
            at.sandbox_id.as_str().to_owned(),
        );
        let name = format!("differently-{snapshot_id}");
        match api::take_snapshot(c, &at.backend_ref, &name, &metadata).await {
            Ok(s) => Ok(SnapshotInfo {
                backend_ref: s.id,
                ready: false,
            }),
            Err(e) => Err(self.gone_or(&at.backend_ref, e).await),
        }
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        match api::delete_snapshot(&self.client, backend_ref).await {
            Ok(()) | Err(AdapterError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        _expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        let c = &self.client;
        let id = &at.backend_ref;
        let d = match api::get(c, id).await {
            Ok(d) if is_gone(&d) => return Err(AdapterError::NotFound),
            Ok(d) => d,
            Err(e) => return Err(e),
        };
        let tunnel = match d.tunnel {
            Some(t) => t,
            None => match api::enable_open_tunnel(c, id).await {
                Ok(t) => t,
                // Another call may have opened it meanwhile: use that one if so.
                Err(e @ AdapterError::Permanent(_)) => match api::get(c, id).await?.tunnel {
                    Some(t) => t,
                    None => return Err(self.gone_or(id, e).await),
                },
                Err(e) => return Err(e),
            },
        };
        if tunnel.auth_mode != "open" {
            return Err(AdapterError::permanent(format!(
                "Runloop devbox {id} has an {} tunnel, whose URLs need its token; Differently \
                 opens only open tunnels",
                tunnel.auth_mode
            )));
        }
        Ok(Endpoint {
            url: format!(
                "https://{port}-{}.{}",
                tunnel.tunnel_key, self.settings.tunnel_domain
            ),
            // The tunnel lasts as long as the devbox.
            expires_at: None,
        })
    }
}

/// Whether a devbox is past use (shut down or failed).
fn is_gone(d: &api::Devbox) -> bool {
    matches!(d.status.as_str(), "shutdown" | "failure")
}
