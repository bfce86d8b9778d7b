//! Tamper-evident audit chains.
//!
//! Every audit record belongs to one chain: its organization's (`org_…`), or `installation`
//! for system events without one. Within a chain records are numbered `chainSeq = 1, 2, …`
//! with no gaps, and each carries `prevHash` (the previous record's `hash`, 32 zero bytes for
//! the first) and `hash = HMAC-SHA256(audit key, prevHash || canonical record)`. The key is
//! server configuration and never enters the database, so someone who can write the database
//! but not read the server's configuration cannot rewrite history without `verify` noticing.
//! One chain per organization means appends of different organizations never wait for each
//! other; signed checkpoints of every chain's head make a truncated tail detectable.
//!
//! The canonical record is documented in `docs/audit.md`: a JSON object with keys sorted by
//! their bytes, no whitespace, `at` as RFC 3339 with microseconds. The same [`Verifier`]
//! checks a live database and an offline export (`differently audit verify`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use differently_core::{OrgId, ProjectId};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{AuditRecord, StoreError};

/// The chain of events that belong to no organization (pools, global policy, secrets).
pub const INSTALLATION_CHAIN: &str = "installation";

/// Version of the canonical form, hashed into every record (`"v": 1`).
pub const CANONICAL_VERSION: u64 = 1;

/// `prevHash` of the first record of a chain and of the first checkpoint.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Outcome of a recorded change that committed (every store transaction's record).
pub const OUTCOME_OK: &str = "ok";

/// Why a key or a hash could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not 64 hexadecimal characters.
    #[error("expected 64 hexadecimal characters (a 32-byte key)")]
    Format,
    /// The system random source failed.
    #[error("the system random source failed: {0}")]
    Random(String),
}

/// The 32-byte HMAC key of the audit chains. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditKey([u8; 32]);

impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuditKey(<redacted>)")
    }
}

impl AuditKey {
    /// A key from raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> AuditKey {
        AuditKey(bytes)
    }

    /// Parses 64 hex characters (surrounding whitespace ignored, as in a file).
    pub fn from_hex(text: &str) -> Result<AuditKey, KeyError> {
        decode_hex32(text.trim()).map(AuditKey)
    }

    /// A fresh random key from the operating system.
    pub fn random() -> Result<AuditKey, KeyError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(AuditKey(b))
    }

    /// `HMAC-SHA256(key, prev || body)`.
    fn mac(&self, prev: &[u8; 32], body: &[u8]) -> [u8; 32] {
        // HMAC accepts keys of any length, so this cannot fail for a 32-byte key.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        m.update(prev);
        m.update(body);
        m.finalize().into_bytes().into()
    }

    /// A short public identifier of the key (truncated SHA-256 of a domain-separated hash),
    /// so operators can tell which key wrote an export without revealing it.
    pub fn key_id(&self) -> String {
        let d = Sha256::new()
            .chain_update(b"differently audit key id\0")
            .chain_update(self.0)
            .finalize();
        hex(&d[..6])
    }
}

static PROCESS_KEY: std::sync::OnceLock<AuditKey> = std::sync::OnceLock::new();

/// Installs the process's audit key (from server configuration) before the store writes.
/// The key is process-wide because one server has one configuration and the audit helpers
/// are shared by every transaction. Fails if a key was already installed or generated.
pub fn set_process_key(key: AuditKey) -> Result<(), AuditKey> {
    PROCESS_KEY.set(key)
}

/// Whether a key was installed or generated already.
pub fn process_key_is_set() -> bool {
    PROCESS_KEY.get().is_some()
}

/// The process's audit key; without a configured one, a random key for this process only
/// (logged once, never shown): fine for `dev` and tests, unverifiable after a restart.
pub fn process_key() -> &'static AuditKey {
    PROCESS_KEY.get_or_init(|| {
        tracing::warn!(
            "no audit key configured: using a random key for this process only; records it \
             writes cannot be verified after it exits (set DIFFERENTLY_AUDIT_KEY)"
        );
        match AuditKey::random() {
            Ok(k) => k,
            // Without randomness nothing secure can run; a fixed key would be worse.
            Err(e) => panic!("cannot create an audit key: {e}"),
        }
    })
}

tokio::task_local! {
    static REQUEST_ID: String;
}

