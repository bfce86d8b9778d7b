//! `DaytonaAdapter`: sandboxes on Daytona (Daytona Cloud or a self-hosted Daytona), always an
//! external pool (third-party infrastructure; the registry forces `trust: external`).
//!
//! The main API creates, finds, stops, starts, snapshots and deletes sandboxes and signs
//! preview URLs; the toolbox (the daemon in each sandbox, behind the toolbox proxy) runs
//! commands and moves files. Every sandbox carries Differently's sandbox and installation ids
//! as Daytona labels, which is how `create` stays idempotent (find before create; the name is
//! the sandbox id too, so a racing second create gets a 409 and finds the first) and how
//! `list` finds orphans.
//!
//! The API key, read through its reference at call time, goes only to the two configured
//! origins, as a bearer token; never into an error, an event or a URL. What live accounts
//! showed (seeds 002 POC 7) is built in: no resources with a snapshot, a 408
//! `PROCESS_EXECUTION_TIMEOUT` is exit 124, asynchronous snapshots restored by name and
//! deleted by id, lifecycle calls that answer before they finish, a 409 during a change.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;

use crate::exec_output::{millis, stdin_of, timed_exit, CollectedOutput};
use crate::files;
use crate::kit::paths::{check_path, dns_name, unique};
use crate::kit::shell;
use crate::kit::tags::{self, create_tags, of_installation, of_sandbox, Tagged};
use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, FileKind, Instance, InstanceRef, InstanceState, SnapshotInfo,
};

pub(crate) mod client;
pub mod config;
mod sandbox;
mod toolbox;

pub use crate::settings::ConfigError;
pub use config::{DaytonaConfig, Settings};

/// Consecutive failed polls of a running command before the stream gives up.
const POLL_FAILURES: u32 = 3;

/// One Daytona pool.
pub struct DaytonaAdapter {
    settings: Settings,
    client: client::Client,
}

/// Daytona state → ours; `None` for sandboxes that are gone or going.
fn state(s: Option<&str>) -> Option<InstanceState> {
    Some(match s.unwrap_or("unknown") {
        // Busy but up: a snapshot or resize of a started sandbox.
        "started" | "snapshotting" | "resizing" | "forking" => InstanceState::Running,
        "stopped" | "stopping" | "archived" | "archiving" => InstanceState::Stopped,
        "paused" | "pausing" => InstanceState::Paused,
        "error" | "build_failed" => InstanceState::Failed,
        "destroyed" | "destroying" => return None,
        // creating, restoring, starting, pulling_snapshot, pending_build, building_snapshot,
        // resuming, unknown, and states added later.
        _ => InstanceState::Pending,
    })
}

impl Tagged for sandbox::Sandbox {
    fn backend_ref(&self) -> &str {
        &self.id
    }
    fn tag(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
    fn state(&self) -> Option<InstanceState> {
        state(self.state.as_deref())
    }
}

/// The Daytona snapshot name of a Differently snapshot id (restore and delete find it by it).
fn snapshot_name(snapshot_id: &str) -> String {
    format!(
        "differently-{}",
        snapshot_id.to_ascii_lowercase().replace('_', "-")
    )
}

/// Permission bits of a toolbox entry: `permissions` is octal; else from the mode string.
fn mode_bits(f: &toolbox::FileInfo) -> u32 {
    if let Ok(m) = u32::from_str_radix(f.permissions.trim_start_matches("0o"), 8) {
        return m & 0o7777;
    }
    let chars: Vec<char> = f.mode.chars().collect();
    let tail = &chars[chars.len().saturating_sub(9)..];
    tail.iter().enumerate().fold(0, |acc, (i, ch)| {
        if *ch == '-' {
            acc
        } else {
            acc | (1 << (8 - i))
        }
    })
}

fn file_entry(dir: &str, f: &toolbox::FileInfo) -> FileEntry {
    let kind = if f.mode.starts_with('L') {
        FileKind::Symlink
    } else if f.is_dir {
        FileKind::Dir
    } else if f.mode.starts_with('-') || f.mode.is_empty() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let path = if dir.ends_with('/') {
        format!("{dir}{}", f.name)
    } else {
        format!("{dir}/{}", f.name)
    };
    FileEntry {
        path,
        kind,
        size: f.size,
        mode: mode_bits(f),
        modified_at: f
            .modified_at
            .as_deref()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc)),
    }
}

crate::kit::from_settings!(DaytonaAdapter, "daytona", DaytonaConfig => Settings, |settings, credentials| {
    let client = client::Client::new(&settings, credentials)?;
    Ok(Self { settings, client })
});

