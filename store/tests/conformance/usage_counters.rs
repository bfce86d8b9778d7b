//! The trigger-maintained usage counters (migrations 0006 and 0017): they follow every row
//! change, survive concurrency without drift, and a recount finds and fixes any drift.
//! Postgres only: the in-memory store counts from its rows.
use differently_store::prelude::*;

use std::sync::Arc;

use chrono::Utc;
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec, SandboxStatus,
};
use differently_store::postgres::PgStore;
use differently_store::testing::TestDb;
use differently_store::{Actor, Admission, Org, PoolSlot, Project, Quota, QuotaScope, Transition};

async fn tenant(s: &PgStore, name: &str) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: name.into(),
        status: differently_store::OrgStatus::Active,
        created_at: Utc::now(),
    };
    let prj = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "p".into(),
        created_at: Utc::now(),
    };
    s.ensure_tenant(&org, &prj).await.unwrap();
    (org.id, prj.id)
}

async fn admit(s: &PgStore, org: &OrgId, prj: &ProjectId) -> Sandbox {
    let sbx = Sandbox::queued(
        org.clone(),
        prj.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        None,
        Utc::now(),
    );
    s.admit(Admission {
        request_id: None,
        direct: None,
        sandbox: sbx.clone(),
        request_hash: "h".into(),
        defaults: Quota::default(),
        actor: Actor::System("test"),
    })
    .await
    .unwrap();
    sbx
}

fn slot() -> PoolSlot {
    PoolSlot {
        name: "p1".into(),
        max_concurrent: Some(1_000),
    }
}

