//! Cases that only make sense for Postgres.

use differently_store::postgres::{PgStore, MIGRATIONS};
use differently_store::prelude::*;
use differently_store::testing::TestDb;

/// Found by the fault suite (S5 with SIGSTOP alone): a stopped leader keeps its session,
/// and so its lock, forever. A lock session that sends nothing for the idle bound is ended
/// by Postgres, so another replica leads; the old holder's next ping fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leader_loses_the_lock_after_the_idle_bound() {
    use differently_store::postgres::LEADER_IDLE_TIMEOUT_SECONDS;
    let db = TestDb::new().await;
    let a = PgStore::connect(db.url(), 2).await.unwrap();
    let b = PgStore::connect(db.url(), 2).await.unwrap();
    let mut lead = a.try_lead().await.unwrap().expect("a leads");
    assert!(
        b.try_lead().await.unwrap().is_none(),
        "one leader at a time"
    );
    // `a` stops pinging, as a stopped process would.
    let started = std::time::Instant::now();
    let bound = std::time::Duration::from_secs(LEADER_IDLE_TIMEOUT_SECONDS);
    let taken = loop {
        if let Some(l) = b.try_lead().await.unwrap() {
            break l;
        }
        assert!(
            started.elapsed() < bound + std::time::Duration::from_secs(5),
            "no standby could lead {:?} after the holder fell silent",
            started.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    };
    assert!(started.elapsed() >= bound - std::time::Duration::from_secs(1));
    assert!(
        !lead.still_held().await,
        "the silent holder learns it lost the lock"
    );
    drop(taken);
}

/// Two replicas starting together both migrate an empty database: the advisory lock makes
/// one apply the migrations and the other find them applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_are_safe() {
    let db = TestDb::new().await;
    // Start from an empty schema (the test database is a migrated template copy).
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(db.store().pool())
        .await
        .unwrap();
    let a = PgStore::connect(db.url(), 2).await.unwrap();
    let b = PgStore::connect(db.url(), 2).await.unwrap();
    // `preflight` reports every migration as pending on an empty schema, without applying any.
    let all: Vec<&str> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
    assert_eq!(a.pending_migrations().await.unwrap(), all);
    assert_eq!(a.pending_migrations().await.unwrap(), all);
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    ra.unwrap();
    rb.unwrap();
    let applied: Vec<String> =
        sqlx::query_scalar("SELECT version FROM schema_migrations ORDER BY version")
            .fetch_all(a.pool())
            .await
            .unwrap();
    let want: Vec<String> = MIGRATIONS.iter().map(|(v, _)| v.to_string()).collect();
    assert_eq!(applied, want);
    // A third run is a no-op, and the schema works.
    a.migrate().await.unwrap();
    assert!(a.pending_migrations().await.unwrap().is_empty());
    let id = b.installation_id().await.unwrap();
    assert_eq!(a.installation_id().await.unwrap(), id);
}

/// The promoted columns stay in step with the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_columns_match_the_document() {
    use chrono::Utc;
    use differently_core::{CreateSandboxRequest, Sandbox, SandboxSpec};
    use differently_store::{Actor, Admission, PoolSlot, Quota};

    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s).await;
    let sbx = Sandbox::queued(
        org.id.clone(),
        prj.id.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        Some("k".into()),
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
    let pool = PoolSlot {
        name: "p1".into(),
        max_concurrent: Some(4),
    };
    s.activate(&sbx.id, &pool, &Quota::default(), Utc::now())
        .await
        .unwrap();
    s.mark_running(&sbx.id, "be-1", Utc::now()).await.unwrap();
    let mismatches: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sandboxes WHERE
             status <> doc->>'status'
          OR status_version <> (doc->>'statusVersion')::bigint
          OR pool IS DISTINCT FROM doc->>'pool'
          OR backend_ref IS DISTINCT FROM doc->>'backendRef'
          OR attempts <> (doc->>'attempts')::int
          OR cpu <> (doc->'spec'->'resources'->>'cpu')::bigint
          OR idempotency_key IS DISTINCT FROM doc->>'idempotencyKey'
          OR (expires_at IS NULL) <> (doc->>'expiresAt' IS NULL)
          OR abs(extract(epoch FROM expires_at - (doc->>'expiresAt')::timestamptz)) > 0.000001
          OR abs(extract(epoch FROM updated_at - (doc->>'updatedAt')::timestamptz)) > 0.000001",
    )
    .fetch_one(s.pool())
    .await
    .unwrap();
    assert_eq!(mismatches, 0);
    let (status, pool_col): (String, Option<String>) =
        sqlx::query_as("SELECT status, pool FROM sandboxes WHERE id = $1")
            .bind(sbx.id.as_str())
            .fetch_one(s.pool())
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), pool_col.as_deref()),
        ("running", Some("p1"))
    );
}

