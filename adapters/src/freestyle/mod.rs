//! `FreestyleAdapter`: sandboxes as Freestyle VMs (v5 API), always an external pool.
//!
//! Every VM carries Differently's sandbox and installation ids in its metadata, and its slug
//! is the sandbox id, so `create` finds a VM by slug before creating (a racing create gets a
//! 409 and adopts the winner) and `list` filters the account's VMs by installation. Exec is
//! `exec-await` (buffered; the API has no streaming output), files are the `fs` routes.
//!
//! What live accounts showed (seeds 002 POC 7) is built in: VMs are created with
//! `automaticRestart: false` (otherwise a powered-off VM boots again about 5 s later), stop is
//! `poweroff` as root (v5 has no stop call), the file mode is sent as the decimal number the
//! API reads, and the sandbox's environment lives in a file written once at create (not in
//! `/tmp`, which is emptied at boot) that every command sources before its own env.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;

use crate::exec_output::{millis, stdin_of, CollectedOutput};
use crate::files;
use crate::kit::paths::{check_path, dns_name};
use crate::kit::shell;
use crate::poll::Poll;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, ExecEvent,
    FileEntry, FileKind, Instance, InstanceRef, InstanceState,
};

mod api;
pub mod config;

pub use crate::settings::ConfigError;
use api::{META_INSTALLATION, META_SANDBOX};
pub use config::{FreestyleConfig, Settings};

/// The largest stdin `exec-await` takes inline.
const STDIN_INLINE_MAX: usize = 1 << 20;

/// Freestyle state → ours; `None` for an unknown VM record without a state.
fn state(s: Option<&str>) -> InstanceState {
    match s.unwrap_or("") {
        "running" => InstanceState::Running,
        "pausing" | "paused" | "suspending" | "suspended" => InstanceState::Paused,
        "stopped" => InstanceState::Stopped,
        "failed" | "error" => InstanceState::Failed,
        _ => InstanceState::Pending,
    }
}

/// One Freestyle pool.
pub struct FreestyleAdapter {
    settings: Settings,
    client: api::Client,
}

crate::kit::from_settings!(FreestyleAdapter, "freestyle", FreestyleConfig => Settings, |settings, credentials| {
    let client = api::client(&settings, credentials)?;
    Ok(Self { settings, client })
});

impl FreestyleAdapter {
    fn instance(vm: &api::Vm) -> Option<Instance> {
        let sandbox_id = SandboxId::parse(vm.metadata.get(META_SANDBOX)?).ok()?;
        Some(Instance {
            backend_ref: vm.id.clone(),
            sandbox_id,
            state: state(vm.state.as_deref()),
        })
    }

    /// The VM of `id` (by slug), if it is ours.
    async fn lookup(&self, id: &SandboxId) -> Result<Option<api::Vm>, AdapterError> {
        let vm = api::get(&self.client, &dns_name(id)).await?;
        Ok(vm.filter(|v| v.metadata.get(META_SANDBOX).map(String::as_str) == Some(id.as_str())))
    }

    async fn wait_state(
        &self,
        backend_ref: &str,
        want: &str,
        timeout: Duration,
    ) -> Result<(), AdapterError> {
        let mut poll = Poll::new(self.settings.poll_interval, timeout);
        loop {
            let Some(vm) = api::get(&self.client, backend_ref).await? else {
                return Err(AdapterError::NotFound);
            };
            let st = vm.state.unwrap_or_default();
            if st == want {
                return Ok(());
            }
            if poll.expired() {
                return Err(AdapterError::transient(format!(
                    "Freestyle VM still {st} after {} s (waiting for {want})",
                    timeout.as_secs()
                )));
            }
            poll.pause().await;
        }
    }

    async fn state_of(&self, at: &InstanceRef) -> Result<String, AdapterError> {
        match api::get(&self.client, &at.backend_ref).await? {
            Some(vm) => Ok(vm.state.unwrap_or_default()),
            None => Err(AdapterError::NotFound),
        }
    }

