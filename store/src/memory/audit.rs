//! Audit chains in the memory store: the same records and hashes as Postgres, kept under the
//! store's one mutex, so an append is atomic with the change it records.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::OrgId;

use crate::audit::{
    self, chain_of, AuditEvent, AuditFilter, AuditStore, ChainHead, Checkpoint, ExportCursor,
    NewAuditEvent, RowGuard, Segment, Verifier, VerifyReport,
};
use crate::memory::MemoryStore;
use crate::{AuditRecord, StoreError};

/// Every record in `seq` order, each chain's head, and the checkpoints.
#[derive(Debug, Default)]
pub(crate) struct MemoryAudit {
    records: Vec<AuditEvent>,
    heads: HashMap<String, (i64, String)>,
    checkpoints: Vec<Checkpoint>,
}

impl MemoryAudit {
    /// Every chain's head, sorted by chain (what a checkpoint signs).
    fn sorted_heads(&self) -> Vec<ChainHead> {
        let mut heads: Vec<ChainHead> = self
            .heads
            .iter()
            .map(|(chain, (chain_seq, hash))| ChainHead {
                chain: chain.clone(),
                chain_seq: *chain_seq,
                hash: hash.clone(),
            })
            .collect();
        heads.sort_by(|a, b| a.chain.cmp(&b.chain));
        heads
    }

    /// Appends `e` to its chain with the current task's request id.
    pub(crate) fn append(&mut self, e: NewAuditEvent, at: DateTime<Utc>) -> AuditEvent {
        let chain = chain_of(e.org_id.as_ref(), &e.resource);
        let head = self.heads.get(&chain).cloned();
        let mut rec = AuditEvent::chained(
            audit::process_key(),
            chain,
            head,
            e,
            at,
            audit::current_request_id(),
        );
        rec.seq = i64::try_from(self.records.len()).unwrap_or(i64::MAX - 1) + 1;
        self.heads
            .insert(rec.chain.clone(), (rec.chain_seq, rec.hash.clone()));
        self.records.push(rec.clone());
        rec
    }

    /// The last `limit` records in the store contract's older shape.
    pub(crate) fn tail(&self, limit: usize) -> Vec<AuditRecord> {
        let skip = self.records.len().saturating_sub(limit);
        self.records[skip..]
            .iter()
            .map(|r| AuditRecord {
                seq: r.seq,
                org_id: r.org_id.as_deref().and_then(|o| OrgId::parse(o).ok()),
                actor: r.actor.clone(),
                action: r.action.clone(),
                resource: r.resource.clone(),
                at: r.at,
                detail: r.detail.clone(),
            })
            .collect()
    }

    /// Records in `(chain, chainSeq)` order (`seq` breaks ties, as duplicates can exist only
    /// after tampering).
    fn chain_order(&self) -> Vec<&AuditEvent> {
        let mut v: Vec<&AuditEvent> = self.records.iter().collect();
        v.sort_by(|a, b| (&a.chain, a.chain_seq, a.seq).cmp(&(&b.chain, b.chain_seq, b.seq)));
        v
    }
}

#[cfg(feature = "test-support")]
impl MemoryStore {
    /// Test support: changes stored audit records directly, as someone with write access to
    /// the storage could (the memory store's equivalent of SQL with triggers disabled).
    pub fn tamper_audit(&self, f: impl FnOnce(&mut Vec<AuditEvent>)) {
        f(&mut self.lock().audit.records);
    }
}

#[async_trait]
impl AuditStore for MemoryStore {
    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        Ok(self.lock().audit.tail(limit as usize))
    }

    async fn append_audit(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError> {
        Ok(self.lock().audit.append(event, Utc::now()))
    }

    async fn append_audit_if(
        &self,
        event: NewAuditEvent,
        guard: &RowGuard,
    ) -> Result<Option<AuditEvent>, StoreError> {
        let mut st = self.lock();
        let holds = st.sandboxes.get(&guard.sandbox).is_some_and(|r| {
            r.sandbox.status == guard.status && r.sandbox.status_version == guard.status_version
        });
        Ok(holds.then(|| st.audit.append(event, Utc::now())))
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, StoreError> {
        let st = self.lock();
        let limit = if filter.limit == 0 {
            usize::MAX
        } else {
            filter.limit as usize
        };
        Ok(st
            .audit
            .records
            .iter()
            .filter(|r| filter.matches(r))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn export_audit(
        &self,
        after: Option<&ExportCursor>,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let st = self.lock();
        Ok(st
            .audit
            .chain_order()
            .into_iter()
            .filter(|r| after.is_none_or(|c| (&r.chain, r.chain_seq) > (&c.chain, c.chain_seq)))
            .take(limit.max(1) as usize)
            .cloned()
            .collect())
    }

    async fn audit_checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        Ok(self.lock().audit.checkpoints.clone())
    }

    async fn write_audit_checkpoint(&self) -> Result<Option<Checkpoint>, StoreError> {
        let mut st = self.lock();
        let heads = st.audit.sorted_heads();
        let last = st.audit.checkpoints.last();
        if heads.is_empty() || last.is_some_and(|l| l.heads == heads) {
            return Ok(None);
        }
        let cp = Checkpoint::next(audit::process_key(), last, heads, Utc::now());
        st.audit.checkpoints.push(cp.clone());
        Ok(Some(cp))
    }

    async fn write_audit_segment(&self, segment: Segment) -> Result<Checkpoint, StoreError> {
        let mut st = self.lock();
        let heads = st.audit.sorted_heads();
        let cp = Checkpoint::next_segment(
            audit::process_key(),
            st.audit.checkpoints.last(),
            heads,
            Utc::now(),
            Some(segment),
        );
        st.audit.checkpoints.push(cp.clone());
        Ok(cp)
    }

    async fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        let st = self.lock();
        let mut v = Verifier::new(audit::process_keyring());
        for cp in &st.audit.checkpoints {
            v.checkpoint(cp);
        }
        for r in st.audit.chain_order() {
            v.record(r);
        }
        Ok(v.finish())
    }
}
