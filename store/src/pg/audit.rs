//! Audit chains on Postgres.
//!
//! An append locks its chain's row in `audit_heads` (reading the newest committed head in the
//! same statement), then inserts the next record and advances the head in one statement, all
//! inside the caller's transaction (a chain's very first append serializes on an advisory lock
//! keyed by the chain, `dly_aud` + a hash of its id, since there is no row to lock yet): the record commits or rolls
//! back with the change it describes, and appends of different organizations never wait for
//! each other. The lock is held until commit, so append audit records last in a transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::{OrgId, ProjectId};
use sha2::{Digest, Sha256};
use sqlx::types::Json;
use sqlx::{Postgres, Row, Transaction};

use crate::audit::{
    self, canonical_json, chain_of, AuditEvent, AuditFilter, AuditStore, ChainHead, Checkpoint,
    ExportCursor, NewAuditEvent, RowGuard, Segment, StagedAudit, Verifier, VerifyReport,
};
use crate::pg::prior_write::{bind, PriorWrite};
use crate::pg::PgStore;
use crate::{AuditRecord, StoreError};
use sqlx::postgres::PgArguments;

/// The advisory lock id of `chain`: "dly_aud" namespaced by the first bytes of its SHA-256.
/// A collision only makes two chains share a lock.
fn chain_lock_id(chain: &str) -> i64 {
    let d = Sha256::new()
        .chain_update(b"dly_aud\0")
        .chain_update(chain.as_bytes())
        .finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

/// Advisory lock of the checkpoint chain.
const CHECKPOINT_LOCK: i64 = 0x646c_795f_6175_6463; // "dly_audc"

const COLUMNS: &str = "seq, chain, chain_seq, org_id, project_id, actor, action, resource, \
                       outcome, request_id, at, detail, prev_hash, hash, key_id";

const CHECKPOINT_COLUMNS: &str = "seq, at, heads, prev_hash, hash, key_id, segment";

/// Appends `e` to its chain inside `tx`, with the current task's request id (a group of one
/// for `append_then_lock_counters`).
pub(crate) async fn append_chained(
    tx: &mut Transaction<'static, Postgres>,
    e: NewAuditEvent,
    at: DateTime<Utc>,
) -> Result<AuditEvent, StoreError> {
    append_then_lock_counters(tx, None, vec![(e, audit::current_request_id())], at, &[])
        .await?
        .pop()
        .ok_or_else(|| StoreError::Internal("audit append of one wrote nothing".into()))
}

/// Appends records inside `tx`, each with its own request id (a group may act for several
/// requests), chains in sorted order and records in the order given; returns them as stored,
/// chain by chain. Every chain's head is locked by one statement (in chain order, the order
/// every writer uses) and every record of every chain is written by one more, so a group
/// spanning many organizations holds their heads for two round trips, not two per chain. The
/// time taken (locks included) is `differently_audit_append_seconds`.
///
/// The insert statement also locks the usage counters of `counters` (empty: none) in their
/// global order (`usage_counters::lock_in_order`), which multi-row writers must do last: the same
/// locks in the same order, one round trip fewer while the heads are held.
///
/// `prior`, the group's own row write, runs first, in the head-lock statement when there are
/// records (`PriorWrite::then_lock_heads`), else alone.
pub(crate) async fn append_then_lock_counters(
    tx: &mut Transaction<'static, Postgres>,
    prior: Option<PriorWrite>,
    events: Vec<(NewAuditEvent, Option<String>)>,
    at: DateTime<Utc>,
    counters: &[String],
) -> Result<Vec<AuditEvent>, StoreError> {
    if events.is_empty() {
        if let Some(w) = prior {
            w.run(tx).await?;
        }
        if !counters.is_empty() {
            crate::pg::usage_counters::lock_in_order(tx, counters).await?;
        }
        return Ok(Vec::new());
    }
    let started = std::time::Instant::now();
    type Pending = Vec<(NewAuditEvent, Option<String>)>;
    let mut by_chain: std::collections::BTreeMap<String, Pending> =
        std::collections::BTreeMap::new();
    for (e, request_id) in events {
        by_chain
            .entry(chain_of(e.org_id.as_ref(), &e.resource))
            .or_default()
            .push((e, request_id));
    }
    let chains: Vec<&str> = by_chain.keys().map(String::as_str).collect();
    let mut heads = match prior {
        Some(w) => w
            .then_lock_heads(tx, &chains)
            .await?
            .into_iter()
            .map(|(chain, seq, hash)| (chain, (seq, hash)))
            .collect(),
        None => lock_heads(tx, &chains).await?,
    };
    for chain in &chains {
        if !heads.contains_key(*chain) {
            // A chain's very first append: rare, serialized on its advisory lock.
            if let Some(head) = first_head(tx, chain).await? {
                heads.insert((*chain).to_owned(), head);
            }
        }
    }
    let mut recs: Vec<AuditEvent> = Vec::new();
    let mut new_heads: Vec<(String, i64, String)> = Vec::with_capacity(by_chain.len());
    for (chain, events) in by_chain {
        let chained = chain_onto(&chain, heads.remove(&chain), events, at);
        if let Some(last) = chained.last() {
            new_heads.push((chain, last.chain_seq, last.hash.clone()));
        }
        recs.extend(chained);
    }
    let mut args = PgArguments::default();
    bind_record_columns(&mut args, &recs)?;
    bind(
        &mut args,
        new_heads.iter().map(|h| h.0.as_str()).collect::<Vec<_>>(),
    )?;
    bind(
        &mut args,
        new_heads.iter().map(|h| h.1).collect::<Vec<i64>>(),
    )?;
    bind(
        &mut args,
        new_heads.iter().map(|h| h.2.as_str()).collect::<Vec<_>>(),
    )?;
    bind(&mut args, counters)?;
    let rows = sqlx::query_with(
        "WITH ins AS (
             INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action,
                 resource, outcome, request_id, at, detail, prev_hash, hash, key_id)
             SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                 $6::text[], $7::text[], $8::text[], $9::text[], $10::timestamptz[],
                 $11::jsonb[], $12::text[], $13::text[], $14::text[])
             RETURNING seq, chain, chain_seq, detail),
         head AS (
             INSERT INTO audit_heads (chain, chain_seq, hash)
             SELECT * FROM UNNEST($15::text[], $16::bigint[], $17::text[])
             ON CONFLICT (chain) DO UPDATE SET chain_seq = EXCLUDED.chain_seq,
                 hash = EXCLUDED.hash),
         counters AS MATERIALIZED (
             SELECT 1 FROM usage_counters WHERE scope = ANY($18)
             ORDER BY rank, scope COLLATE \"C\" FOR UPDATE)
         SELECT seq, chain, chain_seq, detail
         FROM ins, (SELECT count(*) FROM counters) AS locked
         ORDER BY chain COLLATE \"C\", chain_seq",
        args,
    )
    .fetch_all(&mut **tx)
    .await?;
    if rows.len() != recs.len() {
        return Err(StoreError::Internal(format!(
            "audit append: {} of {} records written",
            rows.len(),
            recs.len()
        )));
    }
    // `recs` is in (chain, chain_seq) order too, so rows pair up one to one.
    for (row, rec) in rows.iter().zip(recs.iter_mut()) {
        let chain: String = row.try_get("chain")?;
        let chain_seq: i64 = row.try_get("chain_seq")?;
        if chain != rec.chain || chain_seq != rec.chain_seq {
            return Err(StoreError::Internal(format!(
                "audit append: record {chain}/{chain_seq} came back out of order"
            )));
        }
        rec.seq = row.try_get("seq")?;
        // jsonb normalizes what it stores; a detail that would read back differently would
        // make a correct record fail verification, so refuse it now (fail closed).
        let stored: serde_json::Value = row.try_get("detail")?;
        if canonical_json(&stored) != canonical_json(&rec.detail) {
            return Err(StoreError::Internal(format!(
                "audit detail of {} does not survive storage unchanged",
                rec.action
            )));
        }
    }
    metrics::histogram!("differently_audit_append_seconds").record(started.elapsed().as_secs_f64());
    Ok(recs)
}

