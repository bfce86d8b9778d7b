//! A lone status change in two round trips and no transaction, one after a worker's claim
//! (issue #47).
//!
//! On the lane ([`super::transition_lane`]) a change is BEGIN, lock the row, write it with its
//! audit record, COMMIT: four round trips, with the row and the chain's head locked across
//! two of them. That pays when changes group; a change with nothing to group with (a batch of
//! one) instead reads its row, its version (`xmin`) and its chain's head unlocked, decides in
//! Rust exactly as the lane would, and sends the new row and the chained record in one call of
//! `differently_change_sandbox` (migration 0018). The call writes only if neither the row nor
//! the head moved since the read; a miss writes nothing and answers the row and head it found,
//! which the next try decides on. After [`TRIES`] misses, or for a chain without a head row or
//! a record `jsonb` may not give back digit for digit, the change goes back to the lane. A
//! worker's claim has just read the row it changes next (its create's `running`, its delete's
//! `terminated`), so it leaves the row, version and head in a [`RowMemo`] and that change
//! starts from them instead of reading.
//!
//! What a caller sees is the lane's answer: the same rules on the row as it is when written,
//! the record in the same transaction as the change (the statement's), counters moved by the
//! same trigger at its commit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId};
use sqlx::Row;

use crate::audit::{self, chain_of, chain_suffix, AuditEvent};
use crate::pg::audit_records::sandbox_event;
use crate::pg::audit_standalone::{bind_chained, has_fraction};
use crate::pg::env_at_rest;
use crate::pg::rows::{sandbox_of, to_i32, to_i64};
use crate::pg::transition_lane::Change;
use crate::pg::transition_patch::{self, Patched};
use crate::pg::PgStore;
use crate::{SeenRow, StoreError};

/// Calls before a change goes back to the lane: a row or head that moved twice in a row is
/// contended, which the lane's locks settle.
const TRIES: usize = 2;

/// What this process's lone status changes did, since start.
#[derive(Debug, Default)]
pub(crate) struct SwapStats {
    /// Decided and written in one statement (refusals included).
    pub(crate) done: AtomicU64,
    /// Calls that found the row or the head moved and wrote nothing.
    pub(crate) misses: AtomicU64,
    /// Handed back to the lane.
    pub(crate) laned: AtomicU64,
    /// Rows read because none was remembered.
    pub(crate) reads: AtomicU64,
    /// Changed from what the caller saw, with no read (`transition_patch`).
    pub(crate) patched: AtomicU64,
}

/// A row as read, with the chain head its next record goes onto.
pub(crate) struct Seen {
    row: Sandbox,
    /// The row version's `xmin`, as text.
    xmin: String,
    /// `(chain_seq, hash)`; `None`: the chain has no head row yet.
    head: Option<(i64, String)>,
    /// Read by this change (or found by its call), not remembered from before it: only a
    /// refusal decided on such a row is an answer.
    fresh: bool,
}

impl Seen {
    /// The row as read.
    pub(crate) fn row(&self) -> &Sandbox {
        &self.row
    }
}

/// Rows this process read, with their version and chain head, right before it changes them
/// (a worker's create claim reads the row it then marks running), so that change needs no
/// read of its own. The change takes its row out; an entry is only a first guess, which the
/// call's guards check like any other.
#[derive(Default)]
pub(crate) struct RowMemo {
    rows: Mutex<HashMap<SandboxId, (Instant, Seen)>>,
}

/// How long a remembered row is worth a first try: a create that took longer has likely
/// seen its row or head move.
const MEMO_FOR: Duration = Duration::from_secs(60);

/// Rows the memo may hold before it starts over (a row claimed and never changed by this
/// process stays until then).
const MEMO_LIMIT: usize = 4096;

impl std::fmt::Debug for RowMemo {
    // The rows hold sandboxes' env values: only their number is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowMemo")
            .field("rows", &self.lock().len())
            .finish()
    }
}

