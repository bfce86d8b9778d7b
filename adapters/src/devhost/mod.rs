//! `DevhostAdapter`: sandboxes as directories on the local machine, for `differently dev`.
//!
//! **Isolation.** With `isolation = "auto"` (the default) or `"bwrap"`, every command runs
//! under bubblewrap with its own mount, PID, IPC, UTS and network namespaces: the sandbox
//! directory is its `/` (its `/tmp`, `/work`, `/home` are directories of it), the host's
//! `/usr`, `/bin`, `/sbin`, `/lib*` and `/etc` are mounted read-only, `/proc` and `/dev` are
//! its own, and it sees no host process and no network. The files API works on the same
//! filesystem: writes below the read-only host directories (and `/proc`, `/dev`) are refused
//! as [`PathProblem::ReadOnly`], reads there show the host's files as commands see them.
//! Without `bwrap` on `PATH`, commands are refused with an error naming the Debian package
//! `bubblewrap`; they never silently run unisolated. Only an explicit `isolation = "none"`
//! runs commands as plain local processes (the local user, the host's `/`, the sandbox
//! directory only as their working directory and `HOME`), with a warning logged and
//! [`DevhostAdapter::isolation`] answering `"none"`. Never configure this adapter for a pool
//! that serves untrusted tenants.
//!
//! Each sandbox is `<root>/<sandbox_id>/` holding `.differently.json` (sandbox id,
//! installation id, creation time, env): that file is the instance's tag, and the backend ref
//! is the sandbox id. `create` is idempotent (an existing tagged directory is the instance),
//! `delete` kills the sandbox's processes and removes the directory, `find` and `list` read the
//! tags under `root`. There is no `lifecycle.stop` and, under bubblewrap (no network), no
//! `ports.expose`: the API answers them 501 `unsupported_operation`.
//!
//! Exec runs a real process in its own process group: clean environment (`PATH` from the host,
//! `HOME` = the sandbox directory, `LANG=C.UTF-8`, then the sandbox's env from create, then
//! the request's env), cwd relative to the sandbox directory (`..` is refused), stdin from
//! `stdin`/`stdinBase64`. Streamed exec sends output as it is read (64 KiB reads into the
//! caller's bounded channel, so a slow reader blocks the command on its pipe); a closed channel
//! kills the process group. On timeout the whole group is killed with SIGKILL and the exit code
//! is 124. A missing program is exit 127, a program that cannot be executed 126, a process
//! killed by signal N is 128+N. `exec` (not streamed) keeps 1 MiB of each stream and sets the
//! `…Truncated` flag beyond it.
//!
//! A background process (`process`) is the same command with its stdin a pipe fed while it
//! runs (`exec.stdin`; closing it is end of input), its signals sent to its process group,
//! and no timeout unless it asks for one; a terminal process is the PTY's.
//!
//! Every process group started in a sandbox is recorded as `<root>/.run/<sandbox>/<pgid>`, so
//! `pause` (SIGSTOP to every group), `resume` (SIGCONT) and `delete` (SIGKILL) reach processes
//! started by another OS process (the API runs commands, a worker pauses them). A paused
//! sandbox carries `<root>/.run/<sandbox>/paused` and refuses exec.
//!
//! Snapshots are tar archives of the sandbox directory (`<root>/.snapshots/<id>.tar`, without
//! the tag); `create` with `from_snapshot` unpacks one before tagging. Files are read and
//! written below the sandbox directory through descriptors ([`crate::local_fs`]): a symlink
//! is followed as the sandbox sees it and never out of the directory.

mod exec;
mod process;
mod pty;

use exec::*;
use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use differently_core::exec::{ExecRequest, TIMEOUT_EXIT_CODE};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::error::{PathProblem, Reason};
use crate::exec_output::millis;
use crate::local_fs::{self, io_err};
use crate::local_pty;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, InstanceState, PtyInput, PtyRequest,
    PtySignal, SnapshotInfo,
};

