//! The adapter contract: the [`Adapter`] trait every backend implements and the types its
//! calls carry. One file so a new adapter kind reads one place to learn what it must do.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::{Resources, SandboxId};
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::AdapterError;

pub use differently_core::capability::Capability;

/// What the backend is asked to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateInstance {
    pub sandbox_id: SandboxId,
    pub installation_id: InstallationId,
    pub template: Option<String>,
    pub resources: Resources,
    pub env: BTreeMap<String, String>,
    /// Backend-side TTL backstop, if the backend supports one.
    pub ttl_seconds: u64,
    /// Restore from this backend snapshot ref instead of the template.
    #[serde(default)]
    pub from_snapshot: Option<String>,
}

impl CreateInstance {
    /// The instance this request made, running as the backend's `backend_ref`: what
    /// `create` answers once the backend has it up.
    pub fn running(&self, backend_ref: impl Into<String>) -> Instance {
        Instance {
            backend_ref: backend_ref.into(),
            sandbox_id: self.sandbox_id.clone(),
            state: InstanceState::Running,
        }
    }
}

/// State of a backend instance as the backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    Pending,
    Running,
    Paused,
    Stopped,
    Failed,
}

/// A backend instance tagged with its sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The backend's own id for it.
    pub backend_ref: String,
    pub sandbox_id: SandboxId,
    pub state: InstanceState,
}

/// Where an existing instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRef {
    pub sandbox_id: SandboxId,
    pub backend_ref: String,
}

/// A stream of bytes to or from a backend (file bodies).
pub type ByteStream = BoxStream<'static, Result<Bytes, AdapterError>>;

/// One piece of streamed exec output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// How a streamed exec ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecExit {
    /// 124 on timeout, 128+n when killed by signal n.
    pub exit_code: i32,
    pub duration_ms: u64,
}

/// Inclusive byte range of a download (`Range: bytes=start-end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    /// Inclusive; `None` means to the end.
    pub end: Option<u64>,
}

/// A download: total size if the backend knows it, and the body (already ranged).
pub struct Download {
    pub total_size: Option<u64>,
    pub body: ByteStream,
}

/// Kind of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    pub path: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
    pub modified_at: Option<DateTime<Utc>>,
}

/// [`Adapter::snapshot_timeout`] of a backend that says nothing else: 15 minutes.
pub const DEFAULT_SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

/// A backend snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// The backend's id for the snapshot; restore passes it back in `CreateInstance`.
    pub backend_ref: String,
    /// False while the backend is still writing it.
    pub ready: bool,
}

/// A URL that reaches a port inside the sandbox without any backend credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    pub url: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A terminal's size, the signals a client may send and the largest side accepted: the core's
/// process types under the names the terminal code uses, so `/pty`, processes and every
/// adapter share one definition (one parse, one bound, one signal table).
pub use differently_core::process::{
    ProcessSignal as PtySignal, TerminalSize as PtySize, MAX_PTY_SIDE as PTY_MAX_SIDE,
};

/// What a terminal is opened with. (`exec.pty`)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtyRequest {
    /// Program and arguments; never empty (the API defaults it to a login shell).
    pub command: Vec<String>,
    /// Added to the sandbox's environment (after it, so these win).
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `None` is the sandbox's default.
    pub cwd: Option<String>,
    pub size: PtySize,
}

impl PtyRequest {
    /// The program's name, for logs and audit (never its arguments).
    pub fn program(&self) -> &str {
        self.command.first().map_or("", String::as_str)
    }
}

/// What a terminal's client sends while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PtyInput {
    /// Bytes typed (written to the terminal, so the line discipline echoes and edits them).
    Stdin(Bytes),
    Resize(PtySize),
    Signal(PtySignal),
}

/// Whether `adapter` can hold warm instances ([`Capability::Warm`]): created ahead of time
/// with no env (never tenant data), tagged with the warm id, found by `find` and `list` like
/// any instance, and usable by the sandbox that claims it after [`Adapter::claim`].
/// Advertised only where that is true; a pool without it gets no refill.
pub fn offers_warm(adapter: &dyn Adapter) -> bool {
    adapter.offers(Capability::Warm)
}

