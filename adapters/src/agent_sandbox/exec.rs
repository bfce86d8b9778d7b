//! Exec over the runtime's `/execute`: the request's argv, env, cwd, stdin and timeout
//! wrapped in a `sh -c` script (see `script.rs`), and the runtime's answer read back,
//! including its own failures (exit code 1 with `Failed to execute command: …`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};

use super::runtime::{Executed, RUNTIME_FAILURE};
use super::script::{self, Exec};
use super::AgentSandboxAdapter;
use crate::exec_output::{check_command, millis, stdin_of, CollectedOutput};
use crate::{AdapterError, ExecEvent, InstanceRef};

/// Slack on top of a command's own timeout before the HTTP call gives up (the `timeout`
/// wrapper's 2 s KILL grace, the runtime's round trip).
const SLACK: Duration = Duration::from_secs(5);

impl AgentSandboxAdapter {
    /// Runs one `sh -c` script in the sandbox, its timeout `secs`.
    pub(super) async fn run_script(
        &self,
        at: &InstanceRef,
        script: &str,
        secs: u64,
    ) -> Result<Executed, AdapterError> {
        let line = script::sh_line(script);
        let wait = Duration::from_secs(secs) + SLACK + self.settings.request_timeout;
        match self.runtime.execute(&at.backend_ref, &line, wait).await {
            Ok(done) => Ok(done),
            Err(c) => Err(self.call_error(&at.backend_ref, c).await),
        }
    }

    /// Puts `bytes` where a script can read them (under the base directory); its path.
    async fn stage_stdin(&self, at: &InstanceRef, bytes: Vec<u8>) -> Result<String, AdapterError> {
        let file = format!(".differently-stdin-{:016x}", super::runtime::rand_u64());
        let base = &self.settings.base_dir;
        // Under the base directory (the only place the runtime writes); `/tmp` when that is
        // the whole file system.
        let (rel, path) = if base == "/" {
            (format!("tmp/{file}"), format!("/tmp/{file}"))
        } else {
            (file.clone(), format!("{base}/{file}"))
        };
        match self
            .runtime
            .upload(&at.backend_ref, &rel, &path, Bytes::from(bytes))
            .await
        {
            Ok(()) => Ok(path),
            Err(c) => Err(self.call_error(&at.backend_ref, c).await),
        }
    }

    pub(super) async fn run_exec(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
    ) -> Result<ExecResult, AdapterError> {
        let started = Instant::now();
        check_command(req)?;
        if let Some((k, _)) = req
            .env
            .iter()
            .find(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
        {
            return Err(AdapterError::invalid_field(
                "env",
                format!("`{k}` is not a variable name this runtime can set"),
            ));
        }
        if let Some(cwd) = &req.cwd {
            if !cwd.starts_with('/') || cwd.contains('\0') {
                return Err(AdapterError::invalid_field(
                    "cwd",
                    format!("`{cwd}` is not an absolute path"),
                ));
            }
        }
        let stdin_file = match stdin_of(req)? {
            Some(bytes) => Some(self.stage_stdin(at, bytes).await?),
            None => None,
        };
        let timeout = req.timeout();
        let secs = timeout.as_secs().max(1);
        let script = script::exec_script(&Exec {
            argv: &req.command,
            env: &req.env,
            cwd: req.cwd.as_deref(),
            stdin_file: stdin_file.as_deref(),
            timeout_secs: secs,
        });
        let done = self.run_script(at, &script, secs).await?;
        let exit_code = exit_code(&done, started.elapsed(), timeout)?;
        let mut out = CollectedOutput::default();
        out.push(&ExecEvent::Stdout(Bytes::from(done.stdout)));
        out.push(&ExecEvent::Stderr(Bytes::from(done.stderr)));
        Ok(out.into_result(exit_code, millis(started.elapsed())))
    }
}

/// The exit code the contract wants of the runtime's answer, or the error it means.
fn exit_code(done: &Executed, took: Duration, timeout: Duration) -> Result<i32, AdapterError> {
    if let Some(marker) = script::refusal(done.exit_code, &done.stderr) {
        return Err(match marker {
            script::NO_CWD => {
                AdapterError::invalid_field("cwd", "exec: the cwd does not exist in the sandbox")
            }
            other => AdapterError::permanent(format!("exec: {other}")),
        });
    }
    if done.exit_code == 1 && done.stdout.is_empty() {
        if let Some(why) = done.stderr.strip_prefix(RUNTIME_FAILURE) {
            // The runtime's own timeout (`SANDBOX_EXEC_TIMEOUT_SECONDS`) came first.
            if why.contains("timed out after") {
                return Ok(124);
            }
            if why.contains("codec can't decode") {
                return Err(AdapterError::permanent(
                    "exec: the command wrote output that is not UTF-8, which this runtime cannot return",
                ));
            }
            return Err(AdapterError::permanent(format!(
                "exec: the runtime could not run the command: {}",
                why.trim_end()
            )));
        }
    }
    Ok(match done.exit_code {
        // `timeout`'s own answer, or its KILL after the grace period.
        124 => 124,
        137 if took >= timeout => 124,
        // Python reports a child killed by signal n as -n.
        n if n < 0 => 128 + i32::try_from(-n).unwrap_or(0),
        n => i32::try_from(n).unwrap_or(i32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(code: i64, stdout: &str, stderr: &str) -> Executed {
        Executed {
            stdout: stdout.into(),
            stderr: stderr.into(),
            exit_code: code,
        }
    }

    #[test]
    fn runtime_answers_map_to_exit_codes_or_errors() {
        let t = Duration::from_secs(1);
        let quick = Duration::from_millis(10);
        assert_eq!(exit_code(&done(3, "", ""), quick, t), Ok(3));
        assert_eq!(exit_code(&done(-9, "", ""), quick, t), Ok(137));
        assert_eq!(
            exit_code(&done(137, "", ""), Duration::from_secs(3), t),
            Ok(124)
        );
        assert_eq!(exit_code(&done(137, "", ""), quick, t), Ok(137));
        let runtime_timeout =
            format!("{RUNTIME_FAILURE}Command '[...]' timed out after 300 seconds");
        assert_eq!(exit_code(&done(1, "", &runtime_timeout), quick, t), Ok(124));
        let bad = format!("{RUNTIME_FAILURE}'utf-8' codec can't decode byte 0xff");
        assert!(matches!(
            exit_code(&done(1, "", &bad), quick, t),
            Err(AdapterError::Permanent(_))
        ));
        // A command's own exit 1 that happens to print something else is left alone.
        assert_eq!(exit_code(&done(1, "", "oops"), quick, t), Ok(1));
        let cwd = exit_code(&done(199, "", script::NO_CWD), quick, t).unwrap_err();
        assert!(
            matches!(&cwd, AdapterError::Permanent(r) if r.field() == Some("cwd")),
            "{cwd:?}"
        );
    }
}
