//! `FakeAdapter`: an in-process backend for tests and benchmarks.
//!
//! It keeps no real instances, only a ledger of the calls the "backend" saw. Instance state is
//! derived by replaying that ledger (`created` → the instance exists, `deleted` → it is gone).
//!
//! With `ledger` set, the ledger is a JSON-lines file and the adapter works across OS
//! processes: every read-check-append sequence runs under an exclusive lock on the sibling file
//! `<ledger>.lock`, so concurrent creators of the same sandbox — threads or processes, each with
//! its own `FakeAdapter` — produce exactly one `created` line. Crash tests rely on that: they
//! `kill -9` a worker after the backend create and count `created` lines with [`read_ledger`] and
//! [`created_count`]. The configured latency is slept *before* the lock is taken and the line is
//! appended, so a process killed mid-create leaves either no trace or a complete line.
//! Without `ledger` the same ledger is kept in memory.
//!
//! Failure injection: the first `failCreates` create calls per sandbox fail with
//! `Transient` (counted from the ledger, so the count is shared across processes too);
//! `capacityFull` refuses every create with `Capacity` (a provider at its plan limit);
//! `unavailable` makes every call fail with `Unavailable` before it reaches the "backend", so
//! such calls leave no ledger line. For the fault suite (FAULTS.md S12, S13):
//! `hangFirstCreateMs` makes the first create call of each sandbox (no create line in the
//! ledger yet) sleep that long before acting, as a backend that hangs does; `timeOutAfterCreate`
//! and `timeOutAfterDelete` make a call that *did* create (or delete) an instance answer
//! `Transient` anyway, as a backend whose answer is lost after it acted does, so only the
//! caller's retry (which then finds `existing` / `missing`) can tell what happened.
//!
//! `exec` does not run anything. It knows these programs:
//! - `echo args…` → stdout is the args joined by a space plus `"\n"`, exit 0;
//! - `true` → exit 0, `false` → exit 1, `fake-exit N` → exit N;
//! - `cat` → stdout is stdin (bytes; `stdinBase64` is decoded), `pwd` → the cwd (`/` by default),
//!   `env` → the request's env as sorted `K=V` lines;
//! - `fake-stderr words…` → the words on stderr, exit 0;
//! - `sleep S` → sleeps S seconds (fractions allowed), so a shorter timeout gives exit 124;
//! - `fake-output N [stderr]` → N bytes of `y\n` (like `yes | head -c N`), generated in 64 KiB
//!   chunks as the reader takes them: streamed exec blocks on a full channel, so memory stays
//!   bounded whatever N is; plain `exec` keeps the first 1 MiB and sets the truncation flag;
//! - anything else (including `sh -c "echo x"`, which is *not* interpreted) → exit 127 with
//!   stderr `fake: command not found: <program>`.
//!
//! Exec on a sandbox without an instance answers `NotFound`; on a paused or stopped one it is
//! refused. The ledger records the program name only, never the arguments. A streamed exec
//! whose reader goes away records a second `exec` line with outcome `cancelled`.
//!
//! Optional operations exist only when named in `capabilities` (otherwise `Unsupported`, and no
//! ledger line): `exec.stream`; `files` (real files below `filesRoot`, default `<ledger>.files`
//! or a temporary directory, one directory per sandbox); `lifecycle.pause` and
//! `lifecycle.stop` (ledger lines `pause`/`resume`/`stop`/`start`; the replayed state is what
//! `find` and `list` report); `snapshots` (a copy of the sandbox's files; `create` with
//! `from_snapshot` starts from it and records the ref on its `created` line); `ports.expose`
//! (`https://fake.invalid/<sandbox>/<port>`, expiring as asked, default one hour); `exec.pty`
//! (a scripted terminal, see `terminal`: echo, `stty size`, `sleep`, `exit N`; ledger line
//! `exec` with the program name). Background processes (`process`, see `process`) need
//! `exec.stream`; with `exec.stdin`, `cat` echoes the stdin it is fed until it is closed.
//!
//! `warm` in `capabilities` advertises warm instances: a create with no env is an instance
//! like any other (same ledger line, same `latencyMs`, `failCreates` and `capacityFull`), and a
//! claim needs no call (`claim_call` is false).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use differently_core::exec::{ExecRequest, ExecResult, OUTPUT_CAP_BYTES, TIMEOUT_EXIT_CODE};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde::Deserialize;

