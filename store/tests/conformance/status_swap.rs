//! Lone status changes decided in one statement (`transition_swap`, migration 0018) next to
//! the group-commit lane, and both racing across processes on one org's chains.

use std::sync::Arc;

use chrono::Utc;
use differently_core::SandboxStatus::{Provisioning, Running, Stopped, Terminated, Terminating};
use differently_store::audit::AuditStore;
use differently_store::postgres::PgStore;
use differently_store::testing::TestDb;
use differently_store::{
    Quota, SandboxReadStore, SeenRow, StoreError, TransitionStore, UsageStore,
};

use crate::cases::{activated, admit, pool, tenant, tr};

/// Changes submitted together share one lane transaction; a change alone is one statement.
/// A single-threaded runtime makes the grouping certain: the lane's task first runs after
/// every change of the batch has been submitted.
#[tokio::test(flavor = "current_thread")]
async fn changes_submitted_together_group_and_a_lone_one_swaps() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s).await;
    let mut ids = Vec::new();
    for _ in 0..20 {
        let a = admit(&s, &org, &prj).await;
        activated(&s, &a.id, &pool("p", None), &Quota::default()).await;
        ids.push(a.id);
    }
    let before = s.status_swaps();
    let refs: Vec<String> = (0..ids.len()).map(|i| format!("ref-{i}")).collect();
    let running = futures::future::join_all(
        ids.iter()
            .zip(&refs)
            .map(|(id, r)| s.mark_running(id, r, Utc::now())),
    )
    .await;
    for r in running {
        assert_eq!(r.unwrap().status, Running);
    }
    assert_eq!(s.status_swaps(), before, "the 20 changes went as one group");

    let one = s
        .transition(tr(&ids[0], &[Running], Terminating), Utc::now())
        .await
        .unwrap();
    assert_eq!(one.status, Terminating);
    let after = s.status_swaps();
    assert_eq!(
        (after.done, after.misses, after.laned, after.reads),
        (
            before.done + 1,
            before.misses,
            before.laned,
            before.reads + 1
        )
    );
    // A refusal is decided the same way, and writes nothing.
    let refused = s
        .transition(tr(&ids[0], &[Running], Terminating), Utc::now())
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::StatusConflict {
                current: Terminating
            })
        ),
        "{refused:?}"
    );
    let missing = s
        .transition(
            tr(&differently_core::SandboxId::new(), &[Running], Terminating),
            Utc::now(),
        )
        .await;
    assert!(matches!(missing, Err(StoreError::NotFound)), "{missing:?}");
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// Two processes (an API and a worker) change the same rows at once: the worker marks each
/// running while the API deletes it, then the worker ends it. Whatever interleaves, each
/// change applies once or is refused on the row as it was, every record is chained once,
/// and the counters match the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_racing_across_processes_apply_once_and_the_chains_verify() {
    let db = TestDb::new().await;
    let api = Arc::new(db.store());
    let worker = Arc::new(PgStore::connect(db.url(), 4).await.unwrap());
    let (org, prj) = tenant(api.as_ref()).await;
    let mut ids = Vec::new();
    for _ in 0..24 {
        let a = admit(api.as_ref(), &org, &prj).await;
        activated(api.as_ref(), &a.id, &pool("p", None), &Quota::default()).await;
        ids.push(a.id);
    }
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (api, worker, id) = (api.clone(), worker.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            let run = {
                let (worker, id) = (worker.clone(), id.clone());
                tokio::spawn(async move {
                    worker
                        .mark_running(&id, &format!("ref-{i}"), Utc::now())
                        .await
                })
            };
            let delete = api
                .transition(tr(&id, &[Provisioning, Running], Terminating), Utc::now())
                .await;
            let run = run.await.unwrap();
            let end = worker
                .transition(tr(&id, &[Terminating], Terminated), Utc::now())
                .await;
            (run, delete, end)
        }));
    }
    let mut running_records = 0;
    for t in tasks {
        let (run, delete, end) = t.await.unwrap();
        match run {
            Ok(x) => {
                assert_eq!(x.status, Running);
                running_records += 1;
            }
            Err(StoreError::StatusConflict { current }) => assert_eq!(current, Terminating),
            Err(e) => panic!("mark_running: {e:?}"),
        }
        assert_eq!(delete.unwrap().status, Terminating);
        assert_eq!(end.unwrap().status, Terminated);
    }
    for id in &ids {
        let row = api.get_sandbox(id).await.unwrap().unwrap();
        assert_eq!(row.status, Terminated);
    }
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT action FROM audit_events WHERE org_id = $1 AND action <> 'sandbox.admit'",
    )
    .bind(org.as_str())
    .fetch_all(api.pool())
    .await
    .unwrap();
    let count = |a: &str| actions.iter().filter(|x| x.as_str() == a).count();
    assert_eq!(count("sandbox.running"), running_records);
    assert_eq!(count("sandbox.terminating"), ids.len());
    assert_eq!(count("sandbox.terminated"), ids.len());
    let report = api.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(
        api.reconcile_usage().await.unwrap(),
        vec![],
        "counters drifted"
    );
    eprintln!(
        "swaps (done, misses, laned): api {:?}, worker {:?}",
        api.status_swaps(),
        worker.status_swaps()
    );
}

