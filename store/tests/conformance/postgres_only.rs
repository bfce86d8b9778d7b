//! Cases that only make sense for Postgres.

use differently_store::postgres::{PgStore, MIGRATIONS};
use differently_store::testing::TestDb;
use differently_store::Store;

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
    let id = b.installation_id().await.unwrap();
    assert_eq!(a.installation_id().await.unwrap(), id);
}

/// The promoted columns stay in step with the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promoted_columns_match_the_document() {
    use chrono::Utc;
    use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec};
    use differently_store::{Actor, Admission, Org, PoolSlot, Project, Quota};

    let db = TestDb::new().await;
    let s = db.store();
    let org = Org {
        id: OrgId::new(),
        name: "o".into(),
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
    let sbx = Sandbox::queued(
        org.id.clone(),
        prj.id.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        Some("k".into()),
        Utc::now(),
    );
    s.admit(Admission {
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
