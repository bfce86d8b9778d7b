//! A record appended on its own (exec, file calls: `AuditStore::append_audit`) in one
//! autocommit statement when it can be.
//!
//! Appending inside a transaction takes BEGIN, the head lock, the insert and COMMIT: four
//! round trips in front of every exec, with the chain's head held across three of them. A
//! record that is its own transaction does not need the lock held while it is hashed: the
//! process remembers the heads it last wrote, hashes the record onto that head, and one
//! statement advances the head *only if it is still that head* and inserts the record
//! (compare and swap; a concurrent append makes it write nothing, and the unique
//! `(chain, chain_seq)` index would refuse a fork anyway). A miss answers the head the
//! statement found, and the append tries once more on it (reading the head first only if
//! that answer was no newer than the miss), then falls back to the locking path. A chain without a head row, and a
//! record whose `detail` holds a fractional number (which `jsonb` may not give back
//! digit for digit, so it must be checked before commit), always take the locking path.
//!
//! With a [`RowGuard`] (`append_audit_if`) the same statement also checks that the sandbox
//! row is still at the guarded status and version, and writes nothing if it is not; the
//! locking path checks it under the row's key-share lock. A data-plane call that acted on a
//! row it remembered thus needs no read in front of its record.
//!
//! A staged append (`stage_audit_if`, the exec's record) runs its swap inside a transaction
//! whose `COMMIT` overlaps the call. Its `BEGIN` would be one more round trip in front of the
//! call, so the process keeps one transaction begun ahead ([`SpareTx`]): a staged append
//! takes it and asks for the next one once its swap is done, while the call runs. Nothing
//! changes for the record: the transaction is as fresh as one begun then (read committed
//! takes a snapshot per statement, `BEGIN` alone holds no snapshot, no xid and no lock), and
//! its commit is the same.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use sqlx::{Postgres, Row, Transaction};

use crate::audit::{self, chain_of, AuditEvent, NewAuditEvent, RowGuard, StagedAudit};
use crate::pg::audit::append_chained;
use crate::pg::PgStore;
use crate::StoreError;

/// Compare-and-swap attempts before the locking path.
const ATTEMPTS: usize = 2;

/// The newest head of each chain this process knows of, (chain_seq, hash): the heads it
/// appended standalone, the heads its own status changes left, and heads other processes'
/// status events reported (`note`).
#[derive(Debug, Default)]
pub(crate) struct HeadCache {
    heads: Mutex<HashMap<String, (i64, String)>>,
    /// Per resource (a sandbox id), the head of its chain right after this process's last
    /// committed status change of it, for that change's event: (chain, chain_seq, hash).
    after_change: Mutex<HashMap<String, (String, i64, String)>>,
    /// Compare-and-swap appends that found the head moved, since start.
    misses: std::sync::atomic::AtomicU64,
    /// The transaction the next staged append starts from.
    spare: SpareTx,
}

/// Entries a cache map may hold before it starts over, so a busy multi-tenant process does
/// not grow without end.
const CACHE_LIMIT: usize = 100_000;

impl HeadCache {
    pub(crate) fn get(&self, chain: &str) -> Option<(i64, String)> {
        self.lock().get(chain).cloned()
    }

    /// Takes `(seq, hash)` as `chain`'s head unless a newer one is known: after this
    /// process's own append, or as another process reported it. A head that moved again
    /// since only costs the usual compare-and-swap retry.
    pub(crate) fn note(&self, chain: &str, seq: i64, hash: &str) {
        let mut heads = self.lock();
        if heads.get(chain).is_some_and(|(known, _)| *known >= seq) {
            return;
        }
        if heads.len() > CACHE_LIMIT {
            heads.clear();
        }
        heads.insert(chain.to_owned(), (seq, hash.to_owned()));
    }

    /// Records that this process's change of `resource` left `chain` at `(seq, hash)`.
    pub(crate) fn after_change(&self, resource: &str, chain: &str, seq: i64, hash: &str) {
        self.note(chain, seq, hash);
        let mut after = self.after_change.lock().unwrap_or_else(|p| p.into_inner());
        if after.len() > CACHE_LIMIT {
            after.clear();
        }
        after.insert(
            resource.to_owned(),
            (chain.to_owned(), seq, hash.to_owned()),
        );
    }

