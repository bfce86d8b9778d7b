//! Warm pools against both stores: classes round-trip (validated, audited, only on a
//! registered pool), instances move creating → ready → retiring → gone (or creating → failed),
//! counts per class and state.

use std::collections::HashSet;

use chrono::{DateTime, TimeDelta, Utc};
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Resources, Sandbox, SandboxId, SandboxSpec,
    SandboxStatus,
};
use differently_store::audit::AuditFilter;
use differently_store::warm::{WarmClaims, WarmCount, WarmState};
use differently_store::{
    Actor, Admission, Admitted, DirectPlacement, PoolSlot, Quota, QuotaScope, Store, StoreError,
};

use crate::cases::tenant;

use crate::Env;

conformance!(
    warm;
    warm_classes_round_trip_validated_and_audited,
    warm_instances_move_through_their_states,
    warm_counts_list_declared_classes_then_leftovers,
    a_direct_admission_claims_the_oldest_ready_instance,
    a_claim_that_needs_a_call_stays_provisioning_with_the_ref,
    what_makes_a_direct_placement_wait_also_stops_a_claim,
    concurrent_admissions_claim_each_instance_once,
    a_pool_with_warm_instances_is_not_deleted_and_its_classes_go_with_it,
    claim_counts_add_up_per_minute_across_handles,
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

// ---------- the claim inside admission ----------

/// A default create of `org`/`prj`, placed directly on uncapped pool `p` when it may be,
/// claiming from warm class `class` if given; `max_active` is the installation default.
pub(crate) fn warm_admission(
    org: &OrgId,
    prj: &ProjectId,
    class: Option<&str>,
    claim_call: bool,
    max_active: Option<u32>,
) -> Admission {
    let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
    Admission {
        sandbox: Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now()),
        request_hash: "h".into(),
        defaults: Quota {
            max_active,
            ..Quota::default()
        },
        actor: Actor::Key("key_test".into()),
        request_id: None,
        direct: Some(DirectPlacement {
            pool: PoolSlot {
                name: "p".into(),
                max_concurrent: None,
            },
            explanation: serde_json::json!({ "by": "test" }),
            warm_class: class.map(str::to_owned),
            claim_call,
        }),
    }
}

pub(crate) async fn admitted(s: &dyn Store, a: Admission) -> Sandbox {
    match s.admit(a).await {
        Ok(Admitted::New(x)) => x,
        other => panic!("expected New, got {other:?}"),
    }
}

/// A ready instance of (`pool`, `class`) with backend ref `ref-<id>`, ready at `at`.
pub(crate) async fn ready(s: &dyn Store, pool: &str, class: &str, at: DateTime<Utc>) -> SandboxId {
    let id = SandboxId::new();
    s.warm_begin(pool, class, &id, at).await.unwrap();
    assert!(s.warm_ready(&id, &format!("ref-{id}"), at).await.unwrap());
    id
}

pub(crate) async fn records(
    s: &dyn Store,
    id: &SandboxId,
) -> Vec<differently_store::audit::AuditEvent> {
    s.list_audit(&AuditFilter {
        resource: Some(id.to_string()),
        ..Default::default()
    })
    .await
    .unwrap()
}

pub(crate) async fn warm_ids(s: &dyn Store, pool: &str) -> Vec<SandboxId> {
    let mut ids: Vec<SandboxId> = s
        .warm_instances(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.id)
        .collect();
    ids.sort();
    ids
}