/// Many orgs admitting, activating, running and terminating at once: no deadlock, no
/// drift, and the counters equal the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counters_stay_exact_under_concurrency() {
    let db = TestDb::new().await;
    let s = Arc::new(PgStore::connect(db.url(), 16).await.unwrap());
    let mut tasks = Vec::new();
    for o in 0..6 {
        let (org, prj) = tenant(&s, &format!("org{o}")).await;
        for _ in 0..4 {
            let (s, org, prj) = (s.clone(), org.clone(), prj.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..8 {
                    let sbx = admit(&s, &org, &prj).await;
                    s.activate(&sbx.id, &slot(), &Quota::default(), Utc::now())
                        .await
                        .unwrap();
                    s.mark_running(&sbx.id, "be", Utc::now()).await.unwrap();
                    if i % 2 == 0 {
                        for (from, to) in [
                            (SandboxStatus::Running, SandboxStatus::Terminating),
                            (SandboxStatus::Terminating, SandboxStatus::Terminated),
                        ] {
                            let t = Transition {
                                id: sbx.id.clone(),
                                from: vec![from],
                                to,
                                reason: None,
                                actor: Actor::System("test"),
                            };
                            s.transition(t, Utc::now()).await.unwrap();
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let slots = differently_store::placement::PlacementStore::pool_slots_used(s.as_ref())
        .await
        .unwrap();
    // 6 orgs × 4 tasks × 8 sandboxes, half terminated.
    assert_eq!(slots.get("p1"), Some(&(6 * 4 * 4)));
    let cpu = s.active_cpu_by_org().await.unwrap();
    assert_eq!(cpu.len(), 6);
}

/// A change that counts the same before and after (provisioning → running) does not
/// touch the counters, so it never waits behind another transaction holding them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_counts_the_same_takes_no_counter_lock() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "nolock").await;
    let a = admit(&s, &org, &prj).await;
    s.activate(&a.id, &slot(), &Quota::default(), Utc::now())
        .await
        .unwrap();
    let mut other = sqlx::PgConnection::connect(db.url()).await.unwrap();
    let mut held = other.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM usage_counters FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let running = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.mark_running(&a.id, "be", Utc::now()),
    )
    .await
    .expect("mark_running waited for the counters' lock");
    assert_eq!(running.unwrap().status, SandboxStatus::Running);
    held.rollback().await.unwrap();
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
}

/// An admission does not wait for an activation of its org (the row held
/// `FOR NO KEY UPDATE`), and does wait for a change of the org itself (`FOR UPDATE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_wait_for_org_changes_not_for_activations() {
    use sqlx::Connection;
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "locks").await;
    let mut other = sqlx::PgConnection::connect(db.url()).await.unwrap();

    let mut activating = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR NO KEY UPDATE")
        .bind(org.as_str())
        .execute(&mut *activating)
        .await
        .unwrap();
    let admitted = tokio::time::timeout(std::time::Duration::from_secs(5), admit(&s, &org, &prj))
        .await
        .expect("the admission waited for an activation's org lock");
    assert_eq!(admitted.status, SandboxStatus::Queued);
    activating.rollback().await.unwrap();

    let mut changing = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR UPDATE")
        .bind(org.as_str())
        .execute(&mut *changing)
        .await
        .unwrap();
    let blocked = {
        let s = s.clone();
        let (org, prj) = (org.clone(), prj.clone());
        tokio::spawn(async move { admit(&s, &org, &prj).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !blocked.is_finished(),
        "the admission ran during an org change"
    );
    changing.rollback().await.unwrap();
    let admitted = tokio::time::timeout(std::time::Duration::from_secs(5), blocked)
        .await
        .expect("the admission went on after the org change")
        .unwrap();
    assert_eq!(admitted.status, SandboxStatus::Queued);
    assert_eq!(
        s.usage(&QuotaScope::Org(org)).await.unwrap().queued,
        2,
        "both admissions counted"
    );
}

/// A counter changed behind the trigger's back is found, reported with both values, and
/// corrected; the quota check then sees the corrected value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_reports_and_fixes_drift() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "drift").await;
    let a = admit(&s, &org, &prj).await;
    s.activate(&a.id, &slot(), &Quota::default(), Utc::now())
        .await
        .unwrap();
    admit(&s, &org, &prj).await;
    let key = QuotaScope::Org(org.clone()).key();
    sqlx::query("UPDATE usage_counters SET active = active + 5, queued = 0 WHERE scope = $1")
        .bind(&key)
        .execute(s.pool())
        .await
        .unwrap();
    sqlx::query("INSERT INTO usage_counters (scope, rank, slots) VALUES ('pool:ghost', 2, 3)")
        .execute(s.pool())
        .await
        .unwrap();
    let wrong = s.usage(&QuotaScope::Org(org.clone())).await.unwrap();
    assert_eq!((wrong.active, wrong.queued), (6, 0));

    let mut drift = s.reconcile_usage().await.unwrap();
    drift.sort_by(|a, b| a.scope.cmp(&b.scope));
    let scopes: Vec<&str> = drift.iter().map(|d| d.scope.as_str()).collect();
    assert_eq!(scopes, vec![key.as_str(), "pool:ghost"]);
    assert_eq!((drift[0].stored.active, drift[0].counted.active), (6, 1));
    assert_eq!((drift[0].stored.queued, drift[0].counted.queued), (0, 1));
    assert_eq!((drift[1].stored_slots, drift[1].counted_slots), (3, 0));

    let fixed = s.usage(&QuotaScope::Org(org.clone())).await.unwrap();
    assert_eq!((fixed.active, fixed.queued), (1, 1));
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
}

/// Every kind of row change (status, pool, resources, a move to another org's project,
/// several changes of one row in one transaction, a delete) leaves the counters equal to
/// the rows: the trigger of migration 0017 sums a change's deltas per scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_row_change_moves_the_counters_exactly() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "kinds").await;
    let (_, prj2) = tenant(&s, "kinds2").await;
    let a = admit(&s, &org, &prj).await;
    let b = admit(&s, &org, &prj).await;
    s.activate(&a.id, &slot(), &Quota::default(), Utc::now())
        .await
        .unwrap();
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let steps: [(&str, Vec<&str>); 6] = [
        (
            "UPDATE sandboxes SET pool = 'p2' WHERE id = $1",
            vec![a.id.as_str()],
        ),
        (
            "UPDATE sandboxes SET cpu = cpu + 3, disk_gib = 7 WHERE id = $1",
            vec![a.id.as_str()],
        ),
        (
            "UPDATE sandboxes SET status = 'provisioning', pool = 'p1' WHERE id = $1",
            vec![b.id.as_str()],
        ),
        (
            "UPDATE sandboxes SET org_id = (SELECT org_id FROM projects WHERE id = $2),
                 project_id = $2 WHERE id = $1",
            vec![a.id.as_str(), prj2.as_str()],
        ),
        (
            "UPDATE sandboxes SET status = 'paused' WHERE id = $1",
            vec![b.id.as_str()],
        ),
        ("DELETE FROM sandboxes WHERE id = $1", vec![b.id.as_str()]),
    ];
    for (sql, binds) in steps {
        let mut q = sqlx::query(sql);
        for b in binds {
            q = q.bind(b);
        }
        q.execute(s.pool()).await.unwrap();
        assert_eq!(
            s.reconcile_usage().await.unwrap(),
            Vec::new(),
            "after {sql}"
        );
    }
    // Several changes of one row in one transaction, ending where they started but for
    // the pool: each is counted at COMMIT, in order.
    let mut tx = s.pool().begin().await.unwrap();
    for sql in [
        "UPDATE sandboxes SET status = 'terminating' WHERE id = $1",
        "UPDATE sandboxes SET status = 'stopped', pool = NULL WHERE id = $1",
        "UPDATE sandboxes SET status = 'provisioning', pool = 'p1' WHERE id = $1",
    ] {
        sqlx::query(sql)
            .bind(a.id.as_str())
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let moved = s.usage(&QuotaScope::Project(prj2)).await.unwrap();
    assert_eq!(moved.active, 1);
    assert_eq!(moved.cpu, u64::from(a.spec.resources.cpu) + 3);
    assert_eq!(moved.disk_gib, 7);
    let left = s.usage(&QuotaScope::Org(org)).await.unwrap();
    assert_eq!((left.active, left.queued, left.cpu), (0, 0, 0));
}

/// An update of a column the counters do not read (a reason, a deadline, the document)
/// queues no trigger at all, so its COMMIT runs no counter code. Shown with a
/// classification function that fails, inside transactions that are rolled back: firing
/// what is queued (`SET CONSTRAINTS ALL IMMEDIATE`) succeeds after such an update and
/// fails after a status change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_counters_do_not_read_fires_no_trigger() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "quiet").await;
    let a = admit(&s, &org, &prj).await;
    let fire_after = |update: &'static str| {
        let (pool, id) = (s.pool().clone(), a.id.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::raw_sql(
                "CREATE OR REPLACE FUNCTION usage_class(st text)
                 RETURNS sandbox_status_classes LANGUAGE plpgsql STABLE
                 AS $$ BEGIN RAISE EXCEPTION 'usage_class ran'; END; $$",
            )
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query(update)
                .bind(id.as_str())
                .execute(&mut *tx)
                .await
                .unwrap();
            let fired = sqlx::query("SET CONSTRAINTS ALL IMMEDIATE")
                .execute(&mut *tx)
                .await;
            tx.rollback().await.ok();
            fired.map(|_| ()).map_err(|e| e.to_string())
        }
    };
    fire_after(
        "UPDATE sandboxes SET updated_at = now(), next_attempt_at = now(),
             doc = doc || '{}'::jsonb, priority = priority + 1 WHERE id = $1",
    )
    .await
    .expect("an update of no counted column queued the usage trigger");
    let err = fire_after("UPDATE sandboxes SET status = 'failed' WHERE id = $1")
        .await
        .expect_err("a status change must be counted");
    assert!(err.contains("usage_class ran"), "{err}");
    // Both rolled back: the classification and the counters are as they were.
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    assert_eq!(s.usage(&QuotaScope::Org(org)).await.unwrap().queued, 1);
}