fn seen(s: &differently_core::Sandbox) -> SeenRow {
    SeenRow {
        org_id: s.org_id.clone(),
        project_id: s.project_id.clone(),
        status_version: s.status_version,
    }
}

/// A change of a row the caller saw running, by a process that knows the chain's head (its
/// own last change there), is one statement with no read (`transition_patch`); a process
/// that knows no head reads first, as a plain change does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_from_a_seen_row_reads_nothing_when_the_head_is_known() {
    let db = TestDb::new().await;
    let api = db.store();
    let fresh = PgStore::connect(db.url(), 2).await.unwrap();
    let (org, prj) = tenant(&api).await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let a = admit(&api, &org, &prj).await;
        activated(&api, &a.id, &pool("p", None), &Quota::default()).await;
        running.push(api.mark_running(&a.id, "ref", Utc::now()).await.unwrap());
    }
    let delete = |s: &differently_core::Sandbox| tr(&s.id, &[Running], Terminating);

    let before = api.status_swaps();
    let (a, b) = (&running[0], &running[1]);
    // `a`'s chain head is the one `b`'s change left only if they share a shard; the last
    // change of `b` is this process's, so `b`'s head is known either way.
    let changed = api
        .transition_seen(delete(b), seen(b), Utc::now())
        .await
        .unwrap();
    assert_eq!(changed.status, Terminating);
    let after = api.status_swaps();
    assert_eq!(
        (
            after.patched - before.patched,
            after.reads - before.reads,
            after.misses - before.misses,
            after.done - before.done,
        ),
        (1, 0, 0, 1),
        "one statement, no read"
    );

    let before = fresh.status_swaps();
    let changed = fresh
        .transition_seen(delete(a), seen(a), Utc::now())
        .await
        .unwrap();
    assert_eq!(changed.status, Terminating);
    let after = fresh.status_swaps();
    assert_eq!(
        (after.patched - before.patched, after.reads - before.reads),
        (0, 1),
        "no head known: read first"
    );
    let report = api.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// An API process deletes rows it saw running while a worker stops them: whichever lands
/// first, the other is refused on the row as it is, every record is chained once, and the
/// counters match the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_from_seen_rows_racing_another_process_apply_once() {
    let db = TestDb::new().await;
    let api = Arc::new(db.store());
    let worker = Arc::new(PgStore::connect(db.url(), 4).await.unwrap());
    let (org, prj) = tenant(api.as_ref()).await;
    let mut rows = Vec::new();
    for i in 0..24 {
        let a = admit(api.as_ref(), &org, &prj).await;
        activated(api.as_ref(), &a.id, &pool("p", None), &Quota::default()).await;
        rows.push(
            api.mark_running(&a.id, &format!("ref-{i}"), Utc::now())
                .await
                .unwrap(),
        );
    }
    let mut tasks = Vec::new();
    for row in &rows {
        let (api, worker, row) = (api.clone(), worker.clone(), row.clone());
        tasks.push(tokio::spawn(async move {
            let stop = {
                let (worker, id) = (worker.clone(), row.id.clone());
                tokio::spawn(async move {
                    worker
                        .transition(tr(&id, &[Running], Stopped), Utc::now())
                        .await
                })
            };
            let delete = api
                .transition_seen(tr(&row.id, &[Running], Terminating), seen(&row), Utc::now())
                .await;
            (stop.await.unwrap(), delete)
        }));
    }
    let (mut stopped, mut deleted) = (0, 0);
    for (t, row) in tasks.into_iter().zip(&rows) {
        let (stop, delete) = t.await.unwrap();
        let now = api.get_sandbox(&row.id).await.unwrap().unwrap();
        match (stop, delete) {
            (Ok(s), Err(StoreError::StatusConflict { current: Stopped })) => {
                stopped += 1;
                assert_eq!(now, s);
            }
            (
                Err(StoreError::StatusConflict {
                    current: Terminating,
                }),
                Ok(d),
            ) => {
                deleted += 1;
                assert_eq!(now, d);
                assert_eq!(d.status_version, row.status_version + 1);
            }
            other => panic!("both or neither applied: {other:?}"),
        }
    }
    assert_eq!(stopped + deleted, rows.len());
    let report = api.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(
        api.reconcile_usage().await.unwrap(),
        vec![],
        "counters drifted"
    );
    eprintln!(
        "stopped {stopped}, deleted {deleted}; api {:?}",
        api.status_swaps()
    );
}