impl DaytonaAdapter {
    /// The live Daytona sandboxes labelled with `id` (normally one).
    async fn lookup(&self, id: &SandboxId) -> Result<Vec<sandbox::Sandbox>, AdapterError> {
        let labels = BTreeMap::from([(tags::SANDBOX_TAG, id.as_str())]);
        let all = sandbox::list_by_labels(&self.client, &labels).await?;
        Ok(of_sandbox(all, id))
    }

    /// Polls until the sandbox is in one of `want`; `error` or disappearing ends the wait.
    async fn wait_state(
        &self,
        backend_ref: &str,
        want: &[&str],
        timeout: Duration,
    ) -> Result<(), AdapterError> {
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let sbx = sandbox::get(&self.client, backend_ref).await?;
            let st = sbx.state.as_deref().unwrap_or("unknown");
            if want.contains(&st) {
                return Ok(());
            }
            match st {
                "error" | "build_failed" => {
                    return Err(AdapterError::permanent(format!(
                        "Daytona sandbox is {st}: {}",
                        sbx.error_reason.unwrap_or_default()
                    )))
                }
                "destroyed" | "destroying" => return Err(AdapterError::NotFound),
                _ => {}
            }
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "Daytona sandbox still {st} after {} s (waiting for {})",
                    timeout.as_secs(),
                    want.join(" or ")
                )));
            }
            poll.pause().await;
        }
    }

    /// `started`, then the toolbox answering.
    async fn ready(&self, backend_ref: &str) -> Result<(), AdapterError> {
        let timeout = self.settings.ready_timeout;
        let started = Instant::now();
        self.wait_state(backend_ref, &["started"], timeout).await?;
        let left = timeout.saturating_sub(started.elapsed());
        let mut poll = Poll::new(self.settings.poll_interval, left);
        loop {
            match toolbox::version(&self.client, backend_ref).await {
                Ok(()) => return Ok(()),
                Err(e @ AdapterError::Permanent(_)) => return Err(e),
                Err(e) if poll.expired() => {
                    return Err(AdapterError::transient(format!(
                        "the Daytona toolbox did not answer within {} s: {e}",
                        timeout.as_secs()
                    )))
                }
                Err(_) => poll.pause().await,
            }
        }
    }

    fn create_body(&self, req: &CreateInstance) -> sandbox::CreateBody {
        let s = &self.settings;
        let snapshot = req
            .from_snapshot
            .clone()
            .or_else(|| req.template.clone().filter(|t| !t.is_empty()))
            .or_else(|| s.snapshot.clone());
        // Daytona refuses resources with a snapshot (400 "Cannot specify Sandbox resources
        // when using a snapshot", seen live): the snapshot sets the size.
        let sized = snapshot.is_none();
        let r = req.resources;
        sandbox::CreateBody {
            name: dns_name(&req.sandbox_id),
            snapshot,
            env: req.env.clone(),
            labels: create_tags(req),
            target: s.target.clone(),
            cpu: sized.then_some(r.cpu.max(1)),
            memory: sized.then_some(r.memory_mib.div_ceil(1024).max(1)),
            disk: sized.then_some(r.disk_gib.max(1)),
            auto_stop_interval: 0,
            network_block_all: s.egress == config::Egress::None,
        }
    }

    /// The one instance to use of those found; several is a race we lost twice: keep the
    /// oldest-listed, the others are the reconciler's.
    async fn adopt(&self, found: sandbox::Sandbox) -> Result<Instance, AdapterError> {
        let inst = tags::instance(&found)
            .ok_or_else(|| AdapterError::transient("Daytona sandbox is being deleted"))?;
        match inst.state {
            InstanceState::Failed => Err(AdapterError::permanent(format!(
                "Daytona sandbox {} is in error: {}",
                found.id,
                found.error_reason.unwrap_or_default()
            ))),
            InstanceState::Pending | InstanceState::Running => {
                self.ready(&found.id).await?;
                Ok(Instance {
                    state: InstanceState::Running,
                    ..inst
                })
            }
            InstanceState::Stopped | InstanceState::Paused => Ok(inst),
        }
    }

    /// Validates an exec request and uploads its stdin; the stdin file's path if any.
    async fn prepare_exec(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
    ) -> Result<Option<String>, AdapterError> {
        if req.command.first().is_none_or(String::is_empty) {
            return Err(AdapterError::invalid_field("command", "command is empty"));
        }
        if req.command.iter().any(|a| a.contains('\0')) {
            return Err(AdapterError::invalid_field(
                "command",
                "arguments may not contain NUL",
            ));
        }
        let stdin = stdin_of(req)?;
        if let Some(cwd) = &req.cwd {
            check_path("cwd", cwd)?;
            match toolbox::info(&self.client, &at.backend_ref, cwd).await {
                Ok(f) if f.is_dir => {}
                Ok(_) => {
                    return Err(AdapterError::invalid_field(
                        "cwd",
                        "exec: the cwd is not a directory",
                    ))
                }
                Err(AdapterError::PathNotFound(_)) => {
                    return Err(AdapterError::invalid_field(
                        "cwd",
                        "exec: the cwd does not exist in the sandbox",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        let Some(input) = stdin else {
            return Ok(None);
        };
        // The toolbox takes no stdin: the command reads a file it unlinks once opened.
        let path = format!("/tmp/.differently-stdin-{}", unique());
        let body: ByteStream = Box::pin(futures::stream::once(async move {
            Ok::<_, AdapterError>(Bytes::from(input))
        }));
        toolbox::upload(&self.client, &at.backend_ref, &path, body).await?;
        Ok(Some(path))
    }

    /// The stream loop of a session command: polls its logs and status, sending new output.
    async fn follow(
        &self,
        at: &InstanceRef,
        sid: &str,
        cmd: &str,
        timeout: Duration,
        out: &tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<Option<i32>, AdapterError> {
        let id = &at.backend_ref;
        let mut seen = (0usize, 0usize);
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        let mut failures = 0;
        let gone = || AdapterError::permanent("exec cancelled: the output receiver went away");
        loop {
            // The status first: output read after it has ended is complete.
            let status = toolbox::command(&self.client, id, sid, cmd).await;
            let logs = toolbox::logs(&self.client, id, sid, cmd).await;
            let (status, logs) = match (status, logs) {
                (Ok(s), Ok(l)) => {
                    failures = 0;
                    (s, l)
                }
                (Err(e), _) | (_, Err(e)) => {
                    failures += 1;
                    if !e.is_retryable() || failures >= POLL_FAILURES {
                        return Err(e);
                    }
                    poll.pause().await;
                    continue;
                }
            };
            for (text, at_byte, wrap) in [
                (
                    &logs.stdout,
                    &mut seen.0,
                    ExecEvent::Stdout as fn(Bytes) -> ExecEvent,
                ),
                (
                    &logs.stderr,
                    &mut seen.1,
                    ExecEvent::Stderr as fn(Bytes) -> ExecEvent,
                ),
            ] {
                let new = text.get(*at_byte..).unwrap_or("");
                *at_byte = text.len().max(*at_byte);
                if !new.is_empty() && out.send(wrap(Bytes::from(new.to_owned()))).await.is_err() {
                    return Err(gone());
                }
            }
            if let Some(code) = status.exit_code {
                return Ok(Some(code));
            }
            if poll.expired() {
                return Ok(None);
            }
            tokio::select! {
                () = poll.pause() => {}
                () = out.closed() => return Err(gone()),
            }
        }
    }
}

#[async_trait]
impl Adapter for DaytonaAdapter {
    fn kind(&self) -> &'static str {
        "daytona"
    }

    /// `/process/execute` answers stdout and stderr combined, and output of both paths is
    /// JSON text (see docs/providers.md).
    fn exec_fidelity(&self) -> crate::ExecFidelity {
        crate::ExecFidelity {
            binary_output: false,
            buffered_stderr: false,
            exact_line_endings: true,
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = vec![Capability::Exec, Capability::Files, Capability::ExecStream];
        if self.settings.pause {
            caps.push(Capability::LifecyclePause);
        }
        caps.extend([
            Capability::LifecycleStop,
            Capability::Snapshots,
            Capability::PortsExpose,
        ]);
        if self.settings.egress == config::Egress::None {
            caps.push(Capability::NetworkEgressControl);
        }
        caps
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if let Some(found) = self.lookup(&req.sandbox_id).await?.into_iter().next() {
            return self.adopt(found).await;
        }
        let body = self.create_body(req);
        let created = match sandbox::create(&self.client, &body).await? {
            Some(s) => s,
            // The name is taken: a racing create of the same sandbox; use that one.
            None => match self.lookup(&req.sandbox_id).await?.into_iter().next() {
                Some(found) => return self.adopt(found).await,
                None => {
                    return Err(AdapterError::transient(format!(
                        "create sandbox: Daytona says the name {} is taken, but no sandbox carries its label yet",
                        body.name
                    )))
                }
            },
        };
        self.ready(&created.id).await?;
        Ok(req.running(created.id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        for s in self.lookup(sandbox_id).await? {
            match sandbox::delete(&self.client, &s.id).await {
                Ok(()) | Err(AdapterError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(tags::first(&self.lookup(sandbox_id).await?))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let labels = BTreeMap::from([(tags::INSTALLATION_TAG, installation.as_str())]);
        let all = sandbox::list_by_labels(&self.client, &labels).await?;
        Ok(of_installation(&all, installation))
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        let started = Instant::now();
        let stdin_file = self.prepare_exec(at, req).await?;
        let timeout = req.timeout();
        let script = shell::script(
            &req.command,
            &shell::Wrap {
                stdin_file: stdin_file.as_deref(),
                ..Default::default()
            },
        );
        let body = toolbox::ExecuteBody {
            command: shell::sh_c(&script),
            cwd: req.cwd.clone(),
            envs: req.env.clone(),
            timeout: timeout.as_secs().max(1),
        };
        let http_timeout = timeout + self.settings.request_timeout;
        let done = toolbox::execute(&self.client, &at.backend_ref, &body, http_timeout).await?;
        let mut output = CollectedOutput::default();
        let exit_code = match done {
            // A 408 PROCESS_EXECUTION_TIMEOUT carries no output (seen live).
            toolbox::Executed::TimedOut => 124,
            toolbox::Executed::Done {
                exit_code,
                output: text,
            } => {
                output.push(&ExecEvent::Stdout(Bytes::from(text)));
                exit_code
            }
        };
        Ok(output.into_result(exit_code, millis(started.elapsed())))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        sandbox::ping(&self.client).await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        timed_exit(async {
            let stdin_file = self.prepare_exec(at, req).await?;
            let timeout = req.timeout();
            let script = shell::script(
                &req.command,
                &shell::Wrap {
                    env: Some(&req.env),
                    cwd: req.cwd.as_deref(),
                    stdin_file: stdin_file.as_deref(),
                },
            );
            let sid = format!("differently-{}", unique());
            let id = &at.backend_ref;
            toolbox::create_session(&self.client, id, &sid).await?;
            let result =
                match toolbox::session_exec(&self.client, id, &sid, &shell::sh_c(&script)).await {
                    Ok(cmd) => self.follow(at, &sid, &cmd, timeout, &out).await,
                    Err(e) => Err(e),
                };
            // Ending the session kills what still runs in it (a timeout, a cancel, an error).
            if let Err(e) = toolbox::delete_session(&self.client, id, &sid).await {
                tracing::warn!(error = %e, "daytona: ending an exec session failed");
            }
            Ok(result?.unwrap_or(124))
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
        check_path("path", path)?;
        toolbox::upload(&self.client, &at.backend_ref, path, body).await?;
        if let Some(mode) = mode {
            toolbox::chmod(&self.client, &at.backend_ref, path, mode).await?;
        }
        Ok(())
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        check_path("path", path)?;
        let resp = toolbox::download(&self.client, &at.backend_ref, path).await?;
        let total_size = resp.content_length();
        let client = self.client.clone();
        let whole = resp.bytes_stream().map(move |chunk| {
            chunk.map_err(|e| {
                client
                    .http(client::Side::Toolbox)
                    .transport_error("download", e)
            })
        });
        // The toolbox has no ranges: the range is cut out of the whole file here.
        let body = files::cut_to_range(whole, range);
        Ok(Download { total_size, body })
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        check_path("path", path)?;
        let (client, id) = (&self.client, &at.backend_ref);
        files::list_levels(path, depth, |dir| async move {
            let found = toolbox::list(client, id, &dir).await?;
            Ok(found.iter().map(|f| file_entry(&dir, f)).collect())
        })
        .await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        check_path("path", path)?;
        toolbox::delete(&self.client, &at.backend_ref, path).await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        if !self.settings.pause {
            return Err(AdapterError::Unsupported(
                "lifecycle.pause: this Daytona pool does not declare `pause` (Daytona pauses VM-class sandboxes only)".to_owned(),
            ));
        }
        let s = sandbox::get(&self.client, &at.backend_ref).await?;
        match s.state.as_deref() {
            Some("paused") => return Ok(()),
            Some("pausing") => {}
            _ => {
                sandbox::action(&self.client, &at.backend_ref, "pause").await?;
            }
        }
        self.wait_state(&at.backend_ref, &["paused"], self.settings.ready_timeout)
            .await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        if !self.settings.pause {
            return Err(AdapterError::Unsupported(
                "lifecycle.pause: this Daytona pool does not declare `pause`".to_owned(),
            ));
        }
        self.start(at).await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let s = sandbox::get(&self.client, &at.backend_ref).await?;
        match s.state.as_deref() {
            Some("stopped" | "archived") => return Ok(()),
            Some("stopping") => {}
            _ => {
                sandbox::action(&self.client, &at.backend_ref, "stop").await?;
            }
        }
        // Stop answers while still stopping (seen live).
        self.wait_state(
            &at.backend_ref,
            &["stopped", "archived"],
            self.settings.ready_timeout,
        )
        .await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        let s = sandbox::get(&self.client, &at.backend_ref).await?;
        match s.state.as_deref() {
            Some("started" | "starting" | "resuming") => {}
            // Start also resumes a paused sandbox and restores an archived one.
            _ => {
                sandbox::action(&self.client, &at.backend_ref, "start").await?;
            }
        }
        self.ready(&at.backend_ref).await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        let name = snapshot_name(snapshot_id);
        let info = |s: sandbox::Snapshot| -> Result<SnapshotInfo, AdapterError> {
            match s.state.as_deref() {
                Some("error" | "build_failed") => Err(AdapterError::permanent(format!(
                    "Daytona snapshot {} failed: {}",
                    s.name,
                    s.error_reason.unwrap_or_default()
                ))),
                st => Ok(SnapshotInfo {
                    backend_ref: s.name,
                    ready: st == Some("active"),
                }),
            }
        };
        if let Some(s) = sandbox::snapshot_by_name(&self.client, &name).await? {
            return info(s);
        }
        match sandbox::take_snapshot(&self.client, &at.backend_ref, &name).await {
            Ok(()) => {}
            // Busy (another snapshot of it, ours under way?): look once more.
            Err(e @ AdapterError::Transient(_)) => {
                return match sandbox::snapshot_by_name(&self.client, &name).await? {
                    Some(s) => info(s),
                    None => Err(e),
                }
            }
            Err(e) => return Err(e),
        }
        // Asynchronous: active 9-22 s later (seen live); callers ask again.
        match sandbox::snapshot_by_name(&self.client, &name).await? {
            Some(s) => info(s),
            None => Ok(SnapshotInfo {
                backend_ref: name,
                ready: false,
            }),
        }
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        // Restore takes the name; delete needs the id (seen live).
        match sandbox::snapshot_by_name(&self.client, backend_ref).await? {
            None => Ok(()),
            Some(s) => match sandbox::delete_snapshot(&self.client, &s.id).await {
                Ok(()) | Err(AdapterError::NotFound) => Ok(()),
                Err(e) => Err(e),
            },
        }
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        let seconds = expires
            .map_or(self.settings.port_url_seconds, |d| d.as_secs())
            .max(1);
        let signed = sandbox::signed_preview(&self.client, &at.backend_ref, port, seconds).await?;
        let expires_at = chrono::Utc::now()
            + chrono::Duration::seconds(i64::try_from(seconds).unwrap_or(i64::MAX / 2));
        Ok(Endpoint {
            url: signed.url,
            expires_at: Some(expires_at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_and_gone_ones_vanish() {
        assert_eq!(state(Some("started")), Some(InstanceState::Running));
        assert_eq!(state(Some("archived")), Some(InstanceState::Stopped));
        assert_eq!(state(Some("pausing")), Some(InstanceState::Paused));
        assert_eq!(state(Some("build_failed")), Some(InstanceState::Failed));
        assert_eq!(
            state(Some("pulling_snapshot")),
            Some(InstanceState::Pending)
        );
        assert_eq!(state(Some("destroying")), None);
        assert_eq!(state(None), Some(InstanceState::Pending));
    }

    #[test]
    fn modes_read_from_octal_or_the_mode_string() {
        let f = |mode: &str, permissions: &str| toolbox::FileInfo {
            name: "x".into(),
            is_dir: false,
            size: 0,
            mode: mode.into(),
            permissions: permissions.into(),
            modified_at: None,
        };
        assert_eq!(mode_bits(&f("-rw-r--r--", "0644")), 0o644);
        assert_eq!(mode_bits(&f("-rwxr-x---", "")), 0o750);
        assert_eq!(
            file_entry("/a/", &f("Lrwxrwxrwx", "0777")).kind,
            FileKind::Symlink
        );
        assert_eq!(file_entry("/a", &f("-rw-------", "0600")).path, "/a/x");
        assert_eq!(
            dns_name(&SandboxId::parse("sbx_01J0000000000000000000000A").unwrap()),
            "sbx-01j0000000000000000000000a"
        );
    }
}