    /// Compare-and-swap appends that found the head moved, since start.
    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The head this process's last change of `resource` left, if it remembers one.
    pub(crate) fn head_after(&self, resource: &str) -> Option<(String, i64, String)> {
        self.after_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(resource)
            .cloned()
    }

    fn forget(&self, chain: &str) {
        self.lock().remove(chain);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, String)>> {
        self.heads.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a transaction begun ahead waits for a staged append before it is given back. Well
/// under the sessions' `idle_in_transaction_session_timeout` (5 s), after which Postgres
/// would end the session; a quiet process holds no open transaction past it.
const SPARE_FOR: Duration = Duration::from_secs(1);

/// Pools smaller than this keep no transaction begun ahead: it holds one connection out of
/// the pool while it waits, which a pool of one or two cannot spare.
const SPARE_MIN_POOL: u32 = 4;

/// One transaction begun ahead of the next staged append, so that append's only round trip
/// before the call is its compare-and-swap.
#[derive(Default)]
struct SpareTx {
    /// The transaction and when its `BEGIN` was answered.
    slot: Mutex<Option<(Instant, Transaction<'static, Postgres>)>>,
    /// A refill is under way (at most one at a time).
    refilling: AtomicBool,
    /// The task that gives back a transaction no append took is running ([`expire_spares`]).
    expiring: AtomicBool,
}

impl std::fmt::Debug for SpareTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parked = self.lock().is_some();
        f.debug_struct("SpareTx").field("parked", &parked).finish()
    }
}

impl SpareTx {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Transaction<'static, Postgres>)>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parked transaction if it is fresh (begun less than [`SPARE_FOR`] ago); an older
    /// one is dropped (rolled back on its connection's next use).
    fn take(&self) -> Option<Transaction<'static, Postgres>> {
        let (at, tx) = self.lock().take()?;
        (at.elapsed() < SPARE_FOR).then_some(tx)
    }
}

/// A transaction for a staged append, and whether it was begun ahead: the parked one if it
/// is fresh, else a new one (one more round trip).
async fn staging_tx(store: &PgStore) -> Result<(Transaction<'static, Postgres>, bool), StoreError> {
    match store.audit_heads().spare.take() {
        Some(tx) => Ok((tx, true)),
        None => Ok((store.pool().begin().await?, false)),
    }
}

/// A new transaction after the first statement on a parked one failed: its session may have
/// ended while it waited (a database restart), which a transaction begun now would not have
/// met. The failed one wrote nothing (it is rolled back), so the statement can run again.
async fn fresh_after_spare(
    store: &PgStore,
    failed: &StoreError,
) -> Result<Transaction<'static, Postgres>, StoreError> {
    tracing::debug!(error = %failed, "statement on a transaction begun ahead failed; beginning anew");
    Ok(store.pool().begin().await?)
}

/// Begins the next spare transaction in the background (unless one is being begun, the pool
/// is too small to spare a connection, or there is no runtime); [`expire_spares`] gives it
/// back to the pool if no staged append took it within [`SPARE_FOR`]. A `BEGIN` that fails
/// only means the next append begins its own.
fn refill_spare(store: &PgStore) {
    if store.pool().options().get_max_connections() < SPARE_MIN_POOL {
        return;
    }
    let spare = &store.audit_heads().spare;
    if spare.refilling.swap(true, Ordering::AcqRel) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        spare.refilling.store(false, Ordering::Release);
        return;
    };
    let store = store.clone();
    runtime.spawn(async move {
        let spare = &store.audit_heads().spare;
        if let Ok(tx) = store.pool().begin().await {
            let mut slot = spare.lock();
            if slot.is_none() {
                *slot = Some((Instant::now(), tx));
            }
        }
        spare.refilling.store(false, Ordering::Release);
        if !spare.expiring.swap(true, Ordering::AcqRel) {
            expire_spares(store).await;
        }
    });
}

