//! The fake backend's ledger: one line per call the "backend" saw, and the instance state
//! replayed from it. Public so crash tests can read a ledger file and count creates.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;

use chrono::{DateTime, Utc};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde::{Deserialize, Serialize};

use crate::InstanceState;

/// Which adapter call a ledger line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerOp {
    Create,
    Delete,
    Exec,
    Find,
    List,
    Pause,
    Resume,
    Stop,
    Start,
    Snapshot,
    DeleteSnapshot,
    ExposePort,
    Renew,
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
    /// A streamed exec whose reader went away: the command was stopped.
    Cancelled,
    /// The instance is not in a state that allows the call (exec while paused).
    Refused,
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
    /// Snapshot ref: taken or deleted (`snapshot`, `deletesnapshot`), or restored (`create`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// `exposeport` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// An instance that exists according to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveInstance {
    pub sandbox_id: SandboxId,
    pub backend_ref: String,
    pub installation_id: Option<InstallationId>,
    /// Running, paused or stopped, as the lifecycle lines left it.
    pub state: InstanceState,
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
pub(super) fn parse_lines(bytes: &[u8]) -> (Vec<LedgerEntry>, usize) {
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
pub(super) struct State {
    pub(super) live: BTreeMap<SandboxId, LiveInstance>,
    /// `created` lines per sandbox, to number backend refs.
    pub(super) generations: HashMap<SandboxId, u64>,
    /// Create lines of any outcome per sandbox (`FakeConfig::hang_first_create_ms`).
    pub(super) create_calls: HashMap<SandboxId, u32>,
    /// Failed create lines per sandbox, for failure injection.
    pub(super) failed_creates: HashMap<SandboxId, u32>,
    /// Snapshot refs that exist.
    pub(super) snapshots: std::collections::BTreeSet<String>,
    /// Snapshot calls per snapshot ref, for `FakeConfig::snapshot_ready_after`.
    pub(super) snapshot_calls: HashMap<String, u32>,
    /// Refused snapshot deletes per snapshot ref, for `FakeConfig::refuse_snapshot_deletes`.
    pub(super) refused_snapshot_deletes: HashMap<String, u32>,
}

impl State {
    pub(super) fn apply(&mut self, e: &LedgerEntry) {
        if let (LedgerOp::Snapshot, Some(r)) = (e.op, &e.snapshot) {
            *self.snapshot_calls.entry(r.clone()).or_default() += 1;
        }
        if let (LedgerOp::DeleteSnapshot, LedgerOutcome::Failed, Some(r)) =
            (e.op, e.outcome, &e.snapshot)
        {
            *self.refused_snapshot_deletes.entry(r.clone()).or_default() += 1;
        }
        match (e.op, e.outcome, &e.snapshot) {
            (LedgerOp::Snapshot, LedgerOutcome::Ok, Some(r)) => {
                self.snapshots.insert(r.clone());
            }
            (LedgerOp::DeleteSnapshot, LedgerOutcome::Ok, Some(r)) => {
                self.snapshots.remove(r);
            }
            _ => {}
        }
        let Some(sbx) = &e.sandbox_id else { return };
        let new_state = match (e.op, e.outcome) {
            (LedgerOp::Pause, LedgerOutcome::Ok) => Some(InstanceState::Paused),
            (LedgerOp::Stop, LedgerOutcome::Ok) => Some(InstanceState::Stopped),
            (LedgerOp::Resume | LedgerOp::Start, LedgerOutcome::Ok) => Some(InstanceState::Running),
            _ => None,
        };
        if let (Some(state), Some(live)) = (new_state, self.live.get_mut(sbx)) {
            live.state = state;
        }
        if e.op == LedgerOp::Create {
            *self.create_calls.entry(sbx.clone()).or_default() += 1;
        }
        match (e.op, e.outcome) {
            (LedgerOp::Create, LedgerOutcome::Created) => {
                *self.generations.entry(sbx.clone()).or_default() += 1;
                self.live.insert(
                    sbx.clone(),
                    LiveInstance {
                        sandbox_id: sbx.clone(),
                        backend_ref: e.backend_ref.clone().unwrap_or_default(),
                        installation_id: e.installation_id.clone(),
                        state: InstanceState::Running,
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
