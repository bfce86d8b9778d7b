//! A lone admission in two round trips and no transaction (issue #47).
//!
//! On the lane ([`super::admission_lanes`]) a create is a transaction of about seven round
//! trips, with the org's admission lock held across five of them. That pays when creates
//! group; a create with nothing to group with (a batch of one) instead reads what its
//! decision rests on in one unlocked statement (the project's org, both quotas, both usage
//! counters, a row under its `Idempotency-Key`, its chain's head), decides in Rust exactly as
//! the lane would ([`decide_item`]), and sends the decided row and its chained records in one
//! call of `differently_admit_sandbox` (migration 0019). The call takes the lane's locks in
//! the lane's order and writes only if the decision still holds (the guards are listed in
//! the migration); otherwise it writes nothing and the create takes the lane, which decides
//! it under the locks. A refusal, a replay and an unknown project need no call: they write
//! nothing, and the read is a committed state.
//!
//! Not taken here (the lane's): a placement that may claim a warm instance or is on a
//! capped pool, a chain without a head row, and records `jsonb` may not give back digit for
//! digit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

use differently_core::accounting;
use sqlx::postgres::PgArguments;
use sqlx::Row;

use crate::audit::{self, chain_of};
use crate::pg::admission_lanes::{decide_item, direct_of, insert_rows, Next};
use crate::pg::audit::{bind_record_columns, chain_onto};
use crate::pg::audit_records::sandbox_event;
use crate::pg::audit_standalone::has_fraction;
use crate::pg::limits::{limits_of, LimitsSeen, LIMITS_COLUMNS, LIMITS_JOINS};
use crate::pg::locks::ADMISSION_LOCK_SPACE;
use crate::pg::prior_write::bind;
use crate::pg::rows::sandbox_of;
use crate::pg::usage_counters::Counter;
use crate::pg::PgStore;
use crate::shared::rules;
use crate::{Admission, Admitted, QuotaScope, StoreError};

/// What this process's lone admissions did, since start.
#[derive(Debug, Default)]
pub(crate) struct AdmitSwapStats {
    /// Answered without the lane: written in one statement, or refused or replayed on the
    /// read.
    pub(crate) done: AtomicU64,
    /// Calls that found a guard broken and wrote nothing (the create then took the lane).
    pub(crate) misses: AtomicU64,
    /// Handed to the lane without a call (a warm or capped placement, no head row, a
    /// fractional number in a record).
    pub(crate) declined: AtomicU64,
}

/// Admits `a` alone. `None`: not done here (nothing written); the lane must decide it. An
/// error is the caller's, as a lone admission's is on the lane.
pub(crate) async fn admit(store: &PgStore, a: &Admission) -> Option<Result<Admitted, StoreError>> {
    // Served from the first admission on, misses or not, so the dashboard's panel has a
    // series (deploy/grafana/differently.json; its test requires every charted metric
    // served).
    static MISSES_SERVED: std::sync::Once = std::sync::Once::new();
    MISSES_SERVED.call_once(|| {
        metrics::counter!("differently_admission_swap_misses_total").increment(0);
    });
    let stats = store.admit_swap_stats();
    let outcome = |o: &'static str| {
        metrics::counter!("differently_admission_swaps_total", "outcome" => o).increment(1);
    };
    if !eligible(a) {
        stats.declined.fetch_add(1, Ordering::Relaxed);
        outcome("lane");
        return None;
    }
    match attempt(store, a).await {
        Ok(Attempt::Answered(answer)) => {
            let answer = *answer;
            stats.done.fetch_add(1, Ordering::Relaxed);
            outcome("done");
            Some(answer)
        }
        Ok(Attempt::Declined) => {
            stats.declined.fetch_add(1, Ordering::Relaxed);
            outcome("lane");
            None
        }
        Ok(Attempt::Missed(what)) => {
            stats.misses.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("differently_admission_swap_misses_total").increment(1);
            tracing::debug!(guard = %what, "lone admission missed; taking the lane");
            outcome("lane");
            None
        }
        // As on the lane, where a lone admission's failed transaction is its caller's error:
        // a call whose answer was lost may have committed, which the lane would then replay
        // or misreport.
        Err(e) => {
            outcome("error");
            Some(Err(e))
        }
    }
}

/// Whether `a` may be decided here: admissible, and placed (if at all) cold on an uncapped
/// pool. A warm claim deletes a warm row and takes its id; a capped pool is locked and
/// counted; both are the lane's.
fn eligible(a: &Admission) -> bool {
    accounting::check_admissible(&a.sandbox).is_ok()
        && direct_of(a).is_none_or(|d| !d.claim_only() && d.warm_class.is_none())
}

