//! `DevhostAdapter`: sandboxes as plain directories on the local machine, for `differently dev`.
//!
//! **No isolation. Development only.** Commands run as the local user, with the local user's
//! rights, on the local machine; the "sandbox" is just a working directory. Never configure this
//! adapter for a pool that serves untrusted tenants.
//!
//! Each sandbox is `<root>/<sandbox_id>/` holding `.differently.json` (sandbox id, installation
//! id, creation time): that file is the instance's tag, and the backend ref is the sandbox id.
//! `create` is idempotent (an existing tagged directory is the instance), `delete` removes the
//! directory, `find` and `list` read the tags under `root`.
//!
//! `exec` runs a real process in its own process group: clean environment (`PATH` from the host,
//! `HOME` = the sandbox directory, `LANG=C.UTF-8`, then the request's env), cwd relative to the
//! sandbox directory (`..` is refused), stdout and stderr each capped at 1 MiB. The call ends
//! when the process has exited and its output pipes have closed (a background child that keeps
//! them open keeps the exec running). On timeout the whole process group is killed with
//! SIGKILL and the exit code is 124. A missing program is exit 127, a program that cannot be
//! executed 126, a process killed by signal N is 128+N, as a shell reports them.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::exec::{ExecRequest, ExecResult, TIMEOUT_EXIT_CODE};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::{Adapter, AdapterError, CreateInstance, Instance, InstanceRef, InstanceState};

/// Name of the tag file inside each sandbox directory.
pub const TAG_FILE: &str = ".differently.json";
/// Cap on captured stdout and on captured stderr, each.
pub const OUTPUT_CAP_BYTES: usize = 1024 * 1024;
/// `PATH` for commands when the host has none.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How long to wait for pipes to close after the group was killed (a process that left the
/// group may still hold them).
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Settings of a `devhost` pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DevhostConfig {
    /// Directory holding one subdirectory per sandbox.
    pub root: PathBuf,
}

impl Default for DevhostConfig {
    fn default() -> Self {
        Self {
            root: std::env::temp_dir().join("differently-devhost"),
        }
    }
}

/// Contents of the tag file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DevhostTag {
    pub sandbox_id: SandboxId,
    pub installation_id: InstallationId,
    pub created_at: DateTime<Utc>,
}

/// Local-directory backend; see the module docs.
#[derive(Debug, Clone)]
pub struct DevhostAdapter {
    config: DevhostConfig,
}

impl DevhostAdapter {
    /// An adapter rooted at `config.root` (created on first use).
    pub fn new(config: DevhostConfig) -> Self {
        Self { config }
    }

    /// The directory of a sandbox, whether or not it exists.
    pub fn sandbox_dir(&self, sandbox_id: &SandboxId) -> PathBuf {
        // Sandbox ids are validated ULIDs with a prefix: safe as a single path component.
        self.config.root.join(sandbox_id.as_str())
    }

    async fn read_tag(&self, dir: &Path) -> Result<Option<DevhostTag>, AdapterError> {
        match tokio::fs::read(dir.join(TAG_FILE)).await {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(tag) => Ok(Some(tag)),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "ignoring bad devhost tag");
                    Ok(None)
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read tag", e)),
        }
    }
}

fn io_err(what: &str, e: io::Error) -> AdapterError {
    AdapterError::Transient(format!("devhost: {what}: {e}"))
}

fn instance(tag_sandbox: &SandboxId) -> Instance {
    Instance {
        backend_ref: tag_sandbox.as_str().to_owned(),
        sandbox_id: tag_sandbox.clone(),
        state: InstanceState::Running,
    }
}

/// The directory an exec runs in: `cwd` taken relative to the sandbox directory.
fn resolve_cwd(sandbox_dir: &Path, cwd: Option<&str>) -> Result<PathBuf, AdapterError> {
    let mut dir = sandbox_dir.to_path_buf();
    for c in Path::new(cwd.unwrap_or("/")).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => dir.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(AdapterError::Permanent(
                    "cwd may not contain `..`".to_owned(),
                ))
            }
        }
    }
    Ok(dir)
}

/// Output captured from one pipe.
#[derive(Debug, Default)]
struct Capture {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Reads `pipe` to the end, keeping the first `OUTPUT_CAP_BYTES` and discarding the rest so
/// the child never blocks on a full pipe.
async fn drain(mut pipe: impl AsyncRead + Unpin, into: Arc<Mutex<Capture>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut cap = into.lock().unwrap_or_else(|p| p.into_inner());
        let room = OUTPUT_CAP_BYTES.saturating_sub(cap.bytes.len());
        let keep = n.min(room);
        cap.bytes.extend_from_slice(&buf[..keep]);
        if keep < n {
            cap.truncated = true;
        }
    }
}

fn take(capture: &Arc<Mutex<Capture>>) -> (String, bool) {
    let cap = capture.lock().unwrap_or_else(|p| p.into_inner());
    (
        String::from_utf8_lossy(&cap.bytes).into_owned(),
        cap.truncated,
    )
}

