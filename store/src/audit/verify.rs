//! The verifier: walks checkpoints and chains, record by record, and reports the first
//! problem of each chain. The same walk checks a live database and an offline export.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::key::{AuditKey, AuditKeyring};
use super::record::{AuditEvent, ChainHead, Checkpoint, GENESIS_HASH};

/// What is wrong with a record or checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub kind: ProblemKind,
    /// The chain (`checkpoints` for checkpoint problems).
    pub chain: String,
    /// The position at fault (for `missing`: the absent one).
    pub chain_seq: i64,
    /// The stored record at fault, when there is one.
    #[schema(required)]
    pub seq: Option<i64>,
    pub message: String,
}

/// Result of walking the chains and checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub ok: bool,
    pub chains: u64,
    pub records: u64,
    pub checkpoints: u64,
    /// Records written before chaining existed (migration 0004); not verifiable.
    pub unchained_records: u64,
    /// The first problem in walk order (chains by id, then by position).
    #[schema(required)]
    pub first_bad: Option<Problem>,
    /// The first problem of each broken chain (at most [`MAX_PROBLEMS`]).
    pub problems: Vec<Problem>,
    /// Records a segment covers whose signature no known key could check: only their links
    /// were verified.
    #[serde(default)]
    #[schema(required)]
    pub unverifiable_records: u64,
    /// Checkpoints a later segment covers whose signature no known key could check.
    #[serde(default)]
    #[schema(required)]
    pub unverifiable_checkpoints: u64,
    /// Key ids named by records or checkpoints that the verifier's ring does not hold.
    #[serde(default)]
    #[schema(required)]
    pub unknown_key_ids: Vec<String>,
    /// Every segment checkpoint, oldest first.
    #[serde(default)]
    #[schema(required)]
    pub segments: Vec<SegmentInfo>,
}

/// A segment as listed in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SegmentInfo {
    pub seq: i64,
    pub at: DateTime<Utc>,
    #[schema(required)]
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