/// Runs `f` with `id` as the request id recorded by every audit record it writes.
pub async fn with_request_id<F: Future>(id: String, f: F) -> F::Output {
    REQUEST_ID.scope(id, f).await
}

/// The request id of the current task, if the API set one.
pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Parses exactly 64 hex characters.
pub(crate) fn decode_hex32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(KeyError::Format);
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16).ok_or(KeyError::Format)?;
        let lo = (pair[1] as char).to_digit(16).ok_or(KeyError::Format)?;
        out[i] = u8::try_from(hi * 16 + lo).map_err(|_| KeyError::Format)?;
    }
    Ok(out)
}

/// Chains per organization. Every append to a chain holds its head until commit, so one
/// chain per org made all of an org's changes (creates, activations, exec records, deletes)
/// wait for each other; with shards they wait only for changes to the same shard. A
/// resource's records always go to the same shard (`chain_of`), so a sandbox's history is
/// one chain, in order.
pub const ORG_CHAIN_SHARDS: u32 = 8;

/// The chain a record about `resource` goes to: `<org>/<shard>` (shard 0–7 from the first
/// four bytes of SHA-256 of the resource, stable across versions and processes), or the
/// installation chain for events of no organization.
pub fn chain_of(org: Option<&OrgId>, resource: &str) -> String {
    match org {
        None => INSTALLATION_CHAIN.to_owned(),
        Some(o) => {
            let d = Sha256::digest(resource.as_bytes());
            let shard = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % ORG_CHAIN_SHARDS;
            format!("{o}/{shard}")
        }
    }
}

/// `at` as stored: Postgres keeps microseconds, so hashes are computed over that precision.
pub fn stored_time(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at)
}

/// Deterministic JSON: object keys sorted by their bytes, no whitespace, numbers and
/// strings as `serde_json` writes them.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(x) = map.get(*k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A record to append; the store adds the chain fields, the time and the request id.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEvent {
    /// `None`: the installation chain.
    pub org_id: Option<OrgId>,
    pub project_id: Option<ProjectId>,
    /// `key:<id>` or `system:<role>`.
    pub actor: String,
    /// e.g. `sandbox.exec`, `file.upload`, `pool.register`.
    pub action: String,
    /// The id or name acted on.
    pub resource: String,
    /// `ok`, or what went wrong (`error`, `denied`, `exit:1`).
    pub outcome: String,
    /// What else matters. Never argument values, environment values or secrets.
    pub detail: Value,
}

/// A stored audit record, as served and exported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// Installation-wide order (a cursor); not hashed, may have gaps.
    pub seq: i64,
    pub chain: String,
    /// Position in the chain: 1, 2, 3, … without gaps.
    pub chain_seq: i64,
    pub org_id: Option<String>,
    pub project_id: Option<String>,
    pub actor: String,
    pub action: String,
    pub resource: String,
    pub outcome: String,
    pub request_id: Option<String>,
    pub at: DateTime<Utc>,
    pub detail: Value,
    /// Hex of the previous record's `hash` (genesis: zeros).
    pub prev_hash: String,
    /// Hex of `HMAC-SHA256(key, prevHash bytes || canonical())`.
    pub hash: String,
}

impl AuditEvent {
    /// The canonical bytes hashed for this record (everything but `seq` and `hash`).
    pub fn canonical(&self) -> String {
        canonical_json(&json!({
            "v": CANONICAL_VERSION,
            "chain": self.chain,
            "chainSeq": self.chain_seq,
            "orgId": self.org_id,
            "projectId": self.project_id,
            "actor": self.actor,
            "action": self.action,
            "resource": self.resource,
            "outcome": self.outcome,
            "requestId": self.request_id,
            "at": self.at.to_rfc3339_opts(SecondsFormat::Micros, true),
            "detail": self.detail,
        }))
    }

    /// The hash this record must carry under `key`; `None` if `prev_hash` is not hex.
    pub fn expected_hash(&self, key: &AuditKey) -> Option<String> {
        let prev = decode_hex32(&self.prev_hash).ok()?;
        Some(hex(&key.mac(&prev, self.canonical().as_bytes())))
    }

