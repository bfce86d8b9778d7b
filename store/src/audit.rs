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

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// Version of the canonical form of records and checkpoints that carry no key id (`"v": 1`).
pub const CANONICAL_VERSION: u64 = 1;

/// Version of the canonical form that also hashes the signing key's id (`"v": 2`).
pub const CANONICAL_VERSION_KEYED: u64 = 2;

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

    /// The key as 64 hex characters: only for handing a newly generated key to its owner
    /// (`differently key generate --audit`, `dev`), never for logs.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
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

/// The keys a verifier knows: the one that signs now and the ones that signed before it, so
/// chains written before a rotation still verify. Records name their key by id.
#[derive(Clone, Debug)]
pub struct AuditKeyring {
    current: AuditKey,
    previous: Vec<AuditKey>,
}

impl AuditKeyring {
    /// A ring of one key.
    pub fn new(current: AuditKey) -> AuditKeyring {
        AuditKeyring {
            current,
            previous: vec![],
        }
    }

    /// The same ring that also knows `previous` (retired keys, still trusted to verify).
    pub fn with_previous(mut self, previous: Vec<AuditKey>) -> AuditKeyring {
        self.previous = previous;
        self
    }

    /// The signing key.
    pub fn current(&self) -> &AuditKey {
        &self.current
    }

    /// The key with this id, if the ring has it.
    pub fn by_id(&self, id: &str) -> Option<&AuditKey> {
        self.keys().find(|k| k.key_id() == id)
    }

    /// Every key, the signing one first.
    pub fn keys(&self) -> impl Iterator<Item = &AuditKey> {
        std::iter::once(&self.current).chain(self.previous.iter())
    }
}

impl From<AuditKey> for AuditKeyring {
    fn from(k: AuditKey) -> AuditKeyring {
        AuditKeyring::new(k)
    }
}

static PROCESS_KEY: std::sync::OnceLock<AuditKey> = std::sync::OnceLock::new();
static PROCESS_PREVIOUS_KEYS: std::sync::OnceLock<Vec<AuditKey>> = std::sync::OnceLock::new();

/// Installs retired keys that `verify` still accepts (key rotation). Fails if already set.
pub fn set_process_previous_keys(keys: Vec<AuditKey>) -> Result<(), Vec<AuditKey>> {
    PROCESS_PREVIOUS_KEYS.set(keys)
}

/// The process's signing key and its retired keys.
pub fn process_keyring() -> AuditKeyring {
    AuditKeyring::new(process_key().clone())
        .with_previous(PROCESS_PREVIOUS_KEYS.get().cloned().unwrap_or_default())
}

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
    /// Id of the key that signed it ([`AuditKey::key_id`]); absent on records written before
    /// key ids existed, which verify under any key of the ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

/// Adds the key id to a canonical object (and moves it to the keyed version), so the id a
/// record names is covered by its own hash and cannot be relabelled.
fn keyed(mut v: Value, key_id: Option<&str>) -> Value {
    if let (Some(id), Value::Object(map)) = (key_id, &mut v) {
        map.insert("keyId".to_owned(), Value::String(id.to_owned()));
        map.insert("v".to_owned(), json!(CANONICAL_VERSION_KEYED));
    }
    v
}

impl AuditEvent {
    /// The canonical bytes hashed for this record (everything but `seq` and `hash`).
    pub fn canonical(&self) -> String {
        canonical_json(&keyed(
            json!({
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
            }),
            self.key_id.as_deref(),
        ))
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
            key_id: Some(key.key_id()),
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
    /// Id of the key that signed it; absent on checkpoints from before key ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// Present when this checkpoint starts a new segment after a lost key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// What a segment checkpoint says: everything at or before its heads that no known key can
/// check was written with a key that is gone. Verification then checks only the links of
/// those records (content could have changed undetected) and counts them as unverifiable;
/// everything after is checked in full. Writing one is an explicit, signed, exported act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Segment {
    /// Why, in the operator's words.
    pub reason: String,
    /// Key ids the records named that no key of the signer's ring matched.
    pub lost_key_ids: Vec<String>,
}

impl Checkpoint {
    /// The canonical bytes hashed for this checkpoint.
    pub fn canonical(&self) -> String {
        let mut v = json!({
            "v": CANONICAL_VERSION,
            "kind": "checkpoint",
            "seq": self.seq,
            "at": self.at.to_rfc3339_opts(SecondsFormat::Micros, true),
            "heads": self.heads,
        });
        if let (Some(seg), Value::Object(map)) = (&self.segment, &mut v) {
            map.insert("kind".to_owned(), json!("segment"));
            map.insert("segment".to_owned(), json!(seg));
        }
        canonical_json(&keyed(v, self.key_id.as_deref()))
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
        heads: Vec<ChainHead>,
        at: DateTime<Utc>,
    ) -> Checkpoint {
        Checkpoint::next_segment(key, prev, heads, at, None)
    }

