//! Warm pools against both stores: classes round-trip (validated, audited, only on a
//! registered pool), instances move creating → ready → retiring → gone (or creating → failed),
//! counts per class and state.

use chrono::{TimeDelta, Utc};
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::{Resources, SandboxId};
use differently_store::audit::AuditFilter;
use differently_store::warm::{WarmCount, WarmState};
use differently_store::{Actor, Store, StoreError};

use crate::Env;

conformance!(
    warm;
    warm_classes_round_trip_validated_and_audited,
    warm_instances_move_through_their_states,
    warm_counts_list_declared_classes_then_leftovers,
);

pub(crate) fn pool_record(name: &str) -> PoolRecord {
    PoolRecord {
        name: name.into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: None,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: None,
        settings: serde_json::json!({}),
        source: PoolSource::Api,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    }
}

pub(crate) fn class(name: &str, size: u32) -> WarmClass {
    WarmClass {
        name: name.into(),
        size,
        max_size: None,
        refill_per_second: 1.0,
        max_age_seconds: 3600,
        template: None,
        resources: None,
    }
}

fn classes(v: Vec<WarmClass>) -> WarmClasses {
    WarmClasses { classes: v }
}

fn count(class: &str, creating: u32, ready: u32, retiring: u32) -> WarmCount {
    WarmCount {
        class: class.into(),
        creating,
        ready,
        retiring,
    }
}

