//! Group commit of one-row status changes (`mark_running`, `transition`) on Postgres.
//!
//! Workers mark sandboxes running and terminated, and the API moves them to terminating, one
//! row per call and up to 64 calls at a time per worker. Each was a transaction of its own:
//! BEGIN, lock the row, write it, lock the audit head, insert the record, COMMIT, and a WAL
//! flush. Postgres CPU per sandbox was the limit of the whole system (`docs/performance.md`),
//! so changes that arrive while the previous group commits now share one transaction: rows
//! locked in id order, and the audit heads of their chains after them, with one statement
//! (`postgres::lock_sandboxes_and_heads`); each change decided in Rust exactly as alone (in
//! arrival order; an id given twice sees the first change); then the rows, the audit records
//! of all their chains and the new heads written, and the usage counters locked in their
//! global order, with one more; one commit. Four round trips with BEGIN and COMMIT. A change its rules refuse fails alone; a group whose transaction fails is
//! retried change by change. The batching itself is `group_commit` (one lane per process).
//!
//! Changes to `queued` keep their own transaction (they also move `next_attempt_at`).

use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId};
use tokio::sync::oneshot;

use crate::group_commit::Lanes;
use crate::memory::rules;
use crate::postgres::{lock_sandboxes_and_heads, sandbox_event, update_sandboxes, PgStore};
use crate::{audit, audit_pg, usage_pg, StoreError, Transition};

/// Most changes decided in one transaction.
const MAX_GROUP: usize = 64;

/// One requested change.
#[derive(Debug)]
pub(crate) enum Change {
    /// `mark_running` with the backend's instance reference.
    Running { backend_ref: String },
    /// `transition` (never to `queued`).
    To(Transition),
}

pub(crate) struct Pending {
    id: SandboxId,
    change: Change,
    now: DateTime<Utc>,
    request_id: Option<String>,
    reply: oneshot::Sender<Result<Sandbox, StoreError>>,
}

/// The one lane of a process's status changes (`group_commit`).
pub(crate) type TransitionLane = Lanes<(), Pending>;

/// Applies `change` to row `id` with whatever else this process is changing right now.
pub(crate) async fn submit(
    store: &PgStore,
    id: &SandboxId,
    change: Change,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let (reply, rx) = oneshot::channel();
    let job = Pending {
        id: id.clone(),
        change,
        now,
        request_id: audit::current_request_id(),
        reply,
    };
    let batch_store = store.clone();
    store.transitions().push((), job, MAX_GROUP, move |group| {
        let store = batch_store.clone();
        async move { run(&store, group).await }
    });
    rx.await
        .unwrap_or_else(|_| Err(StoreError::Database("the change's group stopped".into())))
}

/// Decides a batch and answers each caller; a batch whose transaction fails is retried
/// change by change.
async fn run(store: &PgStore, group: Vec<Pending>) {
    metrics::histogram!("differently_transition_group_size").record(group.len() as f64);
    let outcomes = match decide(store, &group).await {
        Ok(outcomes) => outcomes,
        Err(e) if group.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, size = group.len(),
                "status change group failed as a whole; applying its changes one by one");
            let mut each = Vec::with_capacity(group.len());
            for p in &group {
                each.push(match decide(store, std::slice::from_ref(p)).await {
                    Ok(mut one) => one
                        .pop()
                        .unwrap_or_else(|| Err(StoreError::Database("change not decided".into()))),
                    Err(e) => Err(e),
                });
            }
            each
        }
    };
    for (p, outcome) in group.into_iter().zip(outcomes) {
        let _ = p.reply.send(outcome);
    }
}