    /// [`Checkpoint::next`], optionally starting a segment (see [`Segment`]).
    pub fn next_segment(
        key: &AuditKey,
        prev: Option<&Checkpoint>,
        mut heads: Vec<ChainHead>,
        at: DateTime<Utc>,
        segment: Option<Segment>,
    ) -> Checkpoint {
        heads.sort_by(|a, b| a.chain.cmp(&b.chain));
        let mut cp = Checkpoint {
            seq: prev.map_or(1, |p| p.seq + 1),
            at: stored_time(at),
            heads,
            prev_hash: prev.map_or_else(|| GENESIS_HASH.to_owned(), |p| p.hash.clone()),
            hash: String::new(),
            key_id: Some(key.key_id()),
            segment,
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
    /// A record or checkpoint names a key the verifier does not have (a retired key not
    /// configured, or a lost one: see `docs/audit.md`).
    UnknownKey,
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
    /// Records a segment covers whose signature no known key could check: only their links
    /// were verified.
    #[serde(default)]
    pub unverifiable_records: u64,
    /// Checkpoints a later segment covers whose signature no known key could check.
    #[serde(default)]
    pub unverifiable_checkpoints: u64,
    /// Key ids named by records or checkpoints that the verifier's ring does not hold.
    #[serde(default)]
    pub unknown_key_ids: Vec<String>,
    /// Every segment checkpoint, oldest first.
    #[serde(default)]
    pub segments: Vec<SegmentInfo>,
}

/// A segment as listed in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SegmentInfo {
    pub seq: i64,
    pub at: DateTime<Utc>,
    pub key_id: Option<String>,
    pub reason: String,
    pub lost_key_ids: Vec<String>,
}

/// Whether a signature checks out under a keyring.
#[derive(Debug, PartialEq, Eq)]
enum Signature {
    Valid,
    /// The named key is not in the ring.
    UnknownKey(String),
    /// A key was found (or, unlabelled, every key was tried) and the hash differs.
    Mismatch,
}

fn check_signature(
    ring: &AuditKeyring,
    key_id: Option<&str>,
    hash: &str,
    expected: impl Fn(&AuditKey) -> Option<String>,
) -> Signature {
    let matches = |k: &AuditKey| expected(k).as_deref() == Some(hash);
    match key_id {
        Some(id) => match ring.by_id(id) {
            Some(k) if matches(k) => Signature::Valid,
            Some(_) => Signature::Mismatch,
            None => Signature::UnknownKey(id.to_owned()),
        },
        None if ring.keys().any(matches) => Signature::Valid,
        None => Signature::Mismatch,
    }
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
    ring: AuditKeyring,
    chains: BTreeMap<String, Walk>,
    /// Heads promised by the latest validly signed checkpoint.
    promised: HashMap<String, ChainHead>,
    last_checkpoint: Option<(i64, String)>,
    checkpoint_broken: bool,
    /// The first checkpoint whose signature failed and how many did, until a segment covers
    /// them or the checkpoints end.
    unsigned: Option<(Problem, u64)>,
    /// Per chain, the last position a segment covers.
    covered: HashMap<String, i64>,
    checkpoints_done: bool,
    records: u64,
    checkpoints: u64,
    unchained: u64,
    unverifiable_records: u64,
    unverifiable_checkpoints: u64,
    unknown_key_ids: BTreeSet<String>,
    segments: Vec<SegmentInfo>,
    problems: Vec<Problem>,
    first_bad: Option<Problem>,
}

impl Verifier {
    /// A verifier checking with `ring` (an [`AuditKey`] converts into a ring of one).
    pub fn new(ring: impl Into<AuditKeyring>) -> Verifier {
        Verifier {
            ring: ring.into(),
            chains: BTreeMap::new(),
            promised: HashMap::new(),
            last_checkpoint: None,
            checkpoint_broken: false,
            unsigned: None,
            covered: HashMap::new(),
            checkpoints_done: false,
            records: 0,
            checkpoints: 0,
            unchained: 0,
            unverifiable_records: 0,
            unverifiable_checkpoints: 0,
            unknown_key_ids: BTreeSet::new(),
            segments: vec![],
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
        let broken_link = if cp.seq != want_seq + 1 {
            Some(format!("checkpoint {} follows {want_seq}", cp.seq))
        } else if cp.prev_hash != want_prev {
            Some(format!(
                "checkpoint {} does not link to its predecessor",
                cp.seq
            ))
        } else {
            None
        };
        if let Some(message) = broken_link {
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
        let problem = match check_signature(&self.ring, cp.key_id.as_deref(), &cp.hash, |k| {
            cp.expected_hash(k)
        }) {
            Signature::Valid => None,
            Signature::UnknownKey(id) => {
                let p = Problem {
                    kind: ProblemKind::UnknownKey,
                    chain: "checkpoints".to_owned(),
                    chain_seq: cp.seq,
                    seq: None,
                    message: unknown_key_message(&id),
                };
                self.unknown_key_ids.insert(id);
                Some(p)
            }
            Signature::Mismatch => Some(Problem {
                kind: ProblemKind::BadCheckpoint,
                chain: "checkpoints".to_owned(),
                chain_seq: cp.seq,
                seq: None,
                message: format!("checkpoint {} does not match its hash", cp.seq),
            }),
        };
        if let Some(p) = problem {
            // A later segment may still cover it: decided when the checkpoints end.
            match &mut self.unsigned {
                Some((_, n)) => *n += 1,
                None => self.unsigned = Some((p, 1)),
            }
            return;
        }
        self.promised = cp
            .heads
            .iter()
            .map(|h| (h.chain.clone(), h.clone()))
            .collect();
        if let Some(seg) = &cp.segment {
            if let Some((_, n)) = self.unsigned.take() {
                self.unverifiable_checkpoints += n;
            }
            for h in &cp.heads {
                let end = self.covered.entry(h.chain.clone()).or_insert(0);
                *end = (*end).max(h.chain_seq);
            }
            self.segments.push(SegmentInfo {
                seq: cp.seq,
                at: cp.at,
                key_id: cp.key_id.clone(),
                reason: seg.reason.clone(),
                lost_key_ids: seg.lost_key_ids.clone(),
            });
        }
    }

    /// Reports an uncovered unsigned checkpoint once the checkpoints are all in.
    fn end_checkpoints(&mut self) {
        if std::mem::replace(&mut self.checkpoints_done, true) {
            return;
        }
        if let Some((p, _)) = self.unsigned.take() {
            self.checkpoint_broken = true;
            self.report(p);
        }
    }

    /// Checks one record; records come in `(chain, chainSeq)` order.
    pub fn record(&mut self, r: &AuditEvent) {
        self.end_checkpoints();
        self.records += 1;
        let covered = self
            .covered
            .get(&r.chain)
            .is_some_and(|end| r.chain_seq <= *end);
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
        } else {
            let sig = check_signature(&self.ring, r.key_id.as_deref(), &r.hash, |k| {
                r.expected_hash(k)
            });
            if let Signature::UnknownKey(id) = &sig {
                self.unknown_key_ids.insert(id.clone());
            }
            match sig {
                Signature::Valid => None,
                // Written before a segment by a key that is gone: only its link is checked.
                _ if covered => {
                    self.unverifiable_records += 1;
                    None
                }
                Signature::UnknownKey(id) => Some((
                    ProblemKind::UnknownKey,
                    r.chain_seq,
                    Some(r.seq),
                    unknown_key_message(&id),
                )),
                Signature::Mismatch => Some((
                    ProblemKind::HashMismatch,
                    r.chain_seq,
                    Some(r.seq),
                    "the record does not match its hash".to_owned(),
                )),
            }
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
        self.end_checkpoints();
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
            unverifiable_records: self.unverifiable_records,
            unverifiable_checkpoints: self.unverifiable_checkpoints,
            unknown_key_ids: self.unknown_key_ids.into_iter().collect(),
            segments: self.segments,
        }
    }
}

fn unknown_key_message(id: &str) -> String {
    format!(
        "signed with audit key {id}, which this verifier does not hold: configure it as a \
         previous key, or, if it is lost, start a new segment (docs/audit.md)"
    )
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

/// A guarded record written but not yet committed ([`AuditStore::stage_audit_if`]): the
/// guard held and the record has its place in the chain, so the action it covers may start
/// while [`commit`](StagedAudit::commit) makes it durable. The action's answer waits for the
/// commit; dropping a pending record uncommitted writes nothing.
pub struct StagedAudit {
    record: AuditEvent,
    commit: Option<PendingCommit>,
}

/// The commit a [`StagedAudit`] still owes.
type PendingCommit = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

impl StagedAudit {
    /// A record that is already durable.
    pub fn committed(record: AuditEvent) -> StagedAudit {
        StagedAudit {
            record,
            commit: None,
        }
    }

    /// A record that is durable once `commit` has completed successfully.
    pub fn pending(
        record: AuditEvent,
        commit: impl Future<Output = Result<(), StoreError>> + Send + 'static,
    ) -> StagedAudit {
        StagedAudit {
            record,
            commit: Some(Box::pin(commit)),
        }
    }

    /// The record as it will be committed.
    pub fn record(&self) -> &AuditEvent {
        &self.record
    }

    /// Makes the record durable; an error means it was not written, and the action it covers
    /// must fail (fail closed).
    pub async fn commit(self) -> Result<AuditEvent, StoreError> {
        if let Some(commit) = self.commit {
            commit.await?;
        }
        Ok(self.record)
    }
}

impl fmt::Debug for StagedAudit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagedAudit")
            .field("record", &self.record)
            .field("pending", &self.commit.is_some())
            .finish()
    }
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