async fn a_direct_admission_claims_the_oldest_ready_instance(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let t = Utc::now() - TimeDelta::seconds(60);
    // Made first but ready last: the oldest *ready* is claimed first.
    let late = ready(s, "p", "x", t + TimeDelta::seconds(2)).await;
    let early = ready(s, "p", "x", t).await;
    let other_class = ready(s, "p", "y", t - TimeDelta::seconds(10)).await;
    let other_pool = ready(s, "q", "x", t - TimeDelta::seconds(10)).await;

    let a = warm_admission(&org, &prj, Some("x"), false, Some(10));
    let asked_id = a.sandbox.id.clone();
    let row = admitted(s, a).await;
    assert_eq!(row.id, early, "the row takes the instance's id");
    assert_eq!(row.status, SandboxStatus::Running);
    assert_eq!(row.backend_ref, Some(format!("ref-{early}")));
    assert_eq!(row.pool.as_deref(), Some("p"));
    assert_eq!((row.status_version, row.attempts), (3, 1));
    let started = row.started_at.expect("started");
    assert_eq!(
        row.expires_at,
        Some(started + TimeDelta::seconds(row.spec.ttl_seconds as i64))
    );
    assert_eq!(s.get_sandbox(&early).await.unwrap(), Some(row.clone()));
    assert_eq!(s.get_sandbox(&asked_id).await.unwrap(), None);
    assert!(records(s, &asked_id).await.is_empty());
    let recs = records(s, &early).await;
    let kinds: Vec<(&str, &str)> = recs
        .iter()
        .map(|r| (r.action.as_str(), r.actor.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("sandbox.admit", "key:key_test"),
            ("sandbox.activate", "system:admission")
        ]
    );
    assert_eq!(recs[1].detail["cause"], "warm");
    assert_eq!(recs[1].detail["warmClass"], "x");
    assert_eq!(recs[1].detail["status"], "running");
    assert_eq!(recs[1].detail["pool"], "p");
    assert_eq!(
        s.get_placement(&early).await.unwrap(),
        Some(serde_json::json!({ "by": "test" }))
    );
    // Counted as any running sandbox.
    let u = s.usage(&QuotaScope::Org(org.clone())).await.unwrap();
    assert_eq!((u.queued, u.active, u.cpu), (0, 1, 1));
    let mut left = vec![late.clone(), other_class.clone()];
    left.sort();
    assert_eq!(warm_ids(s, "p").await, left);

    // The next takes the other one; then none is ready and the create is placed as before.
    let second = admitted(s, warm_admission(&org, &prj, Some("x"), false, Some(10))).await;
    assert_eq!(
        (second.id.clone(), second.status),
        (late, SandboxStatus::Running)
    );
    let a = warm_admission(&org, &prj, Some("x"), false, Some(10));
    let asked_id = a.sandbox.id.clone();
    let cold = admitted(s, a).await;
    assert_eq!(cold.id, asked_id);
    assert_eq!(
        (cold.status, cold.backend_ref.clone(), cold.status_version),
        (SandboxStatus::Provisioning, None, 2)
    );
    let recs = records(s, &cold.id).await;
    assert_eq!(recs.len(), 2);
    assert!(recs[1].detail.get("cause").is_none());
    // Without a class nothing is claimed either.
    let plain = admitted(s, warm_admission(&org, &prj, None, false, Some(10))).await;
    assert_eq!(plain.status, SandboxStatus::Provisioning);
    assert_eq!(warm_ids(s, "p").await, vec![other_class]);
    assert_eq!(warm_ids(s, "q").await, vec![other_pool]);
    let u = s.usage(&QuotaScope::Org(org)).await.unwrap();
    assert_eq!((u.queued, u.active), (0, 4));
}

async fn a_claim_that_needs_a_call_stays_provisioning_with_the_ref(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let id = ready(s, "p", "x", Utc::now()).await;
    let row = admitted(s, warm_admission(&org, &prj, Some("x"), true, None)).await;
    assert_eq!(row.id, id);
    assert_eq!(row.status, SandboxStatus::Provisioning);
    assert_eq!(row.backend_ref, Some(format!("ref-{id}")));
    assert_eq!((row.status_version, row.started_at), (2, None));
    let recs = records(s, &id).await;
    assert_eq!(recs[1].detail["cause"], "warm");
    assert_eq!(recs[1].detail["status"], "provisioning");
    assert!(warm_ids(s, "p").await.is_empty());
    // The worker's claim call done, it records running as for any create.
    let running = s
        .mark_running(&id, &format!("ref-{id}"), Utc::now())
        .await
        .unwrap();
    assert_eq!(running.status, SandboxStatus::Running);
}