/// What one attempt came to.
enum Attempt {
    /// The caller's answer: admitted, replayed or refused.
    Answered(Box<Result<Admitted, StoreError>>),
    /// The lane's to decide; no call was made.
    Declined,
    /// The call found this guard broken and wrote nothing.
    Missed(String),
}

/// Everything a lone admission's decision rests on, read unlocked.
struct Seen {
    limits: crate::pg::limits::Limits,
    guards: LimitsSeen,
    /// `(chain_seq, hash)` of the new row's chain; `None`: no head row yet.
    head: Option<(i64, String)>,
    /// The row already stored under the `Idempotency-Key`, with its request hash.
    earlier: Option<(differently_core::Sandbox, String)>,
}

async fn attempt(store: &PgStore, a: &Admission) -> Result<Attempt, StoreError> {
    let seen = read(store, a).await?;
    settle(store, a, seen).await
}

/// Decides `a` on `seen` and, if it is admitted, sends it.
async fn settle(store: &PgStore, a: &Admission, seen: Seen) -> Result<Attempt, StoreError> {
    let s = &a.sandbox;
    let org_scope = QuotaScope::Org(s.org_id.clone());
    let prj_scope = QuotaScope::Project(s.project_id.clone());
    if let Some((earlier, hash)) = seen.earlier {
        return Ok(Attempt::Answered(Box::new(if hash == a.request_hash {
            Ok(Admitted::Replayed(earlier))
        } else {
            Err(StoreError::IdempotencyMismatch)
        })));
    }
    if seen.limits.project_org.as_deref() != Some(s.org_id.as_str()) {
        return Ok(Attempt::Answered(Box::new(Err(StoreError::NotFound))));
    }
    let Some(head) = seen.head else {
        return Ok(Attempt::Declined);
    };
    let mut org_usage = seen.limits.org_usage;
    let mut prj_usage = seen.limits.prj_usage;
    let quota = seen.limits.org_quota.unwrap_or_default().or(&a.defaults);
    let prj_quota = seen.limits.prj_quota.unwrap_or_default();
    let (mut row, next) = match decide_item(
        a,
        (&mut org_usage, &quota),
        (&mut prj_usage, &prj_quota),
        None,
    ) {
        Ok(decided) => decided,
        Err(e) => return Ok(Attempt::Answered(Box::new(Err(e)))),
    };
    let placed = match next {
        Next::Stay => None,
        Next::Place(d) => Some((rules::activate_direct(&mut row, &d.pool, s.created_at), d)),
    };
    let request_id = a.request_id.clone().or_else(audit::current_request_id);
    let mut events = vec![sandbox_event(&row, rules::admit_entry(&row, &a.actor))];
    if let Some((entry, _)) = &placed {
        events.push(sandbox_event(&row, entry.clone()));
    }
    if events.iter().any(|e| has_fraction(&e.detail)) {
        return Ok(Attempt::Declined);
    }
    let recs = chain_onto(
        &chain_of(Some(&row.org_id), row.id.as_str()),
        Some(head.clone()),
        events.into_iter().map(|e| (e, request_id.clone())),
        s.created_at,
    );
    let admitted = [(0, row, None)];
    let mut args = insert_rows(std::slice::from_ref(a), &admitted)?.into_args();
    bind_record_columns(&mut args, &recs)?;
    bind_guards(
        &mut args,
        placed.is_some(),
        &org_scope,
        &prj_scope,
        &seen.guards,
        head.0,
    )?;
    bind(&mut args, placed.as_ref().map(|(_, d)| &d.explanation))?;
    bind(&mut args, s.created_at)?;
    let answer: String = sqlx::query_scalar_with(CALL.as_str(), args)
        .fetch_one(store.pool())
        .await?;
    let [(_, row, _)] = admitted;
    match answer.strip_prefix("moved:") {
        None if answer == "done" => Ok(Attempt::Answered(Box::new(Ok(Admitted::New(row))))),
        Some(what) => Ok(Attempt::Missed(what.to_owned())),
        None => Err(StoreError::Internal(format!(
            "differently_admit_sandbox answered {answer:?}"
        ))),
    }
}