/// `events` (each with its request id) as records of `chain`, in order, the first onto
/// `head` (`None`: the chain's first record), each onto the one before.
pub(crate) fn chain_onto(
    chain: &str,
    mut head: Option<(i64, String)>,
    events: impl IntoIterator<Item = (NewAuditEvent, Option<String>)>,
    at: DateTime<Utc>,
) -> Vec<AuditEvent> {
    let mut recs = Vec::new();
    for (e, request_id) in events {
        let rec = AuditEvent::chained(
            audit::process_key(),
            chain.to_owned(),
            head.take(),
            e,
            at,
            request_id,
        );
        head = Some((rec.chain_seq, rec.hash.clone()));
        recs.push(rec);
    }
    recs
}

/// Binds `recs` as the 14 arrays of `audit_events`' columns, `chain` to `key_id` in column
/// order (`$n` to `$n+13`, cast `text[]` but `chain_seq` `bigint[]`, `at` `timestamptz[]`
/// and `detail` `jsonb[]`), as a multi-row insert `SELECT`s them from `UNNEST`.
pub(crate) fn bind_record_columns(
    args: &mut PgArguments,
    recs: &[AuditEvent],
) -> Result<(), StoreError> {
    let col =
        |f: fn(&AuditEvent) -> Option<&str>| -> Vec<Option<&str>> { recs.iter().map(f).collect() };
    bind(args, col(|r| Some(&r.chain)))?;
    bind(args, recs.iter().map(|r| r.chain_seq).collect::<Vec<i64>>())?;
    bind(args, col(|r| r.org_id.as_deref()))?;
    bind(args, col(|r| r.project_id.as_deref()))?;
    bind(args, col(|r| Some(&r.actor)))?;
    bind(args, col(|r| Some(&r.action)))?;
    bind(args, col(|r| Some(&r.resource)))?;
    bind(args, col(|r| Some(&r.outcome)))?;
    bind(args, col(|r| r.request_id.as_deref()))?;
    bind(
        args,
        recs.iter().map(|r| r.at).collect::<Vec<DateTime<Utc>>>(),
    )?;
    bind(
        args,
        recs.iter()
            .map(|r| r.detail.clone())
            .collect::<Vec<serde_json::Value>>(),
    )?;
    bind(args, col(|r| Some(&r.prev_hash)))?;
    bind(args, col(|r| Some(&r.hash)))?;
    bind(args, col(|r| r.key_id.as_deref()))?;
    Ok(())
}