    /// The record that follows `prev` (the chain's head, `None` for the first) in `chain`,
    /// hashed under `key`. `seq` is left 0 for the store to fill.
    pub fn chained(
        key: &AuditKey,
        chain: String,
        prev: Option<(i64, String)>,
        e: NewAuditEvent,
        at: DateTime<Utc>,
        request_id: Option<String>,
    ) -> AuditEvent {
        let (prev_seq, prev_hash) = prev.unwrap_or((0, GENESIS_HASH.to_owned()));
        let mut rec = AuditEvent {
            seq: 0,
            chain,
            chain_seq: prev_seq + 1,
            org_id: e.org_id.map(|o| o.as_str().to_owned()),
            project_id: e.project_id.map(|p| p.as_str().to_owned()),
            actor: e.actor,
            action: e.action,
            resource: e.resource,
            outcome: e.outcome,
            request_id,
            at: stored_time(at),
            detail: e.detail,
            prev_hash,
            hash: String::new(),
        };
        // The previous hash came from our own writes; a malformed one (a tampered head)
        // chains from genesis bytes, which `verify` then reports as a broken link.
        let prev = decode_hex32(&rec.prev_hash).unwrap_or([0; 32]);
        rec.hash = hex(&key.mac(&prev, rec.canonical().as_bytes()));
        rec
    }
}

/// One chain's head as recorded in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainHead {
    pub chain: String,
    pub chain_seq: i64,
    pub hash: String,
}

/// A signed snapshot of every chain's head; checkpoints form a chain of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// 1, 2, 3, … without gaps.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// Sorted by chain.
    pub heads: Vec<ChainHead>,
    pub prev_hash: String,
    pub hash: String,
}

impl Checkpoint {
    /// The canonical bytes hashed for this checkpoint.
    pub fn canonical(&self) -> String {
        canonical_json(&json!({
            "v": CANONICAL_VERSION,
            "kind": "checkpoint",
            "seq": self.seq,
            "at": self.at.to_rfc3339_opts(SecondsFormat::Micros, true),
            "heads": self.heads,
        }))
    }

    /// The hash this checkpoint must carry under `key`.
    pub fn expected_hash(&self, key: &AuditKey) -> Option<String> {
        let prev = decode_hex32(&self.prev_hash).ok()?;
        Some(hex(&key.mac(&prev, self.canonical().as_bytes())))
    }

    /// The checkpoint after `prev` with `heads` (sorted here), hashed under `key`.
    pub fn next(
        key: &AuditKey,
        prev: Option<&Checkpoint>,
        mut heads: Vec<ChainHead>,
        at: DateTime<Utc>,
    ) -> Checkpoint {
        heads.sort_by(|a, b| a.chain.cmp(&b.chain));
        let mut cp = Checkpoint {
            seq: prev.map_or(1, |p| p.seq + 1),
            at: stored_time(at),
            heads,
            prev_hash: prev.map_or_else(|| GENESIS_HASH.to_owned(), |p| p.hash.clone()),
            hash: String::new(),
        };
        let prev = decode_hex32(&cp.prev_hash).unwrap_or([0; 32]);
        cp.hash = hex(&key.mac(&prev, cp.canonical().as_bytes()));
        cp
    }
}

/// One line of an export (`GET /v1/admin/audit/export`): JSON lines, checkpoints first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ExportLine {
    Checkpoint(Checkpoint),
    Record(Box<AuditEvent>),
}

/// What is wrong with a record or checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The record's content does not match its hash (edited, or moved to another position).
    HashMismatch,
    /// `prevHash` is not the previous record's hash (reordered or replaced).
    BrokenLink,
    /// A `chainSeq` is absent (deleted).
    Missing,
    /// A `chainSeq` appears twice.
    Duplicate,
    /// A checkpoint names a head the chain does not have (edited or truncated tail).
    CheckpointMismatch,
    /// The chain ends before the head a checkpoint recorded (truncated tail).
    Truncated,
    /// A checkpoint itself fails its hash or link, or one is missing.
    BadCheckpoint,
}

/// The first problem found in one chain (or in the checkpoints).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub kind: ProblemKind,
    /// The chain (`checkpoints` for checkpoint problems).
    pub chain: String,
    /// The position at fault (for `missing`: the absent one).
    pub chain_seq: i64,
    /// The stored record at fault, when there is one.
    pub seq: Option<i64>,
    pub message: String,
}