/// Gives back a parked transaction once it is [`SPARE_FOR`] old, for as long as one is
/// parked. One such task at a time: under a steady stream of execs it wakes about once a
/// second (each exec replaces the spare it took), not once per exec.
async fn expire_spares(store: PgStore) {
    let spare = &store.audit_heads().spare;
    loop {
        let age = spare.lock().as_ref().map(|(at, _)| at.elapsed());
        match age {
            Some(age) if age < SPARE_FOR => tokio::time::sleep(SPARE_FOR - age).await,
            Some(_) => {
                let old = {
                    let mut slot = spare.lock();
                    match slot.as_ref() {
                        Some((at, _)) if at.elapsed() >= SPARE_FOR => slot.take(),
                        _ => None,
                    }
                };
                // Dropped outside the lock: the rollback is queued on the connection, which
                // goes back to the pool.
                drop(old);
            }
            None => {
                spare.expiring.store(false, Ordering::Release);
                // One parked after the look above and before the flag was cleared still
                // needs a task to give it back.
                if spare.lock().is_none() || spare.expiring.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        }
    }
}

/// Appends `e` as its own transaction; with `guard`, only if the sandbox row still holds it
/// (`StatusConflict` otherwise, with nothing written).
pub(crate) async fn append(
    store: &PgStore,
    e: NewAuditEvent,
    guard: Option<&RowGuard>,
) -> Result<AuditEvent, StoreError> {
    let chain = chain_of(e.org_id.as_ref(), &e.resource);
    let cache = store.audit_heads();
    if !has_fraction(&e.detail) {
        let started = std::time::Instant::now();
        let at = Utc::now();
        let request_id = audit::current_request_id();
        let mut head = cache.get(&chain);
        for _ in 0..ATTEMPTS {
            let Some(prev) = (match head.take() {
                Some(h) => Some(h),
                None => read_head(store.pool(), &chain).await?,
            }) else {
                break;
            };
            let prev_seq = prev.0;
            let mut rec = AuditEvent::chained(
                audit::process_key(),
                chain.clone(),
                Some(prev.clone()),
                e.clone(),
                at,
                request_id.clone(),
            );
            match swap_in(store.pool(), &rec, prev_seq, guard).await? {
                Swap::Refused(current) => return Err(StoreError::StatusConflict { current }),
                Swap::Done(seq) => {
                    rec.seq = seq;
                    cache.note(&chain, rec.chain_seq, &rec.hash);
                    metrics::histogram!("differently_audit_append_seconds")
                        .record(started.elapsed().as_secs_f64());
                    return Ok(rec);
                }
                Swap::Moved(found) => {
                    cache
                        .misses
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("differently_audit_append_retries_total").increment(1);
                    cache.forget(&chain);
                    // A head no newer than the one missed was read before a concurrent
                    // append committed: read it again rather than miss again.
                    head = found.filter(|(seq, _)| *seq > prev_seq);
                }
            }
        }
    }
    let mut tx = store.pool().begin().await?;
    if let Some(g) = guard {
        // Held until commit: the row cannot change under the record.
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT status, status_version FROM sandboxes WHERE id = $1 FOR KEY SHARE",
        )
        .bind(g.sandbox.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let (status, version) = row.unzip();
        if status.as_deref() != Some(g.status.as_str()) || version != Some(g.status_version) {
            return Err(StoreError::StatusConflict {
                current: parse_status(status.as_deref()),
            });
        }
    }
    let rec = append_chained(&mut tx, e, Utc::now()).await?;
    tx.commit().await?;
    cache.note(&chain, rec.chain_seq, &rec.hash);
    Ok(rec)
}

/// [`append`] with a guard, split at its commit (`AuditStore::stage_audit_if`): the
/// compare-and-swap runs inside a transaction, which holds the chain's head row from the
/// swap to the commit the caller runs while it acts, so the record keeps its place and no
/// other append can land before it. `StatusConflict`: the row moved, nothing written. A
/// record the swap cannot take (no head row, a fractional number, two misses) is appended
/// on the locking path and answered already committed.
pub(crate) async fn stage(
    store: &PgStore,
    e: NewAuditEvent,
    guard: &RowGuard,
) -> Result<StagedAudit, StoreError> {
    let chain = chain_of(e.org_id.as_ref(), &e.resource);
    let cache = store.audit_heads();
    if !has_fraction(&e.detail) {
        let started = std::time::Instant::now();
        let at = Utc::now();
        let request_id = audit::current_request_id();
        let (mut tx, mut spare) = staging_tx(store).await?;
        let mut head = cache.get(&chain);
        for _ in 0..ATTEMPTS {
            let Some(prev) = (match head.take() {
                Some(h) => Some(h),
                None => {
                    let read = match read_head(&mut *tx, &chain).await {
                        Err(e) if spare => {
                            tx = fresh_after_spare(store, &e).await?;
                            read_head(&mut *tx, &chain).await?
                        }
                        read => read?,
                    };
                    spare = false;
                    read
                }
            }) else {
                break;
            };
            let prev_seq = prev.0;
            let mut rec = AuditEvent::chained(
                audit::process_key(),
                chain.clone(),
                Some(prev.clone()),
                e.clone(),
                at,
                request_id.clone(),
            );
            let swapped = match swap_in(&mut *tx, &rec, prev_seq, Some(guard)).await {
                Err(e) if spare => {
                    tx = fresh_after_spare(store, &e).await?;
                    swap_in(&mut *tx, &rec, prev_seq, Some(guard)).await?
                }
                swapped => swapped?,
            };
            spare = false;
            match swapped {
                Swap::Refused(current) => return Err(StoreError::StatusConflict { current }),
                Swap::Done(seq) => {
                    rec.seq = seq;
                    // Noted before the commit: a later append from this process hashes onto
                    // it and waits on the head row; should the commit fail, that append
                    // misses and reads the head again.
                    cache.note(&chain, rec.chain_seq, &rec.hash);
                    // The next staged append's transaction begins while this call runs.
                    refill_spare(store);
                    return Ok(StagedAudit::pending(rec, async move {
                        tx.commit().await?;
                        metrics::histogram!("differently_audit_append_seconds")
                            .record(started.elapsed().as_secs_f64());
                        Ok(())
                    }));
                }
                Swap::Moved(found) => {
                    cache
                        .misses
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("differently_audit_append_retries_total").increment(1);
                    cache.forget(&chain);
                    head = found.filter(|(seq, _)| *seq > prev_seq);
                }
            }
        }
    }
    append(store, e, Some(guard))
        .await
        .map(StagedAudit::committed)
}

/// The chain's committed head, unlocked; `None` without a head row.
async fn read_head(
    db: impl sqlx::PgExecutor<'_>,
    chain: &str,
) -> Result<Option<(i64, String)>, StoreError> {
    sqlx::query("SELECT chain_seq, hash FROM audit_heads WHERE chain = $1")
        .bind(chain)
        .fetch_optional(db)
        .await?
        .map(|r| -> Result<(i64, String), StoreError> { Ok((r.try_get(0)?, r.try_get(1)?)) })
        .transpose()
}

/// What a compare-and-swap append did.
enum Swap {
    /// Written; the record's global `seq`.
    Done(i64),
    /// Nothing written: the guarded row is not as guarded (its status now, `Failed` standing
    /// in for a row that is gone).
    Refused(differently_core::SandboxStatus),
    /// Nothing written: the head had moved. The head the statement saw, if the chain has one
    /// (it may predate an append the statement waited for).
    Moved(Option<(i64, String)>),
}

/// Advances the head from `prev_seq` to `rec` and inserts `rec`, in one autocommit
/// statement; if the head is no longer at `prev_seq`, writes nothing and answers the head.
/// With `guard`, also writes nothing unless the sandbox row is at the guarded status and
/// version (checked first: a refused guard is answered before a moved head).
async fn swap_in(
    db: impl sqlx::PgExecutor<'_>,
    rec: &AuditEvent,
    prev_seq: i64,
    guard: Option<&RowGuard>,
) -> Result<Swap, StoreError> {
    let query = sqlx::query(
        "WITH g AS (
             SELECT s.status, s.status = $16 AND s.status_version = $17 AS holds
             FROM sandboxes s WHERE $15::text IS NOT NULL AND s.id = $15),
         h AS (
             UPDATE audit_heads SET chain_seq = $2, hash = $13
             WHERE chain = $1 AND chain_seq = $14
               AND ($15::text IS NULL OR EXISTS (SELECT 1 FROM g WHERE holds))
             RETURNING 1),
         ins AS (
             INSERT INTO audit_events (chain, chain_seq, org_id, project_id, actor, action,
                 resource, outcome, request_id, at, detail, prev_hash, hash, key_id)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $18 FROM h
             RETURNING seq)
         SELECT (SELECT seq FROM ins) AS seq, cur.chain_seq, cur.hash,
                (SELECT holds FROM g) AS holds, (SELECT status FROM g) AS status
         FROM (SELECT 1) AS one LEFT JOIN audit_heads cur ON cur.chain = $1",
    );
    let row = bind_chained(query, rec)
        .bind(prev_seq)
        .bind(guard.map(|g| g.sandbox.as_str()))
        .bind(guard.map(|g| g.status.as_str()))
        .bind(guard.map(|g| g.status_version))
        .bind(&rec.key_id)
        .fetch_one(db)
        .await?;
    if let Some(seq) = row.try_get::<Option<i64>, _>("seq")? {
        return Ok(Swap::Done(seq));
    }
    if guard.is_some() && row.try_get::<Option<bool>, _>("holds")? != Some(true) {
        let status: Option<String> = row.try_get("status")?;
        return Ok(Swap::Refused(parse_status(status.as_deref())));
    }
    let seq: Option<i64> = row.try_get("chain_seq")?;
    let hash: Option<String> = row.try_get("hash")?;
    Ok(Swap::Moved(seq.zip(hash)))
}

