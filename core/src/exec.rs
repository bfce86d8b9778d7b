//! Exec request and result on the wire.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::capped::{CappedOutput, OUTPUT_CAP_BYTES};
use crate::FieldError;

/// Default and maximum time an exec may run.
pub const DEFAULT_EXEC_TIMEOUT_SECONDS: u64 = 60;
pub const MAX_EXEC_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// Exit code of a command that ran out of time, as `timeout(1)` reports it.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// Body of `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub stdin: Option<String>,
    /// Binary stdin, base64-encoded; exclusive with `stdin`.
    pub stdin_base64: Option<String>,
    pub timeout_seconds: Option<u64>,
    /// How `stdout`/`stderr` are returned: `utf8` (lossy, default) or `base64` (binary-safe).
    pub output_encoding: Option<OutputEncoding>,
}

/// Encoding of exec output in JSON answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    #[default]
    Utf8,
    Base64,
}

impl ExecRequest {
    /// Checks the request; the error names the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        validate_command(&self.command, &self.env, self.cwd.as_deref())?;
        if self.stdin.is_some() && self.stdin_base64.is_some() {
            return Err(FieldError::new(
                "stdinBase64",
                "give stdin or stdinBase64, not both",
            ));
        }
        validate_timeout(self.timeout_seconds)
    }

    /// The program name, which is all the audit log records of an exec.
    pub fn program(&self) -> &str {
        self.command.first().map(String::as_str).unwrap_or("")
    }

    /// The effective timeout.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_seconds.unwrap_or(DEFAULT_EXEC_TIMEOUT_SECONDS))
    }
}

/// Checks what every command that runs in a sandbox is given (exec's and a background
/// process's): a program, no NUL anywhere, env names as a sandbox's, an absolute `cwd`. The
/// error names the field.
pub fn validate_command(
    command: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<(), FieldError> {
    match command.first() {
        None => return Err(FieldError::new("command", "must name a program")),
        Some(p) if p.is_empty() => {
            return Err(FieldError::new("command[0]", "program name is empty"))
        }
        _ => {}
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(FieldError::new("command", "arguments may not contain NUL"));
    }
    crate::sandbox::validate_env_names(env)?;
    if let Some((k, _)) = env.iter().find(|(_, v)| v.contains('\0')) {
        return Err(FieldError::new(
            format!("env.{k}"),
            "values may not contain NUL",
        ));
    }
    if let Some(cwd) = cwd {
        if cwd.contains('\0') {
            return Err(FieldError::new("cwd", "may not contain NUL"));
        }
        if !cwd.starts_with('/') {
            return Err(FieldError::new("cwd", "must be an absolute path"));
        }
    }
    Ok(())
}

/// Checks a command's `timeoutSeconds`: 1 to [`MAX_EXEC_TIMEOUT_SECONDS`] when given.
pub fn validate_timeout(timeout_seconds: Option<u64>) -> Result<(), FieldError> {
    match timeout_seconds {
        Some(t) if t == 0 || t > MAX_EXEC_TIMEOUT_SECONDS => Err(FieldError::new(
            "timeoutSeconds",
            format!("must be between 1 and {MAX_EXEC_TIMEOUT_SECONDS}"),
        )),
        _ => Ok(()),
    }
}

/// Outcome of a finished exec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}