impl RowMemo {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (Instant, Seen)>> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `seen` for the row's next change in this process.
    pub(crate) fn remember(&self, seen: Seen) {
        let mut rows = self.lock();
        if rows.len() >= MEMO_LIMIT {
            rows.clear();
        }
        rows.insert(seen.row.id.clone(), (Instant::now(), seen));
    }

    /// The row remembered for `id`, if it is recent; forgotten either way.
    fn take(&self, id: &SandboxId) -> Option<Seen> {
        let (at, seen) = self.lock().remove(id)?;
        (at.elapsed() < MEMO_FOR).then_some(seen)
    }
}

/// What one call did.
enum Swapped {
    /// Written.
    Done,
    /// Nothing written; what the call found.
    Moved(Box<Seen>),
    Gone,
    NoHead,
}

/// Applies `change` to row `id` alone. `None`: not done here (nothing written); the lane
/// must decide it. An error is the caller's, as a lone change's is on the lane.
pub(crate) async fn change(
    store: &PgStore,
    id: &SandboxId,
    change: &Change,
    seen: Option<&SeenRow>,
    now: DateTime<Utc>,
    request_id: Option<&str>,
) -> Option<Result<Sandbox, StoreError>> {
    // Served from the first change on, misses or not, so the dashboard's panel has a series
    // (deploy/grafana/differently.json; its test requires every charted metric served).
    static MISSES_SERVED: std::sync::Once = std::sync::Once::new();
    MISSES_SERVED.call_once(|| {
        metrics::counter!("differently_transition_swap_misses_total").increment(0);
    });
    match attempt(store, id, change, seen, now, request_id).await {
        Ok(Some(done)) => {
            store.swap_stats().done.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("differently_transition_swaps_total", "outcome" => "done")
                .increment(1);
            Some(done)
        }
        Ok(None) => {
            store.swap_stats().laned.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("differently_transition_swaps_total", "outcome" => "lane")
                .increment(1);
            None
        }
        // As on the lane, where a lone change's failed transaction is its caller's error:
        // a call whose answer was lost may or may not have committed, which a retry on the
        // lane would misreport as a conflict.
        Err(e) => {
            metrics::counter!("differently_transition_swaps_total", "outcome" => "error")
                .increment(1);
            Some(Err(e))
        }
    }
}

async fn attempt(
    store: &PgStore,
    id: &SandboxId,
    change: &Change,
    seen_by_caller: Option<&SeenRow>,
    now: DateTime<Utc>,
    request_id: Option<&str>,
) -> Result<Option<Result<Sandbox, StoreError>>, StoreError> {
    let seen = match store.row_memo().take(id) {
        Some(seen) => seen,
        None => {
            let patched = match (change, seen_by_caller) {
                (Change::To(t), Some(by_caller)) => {
                    transition_patch::patch(store, t, by_caller, now, request_id).await?
                }
                _ => None,
            };
            match patched {
                Some(Patched::Done(next)) => {
                    store.swap_stats().patched.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("differently_transition_patches_total").increment(1);
                    return Ok(Some(Ok(*next)));
                }
                Some(Patched::Gone) => return Ok(Some(Err(StoreError::NotFound))),
                Some(Patched::Moved(found)) => {
                    store.swap_stats().misses.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!("differently_transition_swap_misses_total").increment(1);
                    *found
                }
                None => match read(store, id).await? {
                    Some(seen) => seen,
                    None => return Ok(Some(Err(StoreError::NotFound))),
                },
            }
        }
    };
    settle(store, seen, change, now, request_id).await
}