/// Locks the head rows of `chains` (sorted) in that order; the newest committed head of each
/// chain that has one.
async fn lock_heads(
    tx: &mut Transaction<'static, Postgres>,
    chains: &[&str],
) -> Result<std::collections::HashMap<String, (i64, String)>, StoreError> {
    let rows = sqlx::query(
        "SELECT chain, chain_seq, hash FROM audit_heads WHERE chain = ANY($1)
         ORDER BY chain COLLATE \"C\" FOR UPDATE",
    )
    .bind(chains)
    .fetch_all(&mut **tx)
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?))))
        .collect()
}

/// A chain's first append (no head row yet): first appends of one chain serialize on an
/// advisory lock, re-check for a head row created meanwhile, and otherwise start from the
/// chain's newest record, if any. The append then creates the head row.
async fn first_head(
    tx: &mut Transaction<'static, Postgres>,
    chain: &str,
) -> Result<Option<(i64, String)>, StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(chain_lock_id(chain))
        .execute(&mut **tx)
        .await?;
    if let Some(head) = lock_heads(tx, &[chain]).await?.remove(chain) {
        return Ok(Some(head));
    }
    // Read committed: this statement sees every record committed before the lock was ours.
    sqlx::query(
        "SELECT chain_seq, hash FROM audit_events WHERE chain = $1
         ORDER BY chain_seq DESC LIMIT 1",
    )
    .bind(chain)
    .fetch_optional(&mut **tx)
    .await?
    .map(|r| -> Result<(i64, String), StoreError> { Ok((r.try_get(0)?, r.try_get(1)?)) })
    .transpose()
}

