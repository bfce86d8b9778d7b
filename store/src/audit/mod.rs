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

mod canonical;
mod key;
mod process_key;
mod record;
mod verify;

use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{OrgId, ProjectId};

use crate::{AuditRecord, StoreError};

pub use canonical::{canonical_json, stored_time};
pub(crate) use key::decode_hex32;
pub use key::{hex, AuditKey, AuditKeyring, KeyError};
pub use process_key::{
    process_key, process_key_is_set, process_keyring, set_process_key, set_process_previous_keys,
};
pub use record::{
    chain_of, chain_suffix, AuditEvent, ChainHead, Checkpoint, ExportLine, NewAuditEvent, Segment,
    CANONICAL_VERSION, CANONICAL_VERSION_KEYED, GENESIS_HASH, INSTALLATION_CHAIN, ORG_CHAIN_SHARDS,
    OUTCOME_OK,
};
pub use verify::{Problem, ProblemKind, SegmentInfo, Verifier, VerifyReport, MAX_PROBLEMS};

// The request id is the API's (it sets it per request, in `differently_core::request_id`);
// the store's writers read it here because every audit record carries it.
pub(crate) use differently_core::request_id::{current_request_id, with_request_id};

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
mod tests;