/// The call: the row's 20 arrays ($1..$20, as the lane's insert binds them), the records' 14
/// ($21..$34), the guards ($35..$43), the placement and its time ($44, $45).
static CALL: LazyLock<String> = LazyLock::new(|| {
    let params: Vec<String> = (1..=45).map(|n| format!("${n}")).collect();
    format!("SELECT differently_admit_sandbox({})", params.join(", "))
});

/// Binds the guards ($35..$43 of [`CALL`]).
fn bind_guards(
    args: &mut PgArguments,
    places: bool,
    org_scope: &QuotaScope,
    prj_scope: &QuotaScope,
    guards: &LimitsSeen,
    prev_seq: i64,
) -> Result<(), StoreError> {
    let usage = |c: &Counter| vec![c.queued, c.active, c.cpu, c.memory_mib, c.disk_gib];
    bind(args, ADMISSION_LOCK_SPACE)?;
    bind(args, places)?;
    bind(args, org_scope.key())?;
    bind(args, prj_scope.key())?;
    bind(args, guards.org_quota_xmin.as_deref())?;
    bind(args, guards.prj_quota_xmin.as_deref())?;
    bind(args, usage(&guards.org_counter))?;
    bind(args, usage(&guards.prj_counter))?;
    bind(args, prev_seq)?;
    Ok(())
}