use tokio::sync::mpsc;

mod ledger;
mod process;
mod programs;
mod state;
mod terminal;

use state::*;

pub use ledger::{
    created_count, live_instances, read_ledger, LedgerEntry, LedgerOp, LedgerOutcome, LiveInstance,
};
use ledger::{parse_lines, State};
use programs::{emit, plan, stdin_of, yes_bytes, Output};

use crate::error::Reason;
use crate::exec_output::{millis, timed_exit, CollectedOutput};
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, Capability, CreateInstance, Download, Endpoint,
    ExecEvent, ExecExit, FileEntry, Instance, InstanceRef, InstanceState, PtyInput, PtyRequest,
    SnapshotInfo,
};

/// Settings of a `fake` pool (`adapterSettings` in the pool config).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeConfig {
    /// Sleep applied to create and delete, to make benchmarks and crash windows realistic.
    pub latency_ms: u64,
    /// The first N create calls per sandbox fail with `Transient`.
    pub fail_creates: u32,
    /// Every call fails with `Unavailable`; health fails.
    pub unavailable: bool,
    /// JSON-lines ledger file shared across processes; `None` keeps the ledger in memory.
    pub ledger: Option<PathBuf>,
    /// What `capabilities()` advertises, and which optional operations exist.
    pub capabilities: Vec<String>,
    /// Where `files` keeps sandbox files; default `<ledger>.files`, or a temporary directory.
    pub files_root: Option<PathBuf>,
    /// `list` fails with `Unavailable` (everything else works): a backend whose listing is
    /// broken, which the reconciler must leave alone.
    pub fail_list: bool,
    /// A snapshot answers `ready: false` to its first N calls, as a backend still writing it
    /// does (a real OpenSandbox snapshot is Creating for ~0.3 s); 0: ready at once.
    pub snapshot_ready_after: u32,
    /// The first N deletes of each snapshot fail with `Transient`, as OpenSandbox's
    /// `409 SNAPSHOT::DELETE_CONFLICT` does while a sandbox restored from it still runs.
    pub refuse_snapshot_deletes: u32,
    /// The first create call of each sandbox sleeps this long before acting (a hung backend).
    pub hang_first_create_ms: u64,
    /// A create that made a new instance answers `Transient` (effect, then a lost answer).
    pub time_out_after_create: bool,
    /// A delete that removed an instance answers `Transient` (effect, then a lost answer).
    pub time_out_after_delete: bool,
    /// Every create is refused with `Capacity` (a provider at its plan limit), before it
    /// reaches the "backend": no ledger line. Everything else, health included, works.
    pub capacity_full: bool,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            fail_creates: 0,
            capacity_full: false,
            unavailable: false,
            ledger: None,
            capabilities: vec!["exec".to_owned()],
            files_root: None,
            fail_list: false,
            snapshot_ready_after: 0,
            refuse_snapshot_deletes: 0,
            hang_first_create_ms: 0,
            time_out_after_create: false,
            time_out_after_delete: false,
        }
    }
}

/// The adapter's view of the ledger. For a file ledger, `offset` is how far the file has been
/// replayed into `state`; the rest is read under the file lock on the next call.
#[derive(Debug, Default)]
struct Inner {
    state: State,
    offset: u64,
    /// Memory ledger only.
    log: Vec<LedgerEntry>,
}

#[derive(Debug, Clone)]
struct FilePaths {
    ledger: PathBuf,
    lock: PathBuf,
}

/// A process-unique suffix for the scratch directory.
fn ulid_suffix() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    (u128::from(nanos.unsigned_abs()) << 16) + u128::from(N.fetch_add(1, Ordering::Relaxed))
}