/// Result of walking the chains and checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub ok: bool,
    pub chains: u64,
    pub records: u64,
    pub checkpoints: u64,
    /// Records written before chaining existed (migration 0004); not verifiable.
    pub unchained_records: u64,
    /// The first problem in walk order (chains by id, then by position).
    pub first_bad: Option<Problem>,
    /// The first problem of each broken chain (at most [`MAX_PROBLEMS`]).
    pub problems: Vec<Problem>,
}

/// Most problems listed in one report.
pub const MAX_PROBLEMS: usize = 100;

/// Where a chain's walk is.
#[derive(Debug)]
struct Walk {
    next: i64,
    prev_hash: String,
    broken: bool,
}

/// Checks chains record by record. Feed every checkpoint (in `seq` order), then every record
/// in `(chain, chainSeq)` order, then [`Verifier::finish`]. Memory is per chain, not per record.
#[derive(Debug)]
pub struct Verifier {
    key: AuditKey,
    chains: BTreeMap<String, Walk>,
    /// Heads promised by the latest valid checkpoint.
    promised: HashMap<String, ChainHead>,
    last_checkpoint: Option<(i64, String)>,
    checkpoint_broken: bool,
    records: u64,
    checkpoints: u64,
    unchained: u64,
    problems: Vec<Problem>,
    first_bad: Option<Problem>,
}

impl Verifier {
    /// A verifier checking with `key`.
    pub fn new(key: AuditKey) -> Verifier {
        Verifier {
            key,
            chains: BTreeMap::new(),
            promised: HashMap::new(),
            last_checkpoint: None,
            checkpoint_broken: false,
            records: 0,
            checkpoints: 0,
            unchained: 0,
            problems: vec![],
            first_bad: None,
        }
    }

    /// Counts records that predate chaining.
    pub fn unchained(&mut self, n: u64) {
        self.unchained += n;
    }

    fn report(&mut self, p: Problem) {
        if self.first_bad.is_none() {
            self.first_bad = Some(p.clone());
        }
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }

    /// Checks one checkpoint; they must come in `seq` order before any record.
    pub fn checkpoint(&mut self, cp: &Checkpoint) {
        self.checkpoints += 1;
        if self.checkpoint_broken {
            return;
        }
        let (want_seq, want_prev) = self
            .last_checkpoint
            .clone()
            .unwrap_or((0, GENESIS_HASH.to_owned()));
        let problem = if cp.seq != want_seq + 1 {
            Some(format!("checkpoint {} follows {want_seq}", cp.seq))
        } else if cp.prev_hash != want_prev {
            Some(format!(
                "checkpoint {} does not link to its predecessor",
                cp.seq
            ))
        } else if cp.expected_hash(&self.key).as_deref() != Some(cp.hash.as_str()) {
            Some(format!("checkpoint {} does not match its hash", cp.seq))
        } else {
            None
        };
        if let Some(message) = problem {
            self.checkpoint_broken = true;
            self.report(Problem {
                kind: ProblemKind::BadCheckpoint,
                chain: "checkpoints".to_owned(),
                chain_seq: cp.seq,
                seq: None,
                message,
            });
            return;
        }
        self.last_checkpoint = Some((cp.seq, cp.hash.clone()));
        self.promised = cp
            .heads
            .iter()
            .map(|h| (h.chain.clone(), h.clone()))
            .collect();
    }

