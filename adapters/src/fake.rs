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
//! `unavailable` makes every call fail with `Unavailable` before it reaches the "backend", so
//! such calls leave no ledger line.
//!
//! `exec` does not run anything. It knows three programs:
//! - `echo args…` → stdout is the args joined by a space plus `"\n"`, exit 0;
//! - `true` → exit 0, `false` → exit 1;
//! - anything else (including `sh -c "echo x"`, which is *not* interpreted) → exit 127 with
//!   stderr `fake: command not found: <program>`.
//!
//! Exec on a sandbox without an instance answers `NotFound`. The ledger records the program
//! name only, never the arguments.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde::{Deserialize, Serialize};

use crate::{Adapter, AdapterError, CreateInstance, Instance, InstanceRef, InstanceState};

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
    /// What `capabilities()` advertises.
    pub capabilities: Vec<String>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            fail_creates: 0,
            unavailable: false,
            ledger: None,
            capabilities: vec!["exec".to_owned()],
        }
    }
}

/// Which adapter call a ledger line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerOp {
    Create,
    Delete,
    Exec,
    Find,
    List,
}

/// What the call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerOutcome {
    /// Create made a new instance.
    Created,
    /// Create found the instance already there.
    Existing,
    /// Delete removed an instance.
    Deleted,
    /// The instance did not exist (delete, find, exec).
    Missing,
    /// Find, list or exec succeeded.
    Ok,
    /// Injected failure.
    Failed,
}

/// One line of the ledger: one call as the fake backend saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// When the call was recorded (RFC 3339).
    pub at: DateTime<Utc>,
    pub op: LedgerOp,
    /// The sandbox the call was about; absent for `list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<SandboxId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<String>,
    /// Installation tag: on `created` lines and on `list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<InstallationId>,
    pub outcome: LedgerOutcome,
    /// Process that made the call, so crash tests can tell workers apart.
    pub pid: u32,
    /// Exec only: the program name, never its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
}

/// An instance that exists according to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveInstance {
    pub sandbox_id: SandboxId,
    pub backend_ref: String,
    pub installation_id: Option<InstallationId>,
}

/// Reads a ledger file. A missing file is an empty ledger. Lines that do not parse (torn by a
/// writer killed mid-write) are skipped with a warning.
pub fn read_ledger(path: &Path) -> io::Result<Vec<LedgerEntry>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(parse_lines(&bytes).0)
}

/// How many `created` lines the ledger holds for `sandbox_id`: the number of backend instances
/// ever made for it. Crash tests assert this is exactly 1.
pub fn created_count(entries: &[LedgerEntry], sandbox_id: &SandboxId) -> usize {
    entries
        .iter()
        .filter(|e| {
            e.op == LedgerOp::Create
                && e.outcome == LedgerOutcome::Created
                && e.sandbox_id.as_ref() == Some(sandbox_id)
        })
        .count()
}

/// The instances that exist after replaying `entries`, ordered by sandbox id.
pub fn live_instances(entries: &[LedgerEntry]) -> Vec<LiveInstance> {
    let mut state = State::default();
    for e in entries {
        state.apply(e);
    }
    state.live.into_values().collect()
}

/// Parses complete lines; returns the entries and how many bytes were consumed (up to and
/// including the last newline).
fn parse_lines(bytes: &[u8]) -> (Vec<LedgerEntry>, usize) {
    let consumed = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut entries = Vec::new();
    for (n, line) in bytes[..consumed].split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(entry) => entries.push(entry),
            Err(e) => tracing::warn!(line = n + 1, error = %e, "skipping bad fake ledger line"),
        }
    }
    (entries, consumed)
}

/// State derived from the ledger.
#[derive(Debug, Default)]
struct State {
    live: BTreeMap<SandboxId, LiveInstance>,
    /// `created` lines per sandbox, to number backend refs.
    generations: HashMap<SandboxId, u64>,
    /// Failed create lines per sandbox, for failure injection.
    failed_creates: HashMap<SandboxId, u32>,
}