fn event_of(r: &sqlx::postgres::PgRow) -> Result<AuditEvent, StoreError> {
    Ok(AuditEvent {
        seq: r.try_get("seq")?,
        chain: r.try_get("chain")?,
        chain_seq: r.try_get("chain_seq")?,
        org_id: r.try_get("org_id")?,
        project_id: r.try_get("project_id")?,
        actor: r.try_get("actor")?,
        action: r.try_get("action")?,
        resource: r.try_get("resource")?,
        outcome: r.try_get("outcome")?,
        request_id: r.try_get("request_id")?,
        at: r.try_get("at")?,
        detail: r.try_get("detail")?,
        prev_hash: r.try_get("prev_hash")?,
        hash: r.try_get("hash")?,
        key_id: r.try_get("key_id")?,
    })
}

fn checkpoint_of(r: &sqlx::postgres::PgRow) -> Result<Checkpoint, StoreError> {
    let Json(heads): Json<Vec<ChainHead>> = r.try_get("heads")?;
    Ok(Checkpoint {
        seq: r.try_get("seq")?,
        at: r.try_get("at")?,
        heads,
        prev_hash: r.try_get("prev_hash")?,
        hash: r.try_get("hash")?,
        key_id: r.try_get("key_id")?,
        segment: r
            .try_get::<Option<Json<Segment>>, _>("segment")?
            .map(|Json(s)| s),
    })
}

impl PgStore {
    /// Signs every chain's head as the next checkpoint (a segment's always; a plain one only
    /// when a head moved), under the checkpoint chain's lock.
    async fn write_checkpoint(
        &self,
        segment: Option<Segment>,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let mut tx = self.pool().begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(CHECKPOINT_LOCK)
            .execute(&mut *tx)
            .await?;
        let last = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints ORDER BY seq DESC LIMIT 1"
        ))
        .fetch_optional(&mut *tx)
        .await?
        .as_ref()
        .map(checkpoint_of)
        .transpose()?;
        // Each head is a committed record; heads of different chains need not be taken at
        // one instant, only each at a real position.
        let rows = sqlx::query(
            "SELECT DISTINCT ON (chain) chain, chain_seq, hash FROM audit_events
             WHERE chain IS NOT NULL ORDER BY chain, chain_seq DESC",
        )
        .fetch_all(&mut *tx)
        .await?;
        let mut heads = Vec::with_capacity(rows.len());
        for r in &rows {
            heads.push(ChainHead {
                chain: r.try_get("chain")?,
                chain_seq: r.try_get("chain_seq")?,
                hash: r.try_get("hash")?,
            });
        }
        let unchanged = heads.is_empty() || last.as_ref().is_some_and(|l| l.heads == heads);
        if unchanged && segment.is_none() {
            return Ok(None);
        }
        let cp = Checkpoint::next_segment(
            audit::process_key(),
            last.as_ref(),
            heads,
            Utc::now(),
            segment,
        );
        sqlx::query(
            "INSERT INTO audit_checkpoints (seq, at, heads, prev_hash, hash, key_id, segment)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(cp.seq)
        .bind(cp.at)
        .bind(Json(&cp.heads))
        .bind(&cp.prev_hash)
        .bind(&cp.hash)
        .bind(&cp.key_id)
        .bind(cp.segment.as_ref().map(Json))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(cp))
    }
}

/// Records read per query while verifying.
const VERIFY_BATCH: u32 = 5000;