    /// Checks one record; records come in `(chain, chainSeq)` order.
    pub fn record(&mut self, r: &AuditEvent) {
        self.records += 1;
        let walk = self.chains.entry(r.chain.clone()).or_insert_with(|| Walk {
            next: 1,
            prev_hash: GENESIS_HASH.to_owned(),
            broken: false,
        });
        let problem = if r.chain_seq < walk.next {
            Some((
                ProblemKind::Duplicate,
                r.chain_seq,
                Some(r.seq),
                format!("chainSeq {} appears twice", r.chain_seq),
            ))
        } else if r.chain_seq > walk.next {
            Some((
                ProblemKind::Missing,
                walk.next,
                None,
                format!(
                    "record {} is missing (the next present is {}, seq {})",
                    walk.next, r.chain_seq, r.seq
                ),
            ))
        } else if r.prev_hash != walk.prev_hash {
            Some((
                ProblemKind::BrokenLink,
                r.chain_seq,
                Some(r.seq),
                "prevHash is not the previous record's hash".to_owned(),
            ))
        } else if r.expected_hash(&self.key).as_deref() != Some(r.hash.as_str()) {
            Some((
                ProblemKind::HashMismatch,
                r.chain_seq,
                Some(r.seq),
                "the record does not match its hash".to_owned(),
            ))
        } else {
            None
        };
        // After a gap the walk continues from the record found: one problem, not two.
        let duplicate = r.chain_seq < walk.next;
        if !duplicate {
            walk.next = r.chain_seq + 1;
            walk.prev_hash = r.hash.clone();
        }
        let first_in_chain = !walk.broken;
        if problem.is_some() {
            walk.broken = true;
        }
        let promised = self
            .promised
            .get(&r.chain)
            .filter(|h| h.chain_seq == r.chain_seq)
            .cloned();
        if let Some((kind, chain_seq, seq, message)) = problem {
            if first_in_chain {
                self.report(Problem {
                    kind,
                    chain: r.chain.clone(),
                    chain_seq,
                    seq,
                    message,
                });
            }
        } else if let Some(h) = promised {
            if h.hash != r.hash && first_in_chain {
                if let Some(w) = self.chains.get_mut(&r.chain) {
                    w.broken = true;
                }
                self.report(Problem {
                    kind: ProblemKind::CheckpointMismatch,
                    chain: r.chain.clone(),
                    chain_seq: r.chain_seq,
                    seq: Some(r.seq),
                    message: "the record differs from the one a checkpoint signed".to_owned(),
                });
            }
        }
    }

    /// Checks that no chain ends before its checkpointed head, and reports.
    pub fn finish(mut self) -> VerifyReport {
        let mut promised: Vec<ChainHead> = self.promised.values().cloned().collect();
        promised.sort_by(|a, b| a.chain.cmp(&b.chain));
        for h in promised {
            let (end, broken) = self
                .chains
                .get(&h.chain)
                .map_or((0, false), |w| (w.next - 1, w.broken));
            if end < h.chain_seq && !broken {
                self.report(Problem {
                    kind: ProblemKind::Truncated,
                    chain: h.chain.clone(),
                    chain_seq: end + 1,
                    seq: None,
                    message: format!(
                        "the chain ends at {end} but a checkpoint signed a head at {}",
                        h.chain_seq
                    ),
                });
            }
        }
        VerifyReport {
            ok: self.first_bad.is_none(),
            chains: self.chains.len() as u64,
            records: self.records,
            checkpoints: self.checkpoints,
            unchained_records: self.unchained,
            first_bad: self.first_bad,
            problems: self.problems,
        }
    }
}

/// Filter for listing audit records; results ascend by `seq`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// Only this organization's chain (`None`: every record, for operators).
    pub org_id: Option<OrgId>,
    pub project_id: Option<ProjectId>,
    pub action: Option<String>,
    pub actor: Option<String>,
    pub resource: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// Only records with `seq` greater than this (cursor).
    pub after: Option<i64>,
    pub limit: u32,
}

impl AuditFilter {
    /// Whether `r` passes the filter (the memory store's query).
    pub fn matches(&self, r: &AuditEvent) -> bool {
        let eq = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| Some(w) == have)
        };
        self.org_id
            .as_ref()
            .is_none_or(|o| r.org_id.as_deref() == Some(o.as_str()))
            && self
                .project_id
                .as_ref()
                .is_none_or(|p| r.project_id.as_deref() == Some(p.as_str()))
            && eq(&self.action, Some(&r.action))
            && eq(&self.actor, Some(&r.actor))
            && eq(&self.resource, Some(&r.resource))
            && self.since.is_none_or(|t| r.at >= t)
            && self.until.is_none_or(|t| r.at < t)
            && self.after.is_none_or(|a| r.seq > a)
    }
}

/// Position in an export: after this record of this chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportCursor {
    pub chain: String,
    pub chain_seq: i64,
}

/// The state a sandbox row must still be in for a guarded append
/// ([`AuditStore::append_audit_if`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGuard {
    pub sandbox: differently_core::SandboxId,
    pub status: differently_core::SandboxStatus,
    pub status_version: i64,
}