/// Binds `rec`'s chained fields, `chain` to `hash` in the order of `audit_events`' columns
/// (13 parameters; `key_id` is bound where each statement takes it).
pub(crate) fn bind_chained<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    rec: &'q AuditEvent,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    q.bind(&rec.chain)
        .bind(rec.chain_seq)
        .bind(&rec.org_id)
        .bind(&rec.project_id)
        .bind(&rec.actor)
        .bind(&rec.action)
        .bind(&rec.resource)
        .bind(&rec.outcome)
        .bind(&rec.request_id)
        .bind(rec.at)
        .bind(&rec.detail)
        .bind(&rec.prev_hash)
        .bind(&rec.hash)
}

/// A stored status; `Failed` stands in for a row that is gone (or a status this version
/// does not know), which a guard treats the same: not the row it guarded.
fn parse_status(s: Option<&str>) -> differently_core::SandboxStatus {
    s.and_then(|s| s.parse().ok())
        .unwrap_or(differently_core::SandboxStatus::Failed)
}

/// Whether `v` holds a number that is not an integer: `jsonb` keeps numbers as `numeric`
/// and prints them its own way (`1e-7` comes back `0.0000001`), so such a record must be
/// checked before its commit, which only the locking path does. Integers come back as
/// written.
pub(crate) fn has_fraction(v: &Value) -> bool {
    match v {
        Value::Number(n) => !(n.is_i64() || n.is_u64()),
        Value::Array(a) => a.iter().any(has_fraction),
        Value::Object(o) => o.values().any(has_fraction),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_fractional_numbers_need_the_checked_path() {
        assert!(!has_fraction(
            &json!({"program": "echo", "n": 3, "big": u64::MAX})
        ));
        assert!(!has_fraction(&json!(["a", -4, {"x": null, "y": true}])));
        assert!(has_fraction(&json!({"ratio": 0.5})));
        assert!(has_fraction(&json!({"deep": [1, {"f": 1e-7}]})));
        // canonical_json is what is hashed; an integer survives it unchanged.
        assert_eq!(audit::canonical_json(&json!({"n": 3})), r#"{"n":3}"#);
    }
}
