//! Postgres only: deleting a webhook while its deliveries' attempts are being recorded.

use super::*;
use differently_store::postgres::PgStore;
use differently_store::testing::TestDb;
use differently_store::StoreError;
use sqlx::Connection;

/// Waits (up to 30 s) until a session other than `me` waits on a lock in this database.
async fn someone_waits_on_a_lock(pool: &sqlx::PgPool, me: i32) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> $1 AND wait_event_type = 'Lock'",
        )
        .bind(me)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "the attempt's record never waited on the webhook's lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A delete takes the webhook, then (cascading) its deliveries. An attempt recorded at
/// that moment must wait for the webhook before it touches its delivery: taking the
/// delivery first, it deadlocked with the delete, and Postgres aborted one of them (the
/// delete answered 500, or the attempt's record was lost and the delivery sent again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_and_an_attempts_record_never_deadlock() {
    ensure_seal_key();
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = Arc::new(db.store());
    let s = store.as_ref();
    let (o, p) = tenant(s).await;
    let w = s
        .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
        .await
        .unwrap();
    let t0 = Utc::now();
    s.enqueue_deliveries(&[delivery(&w, "evt_1")], t0)
        .await
        .unwrap();
    let d = s
        .claim_deliveries(t0, Duration::seconds(60), 1, ANY)
        .await
        .unwrap()
        .remove(0);

    // The delete, step by step on its own connection: the webhook's row first…
    let mut deleter = sqlx::PgConnection::connect(db.url()).await.unwrap();
    let me: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut deleter)
        .await
        .unwrap();
    let mut tx = deleter.begin().await.unwrap();
    sqlx::query("SELECT id FROM webhooks WHERE id = $1 FOR UPDATE")
        .bind(&w.id)
        .execute(&mut *tx)
        .await
        .unwrap();
    // …meanwhile the deliverer records the attempt, and waits on that row…
    let recorder = {
        let store = store.clone();
        let id = d.id.clone();
        tokio::spawn(async move {
            store
                .record_attempt(&id, &success(), &DisablePolicy::default(), Utc::now())
                .await
        })
    };
    someone_waits_on_a_lock(db.store().pool(), me).await;
    // …then the delete cascades to the delivery. Had the record taken the delivery
    // first, this would deadlock.
    sqlx::query("DELETE FROM webhooks WHERE id = $1")
        .bind(&w.id)
        .execute(&mut *tx)
        .await
        .expect("the delete is not a deadlock victim");
    tx.commit().await.unwrap();
    // The record finds the delivery gone with its webhook: not found, no error.
    match recorder.await.unwrap() {
        Err(StoreError::NotFound) => {}
        other => panic!("the attempt's record: {other:?}"),
    }
}

/// The same through the store's calls, many times over: deliveries of a few webhooks
/// claimed and recorded by four deliverers, many at once per webhook (their records
/// queue on the webhook's row, as a delete does), while every webhook is deleted. Every
/// delete succeeds, and every record either lands or finds its webhook gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_webhooks_under_delivery_load_never_fails() {
    ensure_seal_key();
    let db = TestDb::new().await;
    let store: Arc<dyn Store> = Arc::new(db.store());
    let (o, p) = tenant(store.as_ref()).await;
    let mut hooks = Vec::new();
    for _ in 0..3 {
        let w = store
            .create_webhook(&hook(&o, &p, &[]), b"a", &actor())
            .await
            .unwrap();
        let items: Vec<NewDelivery> = (0..150)
            .map(|i| delivery(&w, &format!("evt_{i}")))
            .collect();
        store.enqueue_deliveries(&items, Utc::now()).await.unwrap();
        hooks.push(w);
    }
    let mut deliverers = Vec::new();
    for _ in 0..4 {
        let s: Arc<dyn Store> = Arc::new(PgStore::connect(db.url(), 4).await.unwrap());
        deliverers.push(tokio::spawn(async move {
            loop {
                let got = s
                    .claim_deliveries(Utc::now(), Duration::seconds(60), 16, ANY)
                    .await
                    .unwrap();
                if got.is_empty() {
                    return;
                }
                let records = got.iter().map(|d| {
                    // Failures too: they update the webhook's failure run.
                    let o = if d.event_id.ends_with('0') {
                        failure(Some(Duration::hours(1)))
                    } else {
                        success()
                    };
                    let s = s.clone();
                    let id = d.id.clone();
                    async move {
                        s.record_attempt(&id, &o, &DisablePolicy::default(), Utc::now())
                            .await
                    }
                });
                for r in futures::future::join_all(records).await {
                    match r {
                        Ok(_) | Err(StoreError::NotFound) => {}
                        Err(e) => panic!("an attempt's record failed: {e}"),
                    }
                }
            }
        }));
    }
    for w in &hooks {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        store
            .delete_webhook(&w.id, &actor())
            .await
            .unwrap_or_else(|e| panic!("deleting {} under load: {e}", w.id));
    }
    for d in deliverers {
        d.await.unwrap();
    }
    for w in &hooks {
        assert_eq!(store.get_webhook(&w.id).await.unwrap(), None);
        assert!(store
            .list_deliveries(&w.id, None, 1)
            .await
            .unwrap()
            .is_empty());
    }
}