    /// Writes the sandbox's environment file (mode 0644; uploads are root-owned, seen live).
    async fn write_env(
        &self,
        backend_ref: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<(), AdapterError> {
        let text: String = env
            .iter()
            .map(|(k, v)| format!("export {k}={}\n", shell::quote(v)))
            .collect();
        api::write(
            &self.client,
            backend_ref,
            &self.settings.env_file,
            Some(0o644),
            reqwest::Body::from(text),
        )
        .await
    }

    /// Runs `script` through `exec-await` (as `user` when given).
    async fn run(
        &self,
        backend_ref: &str,
        script: &str,
        timeout: Duration,
        stdin: Option<String>,
        user: Option<&str>,
    ) -> Result<api::ExecAnswer, AdapterError> {
        let body = api::ExecBody {
            command: shell::sh_c(script),
            timeout_ms: millis(timeout).max(1),
            env: BTreeMap::new(),
            stdin,
            linux_user: user.map(str::to_owned),
        };
        api::exec(
            &self.client,
            backend_ref,
            &body,
            timeout + self.settings.request_timeout,
        )
        .await
    }
}

fn entry(dir: &str, e: &api::Entry) -> FileEntry {
    let kind = match e.kind.as_deref() {
        Some("file") => FileKind::File,
        Some("directory" | "dir") => FileKind::Dir,
        Some("symlink") => FileKind::Symlink,
        _ => FileKind::Other,
    };
    FileEntry {
        path: format!("{}/{}", dir.trim_end_matches('/'), e.name),
        kind,
        size: e.size,
        mode: e.mode.unwrap_or(0) & 0o7777,
        modified_at: e.modified_at,
    }
}

#[async_trait]
impl Adapter for FreestyleAdapter {
    fn kind(&self) -> &'static str {
        "freestyle"
    }

