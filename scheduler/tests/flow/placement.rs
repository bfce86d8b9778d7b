//! Placement under quota and capacity: what waits is explained as waiting, a full pool
//! sends work to the next ranked one or keeps it queued, and freed room goes to the fair
//! choice, woken by the announced end.

use super::*;

/// A sandbox the policy would place but its org's quota keeps waiting: its explanation says
/// waiting, behind the org's wall, with the row's own reason — never `placed` on a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_waiting_on_its_org_quota_is_explained_as_waiting() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let quota = differently_core::tenancy::Quota {
        max_cpu: Some(2),
        ..Default::default()
    };
    p.store
        .put_quota(
            &differently_store::QuotaScope::Org(p.org.clone()),
            &quota,
            &Actor::System("test"),
        )
        .await
        .expect("quota");
    let first = p
        .admit(serde_json::json!({ "resources": { "cpu": 2 } }))
        .await;
    p.reaches(&first.id, Running).await;
    let second = p
        .admit(serde_json::json!({ "resources": { "cpu": 1 } }))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let (row, doc) = loop {
        let row = p.row(&second.id).await;
        let doc = p.store.get_placement(&second.id).await.expect("placement");
        if let (Some(reason), Some(doc)) = (&row.status_reason, doc) {
            if reason.starts_with("waiting: org cpu quota") {
                break (row, doc);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never waited on the org quota: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(row.status, Queued, "{row:?}");
    assert_eq!(doc["decision"], "waiting", "{doc}");
    assert_eq!(doc["wall"], "org", "{doc}");
    assert_eq!(
        doc["reason"].as_str(),
        row.status_reason.as_deref(),
        "{doc}"
    );
    assert!(doc.get("pool").is_none(), "{doc}");
}

/// Found by the dashboard: a sandbox whose admission tried direct placement while its org was
/// at quota got its waiting reason from the store at once, and the leader, seeing the same
/// reason again, never stored an explanation: `GET …/placement` answered 404. The leader now
/// stores one the first time it explains a candidate, whatever the row already says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_admission_refused_by_the_quota_is_still_explained() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let quota = differently_core::tenancy::Quota {
        max_cpu: Some(2),
        ..Default::default()
    };
    p.store
        .put_quota(
            &differently_store::QuotaScope::Org(p.org.clone()),
            &quota,
            &Actor::System("test"),
        )
        .await
        .expect("quota");
    let first = p
        .admit(serde_json::json!({ "resources": { "cpu": 2 } }))
        .await;
    p.reaches(&first.id, Running).await;
    let req: CreateSandboxRequest =
        serde_json::from_value(serde_json::json!({ "resources": { "cpu": 1 } })).expect("request");
    let row = Sandbox::queued(
        p.org.clone(),
        p.project.clone(),
        SandboxSpec::build(&req).expect("spec"),
        None,
        Utc::now(),
    );
    let admitted = p
        .store
        .admit(Admission {
            sandbox: row,
            request_hash: "h".into(),
            defaults: Default::default(),
            actor: Actor::Key("key_test".into()),
            request_id: None,
            direct: Some(differently_store::DirectPlacement {
                pool: differently_store::PoolSlot {
                    name: "fake".into(),
                    max_concurrent: None,
                },
                explanation: serde_json::json!({"decision": "placed", "pool": "fake"}),
                warm_class: None,
                claim_call: false,
            }),
        })
        .await
        .expect("admit");
    let (Admitted::New(second) | Admitted::Replayed(second)) = admitted;
    // The store refused the direct activation: queued, with its reason, and no explanation.
    assert_eq!(second.status, Queued, "{second:?}");
    let reason = second.status_reason.clone().expect("a waiting reason");
    assert!(reason.starts_with("waiting: org cpu quota"), "{reason}");
    assert!(p
        .store
        .get_placement(&second.id)
        .await
        .expect("read")
        .is_none());
    p.announcer.admitted(&second, "").await.expect("announce");
    let deadline = tokio::time::Instant::now() + WAIT;
    let doc = loop {
        if let Some(doc) = p.store.get_placement(&second.id).await.expect("placement") {
            break doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never explained why it waits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(doc["decision"], "waiting", "{doc}");
    assert_eq!(doc["wall"], "org", "{doc}");
    assert_eq!(doc["reason"].as_str(), Some(reason.as_str()), "{doc}");
}

/// A pool whose backend refuses creates for capacity (a provider at its plan limit), on a
/// real Postgres and nats-server: the sandbox goes back to placement at once (no redelivery
/// to the full pool), the full pool gets no new placements for a while (here and in the
/// fleet-wide health view), and the sandbox runs on the next ranked pool, created once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_for_capacity_falls_back_to_the_next_ranked_pool() {
    let fakes = [
        // Ranked first: private-first ties break by name.
        ("fake", serde_json::json!({ "capacityFull": true })),
        ("spare", serde_json::json!({})),
    ];
    let p = plane_on(Parts::Real, &fakes, WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({})).await;
    let row = p.reaches(&s.id, Running).await;
    assert_eq!(row.pool.as_deref(), Some("spare"), "{row:?}");
    assert_eq!(
        row.attempts, 2,
        "placed on the full pool first, then on the next one: {row:?}"
    );
    let spare_ledger = p._dir.path().join("spare.jsonl");
    let spare = created_count(&read_ledger(&spare_ledger).unwrap_or_default(), &s.id);
    assert_eq!(spare, 1, "one instance on the pool with room");
    assert_eq!(p.creates(&s.id), 0, "nothing was made on the full pool");

    // The refusal is visible: in this process's pool view and in the stored health view
    // the other processes read.
    let full = p.pools.get("fake").expect("pool fake");
    let until = full
        .capacity_refused_until(Utc::now())
        .expect("the full pool is refused for a while");
    assert!(
        until > Utc::now() + chrono::Duration::seconds(20),
        "{until}"
    );
    assert!(!full.view().healthy);
    let health = p.store.pool_health().await.expect("health");
    let fake = health
        .iter()
        .find(|h| h.name == "fake")
        .expect("fake's health");
    assert!(!fake.healthy, "{fake:?}");
    assert!(
        fake.error
            .as_deref()
            .is_some_and(|e| e.starts_with("insufficient capacity")),
        "{fake:?}"
    );
    // The decision that placed it says why the first pool was passed over.
    let explained = p
        .store
        .get_placement(&s.id)
        .await
        .expect("read placement")
        .expect("explanation stored");
    let text = explained.to_string();
    assert!(
        text.contains("spare") && text.contains("unhealthy"),
        "{text}"
    );

    // A probe of the full pool while refused keeps it unhealthy for the fleet.
    let probe = full.probe("test").await;
    assert!(!probe.healthy, "{probe:?}");
}

/// The only pool has no room: the sandbox is not failed for it; it waits in the queue (the
/// placement explains the full pool as unhealthy) and is not sent back to the full pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_for_capacity_with_nowhere_else_waits_instead_of_failing() {
    let fakes = [("fake", serde_json::json!({ "capacityFull": true }))];
    let p = plane_on(Parts::Memory, &fakes, WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({})).await;
    p.reaches(&s.id, Provisioning).await;
    let row = p.reaches(&s.id, Queued).await;
    assert_eq!(row.attempts, 1, "{row:?}");
    let reason = row.status_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("insufficient capacity") || reason.contains("fake (unhealthy)"),
        "{row:?}"
    );
    // Well past the requeue delay: placement keeps it waiting, it never fails.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let row = p.row(&s.id).await;
    assert_eq!(row.status, Queued, "{row:?}");
    assert_eq!(
        row.attempts, 1,
        "not placed on the full pool again: {row:?}"
    );
}