/// Organizations written before 0002 (documents without `status`) read back as active after
/// migrating, and the promoted column agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_migration_backfills_org_status() {
    use differently_core::OrgId;
    use differently_store::OrgStatus;

    let db = TestDb::new().await;
    let pool = db.store().pool().clone();
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .execute(&pool)
        .await
        .unwrap();
    let (v1, sql1) = MIGRATIONS[0];
    assert_eq!(v1, "0001_init");
    sqlx::raw_sql(sql1).execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO schema_migrations (version) VALUES ($1)")
        .bind(v1)
        .execute(&pool)
        .await
        .unwrap();
    let id = OrgId::new();
    let doc = serde_json::json!({
        "id": id.as_str(),
        "name": "legacy",
        "createdAt": "2024-01-01T00:00:00Z",
    });
    sqlx::query(
        "INSERT INTO organizations (id, name, doc, created_at) VALUES ($1, 'legacy', $2, now())",
    )
    .bind(id.as_str())
    .bind(doc)
    .execute(&pool)
    .await
    .unwrap();

    let s = PgStore::connect(db.url(), 2).await.unwrap();
    s.migrate().await.unwrap();
    let org = s.get_org(&id).await.unwrap().unwrap();
    assert_eq!(org.status, OrgStatus::Active);
    let column: String = sqlx::query_scalar("SELECT status FROM organizations WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(column, "active");
}

/// A direct placement reserves capacity, so it waits for an activation of its org holding
/// the org row (`FOR NO KEY UPDATE`), while a plain admission does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_admission_waits_for_the_org_s_activations() {
    use std::time::Duration;

    use chrono::Utc;
    use differently_core::{CreateSandboxRequest, Sandbox, SandboxSpec};
    use differently_store::{Actor, Admission, Admitted, DirectPlacement, PoolSlot, Quota};

    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s).await;
    let admission = |direct: bool| Admission {
        request_id: None,
        direct: direct.then(|| DirectPlacement {
            pool: PoolSlot {
                name: "p".into(),
                max_concurrent: None,
            },
            explanation: serde_json::json!({}),
            warm_class: None,
            claim_call: false,
        }),
        sandbox: Sandbox::queued(
            org.id.clone(),
            prj.id.clone(),
            SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
            None,
            Utc::now(),
        ),
        request_hash: "h".into(),
        defaults: Quota::default(),
        actor: Actor::System("test"),
    };
    // An activation of the org, in flight: it holds the org row as activations take it.
    let hold_org = || async {
        let mut activation = s.pool().begin().await.unwrap();
        sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR NO KEY UPDATE")
            .bind(org.id.as_str())
            .fetch_one(&mut *activation)
            .await
            .unwrap();
        activation
    };
    let activation = hold_org().await;
    let other = db.store();
    let direct = admission(true);
    let placing = tokio::spawn(async move { other.admit(direct).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !placing.is_finished(),
        "a direct placement waits for the activation"
    );
    activation.rollback().await.unwrap();
    let placed = tokio::time::timeout(Duration::from_secs(5), placing)
        .await
        .expect("it proceeds once the activation ends")
        .unwrap()
        .unwrap();
    // Nothing of the org was queued and its quotas admit it: placed in its admission.
    assert!(
        matches!(placed, Admitted::New(x) if x.status == differently_core::SandboxStatus::Provisioning)
    );
    let activation = hold_org().await;
    let queued = tokio::time::timeout(Duration::from_secs(5), s.admit(admission(false)))
        .await
        .expect("a plain admission does not wait for activations")
        .unwrap();
    assert!(
        matches!(queued, Admitted::New(x) if x.status == differently_core::SandboxStatus::Queued)
    );
    activation.rollback().await.unwrap();
}

/// An organization with one project, stored.
async fn tenant(s: &PgStore) -> (differently_store::Org, differently_store::Project) {
    use chrono::Utc;
    use differently_core::{OrgId, ProjectId};
    let org = differently_store::Org {
        id: OrgId::new(),
        name: "o".into(),
        status: differently_store::OrgStatus::Active,
        created_at: Utc::now(),
    };
    let prj = differently_store::Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "p".into(),
        created_at: Utc::now(),
    };
    s.ensure_tenant(&org, &prj).await.unwrap();
    (org, prj)
}