/// Name of the tag file inside each sandbox directory.
pub use crate::local_fs::TAG_FILE;
/// `PATH` for commands when the host has none.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How long to wait for pipes to close after the group was killed (a process that left the
/// group may still hold them).
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// Read size from a child's pipes and from files.
const CHUNK: usize = 64 * 1024;
/// Directory under `root` with process-group records per sandbox.
const RUN_DIR: &str = ".run";
/// Directory under `root` holding snapshot archives.
const SNAPSHOT_DIR: &str = ".snapshots";
/// Marker file of a paused sandbox (inside its run directory).
const PAUSED_MARKER: &str = "paused";
/// Host directories mounted read-only into an isolated command's view (when the host has
/// them), in the order they are mounted.
const READ_ONLY_MOUNTS: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"];
/// Directories an isolated command gets fresh from bubblewrap: nothing the files API can
/// reach.
const OWN_MOUNTS: [&str; 2] = ["/proc", "/dev"];
/// Why commands do not run when bubblewrap is wanted but missing, for the error and the log.
const NO_BWRAP: &str = "exec (devhost isolates commands with bubblewrap, and `bwrap` is not \
on PATH: install the Debian package `bubblewrap`, or set isolation = \"none\" in the pool's \
settings to run commands unisolated as the local user)";

/// How commands are isolated (the `isolation` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IsolationMode {
    /// Under bubblewrap; without `bwrap` on `PATH` commands are refused (never run
    /// unisolated). The same as `Bwrap`, kept as the default and for existing configs.
    #[default]
    Auto,
    /// Under bubblewrap; without `bwrap` on `PATH` commands are refused.
    Bwrap,
    /// Plain local processes, on purpose: the host's whole filesystem is theirs.
    None,
}

/// How this adapter runs commands, decided once at construction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Runner {
    /// Under bubblewrap at this path.
    Bwrap(PathBuf),
    /// Bubblewrap was wanted and is not installed: commands are refused.
    MissingBwrap,
    /// Plain local processes (`isolation = "none"`).
    Plain,
}

/// Where a sandbox path lies in an isolated command's view of the filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// In the sandbox directory.
    Sandbox,
    /// Under a host directory mounted read-only.
    HostReadOnly,
    /// Under `/proc` or `/dev`, which exist only inside a running command.
    Own,
}

/// Settings of a `devhost` pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DevhostConfig {
    /// Directory holding one subdirectory per sandbox.
    pub root: PathBuf,
    /// Isolation of commands; see the module docs.
    pub isolation: IsolationMode,
}