async fn what_makes_a_direct_placement_wait_also_stops_a_claim(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let id = ready(s, "p", "x", Utc::now()).await;

    // The org's quota is full: queued, saying why, and the instance stays ready.
    let first = admitted(s, warm_admission(&org, &prj, None, false, Some(1))).await;
    assert_eq!(first.status, SandboxStatus::Provisioning);
    let waits = admitted(s, warm_admission(&org, &prj, Some("x"), false, Some(1))).await;
    assert_eq!(waits.status, SandboxStatus::Queued);
    assert_ne!(waits.id, id);
    assert_eq!(
        waits.status_reason.as_deref(),
        Some("waiting: org active quota 1/1")
    );
    // Now something of the org waits: a newcomer claims nothing even with room.
    let behind = admitted(s, warm_admission(&org, &prj, Some("x"), false, Some(5))).await;
    assert_eq!(
        (behind.status, behind.id == id),
        (SandboxStatus::Queued, false)
    );

    // An admission refused by its queue limit refuses, and claims nothing.
    let mut refused = warm_admission(&org, &prj, Some("x"), false, Some(5));
    refused.defaults.max_queued = Some(2);
    assert!(matches!(
        s.admit(refused).await,
        Err(StoreError::QuotaExceeded(_))
    ));

    // Another org, but the pool is capped and a queued sandbox (`behind`, not decided by
    // the leader yet) may be waiting for it: the leader's, no claim.
    let (other, other_prj) = tenant(s).await;
    let mut capped = warm_admission(&other, &other_prj, Some("x"), false, None);
    if let Some(d) = capped.direct.as_mut() {
        d.pool.max_concurrent = Some(10);
    }
    let capped = admitted(s, capped).await;
    assert_eq!(capped.status, SandboxStatus::Queued);
    assert_eq!(warm_ids(s, "p").await, vec![id.clone()]);
    assert_eq!(s.get_sandbox(&id).await.unwrap(), None);

    // The project's own quota stops it as well.
    let (third, third_prj) = tenant(s).await;
    s.put_quota(
        &QuotaScope::Project(third_prj.clone()),
        &Quota {
            max_active: Some(1),
            ..Quota::default()
        },
        &Actor::System("test"),
    )
    .await
    .unwrap();
    let placed = admitted(s, warm_admission(&third, &third_prj, None, false, None)).await;
    assert_eq!(placed.status, SandboxStatus::Provisioning);
    let by_project = admitted(
        s,
        warm_admission(&third, &third_prj, Some("x"), false, None),
    )
    .await;
    assert_eq!(by_project.status, SandboxStatus::Queued);
    assert_eq!(
        by_project.status_reason.as_deref(),
        Some("waiting: project active quota 1/1")
    );
    assert_eq!(warm_ids(s, "p").await, vec![id.clone()]);

    // With room again (and nothing of the org waiting), the same create claims it.
    let (fourth, fourth_prj) = tenant(s).await;
    let row = admitted(
        s,
        warm_admission(&fourth, &fourth_prj, Some("x"), false, None),
    )
    .await;
    assert_eq!((row.id, row.status), (id, SandboxStatus::Running));
}

async fn concurrent_admissions_claim_each_instance_once(env: &Env) {
    const ORGS: usize = 6;
    const PER_ORG: usize = 2;
    const READY: usize = 5;
    let s = env.store.clone();
    let t = Utc::now();
    let mut instances = HashSet::new();
    for i in 0..READY {
        instances.insert(ready(s.as_ref(), "p", "x", t + TimeDelta::milliseconds(i as i64)).await);
    }
    let mut tenants = Vec::new();
    for _ in 0..ORGS {
        tenants.push(tenant(s.as_ref()).await);
    }
    // Every admission at once. Each org's admissions go through a handle of their own (on
    // Postgres a pool of connections, as another API process has), so the orgs' transactions
    // run side by side; an org's two may share one transaction (its lane's group).
    let mut tasks = Vec::new();
    for (org, prj) in &tenants {
        let handle = env.reopen().await;
        for _ in 0..PER_ORG {
            let s = handle.clone();
            let a = warm_admission(org, prj, Some("x"), false, None);
            let asked = a.sandbox.id.clone();
            tasks.push(tokio::spawn(async move { (asked, s.admit(a).await) }));
        }
    }
    let mut claimed = HashSet::new();
    let mut cold = 0;
    for task in tasks {
        let (asked, out) = task.await.unwrap();
        let row = match out {
            Ok(Admitted::New(x)) => x,
            other => panic!("expected New, got {other:?}"),
        };
        if row.status == SandboxStatus::Running {
            assert!(instances.contains(&row.id), "{row:?}");
            assert!(claimed.insert(row.id.clone()), "{} claimed twice", row.id);
            assert_eq!(row.backend_ref, Some(format!("ref-{}", row.id)));
        } else {
            assert_eq!(row.status, SandboxStatus::Provisioning);
            assert_eq!(row.id, asked);
            cold += 1;
        }
    }
    assert_eq!(
        claimed, instances,
        "every ready instance claimed exactly once"
    );
    assert_eq!(cold, ORGS * PER_ORG - READY);
    assert!(warm_ids(s.as_ref(), "p").await.is_empty());
    for id in &claimed {
        let row = s.get_sandbox(id).await.unwrap().expect("the claimed row");
        assert_eq!(row.status, SandboxStatus::Running);
    }
}