    /// [`append_audit_if`](AuditStore::append_audit_if) split at its commit: the guard is
    /// checked and the record written, and the caller commits it while the action runs, so a
    /// data-plane call pays for the record's durability (an fsync) in parallel with the
    /// backend instead of before it. `None`: the row moved, and nothing was written. A store
    /// whose appends cost no I/O commits at once.
    async fn stage_audit_if(
        &self,
        event: NewAuditEvent,
        guard: &RowGuard,
    ) -> Result<Option<StagedAudit>, StoreError> {
        Ok(self
            .append_audit_if(event, guard)
            .await?
            .map(StagedAudit::committed))
    }

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

    /// Signs every chain's head as a checkpoint that starts a new segment (after a lost key),
    /// whether or not anything changed.
    async fn write_audit_segment(&self, segment: Segment) -> Result<Checkpoint, StoreError>;

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

    /// `recs` continued by `n` records signed with `k` (a key rotation mid-chain).
    fn extend(k: &AuditKey, mut recs: Vec<AuditEvent>, n: i64) -> Vec<AuditEvent> {
        for i in 0..n {
            let prev = recs.last().map(|r| (r.chain_seq, r.hash.clone()));
            let mut r = AuditEvent::chained(
                k,
                INSTALLATION_CHAIN.into(),
                prev,
                new_event(&format!("b{i}")),
                Utc::now(),
                None,
            );
            r.seq = 100 + i;
            recs.push(r);
        }
        recs
    }