/// What an adapter's exec output can carry where its provider's API is narrower than the
/// contract. Said by the adapter, so the conformance kit holds it to exactly that and the
/// provider docs can tell users, instead of the difference showing up as corrupted output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecFidelity {
    /// Output bytes arrive exactly as the command wrote them. `false`: the provider carries
    /// output as text (JSON strings), so bytes that are not UTF-8 arrive replaced.
    pub binary_output: bool,
    /// A buffered `exec` keeps stderr apart from stdout. `false`: the provider answers them
    /// combined, and everything is in `stdout`.
    pub buffered_stderr: bool,
    /// Output ends exactly as written. `false`: the provider sends output line by line with
    /// the terminators removed, so a final line without a newline arrives with one.
    pub exact_line_endings: bool,
}

impl ExecFidelity {
    /// The contract as written: bytes exact, stderr apart.
    pub const EXACT: ExecFidelity = ExecFidelity {
        binary_output: true,
        buffered_stderr: true,
        exact_line_endings: true,
    };

    /// Output carried as text (JSON strings), so bytes that are not UTF-8 arrive replaced;
    /// otherwise as written.
    pub const TEXT: ExecFidelity = ExecFidelity {
        binary_output: false,
        ..ExecFidelity::EXACT
    };
}

pub use differently_core::pool::VerifiedStatus;

/// An adapter's [`VerifiedStatus`] and what it rests on, in a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verification {
    pub status: VerifiedStatus,
    /// What was run against what (e.g. "OpenSandbox 1.1.1 on its Docker runtime, live").
    pub basis: String,
}

impl Verification {
    pub fn new(status: VerifiedStatus, basis: impl Into<String>) -> Verification {
        Verification {
            status,
            basis: basis.into(),
        }
    }

    /// What is known of a kind whose adapter says nothing of its own: devhost and fake run
    /// here; the HTTP providers were checked against their fakes only (`docs/providers.md`);
    /// a plugin is whatever its author ran.
    pub fn of_kind(kind: &str) -> Verification {
        use VerifiedStatus::*;
        match kind {
            "fake" => {
                Verification::new(Live, "in-process fake backend; nothing external to verify")
            }
            "devhost" => Verification::new(
                Live,
                "runs commands on this host; its tests run it for real",
            ),
            "daytona" | "e2b" | "freestyle" | "vercel" | "cloudflare" | "runloop"
            | "azure_sessions" => Verification::new(
                FakeOnly,
                "tested only against a fake server written from the provider's published API",
            ),
            "agent_sandbox" => Verification::new(
                FakeOnly,
                "tested only against a fake Kubernetes API server, sandbox router and runtime written from agent-sandbox's CRDs and runtime source",
            ),
            "remote" => Verification::new(
                Unknown,
                "an HTTP plugin: verified as far as its author ran the conformance kit against it",
            ),
            _ => Verification::new(
                Unknown,
                "this adapter kind says nothing of its verification",
            ),
        }
    }
}

fn unsupported<T>(op: &str) -> Result<T, AdapterError> {
    Err(AdapterError::Unsupported(op.to_owned()))
}