/// Decides `group` in one transaction; one outcome per change. `Err`: nothing committed.
async fn decide(
    store: &PgStore,
    group: &[Pending],
) -> Result<Vec<Result<Sandbox, StoreError>>, StoreError> {
    let mut ids: Vec<&str> = group.iter().map(|p| p.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut tx = store.begin().await?;
    let locked = lock_sandboxes_and_heads(&mut tx, &ids).await?;
    let mut by_id = locked.rows;
    let before = by_id.clone();
    let mut outcomes = Vec::with_capacity(group.len());
    let mut events = Vec::new();
    let mut changed: Vec<SandboxId> = Vec::new();
    for p in group {
        let Some(s) = by_id.get_mut(&p.id) else {
            outcomes.push(Err(StoreError::NotFound));
            continue;
        };
        let mut next = s.clone();
        let entry = match &p.change {
            Change::Running { backend_ref } => rules::mark_running(&mut next, backend_ref, p.now),
            Change::To(t) => rules::transition(&mut next, t, p.now),
        };
        match entry {
            Ok(entry) => {
                events.push((sandbox_event(&next, entry), p.request_id.clone()));
                *s = next.clone();
                if !changed.contains(&p.id) {
                    changed.push(p.id.clone());
                }
                outcomes.push(Ok(next));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if !changed.is_empty() {
        let rows: Vec<&Sandbox> = changed.iter().filter_map(|id| by_id.get(id)).collect();
        let write = update_sandboxes(&rows)?;
        let at = group.iter().map(|p| p.now).max().unwrap_or_else(Utc::now);
        let mut counters: Vec<String> = rows
            .iter()
            .filter_map(|s| before.get(&s.id).map(|old| usage_pg::moved_by(old, s)))
            .flatten()
            .collect();
        counters.sort_unstable();
        counters.dedup();
        // One row's trigger takes its counters in the global order already (org, project,
        // pool); only several rows can interleave them.
        if rows.len() < 2 {
            counters.clear();
        }
        audit_pg::append_to_locked_heads(
            &mut tx,
            write,
            events,
            locked.heads,
            &locked.chains,
            at,
            &counters,
        )
        .await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use std::collections::HashSet;

    use differently_core::{CreateSandboxRequest, OrgId, ProjectId, SandboxSpec};

    use crate::audit::chain_of;
    use crate::postgres::lock_sandboxes_and_heads;
    use crate::testing::TestDb;
    use crate::{Actor, Admission, Admitted, Org, OrgStatus, Project, Quota, Store};

    use super::*;

    async fn admitted(store: &PgStore, org: &OrgId, prj: &ProjectId) -> Sandbox {
        let spec = SandboxSpec::build(&CreateSandboxRequest::default()).expect("spec");
        let sandbox = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
        let admission = Admission {
            request_id: None,
            direct: None,
            sandbox,
            request_hash: "h".into(),
            defaults: Quota::default(),
            actor: Actor::Key("key_test".into()),
        };
        match store.admit(admission).await.expect("admit") {
            Admitted::New(s) => s,
            other => panic!("expected a new sandbox, got {other:?}"),
        }
    }

    /// An admission locks its org and then the heads of its records' chains in one
    /// statement, and holds both; an unknown org is `NotFound` with nothing locked.
    #[tokio::test]
    async fn an_admission_locks_its_org_and_then_its_chains_heads() {
        use crate::postgres::lock_org_admissions;
        let db = TestDb::new().await;
        let store = db.store();
        let org = Org {
            id: OrgId::new(),
            name: "acme".into(),
            status: OrgStatus::Active,
            created_at: Utc::now(),
        };
        let prj = Project {
            id: ProjectId::new(),
            org_id: org.id.clone(),
            name: "default".into(),
            created_at: Utc::now(),
        };
        store.ensure_tenant(&org, &prj).await.expect("tenant");
        let s = admitted(&store, &org.id, &prj.id).await;
        let chain = chain_of(Some(&org.id), s.id.as_str());
        let fresh = format!("{}/never-written", org.id);
        let stored: (i64, String) =
            sqlx::query_as("SELECT chain_seq, hash FROM audit_heads WHERE chain = $1")
                .bind(&chain)
                .fetch_one(store.pool())
                .await
                .expect("head");

        for capacity in [false, true] {
            let mut tx = store.begin().await.expect("begin");
            let heads = lock_org_admissions(&mut tx, &org.id, capacity, &[&chain, &fresh])
                .await
                .expect("lock");
            assert_eq!(heads.len(), 1, "only existing heads come back");
            assert_eq!(heads.get(&chain), Some(&stored));
            let free: Vec<(String,)> = sqlx::query_as(
                "SELECT chain FROM audit_heads WHERE chain = $1 FOR UPDATE SKIP LOCKED",
            )
            .bind(&chain)
            .fetch_all(store.pool())
            .await
            .expect("heads");
            assert!(free.is_empty(), "the head is held");
            tx.rollback().await.expect("rollback");
        }

        let mut tx = store.begin().await.expect("begin");
        let e = lock_org_admissions(&mut tx, &OrgId::new(), false, &[&chain])
            .await
            .expect_err("unknown org");
        assert!(matches!(e, StoreError::NotFound), "{e}");
        let free: Vec<(String,)> =
            sqlx::query_as("SELECT chain FROM audit_heads WHERE chain = $1 FOR UPDATE SKIP LOCKED")
                .bind(&chain)
                .fetch_all(store.pool())
                .await
                .expect("heads");
        assert_eq!(free.len(), 1, "nothing locked for an unknown org");
        tx.rollback().await.expect("rollback");
    }

    /// The chains the SQL computes are the chains `chain_of` computes, for every row: the
    /// append refuses a record of a chain that was not locked, so a disagreement would fail
    /// every status change, and this is where it would show first.
    #[tokio::test]
    async fn rows_and_their_chains_heads_are_locked_together() {
        let db = TestDb::new().await;
        let store = db.store();
        let mut all = Vec::new();
        for _ in 0..2 {
            let org = Org {
                id: OrgId::new(),
                name: "acme".into(),
                status: OrgStatus::Active,
                created_at: Utc::now(),
            };
            let prj = Project {
                id: ProjectId::new(),
                org_id: org.id.clone(),
                name: "default".into(),
                created_at: Utc::now(),
            };
            store.ensure_tenant(&org, &prj).await.expect("tenant");
            for _ in 0..24 {
                all.push(admitted(&store, &org.id, &prj.id).await);
            }
        }
        let ids: Vec<&str> = all.iter().map(|s| s.id.as_str()).collect();
        let expected: HashSet<String> = all
            .iter()
            .map(|s| chain_of(Some(&s.org_id), s.id.as_str()))
            .collect();
        assert!(expected.len() > 2, "the sandboxes spread over shards");

        let mut tx = store.begin().await.expect("begin");
        let locked = lock_sandboxes_and_heads(&mut tx, &ids).await.expect("lock");
        assert_eq!(locked.rows.len(), all.len());
        assert_eq!(locked.chains, expected);
        // Every chain has a head (each admission appended to it), as stored.
        let stored: Vec<(String, i64, String)> =
            sqlx::query_as("SELECT chain, chain_seq, hash FROM audit_heads WHERE chain = ANY($1)")
                .bind(expected.iter().cloned().collect::<Vec<_>>())
                .fetch_all(store.pool())
                .await
                .expect("heads");
        assert_eq!(stored.len(), expected.len());
        for (chain, seq, hash) in stored {
            assert_eq!(locked.heads.get(&chain), Some(&(seq, hash)), "{chain}");
        }
        // Rows and heads stay locked until this transaction ends.
        let free_rows: Vec<(String,)> =
            sqlx::query_as("SELECT id FROM sandboxes WHERE id = ANY($1) FOR UPDATE SKIP LOCKED")
                .bind(&ids)
                .fetch_all(store.pool())
                .await
                .expect("rows");
        assert!(free_rows.is_empty(), "{free_rows:?}");
        let free_heads: Vec<(String,)> = sqlx::query_as(
            "SELECT chain FROM audit_heads WHERE chain = ANY($1) FOR UPDATE SKIP LOCKED",
        )
        .bind(expected.iter().cloned().collect::<Vec<_>>())
        .fetch_all(store.pool())
        .await
        .expect("heads");
        assert!(free_heads.is_empty(), "{free_heads:?}");
        tx.rollback().await.expect("rollback");
    }
}