/// Decides `change` on `seen` and sends it, deciding again on what a miss found, up to
/// [`TRIES`] calls. `Ok(None)`: the lane's to decide (nothing written).
async fn settle(
    store: &PgStore,
    mut seen: Seen,
    change: &Change,
    now: DateTime<Utc>,
    request_id: Option<&str>,
) -> Result<Option<Result<Sandbox, StoreError>>, StoreError> {
    let mut calls = 0;
    while calls < TRIES {
        let Some(head) = seen.head.clone() else {
            return Ok(None);
        };
        // Decided on the row as it is now (read, or found by the last call): a refusal is
        // the answer the lane would give.
        let mut next = seen.row.clone();
        let entry = match change.apply(&mut next, now) {
            Ok(entry) => entry,
            Err(e) if seen.fresh => return Ok(Some(Err(e))),
            // A remembered row may be out of date: the refusal is decided again on the row
            // as it is.
            Err(_) => match read(store, &seen.row.id).await? {
                Some(now_seen) => {
                    seen = now_seen;
                    continue;
                }
                None => return Ok(Some(Err(StoreError::NotFound))),
            },
        };
        let event = sandbox_event(&next, entry);
        if has_fraction(&event.detail) {
            return Ok(None);
        }
        let chain = chain_of(Some(&next.org_id), next.id.as_str());
        let rec = AuditEvent::chained(
            audit::process_key(),
            chain,
            Some(head.clone()),
            event,
            now,
            request_id.map(str::to_owned),
        );
        calls += 1;
        match swap(store, &seen.xmin, head.0, &next, &rec).await? {
            Swapped::Done => {
                store.audit_heads().after_change(
                    &rec.resource,
                    &rec.chain,
                    rec.chain_seq,
                    &rec.hash,
                );
                return Ok(Some(Ok(next)));
            }
            Swapped::Moved(now_seen) => {
                store.swap_stats().misses.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("differently_transition_swap_misses_total").increment(1);
                seen = *now_seen;
            }
            Swapped::Gone => return Ok(Some(Err(StoreError::NotFound))),
            Swapped::NoHead => return Ok(None),
        }
    }
    Ok(None)
}

/// The row, its version and its chain's head, in one unlocked read; `None`: no such row.
async fn read(store: &PgStore, id: &SandboxId) -> Result<Option<Seen>, StoreError> {
    store.swap_stats().reads.fetch_add(1, Ordering::Relaxed);
    let row = sqlx::query(
        "SELECT s.doc, s.env_sealed, s.xmin::text AS xmin, h.chain_seq, h.hash
         FROM sandboxes s
         LEFT JOIN audit_heads h ON h.chain = s.org_id || $2
         WHERE s.id = $1",
    )
    .bind(id.as_str())
    .bind(chain_suffix(id.as_str()))
    .fetch_optional(store.pool())
    .await?;
    row.as_ref().map(seen_of).transpose()
}

/// A [`Seen`] from a row with `doc`, `env_sealed`, `xmin`, `chain_seq` and `hash`.
pub(crate) fn seen_of(row: &sqlx::postgres::PgRow) -> Result<Seen, StoreError> {
    let seq: Option<i64> = row.try_get("chain_seq")?;
    let hash: Option<String> = row.try_get("hash")?;
    Ok(Seen {
        row: sandbox_of(row)?,
        xmin: row.try_get("xmin")?,
        head: seq.zip(hash),
        fresh: true,
    })
}

/// [`seen_of`] for a row read ahead of its change, to [`RowMemo::remember`].
pub(crate) fn remembered_of(row: &sqlx::postgres::PgRow) -> Result<Seen, StoreError> {
    Ok(Seen {
        fresh: false,
        ..seen_of(row)?
    })
}

