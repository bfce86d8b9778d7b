//! `AzureSessionsAdapter`: sandboxes as sessions of an Azure Container Apps dynamic sessions
//! pool of container type `Shell`, always an external pool (Microsoft's infrastructure; the
//! registry forces `trust: external`).
//!
//! A session has no create call and no tags: it is allocated by the first request that names
//! its `identifier`, and ends when it has been idle for the pool's cooldown or is deleted. So
//! the identifier carries Differently's installation and sandbox ids ([`ident`]); `create`
//! allocates it by writing the sandbox's environment file into it; and because any execution
//! or file call would silently allocate a fresh, empty session for an identifier that has
//! gone, every data call first asks `GET /session` and answers `not_found` for a session that
//! is not there.
//!
//! Exec is a bash `shellCommand` spelling the argument vector, environment and working
//! directory with every value quoted ([`shell`]); the exit code is the execution's answer.
//! Python and Node code-interpreter pools run code, not commands, and are refused at
//! registration (see `config`). Files go through the files API (bytes) plus short scripts
//! (paths outside the data directory, modes, listings).
//!
//! The access token (an Entra token for `https://dynamicsessions.io`), read through its
//! reference at call time, goes only to the pool's origin, as a bearer token.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::pool::VerifiedStatus;
use differently_core::SandboxId;

use crate::exec_output::CollectedOutput;
use crate::kit::paths::check_path;
use crate::kit::{check_command, millis, stdin_of, FromSettings};
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, ExecEvent,
    FileEntry, Instance, InstanceRef, InstanceState, Verification,
};

mod client;
pub mod config;
mod files;
mod ident;
mod shell;

pub use crate::settings::ConfigError;
pub use config::{AzureSessionsConfig, Settings};

/// What one script or command answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ran {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Output that reached `outputStreamsMaxLength` characters (Azure cut it there).
    pub stdout_cut: bool,
    pub stderr_cut: bool,
}

/// One Azure dynamic sessions pool.
pub struct AzureSessionsAdapter {
    settings: Settings,
    client: client::Client,
}

/// The exit code an execution answers. `status` carries the exit code as a decimal string in
/// the spec's shell examples; the shell executor's own `exitCode` is read first when present;
/// an `ExecutionTimeout` error is a command past its timeout (124).
fn exit_of(op: &str, e: &client::Execution) -> Result<i32, AdapterError> {
    let (code, message) = e.error.as_ref().map_or(("", ""), |r| {
        (r.error.code.as_str(), r.error.message.as_str())
    });
    let timed_out = code.to_ascii_lowercase().contains("timeout")
        || e.error_name
            .as_deref()
            .is_some_and(|n| n.eq_ignore_ascii_case("ExecutionTimeout"));
    if timed_out {
        return Ok(differently_core::exec::TIMEOUT_EXIT_CODE);
    }
    if let Some(c) = e
        .exit_code
        .and_then(|c| i32::try_from(c).ok())
        .filter(|c| *c >= 0)
    {
        return Ok(c);
    }
    if let Ok(c) = e.status.trim().parse::<i32>() {
        return Ok(c);
    }
    match e.status.as_str() {
        "Succeeded" => Ok(0),
        "Running" | "NotStarted" => Err(AdapterError::transient(format!(
            "{op}: Azure answered the execution {} before it ended",
            e.status
        ))),
        other => Err(AdapterError::permanent(format!(
            "{op}: Azure execution {other}: {code} {message}"
        ))),
    }
}

crate::kit::from_settings!(AzureSessionsAdapter, "azure_sessions", AzureSessionsConfig => Settings, |settings, credentials| {
    let client = client::Client::new(&settings, credentials)?;
    Ok(Self { settings, client })
});

impl AzureSessionsAdapter {
    /// The sandbox's environment file inside its session.
    fn env_path(sandbox: &SandboxId) -> String {
        format!(
            "/tmp/.differently/env-{}",
            sandbox.as_str().to_ascii_lowercase()
        )
    }

    /// The identifier of `at` and its sandbox, once `GET /session` says the session is there:
    /// any other call would allocate a new, empty one.
    async fn require(&self, at: &InstanceRef) -> Result<(String, SandboxId), AdapterError> {
        let Some((_, sandbox)) = ident::parse(&at.backend_ref) else {
            return Err(AdapterError::NotFound);
        };
        match self.client.session(&at.backend_ref).await? {
            Some(_) => Ok((at.backend_ref.clone(), sandbox)),
            None => Err(AdapterError::NotFound),
        }
    }