/// Deleting rows (a project's history on project delete) takes their usage with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_rows_leave_the_counters() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "del").await;
    admit(&s, &org, &prj).await;
    admit(&s, &org, &prj).await;
    assert_eq!(
        s.usage(&QuotaScope::Org(org.clone())).await.unwrap().queued,
        2
    );
    sqlx::query("DELETE FROM sandboxes WHERE project_id = $1")
        .bind(prj.as_str())
        .execute(s.pool())
        .await
        .unwrap();
    assert_eq!(
        s.usage(&QuotaScope::Org(org.clone())).await.unwrap().queued,
        0
    );
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
}

/// The status classification is core's: a database whose copy disagrees is corrected by
/// the next `migrate`, which also recounts every counter under the corrected rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_resyncs_the_status_classes_and_recounts() {
    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s, "cls").await;
    let a = admit(&s, &org, &prj).await;
    s.activate(&a.id, &slot(), &Quota::default(), Utc::now())
        .await
        .unwrap();
    // Someone's older server believed provisioning holds no CPU, and counted that way.
    sqlx::query("UPDATE sandbox_status_classes SET compute = 0 WHERE status = 'provisioning'")
        .execute(s.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE usage_counters SET cpu = 0, memory_mib = 0 WHERE rank < 2")
        .execute(s.pool())
        .await
        .unwrap();
    s.migrate().await.unwrap();
    let compute: i16 = sqlx::query_scalar(
        "SELECT compute FROM sandbox_status_classes WHERE status = 'provisioning'",
    )
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(compute, 1);
    let u = s.usage(&QuotaScope::Org(org.clone())).await.unwrap();
    assert_eq!(u.cpu, u64::from(a.spec.resources.cpu));
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
}