// ---------- deleting a pool ----------

async fn a_pool_with_warm_instances_is_not_deleted_and_its_classes_go_with_it(env: &Env) {
    let s = env.store.as_ref();
    let actor = Actor::System("test");
    s.upsert_pool(&pool_record("p"), &actor).await.unwrap();
    s.set_warm_classes("p", &classes(vec![class("x", 1)]), &actor)
        .await
        .unwrap();
    let id = ready(s, "p", "x", Utc::now()).await;
    // Its instance's backend delete needs the pool: refused, nothing changed.
    match s.delete_pool("p", &actor).await {
        Err(StoreError::HasDependents(m)) => assert!(m.contains("warm instances"), "{m}"),
        other => panic!("expected HasDependents, got {other:?}"),
    }
    assert!(s.list_pools().await.unwrap().iter().any(|p| p.name == "p"));
    assert_eq!(s.warm_classes("p").await.unwrap().classes.len(), 1);
    // Retiring is not gone yet.
    s.warm_retire(std::slice::from_ref(&id)).await.unwrap();
    assert!(matches!(
        s.delete_pool("p", &actor).await,
        Err(StoreError::HasDependents(_))
    ));
    // Deleted on the backend: the pool goes, and its classes document with it.
    assert!(s.warm_gone(&id).await.unwrap());
    s.delete_pool("p", &actor).await.unwrap();
    assert!(s.list_pools().await.unwrap().iter().all(|p| p.name != "p"));
    assert_eq!(s.warm_classes("p").await.unwrap(), WarmClasses::default());
    assert!(s
        .all_warm_classes()
        .await
        .unwrap()
        .iter()
        .all(|(p, _)| p != "p"));
    // Registered again, it starts with no classes.
    s.upsert_pool(&pool_record("p"), &actor).await.unwrap();
    assert_eq!(s.warm_classes("p").await.unwrap(), WarmClasses::default());
}

// ---------- claim counts (the admin document's claims per minute and hit ratio) ----------

fn claims(pool: &str, class: &str, hits: u64, misses: u64) -> WarmClaims {
    WarmClaims {
        pool: pool.into(),
        class: class.into(),
        hits,
        misses,
    }
}

async fn claim_counts_add_up_per_minute_across_handles(env: &Env) {
    let s = env.store.as_ref();
    let other = env.reopen().await; // another API process
    let now = Utc::now();
    assert!(s.warm_claims_since("p", now).await.unwrap().is_empty());
    s.warm_count_claims(&[claims("p", "x", 2, 1), claims("q", "x", 5, 0)], now)
        .await
        .unwrap();
    other
        .warm_count_claims(&[claims("p", "x", 1, 3), claims("p", "y", 0, 1)], now)
        .await
        .unwrap();
    // Nothing to add still prunes, and changes nothing else.
    s.warm_count_claims(&[], now).await.unwrap();
    let since = now - TimeDelta::minutes(9);
    assert_eq!(
        s.warm_claims_since("p", since).await.unwrap(),
        vec![claims("p", "x", 3, 4), claims("p", "y", 0, 1)]
    );
    assert_eq!(
        other.warm_claims_since("q", since).await.unwrap(),
        vec![claims("q", "x", 5, 0)]
    );
    // Minutes before `since`'s are left out; the one `since` falls in is included.
    let earlier = now - TimeDelta::minutes(20);
    s.warm_count_claims(&[claims("p", "x", 100, 100)], earlier)
        .await
        .unwrap();
    assert_eq!(
        s.warm_claims_since("p", since).await.unwrap()[0],
        claims("p", "x", 3, 4)
    );
    assert_eq!(
        s.warm_claims_since("p", earlier).await.unwrap()[0],
        claims("p", "x", 103, 104)
    );
    // Minutes older than the hour kept are forgotten by the next write.
    let later = now + differently_store::warm::CLAIM_COUNTS_KEPT + TimeDelta::minutes(5);
    s.warm_count_claims(&[claims("p", "x", 1, 0)], later)
        .await
        .unwrap();
    assert_eq!(
        s.warm_claims_since("p", earlier).await.unwrap(),
        vec![claims("p", "x", 1, 0)]
    );
}