    /// Runs `script` in bash in the session of `identifier`, for up to `timeout`.
    pub(crate) async fn run(
        &self,
        identifier: &str,
        op: &str,
        script: String,
        stdin: Option<String>,
        timeout: Duration,
    ) -> Result<Ran, AdapterError> {
        let max = self.settings.output_max_length;
        let body = client::ExecutionRequest {
            code_input_type: "Inline",
            execution_type: "Synchronous",
            shell_command: script,
            stdin,
            timeout_in_seconds: timeout.as_secs().max(1),
            output_streams_max_length: max,
        };
        let http_timeout = timeout + self.settings.request_timeout;
        let done = self.client.execute(identifier, &body, http_timeout).await?;
        let exit_code = exit_of(op, &done)?;
        let result = done.result.unwrap_or_default();
        let cut = |s: &str| s.chars().count() as u64 >= max;
        Ok(Ran {
            exit_code,
            stdout_cut: cut(&result.stdout),
            stderr_cut: cut(&result.stderr),
            stdout: result.stdout,
            stderr: result.stderr,
        })
    }

    /// Runs one of the adapter's own scripts (no stdin, the request timeout).
    pub(crate) async fn script(
        &self,
        identifier: &str,
        op: &str,
        script: String,
    ) -> Result<Ran, AdapterError> {
        let timeout = self.settings.request_timeout.min(self.settings.max_exec);
        self.run(identifier, op, script, None, timeout).await
    }

    fn instance(identifier: &str) -> Option<Instance> {
        let (_, sandbox_id) = ident::parse(identifier)?;
        Some(Instance {
            backend_ref: identifier.to_owned(),
            sandbox_id,
            state: InstanceState::Running,
        })
    }

    /// Every session of ours in the pool, with the ids its identifier carries.
    async fn ours(&self) -> Result<Vec<(String, InstallationId, SandboxId)>, AdapterError> {
        Ok(self
            .client
            .list_sessions()
            .await?
            .into_iter()
            .filter_map(|s| {
                let (i, sbx) = ident::parse(&s.identifier)?;
                Some((s.identifier, i, sbx))
            })
            .collect())
    }
}