    fn head_of(r: &AuditEvent) -> ChainHead {
        ChainHead {
            chain: r.chain.clone(),
            chain_seq: r.chain_seq,
            hash: r.hash.clone(),
        }
    }

    fn segment(reason: &str) -> Option<Segment> {
        Some(Segment {
            reason: reason.into(),
            lost_key_ids: vec![],
        })
    }

    #[test]
    fn records_name_their_key_and_the_name_is_covered_by_the_hash() {
        let k = key(1);
        let mut recs = chain(&k, 2);
        assert_eq!(recs[0].key_id.as_deref(), Some(k.key_id().as_str()));
        assert!(recs[0].canonical().contains("\"keyId\""));
        assert!(recs[0].canonical().contains("\"v\":2"));
        // Relabelling a record with another key's id breaks it.
        recs[1].key_id = Some(key(2).key_id());
        let ring = AuditKeyring::new(k.clone()).with_previous(vec![key(2)]);
        let mut v = Verifier::new(ring);
        recs.iter().for_each(|r| v.record(r));
        let bad = v.finish().first_bad.unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::HashMismatch, 2));
    }

    #[test]
    fn a_rotated_key_still_verifies_old_records_when_the_ring_holds_it() {
        let (old, new) = (key(1), key(2));
        let recs = extend(&new, chain(&old, 3), 3);
        let ring = AuditKeyring::new(new.clone()).with_previous(vec![old.clone()]);
        let mut v = Verifier::new(ring);
        recs.iter().for_each(|r| v.record(r));
        let r = v.finish();
        assert!(r.ok, "{r:?}");
        assert_eq!(r.records, 6);
        // Without the old key the first old record is reported, naming the key it needs.
        let r = verify(&new, &[], &recs);
        let bad = r.first_bad.unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::UnknownKey, 1));
        assert!(bad.message.contains(&old.key_id()), "{}", bad.message);
        assert_eq!(r.unknown_key_ids, vec![old.key_id()]);
    }

    #[test]
    fn records_without_a_key_id_verify_under_any_key_of_the_ring() {
        let (old, new) = (key(1), key(2));
        let mut recs = chain(&old, 3);
        // As written before key ids: v1 canonical form, no id.
        for i in 0..recs.len() {
            recs[i].key_id = None;
            if i > 0 {
                recs[i].prev_hash = recs[i - 1].hash.clone();
            }
            recs[i].hash = recs[i].expected_hash(&old).unwrap();
        }
        assert!(recs[0].canonical().contains("\"v\":1"));
        let ring = AuditKeyring::new(new.clone()).with_previous(vec![old.clone()]);
        let mut v = Verifier::new(ring);
        recs.iter().for_each(|r| v.record(r));
        assert!(v.finish().ok);
        let bad = verify(&new, &[], &recs).first_bad.unwrap();
        assert_eq!(bad.kind, ProblemKind::HashMismatch);
    }

    #[test]
    fn a_segment_after_a_lost_key_checks_links_before_it_and_everything_after() {
        let (lost, new) = (key(1), key(2));
        let old = chain(&lost, 3);
        let c1 = Checkpoint::next(&lost, None, vec![head_of(&old[2])], Utc::now());
        let seg = Checkpoint::next_segment(
            &new,
            Some(&c1),
            vec![head_of(&old[2])],
            Utc::now(),
            segment("key lost in the 2026-12 incident"),
        );
        let recs = extend(&new, old.clone(), 2);
        // Without the segment: the lost key is reported.
        assert!(!verify(&new, std::slice::from_ref(&c1), &recs).ok);
        let r = verify(&new, &[c1.clone(), seg.clone()], &recs);
        assert!(r.ok, "{r:?}");
        assert_eq!((r.unverifiable_records, r.unverifiable_checkpoints), (3, 1));
        assert_eq!(r.segments.len(), 1);
        assert_eq!(r.segments[0].reason, "key lost in the 2026-12 incident");
        assert_eq!(r.unknown_key_ids, vec![lost.key_id()]);

        // A segment does not excuse a broken link before it ...
        let mut cut = recs.clone();
        cut[1].prev_hash = GENESIS_HASH.into();
        let bad = verify(&new, &[c1.clone(), seg.clone()], &cut)
            .first_bad
            .unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::BrokenLink, 2));
        // ... nor an edit after it ...
        let mut edited = recs.clone();
        edited[4].detail = json!({"edited": true});
        let bad = verify(&new, &[c1.clone(), seg.clone()], &edited)
            .first_bad
            .unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::HashMismatch, 5));
        // ... nor records signed with the lost key after it.
        let late = extend(&lost, recs.clone(), 1);
        let bad = verify(&new, &[c1, seg], &late).first_bad.unwrap();
        assert_eq!((bad.kind, bad.chain_seq), (ProblemKind::UnknownKey, 6));
    }

    #[test]
    fn a_segment_signed_with_an_unknown_key_covers_nothing() {
        let (lost, other, new) = (key(1), key(3), key(2));
        let old = chain(&lost, 2);
        let seg = Checkpoint::next_segment(
            &other,
            None,
            vec![head_of(&old[1])],
            Utc::now(),
            segment("forged"),
        );
        let r = verify(&new, std::slice::from_ref(&seg), &old);
        let bad = r.first_bad.unwrap();
        assert_eq!(
            (bad.kind, bad.chain.as_str()),
            (ProblemKind::UnknownKey, "checkpoints")
        );
        assert!(r.segments.is_empty());
        assert_eq!(r.unverifiable_records, 0);
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