async fn warm_sets(s: &dyn Store) -> Vec<differently_store::audit::AuditEvent> {
    s.list_audit(&AuditFilter {
        action: Some("pool.warm.set".into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn warm_classes_round_trip_validated_and_audited(env: &Env) {
    let s = env.store.as_ref();
    let actor = Actor::Key("key_admin".into());
    assert_eq!(s.warm_classes("p").await.unwrap(), WarmClasses::default());
    let doc = classes(vec![
        WarmClass {
            max_size: Some(4),
            refill_per_second: 2.5,
            template: Some("python:3.12".into()),
            resources: Some(Resources {
                cpu: 2,
                ..Resources::DEFAULT
            }),
            ..class("py", 2)
        },
        class("default", 1),
    ]);
    assert!(
        matches!(
            s.set_warm_classes("p", &doc, &actor).await,
            Err(StoreError::NotFound)
        ),
        "an unregistered pool has no warm classes"
    );

    s.upsert_pool(&pool_record("p"), &actor).await.unwrap();
    let mut bad = doc.clone();
    bad.classes[1].size = 1001;
    match s.set_warm_classes("p", &bad, &actor).await {
        Err(StoreError::InvalidValue(e)) => assert_eq!(e.field, "classes[1].size"),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    assert!(
        warm_sets(s).await.is_empty(),
        "nothing written when refused"
    );

    s.set_warm_classes("p", &doc, &actor).await.unwrap();
    assert_eq!(s.warm_classes("p").await.unwrap(), doc);
    // Another handle (a new pool of connections for Postgres) reads the same document.
    assert_eq!(env.reopen().await.warm_classes("p").await.unwrap(), doc);
    let recs = warm_sets(s).await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].resource, "pool:p");
    assert_eq!(recs[0].actor, "key:key_admin");
    assert_eq!(recs[0].detail["old"], serde_json::Value::Null);
    assert_eq!(recs[0].detail["new"]["classes"][0]["name"], "py");

    // The same document again changes nothing and writes no record.
    s.set_warm_classes("p", &doc, &actor).await.unwrap();
    assert_eq!(warm_sets(s).await.len(), 1);

    // A change is recorded with the document it replaced.
    s.upsert_pool(&pool_record("q"), &actor).await.unwrap();
    let smaller = classes(vec![class("default", 3)]);
    s.set_warm_classes("p", &smaller, &actor).await.unwrap();
    s.set_warm_classes("q", &WarmClasses::default(), &actor)
        .await
        .unwrap();
    let recs = warm_sets(s).await;
    assert_eq!(recs.len(), 3);
    let p_change = recs
        .iter()
        .find(|r| r.resource == "pool:p" && !r.detail["old"].is_null())
        .expect("the change of p is recorded");
    assert_eq!(p_change.detail["old"]["classes"][0]["name"], "py");
    assert_eq!(p_change.detail["new"]["classes"][0]["size"], 3);
    assert_eq!(
        s.all_warm_classes().await.unwrap(),
        vec![
            ("p".to_owned(), smaller),
            ("q".to_owned(), WarmClasses::default())
        ]
    );
}

async fn warm_instances_move_through_their_states(env: &Env) {
    let s = env.store.as_ref();
    let t0 = Utc::now();
    let (a, b, c, other) = (
        SandboxId::new(),
        SandboxId::new(),
        SandboxId::new(),
        SandboxId::new(),
    );
    for id in [&a, &b, &c] {
        s.warm_begin("p", "x", id, t0).await.unwrap();
    }
    s.warm_begin("elsewhere", "x", &other, t0).await.unwrap();

    // Begun again while creating: one more attempt; an id taken otherwise is refused.
    s.warm_begin("p", "x", &a, t0).await.unwrap();
    assert!(matches!(
        s.warm_begin("p", "y", &a, t0).await,
        Err(StoreError::AlreadyExists(_))
    ));
    let listed = s.warm_instances("p").await.unwrap();
    assert_eq!(
        listed.iter().map(|w| w.id.clone()).collect::<Vec<_>>(),
        vec![a.clone(), b.clone(), c.clone()],
        "only the pool's rows, by id"
    );
    assert!(listed.iter().all(|w| w.state == WarmState::Creating
        && w.backend_ref.is_none()
        && w.ready_at.is_none()
        && w.class == "x"
        && w.pool == "p"));
    assert_eq!(
        listed.iter().map(|w| w.attempts).collect::<Vec<_>>(),
        vec![2, 1, 1]
    );

    // creating → ready; a redelivered ready keeps the first.
    let t1 = t0 + TimeDelta::seconds(5);
    assert!(s.warm_ready(&a, "ref-a", t1).await.unwrap());
    assert!(s
        .warm_ready(&a, "ref-a", t1 + TimeDelta::seconds(1))
        .await
        .unwrap());
    let got = s.warm_instances("p").await.unwrap();
    let wa = got.iter().find(|w| w.id == a).unwrap();
    assert_eq!(wa.state, WarmState::Ready);
    assert_eq!(wa.backend_ref.as_deref(), Some("ref-a"));
    let ready_at = wa.ready_at.unwrap();
    assert!(
        (ready_at - t1).num_milliseconds().abs() < 5,
        "{ready_at} vs {t1}"
    );
    // A ready row is not a failed create.
    assert!(!s.warm_failed(&a).await.unwrap());

    // Retired while creating: its create's ready says no (the worker deletes the instance).
    assert_eq!(s.warm_retire(std::slice::from_ref(&b)).await.unwrap(), 1);
    assert!(!s.warm_ready(&b, "ref-b", t1).await.unwrap());
    let wb = s.warm_instances("p").await.unwrap();
    let wb = wb.iter().find(|w| w.id == b).unwrap();
    assert_eq!(
        (wb.state, wb.backend_ref.as_deref()),
        (WarmState::Retiring, None)
    );
    assert!(
        !s.warm_failed(&b).await.unwrap(),
        "a retiring row is not failed"
    );
    assert!(s.warm_gone(&b).await.unwrap());
    assert!(!s.warm_gone(&b).await.unwrap());
    // Gone: its create's ready says no.
    assert!(!s.warm_ready(&b, "ref-b", t1).await.unwrap());

    // A create that failed for good removes its creating row.
    assert!(s.warm_failed(&c).await.unwrap());
    assert!(!s.warm_ready(&c, "ref-c", t1).await.unwrap());

    // Retiring a ready row; ids without rows are not counted.
    assert_eq!(
        s.warm_retire(&[a.clone(), SandboxId::new()]).await.unwrap(),
        1
    );
    assert_eq!(s.warm_retire(&[]).await.unwrap(), 0);
    let left = s.warm_instances("p").await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].state, WarmState::Retiring);
    assert_eq!(left[0].backend_ref.as_deref(), Some("ref-a"));
    assert!(s.warm_gone(&a).await.unwrap());
    assert!(s.warm_instances("p").await.unwrap().is_empty());
    assert_eq!(s.warm_instances("elsewhere").await.unwrap().len(), 1);
}

async fn warm_counts_list_declared_classes_then_leftovers(env: &Env) {
    let s = env.store.as_ref();
    let actor = Actor::System("test");
    s.upsert_pool(&pool_record("p"), &actor).await.unwrap();
    s.set_warm_classes("p", &classes(vec![class("b", 2), class("a", 1)]), &actor)
        .await
        .unwrap();
    let now = Utc::now();
    let mut ids = Vec::new();
    for class in ["b", "b", "b", "gone-2", "gone-1"] {
        let id = SandboxId::new();
        s.warm_begin("p", class, &id, now).await.unwrap();
        ids.push(id);
    }
    s.warm_begin("q", "a", &SandboxId::new(), now)
        .await
        .unwrap();
    assert!(s.warm_ready(&ids[0], "r0", now).await.unwrap());
    assert!(s.warm_ready(&ids[1], "r1", now).await.unwrap());
    s.warm_retire(&[ids[1].clone(), ids[3].clone()])
        .await
        .unwrap();
    assert_eq!(
        s.warm_counts("p").await.unwrap(),
        vec![
            count("b", 1, 1, 1),
            count("a", 0, 0, 0),
            count("gone-1", 1, 0, 0),
            count("gone-2", 0, 0, 1),
        ]
    );
    assert_eq!(s.warm_counts("q").await.unwrap(), vec![count("a", 1, 0, 0)]);
    assert!(s.warm_counts("none").await.unwrap().is_empty());
}