/// Fake backend; see the module docs.
#[derive(Debug, Clone)]
pub struct FakeAdapter {
    config: FakeConfig,
    inner: Arc<Mutex<Inner>>,
    files: Option<FilePaths>,
    /// Files directory when neither `filesRoot` nor a ledger is configured.
    scratch: PathBuf,
}

// Never refuses: every setting already has its type.
crate::kit::from_settings!(FakeAdapter, "fake", FakeConfig, infallible);

impl FakeAdapter {
    /// A fake with the given settings. A file ledger is created lazily on the first call.
    pub fn new(config: FakeConfig) -> Self {
        let files = config.ledger.as_ref().map(|ledger| {
            let mut lock = ledger.as_os_str().to_owned();
            lock.push(".lock");
            FilePaths {
                ledger: ledger.clone(),
                lock: PathBuf::from(lock),
            }
        });
        let scratch = std::env::temp_dir().join(format!(
            "differently-fake-{}-{}",
            std::process::id(),
            ulid_suffix()
        ));
        Self {
            config,
            inner: Arc::new(Mutex::new(Inner::default())),
            files,
            scratch,
        }
    }

    /// The settings this fake runs with.
    pub fn config(&self) -> &FakeConfig {
        &self.config
    }

    /// Every ledger line so far (from the file when there is one, so other processes' calls
    /// are included). An unreadable file yields what could be read: this is a test helper.
    pub fn ledger(&self) -> Vec<LedgerEntry> {
        match &self.files {
            Some(f) => read_ledger(&f.ledger).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "fake ledger unreadable");
                Vec::new()
            }),
            None => self.lock_inner().log.clone(),
        }
    }

    fn lock_inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave `Inner` half-updated in a way that
        // matters to a fake, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_available(&self) -> Result<(), AdapterError> {
        if self.config.unavailable {
            Err(AdapterError::unavailable(
                "fake backend configured unavailable".to_owned(),
            ))
        } else {
            Ok(())
        }
    }

    async fn latency(&self) {
        if self.config.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.config.latency_ms)).await;
        }
    }

    /// Runs `decide` against the current state and records the line it returns, atomically
    /// with respect to every other fake sharing the ledger.
    async fn transact<R, F>(&self, decide: F) -> Result<R, AdapterError>
    where
        F: FnOnce(&State) -> (LedgerEntry, R) + Send + 'static,
        R: Send + 'static,
    {
        match &self.files {
            None => {
                let mut inner = self.lock_inner();
                let (entry, r) = decide(&inner.state);
                inner.state.apply(&entry);
                inner.log.push(entry);
                Ok(r)
            }
            Some(files) => {
                let this = self.clone();
                let files = files.clone();
                tokio::task::spawn_blocking(move || {
                    let mut inner = this.lock_inner();
                    file_transact(&mut inner, &files, decide)
                })
                .await
                .map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(
                        format!("fake ledger task failed: {e}"),
                        e,
                    ))
                })?
                .map_err(|e| {
                    AdapterError::Transient(Reason::caused_by(format!("fake ledger: {e}"), e))
                })
            }
        }
    }
}