impl Default for DevhostConfig {
    fn default() -> Self {
        Self {
            root: std::env::temp_dir().join("differently-devhost"),
            isolation: IsolationMode::Auto,
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
    /// The sandbox's env from create; applied under the request's env.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Local-directory backend; see the module docs.
#[derive(Debug, Clone)]
pub struct DevhostAdapter {
    config: DevhostConfig,
    runner: Runner,
    /// Path of util-linux `setsid`, which gives a terminal's program its own session and
    /// controlling terminal; without it there is no `exec.pty`.
    setsid: Option<PathBuf>,
    /// Path of a coreutils `env` that takes `--default-signal` (8.31+). Commands start through
    /// it so they get default signal dispositions, not the ones this process inherited: a
    /// control plane started in the background (`differently dev &`, `nohup`) ignores INT,
    /// QUIT or HUP, and without this every command would too (^C on a terminal would
    /// interrupt nothing). Without such an `env`, commands inherit as before.
    default_signals: Option<PathBuf>,
}

/// `env` from `PATH` if it resets signal dispositions (`--default-signal`).
fn env_with_default_signals() -> Option<PathBuf> {
    let env = which("env")?;
    let ok = std::process::Command::new(&env)
        .args(["--default-signal", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(env)
}

/// Finds `program` on the host `PATH`.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

// Never refuses: every setting already has its type.
crate::kit::from_settings!(DevhostAdapter, "devhost", DevhostConfig, infallible);

impl DevhostAdapter {
    /// An adapter rooted at `config.root` (created on first use). Unless `isolation` is
    /// `"none"`, commands run under bubblewrap or, without `bwrap` on `PATH`, not at all.
    pub fn new(config: DevhostConfig) -> Self {
        let runner = match config.isolation {
            IsolationMode::None => {
                tracing::warn!(
                    root = %config.root.display(),
                    "devhost: isolation = \"none\": commands run UNISOLATED as the local user \
                     and see the host's whole filesystem; every key holder of this pool can \
                     read and write what this user can"
                );
                Runner::Plain
            }
            IsolationMode::Auto | IsolationMode::Bwrap => match which("bwrap") {
                Some(path) => Runner::Bwrap(path),
                None => {
                    tracing::error!(root = %config.root.display(), "devhost: commands are refused: {NO_BWRAP}");
                    Runner::MissingBwrap
                }
            },
        };
        Self {
            config,
            runner,
            setsid: which("setsid"),
            default_signals: env_with_default_signals(),
        }
    }

    /// `"none"` when commands run as plain local processes (`isolation = "none"`), `"bwrap"`
    /// otherwise: under bubblewrap, or refused when it is missing. Nothing else.
    pub fn isolation(&self) -> &'static str {
        match self.runner {
            Runner::Plain => "none",
            Runner::Bwrap(_) | Runner::MissingBwrap => "bwrap",
        }
    }

    /// The isolation a pool with these settings reports ([`DevhostAdapter::isolation`]),
    /// for reports that have the settings rather than the adapter. Settings that do not
    /// parse report nothing.
    pub fn isolation_of(settings: &serde_json::Value) -> Option<&'static str> {
        let config: DevhostConfig = if settings.is_null() {
            DevhostConfig::default()
        } else {
            serde_json::from_value(settings.clone()).ok()?
        };
        Some(match config.isolation {
            IsolationMode::None => "none",
            IsolationMode::Auto | IsolationMode::Bwrap => "bwrap",
        })
    }

    /// Whether files are served as an isolated command sees them (read-only host mounts).
    fn isolated_view(&self) -> bool {
        !matches!(self.runner, Runner::Plain)
    }

    /// Where `path` lies in an isolated command's view; everything is the sandbox's when
    /// commands are not isolated.
    fn side(&self, path: &str) -> Side {
        if !self.isolated_view() {
            return Side::Sandbox;
        }
        let Some(Component::Normal(first)) = Path::new(path)
            .components()
            .find(|c| !matches!(c, Component::RootDir | Component::CurDir))
        else {
            return Side::Sandbox;
        };
        let top = Path::new("/").join(first);
        if OWN_MOUNTS.iter().any(|m| Path::new(m) == top) {
            Side::Own
        } else if READ_ONLY_MOUNTS.iter().any(|m| Path::new(m) == top) && top.exists() {
            // `--ro-bind-try` mounts only what the host has.
            Side::HostReadOnly
        } else {
            Side::Sandbox
        }
    }

    /// Refuses a write to `path` where an isolated command could not write either.
    fn writable(&self, path: &str) -> Result<(), AdapterError> {
        match self.side(path) {
            Side::Sandbox => Ok(()),
            Side::HostReadOnly | Side::Own => {
                Err(AdapterError::bad_path(path, PathProblem::ReadOnly))
            }
        }
    }

    /// Where a read of `path` is served from: the sandbox directory, or the host's `/` for
    /// a path under a read-only mount whose real location stays under one (a host symlink to
    /// elsewhere is not something a command sees).
    fn read_base(&self, sandbox_dir: &Path, path: &str) -> Result<PathBuf, AdapterError> {
        match self.side(path) {
            Side::Sandbox => Ok(sandbox_dir.to_path_buf()),
            Side::Own => Err(AdapterError::Unsupported(format!(
                "files under {} (it exists only inside a running command)",
                path
            ))),
            Side::HostReadOnly => {
                local_fs::components(path)?;
                if let Ok(real) = std::fs::canonicalize(path) {
                    let inside = READ_ONLY_MOUNTS
                        .iter()
                        .any(|m| std::fs::canonicalize(m).is_ok_and(|m| real.starts_with(m)));
                    if !inside {
                        return Err(AdapterError::PathNotFound(path.to_owned()));
                    }
                }
                Ok(PathBuf::from("/"))
            }
        }
    }

    /// The directory of a sandbox, whether or not it exists.
    pub fn sandbox_dir(&self, sandbox_id: &SandboxId) -> PathBuf {
        // Sandbox ids are validated ULIDs with a prefix: safe as a single path component.
        self.config.root.join(sandbox_id.as_str())
    }

    fn run_dir(&self, sandbox_id: &SandboxId) -> PathBuf {
        self.config.root.join(RUN_DIR).join(sandbox_id.as_str())
    }

    fn snapshot_path(&self, snapshot: &str) -> Result<PathBuf, AdapterError> {
        let ok = !snapshot.is_empty()
            && snapshot
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(AdapterError::permanent(format!(
                "devhost: bad snapshot ref {snapshot:?}"
            )));
        }
        Ok(self
            .config
            .root
            .join(SNAPSHOT_DIR)
            .join(format!("{snapshot}.tar")))
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

    /// The tag of an existing instance, or `NotFound`.
    async fn existing(&self, at: &InstanceRef) -> Result<(PathBuf, DevhostTag), AdapterError> {
        let dir = self.sandbox_dir(&at.sandbox_id);
        match self.read_tag(&dir).await? {
            Some(tag) if tag.sandbox_id == at.sandbox_id => Ok((dir, tag)),
            _ => Err(AdapterError::NotFound),
        }
    }

    fn is_paused(&self, sandbox_id: &SandboxId) -> bool {
        self.run_dir(sandbox_id).join(PAUSED_MARKER).exists()
    }

    fn state_of(&self, sandbox_id: &SandboxId) -> InstanceState {
        if self.is_paused(sandbox_id) {
            InstanceState::Paused
        } else {
            InstanceState::Running
        }
    }

    fn instance(&self, sandbox_id: &SandboxId) -> Instance {
        Instance {
            backend_ref: sandbox_id.as_str().to_owned(),
            sandbox_id: sandbox_id.clone(),
            state: self.state_of(sandbox_id),
        }
    }

    /// Sends `signal` to every recorded process group of the sandbox; forgets groups that
    /// no longer exist.
    async fn signal_groups(
        &self,
        sandbox_id: &SandboxId,
        signal: &str,
    ) -> Result<(), AdapterError> {
        let dir = self.run_dir(sandbox_id);
        let mut entries = match tokio::fs::read_dir(&dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("read run dir", e)),
        };
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_err("read run dir", e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(pgid) = name.parse::<u32>() else {
                continue;
            };
            if !signal_group(pgid, signal).await {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Adapter for DevhostAdapter {
    fn kind(&self) -> &'static str {
        "devhost"
    }

    fn capabilities(&self) -> Vec<Capability> {
        let mut caps = vec![
            Capability::Exec,
            Capability::ExecStream,
            // A background process's stdin is a pipe fed while it runs (`process`).
            Capability::ExecStdin,
            Capability::Files,
            Capability::LifecyclePause,
            Capability::Snapshots,
            // An instance is a directory and a tag: one made ahead of time with no env is
            // claimed as is (no backend-side expiry to move).
            Capability::Warm,
        ];
        if self.setsid.is_some() {
            caps.push(Capability::ExecPty);
        }
        if self.runner == Runner::Plain {
            // Without a network namespace a port is reachable on the host.
            caps.push(Capability::PortsExpose);
        }
        caps
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        let dir = self.sandbox_dir(&req.sandbox_id);
        if let Some(tag) = self.read_tag(&dir).await? {
            return Ok(self.instance(&tag.sandbox_id));
        }
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| io_err("create sandbox directory", e))?;
        if self.isolated_view() {
            ensure_tmp(&dir).await?;
        }
        if let Some(snapshot) = &req.from_snapshot {
            let archive = self.snapshot_path(snapshot)?;
            if !archive.exists() {
                return Err(AdapterError::permanent(format!(
                    "devhost: snapshot {snapshot} does not exist"
                )));
            }
            tar(&[
                "-C".as_ref(),
                dir.as_os_str(),
                "-xf".as_ref(),
                archive.as_os_str(),
            ])
            .await?;
        }
        let tag = DevhostTag {
            sandbox_id: req.sandbox_id.clone(),
            installation_id: req.installation_id.clone(),
            created_at: Utc::now(),
            env: req.env.clone(),
        };
        let json = serde_json::to_vec_pretty(&tag).map_err(|e| {
            AdapterError::Permanent(Reason::caused_by(format!("devhost: encode tag: {e}"), e))
        })?;
        // Write then rename, so a reader never sees a half-written tag.
        let tmp = dir.join(format!("{TAG_FILE}.tmp{}", std::process::id()));
        tokio::fs::write(&tmp, json)
            .await
            .map_err(|e| io_err("write tag", e))?;
        tokio::fs::rename(&tmp, dir.join(TAG_FILE))
            .await
            .map_err(|e| io_err("write tag", e))?;
        Ok(self.instance(&req.sandbox_id))
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        // Resume first so stopped processes can die, then kill every group.
        self.signal_groups(sandbox_id, "-CONT").await?;
        self.signal_groups(sandbox_id, "-KILL").await?;
        match tokio::fs::remove_dir_all(self.run_dir(sandbox_id)).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove run directory", e)),
        }
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
            .map(|t| self.instance(&t.sandbox_id)))
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
                    found.push(self.instance(&tag.sandbox_id));
                }
            }
        }
        found.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        Ok(found)
    }

    async fn health(&self) -> Result<(), AdapterError> {
        tokio::fs::create_dir_all(&self.config.root)
            .await
            .map_err(|e| {
                AdapterError::Unavailable(Reason::caused_by(format!("devhost root: {e}"), e))
            })
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        self.run(at, req, out).await
    }

    async fn pty(
        &self,
        at: &InstanceRef,
        req: &PtyRequest,
        input: mpsc::Receiver<PtyInput>,
        out: mpsc::Sender<Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        self.run_pty(at, req, input, out).await
    }

    async fn process(
        &self,
        at: &InstanceRef,
        spec: &crate::process::ProcessSpec,
        input: mpsc::Receiver<crate::process::ProcessInput>,
        out: mpsc::Sender<ExecEvent>,
        go: crate::go_ahead::GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        self.run_process(at, spec, input, out, go).await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        let (dir, _) = self.existing(at).await?;
        self.writable(path)?;
        local_fs::upload(&dir, path, mode, body).await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        let (dir, _) = self.existing(at).await?;
        local_fs::download(&self.read_base(&dir, path)?, path, range).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        let (dir, _) = self.existing(at).await?;
        local_fs::list(&self.read_base(&dir, path)?, path, depth).await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        let (dir, _) = self.existing(at).await?;
        self.writable(path)?;
        local_fs::delete(&dir, path).await
    }

    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        let (dir, _) = self.existing(at).await?;
        if let Err(refused) = self.writable(path) {
            // A read-only host directory that is there is "already there", as `mkdir -p`
            // in the sandbox would find it; only a new one is refused.
            let there = self
                .read_base(&dir, path)
                .ok()
                .and_then(|base| local_fs::metadata_in(&base, path))
                .is_some_and(|m| m.is_dir());
            return if there { Ok(false) } else { Err(refused) };
        }
        local_fs::make_dir(&dir, path, mode).await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.existing(at).await?;
        let run = self.run_dir(&at.sandbox_id);
        tokio::fs::create_dir_all(&run)
            .await
            .map_err(|e| io_err("create run directory", e))?;
        // Marker first: no new command starts once the groups are being stopped.
        tokio::fs::write(run.join(PAUSED_MARKER), b"")
            .await
            .map_err(|e| io_err("write pause marker", e))?;
        self.signal_groups(&at.sandbox_id, "-STOP").await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        self.existing(at).await?;
        self.signal_groups(&at.sandbox_id, "-CONT").await?;
        match tokio::fs::remove_file(self.run_dir(&at.sandbox_id).join(PAUSED_MARKER)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove pause marker", e)),
        }
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        let (dir, _) = self.existing(at).await?;
        let archive = self.snapshot_path(snapshot_id)?;
        if !archive.exists() {
            let parent = archive
                .parent()
                .ok_or_else(|| AdapterError::permanent("snapshot dir"))?;
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| io_err("create snapshot directory", e))?;
            let tmp = archive.with_extension(format!("tar.tmp{}", std::process::id()));
            let exclude = format!("--exclude=./{TAG_FILE}");
            tar(&[
                "-C".as_ref(),
                dir.as_os_str(),
                exclude.as_ref(),
                "-cf".as_ref(),
                tmp.as_os_str(),
                ".".as_ref(),
            ])
            .await?;
            tokio::fs::rename(&tmp, &archive)
                .await
                .map_err(|e| io_err("store snapshot", e))?;
        }
        Ok(SnapshotInfo {
            backend_ref: snapshot_id.to_owned(),
            ready: true,
        })
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        match tokio::fs::remove_file(self.snapshot_path(backend_ref)?).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("delete snapshot", e)),
        }
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        _expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        if self.runner != Runner::Plain {
            return Err(AdapterError::Unsupported(
                "ports.expose (devhost runs commands under bubblewrap with no network)".to_owned(),
            ));
        }
        self.existing(at).await?;
        // Processes share the host network: the port is on loopback and never expires.
        Ok(Endpoint {
            url: format!("http://127.0.0.1:{port}"),
            expires_at: None,
        })
    }
}

#[cfg(test)]
mod tests;