/// A status change's event carries the chain head it left (`audit_head_after`); an API
/// process that notes it (`note_audit_head`) appends the sandbox's next record, an exec's,
/// without the compare-and-swap miss it pays when another process moved the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noted_chain_head_saves_the_next_records_retry() {
    use crate::cases::{activated, admit, pool, tenant};
    use differently_core::SandboxStatus;
    use differently_store::audit::{AuditStore, NewAuditEvent};
    use differently_store::{Actor, Quota, Transition};

    let db = TestDb::new().await;
    let api = db.store();
    let worker = PgStore::connect(db.url(), 2).await.unwrap();
    let (org, prj) = tenant(&api).await;
    let s = admit(&api, &org, &prj).await;
    let s = activated(&api, &s.id, &pool("p", None), &Quota::default()).await;
    let exec = || NewAuditEvent {
        org_id: Some(org.clone()),
        project_id: Some(prj.clone()),
        actor: "key:test".into(),
        action: "sandbox.exec".into(),
        resource: s.id.to_string(),
        outcome: "requested".into(),
        detail: serde_json::json!({ "program": "echo" }),
    };
    api.append_audit(exec()).await.unwrap();
    let start = api.audit_append_misses();

    // Another process moves the chain; the API's next record misses once, then lands.
    let running = worker
        .mark_running(&s.id, "ref-1", chrono::Utc::now())
        .await
        .unwrap();
    assert!(worker.audit_head_after(s.id.as_str()).is_some());
    api.append_audit(exec()).await.unwrap();
    assert_eq!(api.audit_append_misses(), start + 1);

    // The same, with the head the change left noted first (as its status event brings it):
    // no miss.
    let stop = Transition {
        id: running.id.clone(),
        from: vec![SandboxStatus::Running],
        to: SandboxStatus::Stopped,
        reason: None,
        actor: Actor::System("test"),
    };
    worker.transition(stop, chrono::Utc::now()).await.unwrap();
    let (chain, seq, hash) = worker.audit_head_after(s.id.as_str()).unwrap();
    api.note_audit_head(&chain, seq, &hash);
    api.append_audit(exec()).await.unwrap();
    assert_eq!(api.audit_append_misses(), start + 1);
    // An older head than known is ignored, and the chain still verifies.
    api.note_audit_head(&chain, seq - 1, "stale");
    api.append_audit(exec()).await.unwrap();
    assert_eq!(api.audit_append_misses(), start + 1);
    let report = api.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// A connection the database dropped, and a closed pool, are "unavailable" (503 with
/// `Retry-After` at the API), not an internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_unavailable() {
    let db = TestDb::new().await;
    let store = PgStore::connect(db.url(), 1).await.unwrap();
    let org = differently_core::OrgId::new();
    assert!(store.get_org(&org).await.unwrap().is_none());
    // Another session ends this store's only connection, as a database restart would.
    // `pg_terminate_backend` only signals the backend, so under load the next query can
    // still find it (seen once in CI): end it again until a query meets the dropped one.
    let mut dropped = None;
    for _ in 0..20 {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .execute(db.store().pool())
        .await
        .unwrap();
        match store.get_org(&org).await {
            Err(e) => {
                dropped = Some(e);
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
    let e = dropped.expect("a query on the terminated connection failed");
    assert!(e.is_unavailable(), "{e:?}");
    store.close().await;
    let e = store.get_org(&org).await.unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    // A query that is wrong is not.
    let e = differently_store::StoreError::from(
        sqlx::query("SELECT no_such_column FROM orgs")
            .execute(db.store().pool())
            .await
            .unwrap_err(),
    );
    assert!(!e.is_unavailable(), "{e:?}");
}

/// A sweep's query skips (and reports) one row whose document does not decode instead of
/// failing the whole pass: the other rows are still served (issue #20, defect 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_does_not_decode_does_not_fail_the_sweep_queries() {
    use chrono::{TimeDelta, Utc};
    use differently_core::{CreateSandboxRequest, Sandbox, SandboxSpec, SandboxStatus};
    use differently_store::{Actor, Admission, PoolSlot, Quota};

    let db = TestDb::new().await;
    let s = db.store();
    let (org, prj) = tenant(&s).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
        spec.idle_timeout_seconds = Some(1);
        spec.ttl_seconds = 1;
        let sbx = Sandbox::queued(org.id.clone(), prj.id.clone(), spec, None, Utc::now());
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
        let pool = PoolSlot {
            name: "p1".into(),
            max_concurrent: None,
        };
        s.activate(&sbx.id, &pool, &Quota::default(), Utc::now())
            .await
            .unwrap();
        s.mark_running(&sbx.id, "be", Utc::now()).await.unwrap();
        ids.push(sbx.id);
    }
    sqlx::query(
        "UPDATE sandboxes SET doc = jsonb_set(doc, '{spec,ttlSeconds}', '\"not a number\"')
         WHERE id = $1",
    )
    .bind(ids[0].as_str())
    .execute(s.pool())
    .await
    .unwrap();
    let later = Utc::now() + TimeDelta::seconds(30);
    let served = |v: Vec<Sandbox>| v.into_iter().map(|x| x.id).collect::<Vec<_>>();
    let want = vec![ids[1].clone()];
    assert_eq!(served(s.expired(later, 10).await.unwrap()), want);
    assert_eq!(
        served(s.idle_candidates(later, None, 10).await.unwrap()),
        want
    );
    assert_eq!(
        served(s.stale(SandboxStatus::Running, later, 10).await.unwrap()),
        want
    );
    assert_eq!(
        served(s.live_not_listed("p1", later, &[], 10).await.unwrap()),
        want
    );
}