/// Found by the e2e fairness test under CI load: a candidate the policy left waiting for a
/// full pool was parked without walling the pool, so a later candidate of an org with more
/// active CPU, decided after the slot view was re-read, took a slot freed before the release
/// event reached the leader, ahead of the fair order. Here the slot is freed in the store
/// without any event: B (waiting, no active CPU) must still get it before A (active CPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_before_its_release_event_goes_to_the_fair_choice() {
    let p = plane_tuned(
        Parts::Memory,
        &[("fake", serde_json::json!({}))],
        WorkerConfig::default(),
        Tuning {
            max_concurrent: Some(2),
            // Long: A arrives well inside B's back-off, so only the wall keeps A out.
            waiting_backoff: Duration::from_secs(2),
            ..Tuning::default()
        },
    )
    .await;
    let (freed, kept) = (
        p.admit(serde_json::json!({})).await,
        p.admit(serde_json::json!({})).await,
    );
    p.reaches(&freed.id, Running).await;
    p.reaches(&kept.id, Running).await;
    let (b_org, b_project) = p.another_org("small").await;
    let b = p
        .admit_quietly_in(&b_org, &b_project, serde_json::json!({}))
        .await;
    p.announcer.admitted(&b, "").await.expect("announce");
    p.row_until(&b.id, "waited for the full pool", |r| {
        r.status == Queued && r.status_reason.is_some()
    })
    .await;
    // One of A's sandboxes ends in the store only: the leader hears of no release. A keeps
    // one CPU active, B has none: the freed slot is B's.
    p.end_in_store(&freed.id, "test: freed without an event")
        .await;
    // A arrives once the leader's slot view (re-read every tick) has seen the free slot, as a
    // candidate decided late in a long pass does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = p.admit(serde_json::json!({})).await;
    let b_row = p
        .row_until(&b.id, "got the freed slot", |r| r.status != Queued)
        .await;
    assert!(
        matches!(b_row.status, Provisioning | Running),
        "B took the slot: {b_row:?}"
    );
    let a_row = p.row(&a.id).await;
    assert_eq!(
        a_row.status, Queued,
        "A, with more active CPU and arriving later, waits: {a_row:?}"
    );
}

/// The end of a sandbox, announced as the worker announces it, wakes placement at once:
/// the leader reads only final status changes (`Naming::final_event_filter`), and this one
/// must reach it. Placement's tick and the waiting back-off are an hour, so nothing else
/// places the queued sandbox within the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_end_wakes_placement_for_the_sandbox_waiting_on_its_room() {
    let p = plane_tuned(
        Parts::Real,
        &[("fake", serde_json::json!({}))],
        WorkerConfig::default(),
        Tuning {
            max_concurrent: Some(1),
            waiting_backoff: Duration::from_secs(3600),
            tick: Duration::from_secs(3600),
            ..Tuning::default()
        },
    )
    .await;
    let first = p.admit(serde_json::json!({})).await;
    p.reaches(&first.id, Running).await;
    let waiting = p.admit(serde_json::json!({})).await;
    p.row_until(&waiting.id, "waited for the full pool", |r| {
        r.status == Queued && r.status_reason.is_some()
    })
    .await;
    let ended = p.end_in_store(&first.id, "test: ended").await;
    p.announcer.status(&ended).await.expect("announce the end");
    let row = p
        .row_until(&waiting.id, "placed into the freed room", |r| {
            r.status != Queued
        })
        .await;
    assert!(matches!(row.status, Provisioning | Running), "{row:?}");
}