/// Writes `next` and appends `rec` if the row is still at `xmin` and the chain's head at
/// `prev_seq`; one autocommit statement.
async fn swap(
    store: &PgStore,
    xmin: &str,
    prev_seq: i64,
    next: &Sandbox,
    rec: &AuditEvent,
) -> Result<Swapped, StoreError> {
    let (doc, env_sealed) = env_at_rest::stored(next)?;
    let query = sqlx::query(
        "SELECT o_outcome AS outcome, o_xmin AS xmin, o_doc AS doc,
                o_env_sealed AS env_sealed, o_head_seq AS chain_seq, o_head_hash AS hash
         FROM differently_change_sandbox($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
             $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28,
             $29, $30)",
    )
    .bind(next.id.as_str())
    .bind(xmin)
    .bind(prev_seq)
    .bind(next.status.as_str())
    .bind(next.status_version)
    .bind(next.pool.as_deref())
    .bind(next.backend_ref.as_deref())
    .bind(to_i32(next.attempts)?)
    .bind(next.spec.priority)
    .bind(i64::from(next.spec.resources.cpu))
    .bind(to_i64(next.spec.resources.memory_mib, "memory")?)
    .bind(to_i64(next.spec.resources.disk_gib, "disk")?)
    .bind(next.expires_at)
    .bind(next.updated_at)
    .bind(doc)
    .bind(env_sealed);
    let row = bind_chained(query, rec)
        .bind(&rec.key_id)
        .fetch_one(store.pool())
        .await?;
    let outcome: String = row.try_get("outcome")?;
    match outcome.as_str() {
        "done" => Ok(Swapped::Done),
        "row_moved" | "head_moved" => Ok(Swapped::Moved(Box::new(seen_of(&row)?))),
        "gone" => Ok(Swapped::Gone),
        "no_head" => Ok(Swapped::NoHead),
        other => Err(StoreError::Internal(format!(
            "differently_change_sandbox answered {other:?}"
        ))),
    }
}

