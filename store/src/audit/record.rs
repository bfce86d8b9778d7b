//! What a chain holds: records and checkpoints, the chain a record goes to, and how each is
//! hashed onto its predecessor.

use chrono::{DateTime, SecondsFormat, Utc};
use differently_core::{OrgId, ProjectId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::canonical::{canonical_json, stored_time};
use super::key::{decode_hex32, hex, AuditKey};

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
        Some(o) => format!("{o}{}", chain_suffix(resource)),
    }
}

/// What follows the org in the chain of an org's record about `resource`: `/<shard>`. A
/// statement that reads a row and its chain's head at once, before it knows the row's org,
/// joins on `org_id || <this>`.
pub fn chain_suffix(resource: &str) -> String {
    let d = Sha256::digest(resource.as_bytes());
    let shard = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % ORG_CHAIN_SHARDS;
    format!("/{shard}")
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// Installation-wide order (a cursor); not hashed, may have gaps.
    pub seq: i64,
    pub chain: String,
    /// Position in the chain: 1, 2, 3, … without gaps.
    pub chain_seq: i64,
    #[schema(required)]
    pub org_id: Option<String>,
    #[schema(required)]
    pub project_id: Option<String>,
    pub actor: String,
    pub action: String,
    pub resource: String,
    pub outcome: String,
    #[schema(required)]
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
    #[schema(nullable = false)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChainHead {
    pub chain: String,
    pub chain_seq: i64,
    pub hash: String,
}

/// A signed snapshot of every chain's head; checkpoints form a chain of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    #[schema(nullable = false)]
    pub key_id: Option<String>,
    /// Present when this checkpoint starts a new segment after a lost key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub segment: Option<Segment>,
}

/// What a segment checkpoint says: everything at or before its heads that no known key can
/// check was written with a key that is gone. Verification then checks only the links of
/// those records (content could have changed undetected) and counts them as unverifiable;
/// everything after is checked in full. Writing one is an explicit, signed, exported act.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