/// Exit code as a shell reports it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// SIGKILLs every process in group `pgid`. `kill(1)` is used because this crate forbids
/// `unsafe` and so cannot call `kill(2)` itself.
async fn kill_group(pgid: u32) {
    let res = tokio::process::Command::new("kill")
        .args(["-9", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if let Err(e) = res {
        tracing::warn!(pgid, error = %e, "devhost: could not run kill(1)");
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl Adapter for DevhostAdapter {
    fn kind(&self) -> &'static str {
        "devhost"
    }

    fn capabilities(&self) -> Vec<String> {
        vec!["exec".to_owned()]
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        let dir = self.sandbox_dir(&req.sandbox_id);
        if let Some(tag) = self.read_tag(&dir).await? {
            return Ok(instance(&tag.sandbox_id));
        }
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| io_err("create sandbox directory", e))?;
        let tag = DevhostTag {
            sandbox_id: req.sandbox_id.clone(),
            installation_id: req.installation_id.clone(),
            created_at: Utc::now(),
        };
        let json = serde_json::to_vec_pretty(&tag)
            .map_err(|e| AdapterError::Permanent(format!("devhost: encode tag: {e}")))?;
        // Write then rename, so a reader never sees a half-written tag.
        let tmp = dir.join(format!("{TAG_FILE}.tmp{}", std::process::id()));
        tokio::fs::write(&tmp, json)
            .await
            .map_err(|e| io_err("write tag", e))?;
        tokio::fs::rename(&tmp, dir.join(TAG_FILE))
            .await
            .map_err(|e| io_err("write tag", e))?;
        Ok(instance(&req.sandbox_id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        match tokio::fs::remove_dir_all(self.sandbox_dir(sandbox_id)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove sandbox directory", e)),
        }
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        let tag = self.read_tag(&self.sandbox_dir(sandbox_id)).await?;
        Ok(tag
            .filter(|t| &t.sandbox_id == sandbox_id)
            .map(|t| instance(&t.sandbox_id)))
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        let mut entries = match tokio::fs::read_dir(&self.config.root).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list root", e)),
        };
        let mut found = Vec::new();
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_err("list root", e))?
        {
            if let Some(tag) = self.read_tag(&entry.path()).await? {
                if &tag.installation_id == installation {
                    found.push(instance(&tag.sandbox_id));
                }
            }
        }
        found.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        Ok(found)
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        let started = Instant::now();
        let sandbox_dir = self.sandbox_dir(&at.sandbox_id);
        if self.read_tag(&sandbox_dir).await?.is_none() {
            return Err(AdapterError::NotFound);
        }
        let cwd = resolve_cwd(&sandbox_dir, req.cwd.as_deref())?;
        if !tokio::fs::metadata(&cwd).await.is_ok_and(|m| m.is_dir()) {
            return Err(AdapterError::Permanent(format!(
                "cwd {} does not exist in the sandbox",
                req.cwd.as_deref().unwrap_or("/")
            )));
        }
        let Some((program, args)) = req.command.split_first() else {
            return Err(AdapterError::Permanent("command is empty".to_owned()));
        };

        let mut env = BTreeMap::new();
        env.insert(
            "PATH".to_owned(),
            std::env::var("PATH").unwrap_or_else(|_| FALLBACK_PATH.to_owned()),
        );
        env.insert(
            "HOME".to_owned(),
            sandbox_dir.to_string_lossy().into_owned(),
        );
        env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
        env.extend(req.env.clone());

        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&cwd)
            .env_clear()
            .envs(&env)
            .stdin(if req.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);

        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let (code, why) = match e.kind() {
                    io::ErrorKind::NotFound => (127, "command not found"),
                    io::ErrorKind::PermissionDenied => (126, "permission denied"),
                    _ => return Err(io_err(&format!("spawn {program}"), e)),
                };
                return Ok(ExecResult {
                    exit_code: code,
                    stdout: String::new(),
                    stderr: format!("devhost: {program}: {why}\n"),
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_ms: millis(started.elapsed()),
                });
            }
        };
        let pgid = child.id();

        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), req.stdin.clone()) {
            tokio::spawn(async move {
                // A child that exits without reading its stdin is not an error.
                let _ = pipe.write_all(input.as_bytes()).await;
                let _ = pipe.shutdown().await;
            });
        }
        let out = Arc::new(Mutex::new(Capture::default()));
        let err = Arc::new(Mutex::new(Capture::default()));
        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(tokio::spawn(drain(pipe, out.clone())));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(tokio::spawn(drain(pipe, err.clone())));
        }

        let finish = async {
            let status = child.wait().await;
            // Pop only finished readers, so the timeout path never polls a completed handle.
            while let Some(r) = readers.last_mut() {
                let _ = r.await;
                readers.pop();
            }
            status
        };
        let exit_code = match tokio::time::timeout(req.timeout(), finish).await {
            Ok(status) => exit_code(status.map_err(|e| io_err("wait", e))?),
            Err(_) => {
                match pgid {
                    Some(pgid) => kill_group(pgid).await,
                    None => {
                        let _ = child.start_kill();
                    }
                }
                let _ = tokio::time::timeout(DRAIN_GRACE, child.wait()).await;
                let _ = tokio::time::timeout(DRAIN_GRACE, async {
                    while let Some(r) = readers.last_mut() {
                        let _ = r.await;
                        readers.pop();
                    }
                })
                .await;
                for r in &readers {
                    r.abort();
                }
                TIMEOUT_EXIT_CODE
            }
        };
        let (stdout, stdout_truncated) = take(&out);
        let (stderr, stderr_truncated) = take(&err);
        Ok(ExecResult {
            exit_code,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            duration_ms: millis(started.elapsed()),
        })
    }

    async fn health(&self) -> Result<(), AdapterError> {
        tokio::fs::create_dir_all(&self.config.root)
            .await
            .map_err(|e| AdapterError::Unavailable(format!("devhost root: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_is_relative_to_the_sandbox_and_refuses_parent() {
        let base = Path::new("/r/sbx");
        assert_eq!(resolve_cwd(base, None).ok(), Some(base.to_path_buf()));
        assert_eq!(resolve_cwd(base, Some("/")).ok(), Some(base.to_path_buf()));
        assert_eq!(
            resolve_cwd(base, Some("/a/./b")).ok(),
            Some(base.join("a").join("b"))
        );
        assert!(matches!(
            resolve_cwd(base, Some("/a/../../etc")),
            Err(AdapterError::Permanent(_))
        ));
    }
}