#[async_trait]
impl Adapter for FakeAdapter {
    fn kind(&self) -> &'static str {
        "fake"
    }

    /// The configured names this build knows (the settings are free text, as a plugin's
    /// declaration would be).
    fn capabilities(&self) -> Vec<Capability> {
        self.config
            .capabilities
            .iter()
            .filter_map(|c| Capability::parse(c))
            .collect()
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        self.check_available()?;
        if self.config.hang_first_create_ms > 0 {
            let sbx = req.sandbox_id.clone();
            let first = self
                .peek(move |state| !state.create_calls.contains_key(&sbx))
                .await?;
            if first {
                tokio::time::sleep(Duration::from_millis(self.config.hang_first_create_ms)).await;
            }
        }
        self.latency().await;
        if self.config.capacity_full {
            return Err(AdapterError::capacity(
                "fake: the pool is at its plan limit",
                Some(Duration::from_secs(30)),
            ));
        }
        let sbx = req.sandbox_id.clone();
        let installation = req.installation_id.clone();
        let fail_creates = self.config.fail_creates;
        let from_snapshot = req.from_snapshot.clone();
        let created = self
            .transact(move |state| {
                let mut e = entry(LedgerOp::Create, Some(sbx.clone()), LedgerOutcome::Created);
                if let Some(live) = state.live.get(&sbx) {
                    e.outcome = LedgerOutcome::Existing;
                    e.backend_ref = Some(live.backend_ref.clone());
                    return (e, Ok((instance_of(live), false)));
                }
                let failed = state.failed_creates.get(&sbx).copied().unwrap_or(0);
                if failed < fail_creates {
                    e.outcome = LedgerOutcome::Failed;
                    let err = AdapterError::transient(format!(
                        "fake: injected create failure {} of {fail_creates}",
                        failed + 1
                    ));
                    return (e, Err(err));
                }
                if let Some(snap) = &from_snapshot {
                    if !state.snapshots.contains(snap) {
                        e.outcome = LedgerOutcome::Failed;
                        e.snapshot = Some(snap.clone());
                        let err = AdapterError::permanent(format!("fake: no snapshot {snap}"));
                        return (e, Err(err));
                    }
                }
                let generation = state.generations.get(&sbx).copied().unwrap_or(0) + 1;
                let backend_ref = format!("fake-{sbx}-{generation}");
                e.backend_ref = Some(backend_ref.clone());
                e.installation_id = Some(installation);
                e.snapshot = from_snapshot;
                (e, Ok((running(&sbx, &backend_ref), true)))
            })
            .await??;
        if self.config.time_out_after_create && created.1 {
            return Err(AdapterError::transient(
                "fake: create timed out (timeOutAfterCreate: the instance was made)".to_owned(),
            ));
        }
        let created = created.0;
        if let (Some(snap), true) = (&req.from_snapshot, self.offers(Capability::Files)) {
            let from = self.files_root().join(".snapshots").join(snap);
            let to = self.files_root().join(req.sandbox_id.as_str());
            if from.is_dir() && !to.exists() {
                tokio::task::spawn_blocking(move || crate::local_fs::copy_tree(&from, &to))
                    .await
                    .map_err(|e| {
                        AdapterError::Transient(Reason::caused_by(format!("fake restore: {e}"), e))
                    })?
                    .map_err(|e| {
                        AdapterError::Transient(Reason::caused_by(format!("fake restore: {e}"), e))
                    })?;
            }
        }
        Ok(created)
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        self.check_available()?;
        self.latency().await;
        let sbx = sandbox_id.clone();
        let removed = self
            .transact(move |state| {
                let mut e = entry(LedgerOp::Delete, Some(sbx.clone()), LedgerOutcome::Deleted);
                match state.live.get(&sbx) {
                    Some(live) => e.backend_ref = Some(live.backend_ref.clone()),
                    None => e.outcome = LedgerOutcome::Missing,
                }
                let removed = e.outcome == LedgerOutcome::Deleted;
                (e, removed)
            })
            .await?;
        if self.config.time_out_after_delete && removed {
            return Err(AdapterError::transient(
                "fake: delete timed out (timeOutAfterDelete: the instance was removed)".to_owned(),
            ));
        }
        Ok(())
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        self.check_available()?;
        let sbx = sandbox_id.clone();
        self.transact(move |state| {
            let mut e = entry(LedgerOp::Find, Some(sbx.clone()), LedgerOutcome::Ok);
            match state.live.get(&sbx) {
                Some(live) => {
                    e.backend_ref = Some(live.backend_ref.clone());
                    (e, Some(instance_of(live)))
                }
                None => {
                    e.outcome = LedgerOutcome::Missing;
                    (e, None)
                }
            }
        })
        .await
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        self.check_available()?;
        if self.config.fail_list {
            return Err(AdapterError::unavailable(
                "fake backend configured with failList".to_owned(),
            ));
        }
        let installation = installation.clone();
        self.transact(move |state| {
            let mut e = entry(LedgerOp::List, None, LedgerOutcome::Ok);
            e.installation_id = Some(installation.clone());
            let found = state
                .live
                .values()
                .filter(|l| l.installation_id.as_ref() == Some(&installation))
                .map(instance_of)
                .collect();
            (e, found)
        })
        .await
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.check_available()?;
        let started = Instant::now();
        self.exec_line(at, req.program(), None).await?;
        let plan = plan(req, stdin_of(req)?);
        if let Some(d) = plan.sleep {
            if d > req.timeout() {
                tokio::time::sleep(req.timeout()).await;
                return Ok(ExecResult {
                    exit_code: TIMEOUT_EXIT_CODE,
                    stdout: String::new(),
                    stderr: String::new(),
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_ms: millis(started.elapsed()),
                });
            }
            tokio::time::sleep(d).await;
        }
        const CAP: usize = OUTPUT_CAP_BYTES;
        let mut out = CollectedOutput::default();
        for o in &plan.output {
            match o {
                Output::Stdout(b) => out.stdout.push(b),
                Output::Stderr(b) => out.stderr.push(b),
                Output::Generate { n, stderr } => {
                    let keep = usize::try_from((*n).min(CAP as u64 + 1)).unwrap_or(CAP + 1);
                    let b = yes_bytes(0, keep);
                    if *stderr {
                        out.stderr.push(&b)
                    } else {
                        out.stdout.push(&b)
                    }
                }
            }
        }
        Ok(out.into_result(plan.exit_code, millis(started.elapsed())))
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.check_available()
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        self.require(Capability::ExecStream)?;
        timed_exit(async {
            self.exec_line(at, req.program(), None).await?;
            let plan = plan(req, stdin_of(req)?);
            let run = async {
                if let Some(d) = plan.sleep {
                    tokio::time::sleep(d).await;
                }
                emit(&plan, &out).await
            };
            let outcome = tokio::select! {
                r = tokio::time::timeout(req.timeout(), run) => r,
                _ = out.closed() => Ok(Err(())),
            };
            Ok(match outcome {
                Ok(Ok(())) => plan.exit_code,
                Err(_) => TIMEOUT_EXIT_CODE,
                Ok(Err(())) => {
                    self.exec_line(at, req.program(), Some(LedgerOutcome::Cancelled))
                        .await?;
                    128 + 9
                }
            })
        })
        .await
    }

    async fn pty(
        &self,
        at: &InstanceRef,
        req: &PtyRequest,
        input: mpsc::Receiver<PtyInput>,
        out: mpsc::Sender<bytes::Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        self.require(Capability::ExecPty)?;
        timed_exit(async {
            self.exec_line(at, req.program(), None).await?;
            Ok(terminal::run(req.size, input, out).await)
        })
        .await
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
        let dir = self.sandbox_files(at).await?;
        crate::local_fs::upload(&dir, path, mode, body).await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        let dir = self.sandbox_files(at).await?;
        crate::local_fs::download(&dir, path, range).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        let dir = self.sandbox_files(at).await?;
        crate::local_fs::list(&dir, path, depth).await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        let dir = self.sandbox_files(at).await?;
        crate::local_fs::delete(&dir, path).await
    }

    async fn make_dir(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
    ) -> Result<bool, AdapterError> {
        let dir = self.sandbox_files(at).await?;
        crate::local_fs::make_dir(&dir, path, mode).await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        use InstanceState::*;
        self.lifecycle(
            at,
            Capability::LifecyclePause,
            LedgerOp::Pause,
            Running,
            Paused,
        )
        .await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        use InstanceState::*;
        self.lifecycle(
            at,
            Capability::LifecyclePause,
            LedgerOp::Resume,
            Paused,
            Running,
        )
        .await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        use InstanceState::*;
        self.lifecycle(
            at,
            Capability::LifecycleStop,
            LedgerOp::Stop,
            Running,
            Stopped,
        )
        .await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        use InstanceState::*;
        self.lifecycle(
            at,
            Capability::LifecycleStop,
            LedgerOp::Start,
            Stopped,
            Running,
        )
        .await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        self.require(Capability::Snapshots)?;
        self.latency().await;
        let backend_ref = format!("fake-snap-{snapshot_id}");
        if self.offers(Capability::Files) {
            let from = self.files_root().join(at.sandbox_id.as_str());
            let to = self.files_root().join(".snapshots").join(&backend_ref);
            if from.is_dir() && !to.exists() {
                tokio::task::spawn_blocking(move || crate::local_fs::copy_tree(&from, &to))
                    .await
                    .map_err(|e| {
                        AdapterError::Transient(Reason::caused_by(format!("fake snapshot: {e}"), e))
                    })?
                    .map_err(|e| {
                        AdapterError::Transient(Reason::caused_by(format!("fake snapshot: {e}"), e))
                    })?;
            }
        }
        let at = at.clone();
        let r = backend_ref.clone();
        let ready_after = self.config.snapshot_ready_after;
        let ready = self
            .transact(move |state| {
                let earlier = state.snapshot_calls.get(&r).copied().unwrap_or(0);
                let mut e = entry(
                    LedgerOp::Snapshot,
                    Some(at.sandbox_id.clone()),
                    LedgerOutcome::Ok,
                );
                e.backend_ref = Some(at.backend_ref.clone());
                e.snapshot = Some(r);
                let res = if state.live.contains_key(&at.sandbox_id) {
                    Ok(earlier >= ready_after)
                } else {
                    e.outcome = LedgerOutcome::Missing;
                    Err(AdapterError::NotFound)
                };
                (e, res)
            })
            .await??;
        Ok(SnapshotInfo { backend_ref, ready })
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        self.require(Capability::Snapshots)?;
        let r = backend_ref.to_owned();
        let refuse = self.config.refuse_snapshot_deletes;
        self.transact(move |state| {
            let mut e = entry(LedgerOp::DeleteSnapshot, None, LedgerOutcome::Ok);
            let refused = state.refused_snapshot_deletes.get(&r).copied().unwrap_or(0);
            let res = if !state.snapshots.contains(&r) {
                e.outcome = LedgerOutcome::Missing;
                Ok(())
            } else if refused < refuse {
                e.outcome = LedgerOutcome::Failed;
                Err(AdapterError::transient(
                    "fake: the snapshot is in use (a sandbox restored from it runs)",
                ))
            } else {
                Ok(())
            };
            e.snapshot = Some(r);
            (e, res)
        })
        .await??;
        let dir = self.files_root().join(".snapshots").join(backend_ref);
        if backend_ref.starts_with("fake-snap-") && !backend_ref.contains('/') {
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        Ok(())
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        expires: Option<Duration>,
    ) -> Result<Endpoint, AdapterError> {
        self.require(Capability::PortsExpose)?;
        let at = at.clone();
        let exists = self
            .transact(move |state| {
                let mut e = entry(
                    LedgerOp::ExposePort,
                    Some(at.sandbox_id.clone()),
                    LedgerOutcome::Ok,
                );
                e.port = Some(port);
                let ok = state.live.contains_key(&at.sandbox_id);
                if !ok {
                    e.outcome = LedgerOutcome::Missing;
                }
                (e, ok.then_some(at))
            })
            .await?;
        let at = exists.ok_or(AdapterError::NotFound)?;
        let ttl = expires.unwrap_or(Duration::from_secs(3600));
        let expires_at =
            Utc::now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::hours(1));
        Ok(Endpoint {
            url: format!(
                "https://fake.invalid/{}/{port}?exp={}",
                at.sandbox_id,
                expires_at.timestamp()
            ),
            expires_at: Some(expires_at),
        })
    }

    async fn renew(&self, at: &InstanceRef, _ttl: Duration) -> Result<(), AdapterError> {
        self.check_available()?;
        let at = at.clone();
        self.transact(move |state| {
            let mut e = entry(
                LedgerOp::Renew,
                Some(at.sandbox_id.clone()),
                LedgerOutcome::Ok,
            );
            if !state.live.contains_key(&at.sandbox_id) {
                e.outcome = LedgerOutcome::Missing;
            }
            (e, ())
        })
        .await
    }
}

#[cfg(test)]
mod tests;