#[async_trait]
impl AuditStore for PgStore {
    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM (
                 SELECT seq, org_id, actor, action, resource, at, detail FROM audit_events
                 ORDER BY seq DESC LIMIT $1
             ) t ORDER BY seq",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let org: Option<String> = r.try_get("org_id")?;
                let org_id = org
                    .map(|o| OrgId::parse(&o))
                    .transpose()
                    .map_err(|e| StoreError::Internal(e.to_string()))?;
                Ok(AuditRecord {
                    seq: r.try_get("seq")?,
                    org_id,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    resource: r.try_get("resource")?,
                    at: r.try_get("at")?,
                    detail: r.try_get("detail")?,
                })
            })
            .collect()
    }

    async fn append_audit(&self, event: NewAuditEvent) -> Result<AuditEvent, StoreError> {
        crate::pg::audit_standalone::append(self, event, None).await
    }

    fn audit_head_after(&self, resource: &str) -> Option<(String, i64, String)> {
        self.audit_heads().head_after(resource)
    }

    fn note_audit_head(&self, chain: &str, seq: i64, hash: &str) {
        self.audit_heads().note(chain, seq, hash);
    }

    async fn append_audit_if(
        &self,
        event: NewAuditEvent,
        guard: &RowGuard,
    ) -> Result<Option<AuditEvent>, StoreError> {
        match crate::pg::audit_standalone::append(self, event, Some(guard)).await {
            Ok(rec) => Ok(Some(rec)),
            Err(StoreError::StatusConflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn stage_audit_if(
        &self,
        event: NewAuditEvent,
        guard: &RowGuard,
    ) -> Result<Option<StagedAudit>, StoreError> {
        match crate::pg::audit_standalone::stage(self, event, guard).await {
            Ok(staged) => Ok(Some(staged)),
            Err(StoreError::StatusConflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_audit(&self, f: &AuditFilter) -> Result<Vec<AuditEvent>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM audit_events
             WHERE chain IS NOT NULL
               AND ($1::text IS NULL OR org_id = $1)
               AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR action = $3)
               AND ($4::text IS NULL OR actor = $4)
               AND ($5::text IS NULL OR resource = $5)
               AND ($6::timestamptz IS NULL OR at >= $6)
               AND ($7::timestamptz IS NULL OR at < $7)
               AND ($8::bigint IS NULL OR seq > $8)
             ORDER BY seq LIMIT $9"
        );
        let rows = sqlx::query(&sql)
            .bind(f.org_id.as_ref().map(OrgId::as_str))
            .bind(f.project_id.as_ref().map(ProjectId::as_str))
            .bind(f.action.as_deref())
            .bind(f.actor.as_deref())
            .bind(f.resource.as_deref())
            .bind(f.since)
            .bind(f.until)
            .bind(f.after)
            .bind((f.limit != 0).then_some(i64::from(f.limit)))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(event_of).collect()
    }

    async fn export_audit(
        &self,
        after: Option<&ExportCursor>,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM audit_events
             WHERE chain IS NOT NULL
               AND ($1::text IS NULL OR (chain, chain_seq) > ($1, $2))
             ORDER BY chain, chain_seq LIMIT $3"
        );
        let rows = sqlx::query(&sql)
            .bind(after.map(|c| c.chain.as_str()))
            .bind(after.map_or(0, |c| c.chain_seq))
            .bind(i64::from(limit.max(1)))
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(event_of).collect()
    }

    async fn audit_checkpoints(&self) -> Result<Vec<Checkpoint>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints ORDER BY seq"
        ))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(checkpoint_of).collect()
    }

    async fn write_audit_checkpoint(&self) -> Result<Option<Checkpoint>, StoreError> {
        self.write_checkpoint(None).await
    }

    async fn write_audit_segment(&self, segment: Segment) -> Result<Checkpoint, StoreError> {
        self.write_checkpoint(Some(segment))
            .await?
            .ok_or_else(|| StoreError::Internal("a segment checkpoint was not written".into()))
    }

    async fn verify_audit(&self) -> Result<VerifyReport, StoreError> {
        let mut v = Verifier::new(audit::process_keyring());
        let unchained: i64 =
            sqlx::query_scalar("SELECT count(*) FROM audit_events WHERE chain IS NULL")
                .fetch_one(self.pool())
                .await?;
        v.unchained(u64::try_from(unchained).unwrap_or(0));
        for cp in self.audit_checkpoints().await? {
            v.checkpoint(&cp);
        }
        let mut after: Option<ExportCursor> = None;
        loop {
            let batch = self.export_audit(after.as_ref(), VERIFY_BATCH).await?;
            for r in &batch {
                v.record(r);
            }
            match batch.last() {
                Some(r) if batch.len() == VERIFY_BATCH as usize => {
                    after = Some(ExportCursor {
                        chain: r.chain.clone(),
                        chain_seq: r.chain_seq,
                    });
                }
                _ => break,
            }
        }
        Ok(v.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_locks_differ_per_chain_and_are_stable() {
        assert_eq!(chain_lock_id("org_a"), chain_lock_id("org_a"));
        assert_ne!(chain_lock_id("org_a"), chain_lock_id("org_b"));
    }
}