    fn capabilities(&self) -> Vec<Capability> {
        // The firewall (no rules: no outbound traffic) is Freestyle's, always on.
        vec![
            Capability::Exec,
            Capability::Files,
            Capability::LifecyclePause,
            Capability::LifecycleStop,
            Capability::NetworkEgressControl,
        ]
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        let slug = dns_name(&req.sandbox_id);
        let vm = match self.lookup(&req.sandbox_id).await? {
            Some(vm) => vm,
            None => {
                let body = api::CreateBody {
                    slug: slug.clone(),
                    snapshot_id: req
                        .from_snapshot
                        .clone()
                        .or_else(|| req.template.clone().filter(|t| !t.is_empty()))
                        .unwrap_or_else(|| self.settings.snapshot.clone()),
                    metadata: BTreeMap::from([
                        (META_SANDBOX.to_owned(), req.sandbox_id.as_str().to_owned()),
                        (
                            META_INSTALLATION.to_owned(),
                            req.installation_id.as_str().to_owned(),
                        ),
                    ]),
                    firewall: serde_json::json!({ "rules": self.settings.firewall_rules }),
                    automatic_restart: false,
                    idle_timeout_seconds: self.settings.idle_timeout_seconds,
                };
                match api::create(&self.client, &body).await? {
                    Some(vm) => vm,
                    // The slug is taken: a racing create of the same sandbox.
                    None => self.lookup(&req.sandbox_id).await?.ok_or_else(|| {
                        AdapterError::transient(format!(
                            "create VM: Freestyle says the slug {slug} is taken, but the VM is not ours"
                        ))
                    })?,
                }
            }
        };
        if state(vm.state.as_deref()) == InstanceState::Failed {
            return Err(AdapterError::permanent(format!(
                "Freestyle VM {} failed",
                vm.id
            )));
        }
        self.wait_state(&vm.id, "running", self.settings.ready_timeout)
            .await?;
        if !req.env.is_empty() {
            self.write_env(&vm.id, &req.env).await?;
        }
        Ok(req.running(vm.id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        match self.lookup(sandbox_id).await? {
            Some(vm) => api::delete(&self.client, &vm.id).await,
            None => Ok(()),
        }
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(self
            .lookup(sandbox_id)
            .await?
            .as_ref()
            .and_then(Self::instance))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        Ok(api::list(&self.client)
            .await?
            .iter()
            .filter(|vm| {
                vm.metadata.get(META_INSTALLATION).map(String::as_str)
                    == Some(installation.as_str())
            })
            .filter_map(Self::instance)
            .collect())
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        let started = Instant::now();
        if req.command.first().is_none_or(String::is_empty) {
            return Err(AdapterError::invalid_field("command", "command is empty"));
        }
        if let Some(cwd) = &req.cwd {
            check_path("cwd", cwd)?;
            match api::stat(&self.client, &at.backend_ref, cwd).await {
                Ok(e) if e.kind.as_deref() == Some("directory") => {}
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
        let stdin = stdin_of(req)?;
        let mut stdin_file = None;
        let mut inline = None;
        if let Some(input) = stdin {
            use base64::Engine as _;
            if input.len() <= STDIN_INLINE_MAX {
                inline = Some(base64::engine::general_purpose::STANDARD.encode(&input));
            } else {
                // Too big to send inline: a file the command reads and unlinks.
                let path = format!(
                    "/var/tmp/.differently-stdin-{}",
                    started.elapsed().as_nanos()
                );
                api::write(
                    &self.client,
                    &at.backend_ref,
                    &path,
                    Some(0o600),
                    reqwest::Body::from(input),
                )
                .await?;
                stdin_file = Some(path);
            }
        }
        let env_file = shell::quote(&self.settings.env_file);
        let mut script = format!("[ -r {env_file} ] && . {env_file}\n");
        script.push_str(&shell::script(
            &req.command,
            &shell::Wrap {
                env: Some(&req.env),
                cwd: req.cwd.as_deref(),
                stdin_file: stdin_file.as_deref(),
            },
        ));
        let ans = self
            .run(&at.backend_ref, &script, req.timeout(), inline, None)
            .await?;
        let mut out = CollectedOutput::default();
        out.push(&ExecEvent::Stdout(Bytes::from(
            ans.stdout.unwrap_or_default(),
        )));
        out.push(&ExecEvent::Stderr(Bytes::from(
            ans.stderr.unwrap_or_default(),
        )));
        // `statusCode: null` is a command the timeout killed.
        let code = ans.status_code.unwrap_or(124);
        Ok(out.into_result(code, millis(started.elapsed())))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        api::list(&self.client).await.map(drop)
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        check_path("path", path)?;
        api::write(
            &self.client,
            &at.backend_ref,
            path,
            mode,
            reqwest::Body::wrap_stream(body),
        )
        .await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        check_path("path", path)?;
        let resp = api::read(&self.client, &at.backend_ref, path, range).await?;
        let status = resp.status();
        let total_size = files::total_size(&resp);
        // Answered whole despite the Range: cut it here.
        let cut = range.filter(|_| status == reqwest::StatusCode::OK);
        let client = self.client.clone();
        let whole = resp
            .bytes_stream()
            .map(move |chunk| chunk.map_err(|e| client.transport_error("download", e)));
        let body = files::cut_to_range(whole, cut);
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
        files::list_levels(path, depth, |d| async move {
            let found = api::dir(client, id, &d).await?;
            Ok(found.iter().map(|e| entry(&d, e)).collect())
        })
        .await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        check_path("path", path)?;
        api::remove(&self.client, &at.backend_ref, path).await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        match self.state_of(at).await?.as_str() {
            "paused" => return Ok(()),
            "pausing" => {}
            _ => api::action(&self.client, &at.backend_ref, "pause").await?,
        }
        self.wait_state(&at.backend_ref, "paused", self.settings.ready_timeout)
            .await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.start(at).await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        match self.state_of(at).await?.as_str() {
            "stopped" => return Ok(()),
            "paused" | "pausing" => {
                // A paused VM runs no command: wake it to power it off.
                self.start(at).await?;
            }
            _ => {}
        }
        // v5 has no stop: power off as root (needs root, seen live). The call may break as
        // the VM goes down; the state says whether it worked.
        if let Err(e) = self
            .run(
                &at.backend_ref,
                "poweroff || systemctl poweroff",
                Duration::from_secs(30),
                None,
                Some("root"),
            )
            .await
        {
            tracing::debug!(error = %e, "freestyle: poweroff call ended with an error");
        }
        self.wait_state(&at.backend_ref, "stopped", self.settings.ready_timeout)
            .await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        match self.state_of(at).await?.as_str() {
            "running" => return Ok(()),
            "starting" => {}
            _ => api::action(&self.client, &at.backend_ref, "start").await?,
        }
        self.wait_state(&at.backend_ref, "running", self.settings.ready_timeout)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map() {
        assert_eq!(state(Some("running")), InstanceState::Running);
        assert_eq!(state(Some("pausing")), InstanceState::Paused);
        assert_eq!(state(Some("stopped")), InstanceState::Stopped);
        assert_eq!(state(Some("starting")), InstanceState::Pending);
    }

    #[test]
    fn limits_are_capacity_and_refused_keys_permanent() {
        let e = |status: u16, body: &str| {
            api::map_answer(
                "op",
                &crate::kit::ErrorAnswer {
                    status: reqwest::StatusCode::from_u16(status).unwrap(),
                    retry_after: None,
                    body: bytes::Bytes::from(body.to_owned()),
                },
            )
        };
        let c = e(429, r#"{"code":"RATE_LIMITED","message":"slow down"}"#);
        assert!(
            matches!(c, AdapterError::Capacity(_))
                && c.is_retryable()
                && c.to_string().contains("insufficient capacity"),
            "{c}"
        );
        let c = e(
            403,
            r#"{"code":"VM_LIMIT_EXCEEDED","message":"plan allows 10 VMs"}"#,
        );
        assert!(
            matches!(c, AdapterError::Capacity(_))
                && c.is_retryable()
                && c.to_string().contains("insufficient capacity"),
            "{c}"
        );
        let k = e(401, r#"{"error":"UNAUTHORIZED","message":"bad key"}"#);
        assert!(
            matches!(k, AdapterError::Permanent(_))
                && k.to_string().contains("refused the API key")
        );
        assert_eq!(e(404, "{}"), AdapterError::NotFound);
    }
}