/// The misses, made to happen between the read and the call: another process changes the row
/// or moves the chain's head in between.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::audit::{AuditStore, NewAuditEvent};
    use crate::prelude::LifecycleStore;
    use crate::testing::TestDb;
    use crate::{
        Activation, ActivationStore, Actor, Admission, AdmissionStore, Admitted, PoolSlot, Quota,
        SandboxReadStore, Transition, TransitionStore,
    };
    use differently_core::{CreateSandboxRequest, OrgId, SandboxSpec, SandboxStatus};

    /// A provisioning sandbox of a new org, and a second handle on the database (another
    /// process).
    async fn provisioning(db: &TestDb) -> (PgStore, PgStore, Sandbox) {
        let store = db.store();
        let other = PgStore::connect(db.url(), 2).await.unwrap();
        let (org, prj) = db.tenant().await;
        let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
        let sbx = Sandbox::queued(org, prj, spec, None, Utc::now());
        let admission = Admission {
            request_id: None,
            direct: None,
            sandbox: sbx,
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::Key("key_test".into()),
        };
        let Admitted::New(sbx) = store.admit(admission).await.unwrap() else {
            panic!("not admitted");
        };
        let slot = PoolSlot {
            name: "p".into(),
            max_concurrent: None,
        };
        let Activation::Activated(sbx) = store
            .activate(&sbx.id, &slot, &Quota::default(), Utc::now())
            .await
            .unwrap()
        else {
            panic!("not activated");
        };
        (store, other, sbx)
    }

    fn tr(id: &SandboxId, from: SandboxStatus, to: SandboxStatus) -> Transition {
        Transition {
            id: id.clone(),
            from: vec![from],
            to,
            reason: Some("test".into()),
            actor: Actor::System("test"),
        }
    }

    async fn settled(store: &PgStore, seen: Seen, change: &Change) -> Result<Sandbox, StoreError> {
        settle(store, seen, change, Utc::now(), None)
            .await
            .unwrap()
            .expect("decided in one statement, not handed to the lane")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_changed_after_the_read_is_decided_again_and_keeps_that_change() {
        let db = TestDb::new().await;
        let (store, other, sbx) = provisioning(&db).await;
        let seen = read(&store, &sbx.id).await.unwrap().unwrap();
        // A TTL renewal: a new row version at the same status version.
        let ttl = seen.row.spec.ttl_seconds + 600;
        let renewed = other.renew_ttl(&sbx.id, ttl, Utc::now()).await.unwrap();
        assert_eq!(renewed.status_version, seen.row.status_version);
        let change = Change::Running {
            backend_ref: "ref-1".into(),
        };
        let running = settled(&store, seen, &change).await.unwrap();
        assert_eq!(store.status_swaps().misses, 1, "one miss");
        let stored = store.get_sandbox(&sbx.id).await.unwrap().unwrap();
        assert_eq!(stored, running);
        assert_eq!(stored.status, SandboxStatus::Running);
        assert_eq!(stored.spec.ttl_seconds, ttl, "the renewal is not undone");
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_moved_after_the_read_is_chained_onto_again() {
        let db = TestDb::new().await;
        let (store, other, sbx) = provisioning(&db).await;
        let seen = read(&store, &sbx.id).await.unwrap().unwrap();
        let before = seen.head.clone().unwrap();
        let exec = other
            .append_audit(NewAuditEvent {
                org_id: Some(sbx.org_id.clone()),
                project_id: Some(sbx.project_id.clone()),
                actor: "key:test".into(),
                action: "sandbox.exec".into(),
                resource: sbx.id.to_string(),
                outcome: "requested".into(),
                detail: serde_json::json!({ "program": "echo" }),
            })
            .await
            .unwrap();
        assert_eq!(exec.chain_seq, before.0 + 1);
        let change = Change::Running {
            backend_ref: "ref-1".into(),
        };
        settled(&store, seen, &change).await.unwrap();
        assert_eq!(store.status_swaps().misses, 1, "one miss");
        let (action, seq, prev): (String, i64, String) = sqlx::query_as(
            "SELECT action, chain_seq, prev_hash FROM audit_events WHERE chain = $1
             ORDER BY chain_seq DESC LIMIT 1",
        )
        .bind(&exec.chain)
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(action, "sandbox.running");
        assert_eq!(seq, exec.chain_seq + 1);
        assert_eq!(prev, exec.hash);
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_change_the_row_as_found_refuses_is_refused_with_nothing_written() {
        let db = TestDb::new().await;
        let (store, other, sbx) = provisioning(&db).await;
        let seen = read(&store, &sbx.id).await.unwrap().unwrap();
        other
            .transition(
                tr(
                    &sbx.id,
                    SandboxStatus::Provisioning,
                    SandboxStatus::Terminating,
                ),
                Utc::now(),
            )
            .await
            .unwrap();
        let records = store.audit_tail(100).await.unwrap().len();
        let change = Change::To(tr(
            &sbx.id,
            SandboxStatus::Provisioning,
            SandboxStatus::Failed,
        ));
        let refused = settled(&store, seen, &change).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::StatusConflict {
                    current: SandboxStatus::Terminating
                })
            ),
            "{refused:?}"
        );
        assert_eq!(store.audit_tail(100).await.unwrap().len(), records);
        let stored = store.get_sandbox(&sbx.id).await.unwrap().unwrap();
        assert_eq!(stored.status, SandboxStatus::Terminating);
    }

    /// Claims `sbx`'s create the way a worker does, which remembers the row it read.
    async fn claimed(store: &PgStore, sbx: &Sandbox) {
        use crate::work_claims::{ClaimOutcome, WorkClaimStore};
        let (_, outcome) = store
            .claim_create_reading(
                &sbx.id,
                "p",
                "w1",
                Utc::now(),
                std::time::Duration::from_secs(30),
            )
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(outcome, ClaimOutcome::Taken(1)), "{outcome:?}");
        assert_eq!(store.row_memo().lock().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_row_a_claim_read_is_the_next_change_s_first_try() {
        let db = TestDb::new().await;
        let (store, _other, sbx) = provisioning(&db).await;
        claimed(&store, &sbx).await;
        let running = store
            .mark_running(&sbx.id, "ref-1", Utc::now())
            .await
            .unwrap();
        assert_eq!(running.status, SandboxStatus::Running);
        let swaps = store.status_swaps();
        assert_eq!((swaps.done, swaps.misses, swaps.laned), (1, 0, 0));
        assert_eq!(swaps.reads, 0, "decided on the claim's read");
        assert_eq!(store.row_memo().lock().len(), 0, "taken by the change");
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_remembered_row_that_changed_since_is_decided_on_the_row_as_it_is() {
        let db = TestDb::new().await;
        let (store, other, sbx) = provisioning(&db).await;
        // Changed by a renewal since the claim's read: the guard misses once, and the
        // renewal stays.
        claimed(&store, &sbx).await;
        let ttl = sbx.spec.ttl_seconds + 600;
        other.renew_ttl(&sbx.id, ttl, Utc::now()).await.unwrap();
        store
            .mark_running(&sbx.id, "ref-1", Utc::now())
            .await
            .unwrap();
        let swaps = store.status_swaps();
        assert_eq!(
            (swaps.done, swaps.misses, swaps.laned, swaps.reads),
            (1, 1, 0, 0)
        );
        let stored = store.get_sandbox(&sbx.id).await.unwrap().unwrap();
        assert_eq!(stored.spec.ttl_seconds, ttl);

        // A remembered row the change's rules refuse (provisioning, for a change from
        // running) is not the answer: the row as it is (running) is read and decides.
        let (store2, _, sbx2) = provisioning(&db).await;
        claimed(&store2, &sbx2).await;
        // The same handle as `store` (clones share their stats).
        let before = store2.status_swaps();
        other
            .mark_running(&sbx2.id, "ref-2", Utc::now())
            .await
            .unwrap();
        let ended = store2
            .transition(
                tr(&sbx2.id, SandboxStatus::Running, SandboxStatus::Terminating),
                Utc::now(),
            )
            .await
            .unwrap();
        assert_eq!(ended.status, SandboxStatus::Terminating);
        let after = store2.status_swaps();
        assert_eq!(
            (after.done, after.misses, after.laned, after.reads),
            (
                before.done + 1,
                before.misses,
                before.laned,
                before.reads + 1
            ),
            "decided on the row read anew, at the first call"
        );
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_claim_s_row_is_the_end_s_first_try() {
        use crate::work_claims::{ClaimKey, ClaimOutcome, WorkClaimStore};
        let db = TestDb::new().await;
        let (store, other, sbx) = provisioning(&db).await;
        other
            .mark_running(&sbx.id, "ref-1", Utc::now())
            .await
            .unwrap();
        let ending = other
            .transition(
                tr(&sbx.id, SandboxStatus::Running, SandboxStatus::Terminating),
                Utc::now(),
            )
            .await
            .unwrap();
        let hold = std::time::Duration::from_secs(30);
        let taken = store
            .claim_current_work(&ClaimKey::of(&ending), "w1", Utc::now(), hold)
            .await
            .unwrap();
        assert!(matches!(taken, ClaimOutcome::Taken(1)), "{taken:?}");
        // A claim refused takes nothing to remember.
        let held = store
            .claim_current_work(&ClaimKey::of(&ending), "w2", Utc::now(), hold)
            .await
            .unwrap();
        assert!(matches!(held, ClaimOutcome::Held), "{held:?}");
        assert_eq!(store.row_memo().lock().len(), 1);
        let before = store.status_swaps();
        let ended = store
            .transition(
                tr(
                    &sbx.id,
                    SandboxStatus::Terminating,
                    SandboxStatus::Terminated,
                ),
                Utc::now(),
            )
            .await
            .unwrap();
        assert_eq!(ended.status, SandboxStatus::Terminated);
        let after = store.status_swaps();
        assert_eq!(
            (after.done, after.misses, after.reads),
            (before.done + 1, before.misses, before.reads),
            "one call, no read"
        );
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
    }

    #[test]
    fn a_chain_is_its_org_and_the_resource_s_suffix() {
        for _ in 0..200 {
            let (org, id) = (OrgId::new(), SandboxId::new());
            let joined = format!("{}{}", org.as_str(), chain_suffix(id.as_str()));
            assert_eq!(joined, chain_of(Some(&org), id.as_str()));
        }
    }
}