/// One pool's backend. Required methods first; optional operations default to
/// `Unsupported`, and an adapter advertises (in `capabilities`) only what it overrides.
#[async_trait]
pub trait Adapter: Send + Sync + 'static {
    /// The adapter kind (`fake`, `devhost`, `opensandbox`, …).
    fn kind(&self) -> &'static str;

    /// Capabilities this adapter really implements; the conformance kit holds it to them.
    fn capabilities(&self) -> Vec<Capability>;

    /// Whether [`Adapter::capabilities`] has `capability`.
    fn offers(&self, capability: Capability) -> bool {
        self.capabilities().contains(&capability)
    }

    /// What its exec output can carry ([`ExecFidelity::EXACT`] unless the provider's API is
    /// narrower).
    fn exec_fidelity(&self) -> ExecFidelity {
        ExecFidelity::EXACT
    }

    /// How long a snapshot of this backend may take to become ready (a Fast Sandbox writes
    /// full checkpoints); past it, one that is still not ready has failed.
    fn snapshot_timeout(&self) -> std::time::Duration {
        DEFAULT_SNAPSHOT_TIMEOUT
    }

    /// The backend's version as last detected (OpenSandbox's `GET /version`, E2B's envd);
    /// `None` when the adapter has not asked yet or the backend does not say.
    fn backend_version(&self) -> Option<String> {
        None
    }

    /// How far this adapter is verified against its backend; may depend on the detected
    /// version. The default is what is known of its kind ([`Verification::of_kind`]).
    fn verification(&self) -> Verification {
        Verification::of_kind(self.kind())
    }

    /// Creates the instance for `req.sandbox_id`, or returns the one that already exists.
    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError>;

    /// Deletes the instance of `sandbox_id`; succeeds if there is none.
    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError>;

    /// The instance tagged with `sandbox_id`, if any.
    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError>;

    /// Every instance tagged with `installation`, for reconciliation.
    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError>;

    /// Runs a command to completion. The default collects [`Adapter::exec_stream`] (each
    /// stream capped as the API caps it), so an adapter that streams gets `exec` for free; one
    /// whose backend has a cheaper buffered call overrides it.
    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        crate::exec_output::exec_collected(|tx| async move {
            match self.exec_stream(at, req, tx).await {
                Ok(exit) => Ok(exit.exit_code),
                // No `exec_stream` either (the trait's default): say which call it was.
                Err(AdapterError::Unsupported(op)) if op == "exec.stream" => unsupported("exec"),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Whether the backend answers at all; used for pool health.
    async fn health(&self) -> Result<(), AdapterError>;

    /// Runs a command, sending output as it comes. A full `out` channel slows the command
    /// down (backpressure); a closed one cancels it on the backend. (`exec.stream`)
    async fn exec_stream(
        &self,
        _at: &InstanceRef,
        _req: &ExecRequest,
        _out: tokio::sync::mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        unsupported("exec.stream")
    }

    /// [`Adapter::exec_stream`] whose command goes only once `go` is given: the adapter may
    /// prepare it meanwhile (connect, send the request head) but must not let it run before,
    /// nor at all if `go` is withdrawn. The API stages the exec's audit record in that time,
    /// so the set-up overlaps the record's round trip. The default waits, then calls
    /// `exec_stream`. (`exec.stream`)
    async fn exec_stream_after(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
        go: crate::go_ahead::GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        go.wait().await?;
        self.exec_stream(at, req, out).await
    }

    /// Runs `req.command` on a terminal of its own until it exits. Bytes the terminal writes go
    /// to `out` in order (a full `out` slows the program down, as a slow terminal would);
    /// `input` carries keystrokes, resizes and signals. A closed `input` or `out` hangs the
    /// terminal up: the program gets SIGHUP and is killed soon after. Exit code as exec's (128+n
    /// when killed by signal n). (`exec.pty`)
    async fn pty(
        &self,
        _at: &InstanceRef,
        _req: &PtyRequest,
        _input: tokio::sync::mpsc::Receiver<PtyInput>,
        _out: tokio::sync::mpsc::Sender<Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        unsupported("exec.pty")
    }

    /// Runs a background process until it ends: output to `out` as it comes (a full `out`
    /// slows it down; a closed one ends it), `input` carries stdin, its close, signals and
    /// terminal resizes. The API's process supervisor holds this call for the process's life.
    /// Exit code as exec's (128+n when signal n ended it, 124 on `spec.timeout`). The command
    /// must not start before `go` is given. The default runs it on `exec_stream_after` or
    /// `pty` ([`crate::process::by_stream_or_pty`]); adapters offering
    /// [`Capability::ExecStdin`] implement it. (`exec.stream`, `exec.pty`, `exec.stdin`)
    async fn process(
        &self,
        at: &InstanceRef,
        spec: &crate::process::ProcessSpec,
        input: tokio::sync::mpsc::Receiver<crate::process::ProcessInput>,
        out: tokio::sync::mpsc::Sender<ExecEvent>,
        go: crate::go_ahead::GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        crate::process::by_stream_or_pty(self, at, spec, input, out, go).await
    }

    /// Writes a file (absolute path inside the sandbox). (`files`)
    async fn upload(
        &self,
        _at: &InstanceRef,
        _path: &str,
        _mode: Option<u32>,
        _body: ByteStream,
    ) -> Result<(), AdapterError> {
        unsupported("files")
    }

    /// Reads a file, optionally a range of it. (`files`)
    async fn download(
        &self,
        _at: &InstanceRef,
        _path: &str,
        _range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        unsupported("files")
    }

    /// Lists a directory to `depth` levels. (`files`)
    async fn list_files(
        &self,
        _at: &InstanceRef,
        _path: &str,
        _depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        unsupported("files")
    }

    /// Removes a file or an empty directory. (`files`)
    async fn delete_file(&self, _at: &InstanceRef, _path: &str) -> Result<(), AdapterError> {
        unsupported("files")
    }

    /// Makes directory `path` and any missing parents (`mkdir -p`), `mode` on the last one
    /// (default 0o755). `Ok(true)` when it made it, `Ok(false)` when a directory was already
    /// there; anything else at the path is [`PathProblem::NotADirectoryHere`]. The default
    /// runs `mkdir` through [`Adapter::exec`], so every backend that runs commands has it;
    /// adapters whose backend makes directories without starting a process override it.
    /// (`files`)
    ///
    /// [`PathProblem::NotADirectoryHere`]: crate::error::PathProblem::NotADirectoryHere
    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        crate::files::make_dir_by_exec(self, at, path, mode).await
    }

    /// Freezes the sandbox keeping its memory. (`lifecycle.pause`)
    ///
    /// The four lifecycle calls are idempotent: an instance already in the target state is
    /// success, because workers re-issue them on redelivery (a `start` even after its row
    /// already says `running`).
    async fn pause(&self, _at: &InstanceRef) -> Result<(), AdapterError> {
        unsupported("lifecycle.pause")
    }

    /// Undoes `pause`. (`lifecycle.pause`)
    async fn resume(&self, _at: &InstanceRef) -> Result<(), AdapterError> {
        unsupported("lifecycle.pause")
    }

    /// Stops the sandbox keeping its disk. (`lifecycle.stop`)
    async fn stop(&self, _at: &InstanceRef) -> Result<(), AdapterError> {
        unsupported("lifecycle.stop")
    }

    /// Undoes `stop`. (`lifecycle.stop`)
    async fn start(&self, _at: &InstanceRef) -> Result<(), AdapterError> {
        unsupported("lifecycle.stop")
    }

    /// Takes a snapshot named by Differently's snapshot id (idempotent on it). (`snapshots`)
    /// May answer `ready: false` while the backend still writes it; callers ask again (the
    /// same id finds the same snapshot) until it is ready, for up to `snapshot_timeout`.
    async fn snapshot(
        &self,
        _at: &InstanceRef,
        _snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        unsupported("snapshots")
    }

    /// Deletes a snapshot; a missing one is fine. (`snapshots`)
    async fn delete_snapshot(&self, _backend_ref: &str) -> Result<(), AdapterError> {
        unsupported("snapshots")
    }

    /// A URL for `port` inside the sandbox. (`ports.expose`)
    async fn expose_port(
        &self,
        _at: &InstanceRef,
        _port: u16,
        _expires: Option<std::time::Duration>,
    ) -> Result<Endpoint, AdapterError> {
        unsupported("ports.expose")
    }

    /// Whether a claimed warm instance needs [`Adapter::claim`] before its sandbox runs (the
    /// sandbox is then claimed `provisioning` and a worker makes the call); `false`: it is
    /// claimed `running` at once.
    fn claim_call(&self) -> bool {
        false
    }

    /// Readies a warm instance for the sandbox that claimed it: e.g. moves its backend-side
    /// expiry from the warm class's age to the tenant's TTL. Idempotent (a worker repeats it
    /// on redelivery). Only called when [`Adapter::claim_call`] says so.
    async fn claim(&self, _at: &InstanceRef, _ttl_seconds: u64) -> Result<(), AdapterError> {
        Ok(())
    }

    /// Moves the backend-side TTL backstop after a TTL renew. Adapters without a backstop
    /// succeed without doing anything.
    async fn renew(
        &self,
        _at: &InstanceRef,
        _ttl: std::time::Duration,
    ) -> Result<(), AdapterError> {
        Ok(())
    }
}

/// Shared handle to an adapter.
pub type SharedAdapter = Arc<dyn Adapter>;