#[async_trait]
impl Adapter for AzureSessionsAdapter {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    /// Exec and files; nothing else has an API (see docs/providers.md).
    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::Exec, Capability::Files]
    }

    /// Output comes back as JSON strings; stderr is apart.
    fn exec_fidelity(&self) -> crate::ExecFidelity {
        crate::ExecFidelity::TEXT
    }

    fn verification(&self) -> Verification {
        Verification::new(
            VerifiedStatus::FakeOnly,
            "tested only against a fake session pool written from the 2025-10-02-preview data-plane spec and Azure's docs",
        )
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        if req.from_snapshot.is_some() {
            return Err(AdapterError::Unsupported(
                "snapshots: Azure dynamic sessions have no snapshots to restore from".to_owned(),
            ));
        }
        if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(AdapterError::invalid_field(
                "template",
                "an Azure session pool runs the one image of its container type; templates are not supported",
            ));
        }
        if let Err(e) = differently_core::sandbox::validate_env_names(&req.env) {
            return Err(AdapterError::invalid_field("env", e.to_string()));
        }
        let id = ident::identifier(&req.installation_id, &req.sandbox_id);
        let existed = self.client.session(&id).await?.is_some();
        // Written on every create, so a create redelivered after the session was allocated
        // but before its environment was written still leaves the environment in place.
        let script = shell::write_env_script(&Self::env_path(&req.sandbox_id));
        let timeout = self.settings.request_timeout.min(self.settings.max_exec);
        let env = Some(shell::env_file(&req.env));
        let ran = match self.run(&id, "create", script, env, timeout).await {
            Err(AdapterError::NotFound) if !existed => {
                return Err(AdapterError::capacity(
                    "create: the session pool allocates no more sessions (Azure answers 404 past its maxConcurrentSessions)",
                    None,
                ))
            }
            other => other?,
        };
        if ran.exit_code != 0 {
            return Err(AdapterError::permanent(format!(
                "create: writing the sandbox environment failed (exit {}): {}",
                ran.exit_code, ran.stderr
            )));
        }
        Ok(req.running(id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        for (identifier, _, sbx) in self.ours().await? {
            if &sbx == sandbox_id {
                self.client.delete_session(&identifier).await?;
            }
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        Ok(self
            .ours()
            .await?
            .into_iter()
            .find(|(_, _, sbx)| sbx == sandbox_id)
            .and_then(|(identifier, _, _)| Self::instance(&identifier)))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        Ok(self
            .ours()
            .await?
            .into_iter()
            .filter(|(_, i, _)| i == installation)
            .filter_map(|(identifier, _, _)| Self::instance(&identifier))
            .collect())
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        let started = Instant::now();
        check_command(req)?;
        let timeout = req.timeout();
        if timeout > self.settings.max_exec {
            return Err(AdapterError::invalid_field(
                "timeoutSeconds",
                format!(
                    "this Azure session pool runs a command for at most {} s (maxExecSeconds)",
                    self.settings.max_exec.as_secs()
                ),
            ));
        }
        if let Some(cwd) = &req.cwd {
            check_path("cwd", cwd)?;
        }
        let stdin = match stdin_of(req)? {
            None => None,
            Some(bytes) => Some(String::from_utf8(bytes).map_err(|_| {
                AdapterError::invalid_field(
                    "stdinBase64",
                    "Azure takes stdin as a JSON string: it must be UTF-8 text",
                )
            })?),
        };
        let (id, sandbox) = self.require(at).await?;
        let script = shell::exec_script(
            &Self::env_path(&sandbox),
            &req.env,
            req.cwd.as_deref(),
            &req.command,
        );
        let ran = self.run(&id, "exec", script, stdin, timeout).await?;
        if req.cwd.is_some() && ran.exit_code == shell::CWD_EXIT && ran.stderr == shell::CWD_MARKER
        {
            return Err(AdapterError::invalid_field(
                "cwd",
                "exec: the cwd does not exist in the sandbox",
            ));
        }
        let mut out = CollectedOutput::default();
        out.push(&ExecEvent::Stdout(Bytes::from(ran.stdout)));
        out.push(&ExecEvent::Stderr(Bytes::from(ran.stderr)));
        let mut result = out.into_result(ran.exit_code, millis(started.elapsed()));
        result.stdout_truncated |= ran.stdout_cut;
        result.stderr_truncated |= ran.stderr_cut;
        Ok(result)
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.client.ping().await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        check_path("path", path)?;
        let (id, _) = self.require(at).await?;
        let too_big = "upload: Azure's files API takes files up to 128 MB";
        let data = crate::files::read_whole(body, files::UPLOAD_LIMIT, too_big).await?;
        files::upload(self, &id, path, mode, Bytes::from(data)).await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        check_path("path", path)?;
        let (id, _) = self.require(at).await?;
        files::download(self, &id, path, range).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        check_path("path", path)?;
        let (id, _) = self.require(at).await?;
        files::list(self, &id, path, depth).await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        check_path("path", path)?;
        let (id, _) = self.require(at).await?;
        files::remove(self, &id, path).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(v: serde_json::Value) -> client::Execution {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn exit_codes_come_from_the_answer() {
        let e = |v| exit_of("op", &execution(v));
        assert_eq!(e(serde_json::json!({"status": "3"})).unwrap(), 3);
        assert_eq!(e(serde_json::json!({"status": "Succeeded"})).unwrap(), 0);
        assert_eq!(
            e(serde_json::json!({"status": "Succeeded", "exitCode": 2})).unwrap(),
            2
        );
        assert_eq!(
            e(serde_json::json!({"status": "Failed", "error": {"error": {"code": "ExecutionTimeout", "message": "m"}}}))
                .unwrap(),
            124
        );
        assert_eq!(
            e(serde_json::json!({"status": "Failed", "errorName": "ExecutionTimeout", "exitCode": -1}))
                .unwrap(),
            124
        );
        assert!(matches!(
            e(
                serde_json::json!({"status": "Failed", "error": {"error": {"code": "CommandStartError", "message": "m"}}})
            ),
            Err(AdapterError::Permanent(_))
        ));
        assert!(e(serde_json::json!({"status": "Running"}))
            .unwrap_err()
            .is_retryable());
    }
}