impl State {
    fn apply(&mut self, e: &LedgerEntry) {
        let Some(sbx) = &e.sandbox_id else { return };
        match (e.op, e.outcome) {
            (LedgerOp::Create, LedgerOutcome::Created) => {
                *self.generations.entry(sbx.clone()).or_default() += 1;
                self.live.insert(
                    sbx.clone(),
                    LiveInstance {
                        sandbox_id: sbx.clone(),
                        backend_ref: e.backend_ref.clone().unwrap_or_default(),
                        installation_id: e.installation_id.clone(),
                    },
                );
            }
            (LedgerOp::Create, LedgerOutcome::Failed) => {
                *self.failed_creates.entry(sbx.clone()).or_default() += 1;
            }
            (LedgerOp::Delete, LedgerOutcome::Deleted) => {
                self.live.remove(sbx);
            }
            _ => {}
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

/// Fake backend; see the module docs.
#[derive(Debug, Clone)]
pub struct FakeAdapter {
    config: FakeConfig,
    inner: Arc<Mutex<Inner>>,
    files: Option<FilePaths>,
}

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
        Self {
            config,
            inner: Arc::new(Mutex::new(Inner::default())),
            files,
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
            Err(AdapterError::Unavailable(
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
                .map_err(|e| AdapterError::Transient(format!("fake ledger task failed: {e}")))?
                .map_err(|e| AdapterError::Transient(format!("fake ledger: {e}")))
            }
        }
    }
}

/// The file-ledger transaction: lock, catch up on other writers' lines, decide, append, unlock.
fn file_transact<R>(
    inner: &mut Inner,
    files: &FilePaths,
    decide: impl FnOnce(&State) -> (LedgerEntry, R),
) -> io::Result<R> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&files.lock)?;
    lock.lock()?;
    let result = (|| {
        let mut ledger = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&files.ledger)?;
        catch_up(inner, &mut ledger)?;
        let (entry, r) = decide(&inner.state);
        let mut line = serde_json::to_vec(&entry).map_err(io::Error::other)?;
        line.push(b'\n');
        // One write on an O_APPEND file: the line lands whole.
        ledger.write_all(&line)?;
        ledger.flush()?;
        inner.offset += line.len() as u64;
        inner.state.apply(&entry);
        Ok(r)
    })();
    // Dropping the file would release the lock too; unlocking explicitly keeps it obvious.
    let _ = lock.unlock();
    result
}

/// Replays the lines appended since `inner.offset`. A ledger that shrank (someone truncated
/// it) is replayed from the start.
fn catch_up(inner: &mut Inner, ledger: &mut File) -> io::Result<()> {
    let len = ledger.metadata()?.len();
    if len < inner.offset {
        inner.state = State::default();
        inner.offset = 0;
    }
    ledger.seek(SeekFrom::Start(inner.offset))?;
    let mut bytes = Vec::new();
    ledger.read_to_end(&mut bytes)?;
    let (entries, consumed) = parse_lines(&bytes);
    if consumed < bytes.len() {
        // A torn line from a writer killed mid-write: terminate it so our line stays parseable.
        tracing::warn!("fake ledger ends with a torn line; terminating it");
        ledger.write_all(b"\n")?;
        inner.offset += bytes.len() as u64 + 1;
    } else {
        inner.offset += consumed as u64;
    }
    for e in &entries {
        inner.state.apply(e);
    }
    Ok(())
}

fn entry(op: LedgerOp, sandbox_id: Option<SandboxId>, outcome: LedgerOutcome) -> LedgerEntry {
    LedgerEntry {
        at: Utc::now(),
        op,
        sandbox_id,
        backend_ref: None,
        installation_id: None,
        outcome,
        pid: std::process::id(),
        program: None,
    }
}

fn running(sandbox_id: &SandboxId, backend_ref: &str) -> Instance {
    Instance {
        backend_ref: backend_ref.to_owned(),
        sandbox_id: sandbox_id.clone(),
        state: InstanceState::Running,
    }
}

/// What the fake "runs" for an exec; see the module docs.
fn fake_exec(command: &[String]) -> (i32, String, String) {
    let program = command.first().map(String::as_str).unwrap_or("");
    let args = command.get(1..).unwrap_or(&[]);
    match program {
        "echo" => (0, format!("{}\n", args.join(" ")), String::new()),
        "true" => (0, String::new(), String::new()),
        "false" => (1, String::new(), String::new()),
        other => (
            127,
            String::new(),
            format!("fake: command not found: {other}\n"),
        ),
    }
}