/// Audit log operations beyond the records every transaction writes.
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Audit records, newest last.
    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;

    /// Appends one record in its own transaction: security-relevant calls that change no
    /// row (exec: program name only; file transfer: path and size). An error means the
    /// record was not written, and the caller must fail the call (fail closed).
    async fn append_audit(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError>;

    /// [`append_audit`](AuditStore::append_audit) only if the sandbox row is still as
    /// `guard` says (checked in the same statement as the append); `None`: it is not, and
    /// nothing was written. Lets a caller act on a row it read earlier without reading it
    /// again, since the record the action depends on is written only if that row still holds.
    async fn append_audit_if(
        &self,
        event: NewAuditEvent,
        guard: &RowGuard,
    ) -> Result<Option<AuditEvent>, StoreError>;

    /// The head of its chain that this process's last committed status change of `resource`
    /// left, as `(chain, chain_seq, hash)`, for that change's status event; `None` when this
    /// process does not know one (a store without compare-and-swap appends never does).
    fn audit_head_after(&self, _resource: &str) -> Option<(String, i64, String)> {
        None
    }

    /// A chain head another process reported (in a status event): this process's next
    /// standalone record on that chain is hashed onto it. Only a hint; a head that moved again
    /// costs the usual retry, and an older one than known is ignored.
    fn note_audit_head(&self, _chain: &str, _seq: i64, _hash: &str) {}

    /// Records passing `filter`, ascending by `seq`, at most `filter.limit` (0: no limit).
    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, StoreError>;

    /// Chained records in `(chain, chainSeq)` order after `after`, at most `limit`.
    async fn export_audit(
        &self,
        after: Option<&ExportCursor>,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError>;

    /// Every checkpoint in `seq` order.
    async fn audit_checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError>;

    /// Signs the current head of every chain as the next checkpoint; `None` if nothing
    /// changed since the last one.
    async fn write_audit_checkpoint(&self) -> Result<Option<Checkpoint>, StoreError>;

    /// Walks every chain and the checkpoints with the process key.
    async fn verify_audit(&self) -> Result<VerifyReport, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> AuditKey {
        AuditKey::from_bytes([b; 32])
    }

    #[test]
    fn a_resource_always_maps_to_the_same_shard_and_shards_are_all_used() {
        let org = OrgId::new();
        assert_eq!(chain_of(None, "pool-a"), INSTALLATION_CHAIN);
        let mut used = std::collections::BTreeSet::new();
        for i in 0..400 {
            let resource = format!("sbx_{i}");
            let chain = chain_of(Some(&org), &resource);
            assert_eq!(chain, chain_of(Some(&org), &resource));
            let (o, shard) = chain.rsplit_once('/').unwrap_or_default();
            assert_eq!(o, org.as_str());
            used.insert(shard.parse::<u32>().unwrap_or(u32::MAX));
        }
        assert_eq!(used, (0..ORG_CHAIN_SHARDS).collect());
        // Pinned: the mapping is part of the stored data, it must not change between versions.
        assert_eq!(chain_of(Some(&org), "sbx_pinned"), format!("{org}/2"));
    }

    fn new_event(action: &str) -> NewAuditEvent {
        NewAuditEvent {
            org_id: None,
            project_id: None,
            actor: "system:test".into(),
            action: action.into(),
            resource: "r".into(),
            outcome: OUTCOME_OK.into(),
            detail: json!({"b": 1, "a": [true, null, "x"]}),
        }
    }

    fn chain(k: &AuditKey, n: i64) -> Vec<AuditEvent> {
        let mut out: Vec<AuditEvent> = vec![];
        for i in 0..n {
            let prev = out.last().map(|r| (r.chain_seq, r.hash.clone()));
            let mut r = AuditEvent::chained(
                k,
                INSTALLATION_CHAIN.into(),
                prev,
                new_event(&format!("a{i}")),
                Utc::now(),
                Some(format!("req{i}")),
            );
            r.seq = i + 10;
            out.push(r);
        }
        out
    }

    fn verify(k: &AuditKey, cps: &[Checkpoint], recs: &[AuditEvent]) -> VerifyReport {
        let mut v = Verifier::new(k.clone());
        cps.iter().for_each(|c| v.checkpoint(c));
        recs.iter().for_each(|r| v.record(r));
        v.finish()
    }

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let v = json!({"z": 1, "a": {"y": [1, {"c": 2, "b": "é\n"}], "x": null}});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":{"x":null,"y":[1,{"b":"é\n","c":2}]},"z":1}"#
        );
    }

    #[test]
    fn keys_parse_from_hex_only() {
        let k = AuditKey::from_hex(&"ab".repeat(32)).unwrap();
        assert_eq!(k, AuditKey::from_bytes([0xab; 32]));
        assert_eq!(AuditKey::from_hex("abc"), Err(KeyError::Format));
        assert_eq!(AuditKey::from_hex(&"zz".repeat(32)), Err(KeyError::Format));
        assert!(!format!("{k:?}").contains("ab"));
    }

    #[test]
    fn an_intact_chain_verifies_and_a_wrong_key_does_not() {
        let k = key(1);
        let recs = chain(&k, 5);
        let r = verify(&k, &[], &recs);
        assert!(r.ok, "{r:?}");
        assert_eq!((r.records, r.chains), (5, 1));
        let r = verify(&key(2), &[], &recs);
        assert_eq!(r.first_bad.unwrap().chain_seq, 1);
    }

    #[test]
    fn an_edit_is_reported_at_exactly_that_record() {
        let k = key(1);
        let mut recs = chain(&k, 5);
        recs[2].detail = json!({"b": 2});
        let r = verify(&k, &[], &recs);
        let bad = r.first_bad.unwrap();
        assert_eq!(bad.kind, ProblemKind::HashMismatch);
        assert_eq!((bad.chain_seq, bad.seq), (3, Some(12)));
        assert_eq!(r.problems.len(), 1);
    }

    #[test]
    fn a_deletion_is_reported_as_the_missing_position() {
        let k = key(1);
        let mut recs = chain(&k, 5);
        recs.remove(1);
        let bad = verify(&k, &[], &recs).first_bad.unwrap();
        assert_eq!(bad.kind, ProblemKind::Missing);
        assert_eq!((bad.chain_seq, bad.seq), (2, None));
    }

    #[test]
    fn a_reorder_is_reported_at_the_first_moved_record() {
        let k = key(1);
        let mut recs = chain(&k, 5);
        // Swap positions 2 and 3 (as an UPDATE of chain_seq would).
        recs[1].chain_seq = 3;
        recs[2].chain_seq = 2;
        recs.swap(1, 2);
        let bad = verify(&k, &[], &recs).first_bad.unwrap();
        assert_eq!((bad.chain_seq, bad.seq), (2, Some(12)));
    }

    #[test]
    fn checkpoints_catch_a_truncated_tail_and_verify_themselves() {
        let k = key(1);
        let recs = chain(&k, 5);
        let head = |r: &AuditEvent| ChainHead {
            chain: r.chain.clone(),
            chain_seq: r.chain_seq,
            hash: r.hash.clone(),
        };
        let c1 = Checkpoint::next(&k, None, vec![head(&recs[1])], Utc::now());
        let c2 = Checkpoint::next(&k, Some(&c1), vec![head(&recs[4])], Utc::now());
        assert!(verify(&k, &[c1.clone(), c2.clone()], &recs).ok);
        let bad = verify(&k, &[c1.clone(), c2.clone()], &recs[..3])
            .first_bad
            .unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::Truncated, 4));
        let mut forged = c2.clone();
        forged.heads[0].chain_seq = 3;
        let bad = verify(&k, &[c1, forged], &recs).first_bad.unwrap();
        assert_eq!(bad.kind, ProblemKind::BadCheckpoint);
    }

    #[test]
    fn export_lines_round_trip_and_still_verify() {
        let k = key(3);
        let recs = chain(&k, 3);
        let text: Vec<String> = recs
            .iter()
            .map(|r| serde_json::to_string(&ExportLine::Record(Box::new(r.clone()))).unwrap())
            .collect();
        let back: Vec<AuditEvent> = text
            .iter()
            .map(|l| match serde_json::from_str(l).unwrap() {
                ExportLine::Record(r) => *r,
                ExportLine::Checkpoint(_) => panic!("record expected"),
            })
            .collect();
        assert!(verify(&k, &[], &back).ok);
    }
}