/// The limits, the chain's head and an earlier row under the key, in one unlocked read.
async fn read(store: &PgStore, a: &Admission) -> Result<Seen, StoreError> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {LIMITS_COLUMNS}, h.chain_seq, h.hash,
                    r.doc, r.env_sealed, r.request_hash
             FROM (SELECT 1) one {LIMITS_JOINS}
             LEFT JOIN audit_heads h ON h.chain = $4
             LEFT JOIN sandboxes r ON r.project_id = $1 AND r.idempotency_key = $5"
        )
    });
    let s = &a.sandbox;
    let row = sqlx::query(SQL.as_str())
        .bind(s.project_id.as_str())
        .bind(QuotaScope::Org(s.org_id.clone()).key())
        .bind(QuotaScope::Project(s.project_id.clone()).key())
        .bind(chain_of(Some(&s.org_id), s.id.as_str()))
        .bind(s.idempotency_key.as_deref())
        .fetch_one(store.pool())
        .await?;
    let (limits, guards) = limits_of(&row)?;
    let seq: Option<i64> = row.try_get("chain_seq")?;
    let hash: Option<String> = row.try_get("hash")?;
    // `request_hash` is never NULL on a stored row: its presence says the join found one.
    let earlier_hash: Option<String> = row.try_get("request_hash")?;
    let earlier = match earlier_hash {
        Some(hash) => Some((sandbox_of(&row)?, hash)),
        None => None,
    };
    Ok(Seen {
        limits,
        guards,
        head: seq.zip(hash),
        earlier,
    })
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use chrono::Utc;
    use differently_core::{
        CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec, SandboxStatus,
    };

    use super::*;
    use crate::audit::{chain_suffix, AuditStore, NewAuditEvent};
    use crate::testing::TestDb;
    use crate::{
        Actor, AdmissionStore, DirectPlacement, PoolSlot, Quota, Transition, TransitionStore,
        UsageStore,
    };

    /// An admission of a new sandbox, placed directly if `direct`; its id's chain is
    /// `shard`'s (`chain_suffix`) when given.
    fn admission(
        org: &OrgId,
        prj: &ProjectId,
        direct: bool,
        key: Option<&str>,
        shard: Option<&str>,
    ) -> Admission {
        let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
        let sandbox = loop {
            let s = Sandbox::queued(
                org.clone(),
                prj.clone(),
                spec.clone(),
                key.map(str::to_owned),
                Utc::now(),
            );
            if shard.is_none_or(|want| chain_suffix(s.id.as_str()) == want) {
                break s;
            }
        };
        Admission {
            request_id: None,
            direct: direct.then(|| DirectPlacement {
                pool: PoolSlot {
                    name: "p".into(),
                    max_concurrent: None,
                },
                explanation: serde_json::json!({ "pool": "p" }),
                warm_class: None,
                claim_call: false,
            }),
            sandbox,
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::Key("key_test".into()),
        }
    }

    /// A sandbox placed in its admission on the lane (its chain had no head: it makes one;
    /// nothing of the org is queued after it), and its chain's shard.
    async fn first(store: &PgStore, org: &OrgId, prj: &ProjectId) -> (Sandbox, String) {
        let a = admission(org, prj, true, None, None);
        let before = store.admission_swaps().declined;
        let Admitted::New(row) = store.admit(a).await.unwrap() else {
            panic!("not admitted");
        };
        assert_eq!(
            store.admission_swaps().declined,
            before + 1,
            "a chain without a head takes the lane"
        );
        let shard = chain_suffix(row.id.as_str());
        (row, shard)
    }

    /// A new org with [`first`]'s sandbox and a queued one after it (on any chain); the
    /// org, its project and `first`'s shard.
    async fn one_queued(db: &TestDb, store: &PgStore) -> (OrgId, ProjectId, String) {
        let (org, prj) = db.tenant().await;
        let (_, shard) = first(store, &org, &prj).await;
        store
            .admit(admission(&org, &prj, false, None, None))
            .await
            .unwrap();
        (org, prj, shard)
    }

    async fn stored(store: &PgStore, id: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM sandboxes WHERE id = $1")
            .bind(id)
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_admission_is_one_statement_with_its_records_and_placement() {
        let db = TestDb::new().await;
        let store = db.store();
        let (org, prj) = db.tenant().await;
        let (_, shard) = first(&store, &org, &prj).await;
        let a = admission(&org, &prj, true, Some("k1"), Some(&shard));
        let Admitted::New(row) = store.admit(a).await.unwrap() else {
            panic!("not admitted");
        };
        assert_eq!(row.status, SandboxStatus::Provisioning, "placed directly");
        assert_eq!(store.admission_swaps().done, 1);
        assert_eq!(store.admission_swaps().misses, 0);
        let actions: Vec<String> = sqlx::query_scalar(
            "SELECT action FROM audit_events WHERE resource = $1 ORDER BY chain_seq",
        )
        .bind(row.id.as_str())
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_eq!(actions.len(), 2, "admission then activation: {actions:?}");
        assert_eq!(actions[0], "sandbox.admit");
        let placement: serde_json::Value =
            sqlx::query_scalar("SELECT doc FROM placements WHERE sandbox_id = $1")
                .bind(row.id.as_str())
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(placement, serde_json::json!({ "pool": "p" }));
        // The same key and body replays without a call; another body conflicts.
        let again = admission(&org, &prj, true, Some("k1"), None);
        let replayed = store.admit(again).await.unwrap();
        assert!(matches!(replayed, Admitted::Replayed(ref r) if r.id == row.id));
        let mut other_body = admission(&org, &prj, true, Some("k1"), None);
        other_body.request_hash = "other".into();
        assert!(matches!(
            store.admit(other_body).await,
            Err(StoreError::IdempotencyMismatch)
        ));
        assert_eq!(store.admission_swaps().done, 3);
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
        assert_eq!(store.reconcile_usage().await.unwrap(), vec![], "drift");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refusal_on_the_read_writes_nothing() {
        let db = TestDb::new().await;
        let store = db.store();
        let (org, prj, shard) = one_queued(&db, &store).await;
        let full = Quota {
            max_queued: Some(1),
            ..Quota::default()
        };
        store
            .put_quota(&QuotaScope::Org(org.clone()), &full, &Actor::System("test"))
            .await
            .unwrap();
        let a = admission(&org, &prj, false, None, Some(&shard));
        let id = a.sandbox.id.to_string();
        let done = store.admission_swaps().done;
        let refused = store.admit(a).await;
        assert!(
            matches!(refused, Err(StoreError::QuotaExceeded(_))),
            "{refused:?}"
        );
        assert_eq!(
            store.admission_swaps().done,
            done + 1,
            "answered on the read"
        );
        assert_eq!(stored(&store, &id).await, 0);
        let unknown = admission(&org, &ProjectId::new(), false, None, Some(&shard));
        assert!(matches!(
            store.admit(unknown).await,
            Err(StoreError::NotFound)
        ));
    }

    /// Each guard, broken between the read and the call by another process: the call writes
    /// nothing and says which; the create then succeeds (on the lane, or here on a new read).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guard_broken_after_the_read_writes_nothing() {
        let db = TestDb::new().await;
        let store = db.store();
        let other = PgStore::connect(db.url(), 2).await.unwrap();
        let (org, prj) = db.tenant().await;
        let (first_row, shard) = first(&store, &org, &prj).await;
        // Another create of the org; the same create (key and body) again.
        let breakers = [("usage", false), ("replay", true)];
        for (i, (guard, same)) in breakers.into_iter().enumerate() {
            let key = format!("key-{i}");
            let a = admission(&org, &prj, false, Some(&key), Some(&shard));
            let seen = read(&store, &a).await.unwrap();
            let breaker = if same {
                admission(&org, &prj, false, Some(&key), None)
            } else {
                admission(&org, &prj, false, None, None)
            };
            other.admit(breaker).await.unwrap();
            match settle(&store, &a, seen).await.unwrap() {
                Attempt::Missed(what) => assert_eq!(what, guard),
                _ => panic!("{guard}: not a miss"),
            }
            assert_eq!(stored(&store, a.sandbox.id.as_str()).await, 0, "{guard}");
        }
        // A quota written after the read.
        let a = admission(&org, &prj, false, None, Some(&shard));
        let seen = read(&store, &a).await.unwrap();
        other
            .put_quota(
                &QuotaScope::Project(prj.clone()),
                &Quota::default(),
                &Actor::System("test"),
            )
            .await
            .unwrap();
        assert!(
            matches!(settle(&store, &a, seen).await.unwrap(), Attempt::Missed(w) if w == "quota")
        );
        // A record on the chain after the read.
        let seen = read(&store, &a).await.unwrap();
        other
            .append_audit(NewAuditEvent {
                org_id: Some(org.clone()),
                project_id: Some(prj.clone()),
                actor: "key:test".into(),
                action: "sandbox.exec".into(),
                resource: first_row.id.to_string(),
                outcome: "requested".into(),
                detail: serde_json::json!({ "program": "echo" }),
            })
            .await
            .unwrap();
        assert!(
            matches!(settle(&store, &a, seen).await.unwrap(), Attempt::Missed(w) if w == "head")
        );
        assert_eq!(stored(&store, a.sandbox.id.as_str()).await, 0);
        // Taken again from a new read, it is admitted.
        let Admitted::New(row) = store.admit(a).await.unwrap() else {
            panic!("not admitted");
        };
        assert_eq!(stored(&store, row.id.as_str()).await, 1);
        let report = store.verify_audit().await.unwrap();
        assert!(report.ok, "{report:?}");
        assert_eq!(store.reconcile_usage().await.unwrap(), vec![], "drift");
    }

    /// A decision is monotone in usage: less in use after the read still admits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn less_in_use_after_the_read_still_admits() {
        let db = TestDb::new().await;
        let store = db.store();
        let (org, prj) = db.tenant().await;
        let (_, shard) = first(&store, &org, &prj).await;
        // A queued sandbox on another chain, ended between the read and the call.
        let elsewhere = loop {
            let a = admission(&org, &prj, false, None, None);
            if chain_suffix(a.sandbox.id.as_str()) != shard {
                break a;
            }
        };
        let Admitted::New(gone) = store.admit(elsewhere).await.unwrap() else {
            panic!("not admitted");
        };
        let a = admission(&org, &prj, false, None, Some(&shard));
        let seen = read(&store, &a).await.unwrap();
        store
            .transition(
                Transition {
                    id: gone.id.clone(),
                    from: vec![SandboxStatus::Queued],
                    to: SandboxStatus::Terminated,
                    reason: Some("test".into()),
                    actor: Actor::System("test"),
                },
                Utc::now(),
            )
            .await
            .unwrap();
        assert!(matches!(
            settle(&store, &a, seen).await.unwrap(),
            Attempt::Answered(a) if matches!(*a, Ok(Admitted::New(_)))
        ));
        assert_eq!(stored(&store, a.sandbox.id.as_str()).await, 1);
        assert_eq!(store.reconcile_usage().await.unwrap(), vec![], "drift");
    }

    /// Decided before its locks, a direct placement that queues (its org has a queued
    /// sandbox) reserves nothing, so it does not wait for the org's activations; one that
    /// places does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_a_placing_admission_waits_for_activations() {
        let db = TestDb::new().await;
        let store = db.store();
        let (org, prj, shard) = one_queued(&db, &store).await;
        let mut activation = store.pool().begin().await.unwrap();
        sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR NO KEY UPDATE")
            .bind(org.as_str())
            .fetch_one(&mut *activation)
            .await
            .unwrap();
        let done = store.admission_swaps().done;
        let behind = tokio::time::timeout(
            Duration::from_secs(4),
            store.admit(admission(&org, &prj, true, None, Some(&shard))),
        )
        .await
        .expect("a direct placement that queues does not wait for activations")
        .unwrap();
        assert!(matches!(behind, Admitted::New(x) if x.status == SandboxStatus::Queued));
        assert_eq!(
            store.admission_swaps().done,
            done + 1,
            "decided in one statement"
        );
        activation.rollback().await.unwrap();
    }
}