#[async_trait]
impl Adapter for FakeAdapter {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn capabilities(&self) -> Vec<String> {
        self.config.capabilities.clone()
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        self.check_available()?;
        self.latency().await;
        let sbx = req.sandbox_id.clone();
        let installation = req.installation_id.clone();
        let fail_creates = self.config.fail_creates;
        self.transact(move |state| {
            let mut e = entry(LedgerOp::Create, Some(sbx.clone()), LedgerOutcome::Created);
            if let Some(live) = state.live.get(&sbx) {
                e.outcome = LedgerOutcome::Existing;
                e.backend_ref = Some(live.backend_ref.clone());
                return (e, Ok(running(&sbx, &live.backend_ref)));
            }
            let failed = state.failed_creates.get(&sbx).copied().unwrap_or(0);
            if failed < fail_creates {
                e.outcome = LedgerOutcome::Failed;
                let err = AdapterError::Transient(format!(
                    "fake: injected create failure {} of {fail_creates}",
                    failed + 1
                ));
                return (e, Err(err));
            }
            let generation = state.generations.get(&sbx).copied().unwrap_or(0) + 1;
            let backend_ref = format!("fake-{sbx}-{generation}");
            e.backend_ref = Some(backend_ref.clone());
            e.installation_id = Some(installation);
            (e, Ok(running(&sbx, &backend_ref)))
        })
        .await?
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        self.check_available()?;
        self.latency().await;
        let sbx = sandbox_id.clone();
        self.transact(move |state| {
            let mut e = entry(LedgerOp::Delete, Some(sbx.clone()), LedgerOutcome::Deleted);
            match state.live.get(&sbx) {
                Some(live) => e.backend_ref = Some(live.backend_ref.clone()),
                None => e.outcome = LedgerOutcome::Missing,
            }
            (e, ())
        })
        .await
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        self.check_available()?;
        let sbx = sandbox_id.clone();
        self.transact(move |state| {
            let mut e = entry(LedgerOp::Find, Some(sbx.clone()), LedgerOutcome::Ok);
            match state.live.get(&sbx) {
                Some(live) => {
                    e.backend_ref = Some(live.backend_ref.clone());
                    (e, Some(running(&sbx, &live.backend_ref)))
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
        let installation = installation.clone();
        self.transact(move |state| {
            let mut e = entry(LedgerOp::List, None, LedgerOutcome::Ok);
            e.installation_id = Some(installation.clone());
            let found = state
                .live
                .values()
                .filter(|l| l.installation_id.as_ref() == Some(&installation))
                .map(|l| running(&l.sandbox_id, &l.backend_ref))
                .collect();
            (e, found)
        })
        .await
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        self.check_available()?;
        let started = Instant::now();
        let at = at.clone();
        let program = req.program().to_owned();
        let exists = self
            .transact(move |state| {
                let mut e = entry(
                    LedgerOp::Exec,
                    Some(at.sandbox_id.clone()),
                    LedgerOutcome::Ok,
                );
                e.backend_ref = Some(at.backend_ref.clone());
                e.program = Some(program);
                let exists = state
                    .live
                    .get(&at.sandbox_id)
                    .is_some_and(|l| l.backend_ref == at.backend_ref);
                if !exists {
                    e.outcome = LedgerOutcome::Missing;
                }
                (e, exists)
            })
            .await?;
        if !exists {
            return Err(AdapterError::NotFound);
        }
        let (exit_code, stdout, stderr) = fake_exec(&req.command);
        Ok(ExecResult {
            exit_code,
            stdout,
            stderr,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    async fn health(&self) -> Result<(), AdapterError> {
        self.check_available()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_rejects_unknown_fields() {
        let c: FakeConfig = serde_json::from_str("{}").expect("empty config");
        assert_eq!(c, FakeConfig::default());
        assert_eq!(c.capabilities, vec!["exec".to_owned()]);
        let c: FakeConfig =
            serde_json::from_str(r#"{"latencyMs": 5, "failCreates": 2}"#).expect("config");
        assert_eq!((c.latency_ms, c.fail_creates), (5, 2));
        assert!(serde_json::from_str::<FakeConfig>(r#"{"latency": 5}"#).is_err());
    }

    #[test]
    fn torn_and_bad_lines_are_skipped() {
        let sbx = SandboxId::new();
        let mut e = entry(LedgerOp::Create, Some(sbx.clone()), LedgerOutcome::Created);
        e.backend_ref = Some("r".into());
        let mut bytes = serde_json::to_vec(&e).expect("serialize");
        bytes.push(b'\n');
        bytes.extend_from_slice(b"{\"at\":");
        let (entries, consumed) = parse_lines(&bytes);
        assert_eq!(entries.len(), 1);
        assert_eq!(created_count(&entries, &sbx), 1);
        assert_eq!(live_instances(&entries)[0].backend_ref, "r");
        assert!(consumed < bytes.len());
        assert!(parse_lines(b"garbage\n").0.is_empty());
    }

    #[test]
    fn exec_semantics() {
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(fake_exec(&cmd(&["echo", "a", "b"])).1, "a b\n");
        assert_eq!(fake_exec(&cmd(&["false"])).0, 1);
        let (code, _, err) = fake_exec(&cmd(&["sh", "-c", "echo x"]));
        assert_eq!(code, 127);
        assert_eq!(err, "fake: command not found: sh\n");
    }
}