/// The trigger classifies rows with a function `migrate` writes from core's
/// classification: it answers without reading the table, fails on an unknown status, and
/// an older body (one that queries the table) is replaced by the next `migrate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_usage_class_function_is_core_s_classification() {
    let db = TestDb::new().await;
    let s = db.store();
    let classify = |st: &'static str| {
        let pool = s.pool().clone();
        async move {
            sqlx::query_as::<_, (i16, i16, i16, i16, i16)>(
                "SELECT (c).queued, (c).active, (c).compute, (c).disk, (c).slot
                 FROM (SELECT usage_class($1) AS c) x",
            )
            .bind(st)
            .fetch_one(&pool)
            .await
        }
    };
    for st in differently_core::SandboxStatus::ALL {
        let want = (
            i16::from(st == differently_core::SandboxStatus::Queued),
            i16::from(st.counts_active()),
            i16::from(st.reserves_compute()),
            i16::from(st.counts_disk()),
            i16::from(st.holds_pool_slot()),
        );
        assert_eq!(classify(st.as_str()).await.unwrap(), want, "{st:?}");
    }
    let err = classify("sleeping").await.unwrap_err();
    assert!(err.to_string().contains("has no usage class"), "{err}");
    // Even a table that disagrees does not change the answer until `migrate` resyncs it.
    sqlx::query("UPDATE sandbox_status_classes SET active = 0 WHERE status = 'running'")
        .execute(s.pool())
        .await
        .unwrap();
    assert_eq!(classify("running").await.unwrap().1, 1);
    // An older body is replaced.
    sqlx::raw_sql(
        "CREATE OR REPLACE FUNCTION usage_class(st text) RETURNS sandbox_status_classes
         LANGUAGE plpgsql STABLE AS $f$
         DECLARE c sandbox_status_classes;
         BEGIN SELECT * INTO c FROM sandbox_status_classes WHERE status = st; RETURN c; END;
         $f$",
    )
    .execute(s.pool())
    .await
    .unwrap();
    assert_eq!(
        classify("running").await.unwrap().1,
        0,
        "the old body reads the table"
    );
    s.migrate().await.unwrap();
    let body: String = sqlx::query_scalar(
        "SELECT prosrc FROM pg_proc WHERE oid = 'usage_class(text)'::regprocedure",
    )
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert!(!body.contains("FROM sandbox_status_classes"), "{body}");
    assert_eq!(classify("running").await.unwrap().1, 1);
}

/// Store connections end a transaction left idle (a stalled process) instead of holding
/// its locks indefinitely, and an admission waiting behind it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_transaction_cannot_hold_an_organization_forever() {
    let db = TestDb::new().await;
    let s = db.store();
    let timeout: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(timeout, "5s");
    let (org, prj) = tenant(&s, "stall").await;
    // Another handle (like another process) takes the org's row and then stalls.
    let stalled_store = PgStore::connect(db.url(), 1).await.unwrap();
    let mut stalled = stalled_store.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR UPDATE")
        .bind(org.as_str())
        .execute(&mut *stalled)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    tokio::time::timeout(std::time::Duration::from_secs(20), admit(&s, &org, &prj))
        .await
        .expect("the admission waited past the stalled transaction's timeout");
    assert!(started.elapsed() >= std::time::Duration::from_secs(4));
    // The stalled session was ended: its transaction cannot commit.
    assert!(stalled.commit().await.is_err());
}
