//! The cases, each written once over `&Env`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use differently_core::resources::ResourcesRequest;
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_store::{
    Activation, Actor, Admission, Admitted, Org, PoolSlot, Project, Quota, SandboxFilter, Store,
    StoreError, Transition,
};
use SandboxStatus::*;

use crate::Env;

// ---------- helpers ----------

fn store(env: &Env) -> &dyn Store {
    env.store.as_ref()
}

async fn tenant(s: &dyn Store) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        created_at: Utc::now(),
    };
    let prj = project(s, &org).await;
    (org.id, prj)
}

async fn project(s: &dyn Store, org: &Org) -> ProjectId {
    let p = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "default".into(),
        created_at: Utc::now(),
    };
    s.ensure_tenant(org, &p).await.unwrap();
    p.id
}

async fn another_project(s: &dyn Store, org: &OrgId) -> ProjectId {
    let org = Org {
        id: org.clone(),
        name: "acme".into(),
        created_at: Utc::now(),
    };
    project(s, &org).await
}

fn spec_with(cpu: u32, labels: &[(&str, &str)]) -> SandboxSpec {
    let req = CreateSandboxRequest {
        resources: Some(ResourcesRequest {
            cpu: Some(cpu),
            ..Default::default()
        }),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    };
    SandboxSpec::build(&req).unwrap()
}

fn new_sandbox(org: &OrgId, prj: &ProjectId, key: Option<&str>) -> Sandbox {
    Sandbox::queued(
        org.clone(),
        prj.clone(),
        SandboxSpec::build(&CreateSandboxRequest::default()).unwrap(),
        key.map(str::to_owned),
        Utc::now(),
    )
}

fn admission(sandbox: Sandbox, hash: &str, max_queued: Option<u32>) -> Admission {
    Admission {
        sandbox,
        request_hash: hash.into(),
        max_queued,
        actor: Actor::Key("key_test".into()),
    }
}

async fn admit_spec(s: &dyn Store, org: &OrgId, prj: &ProjectId, spec: SandboxSpec) -> Sandbox {
    let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
    match s.admit(admission(sbx, "h", None)).await.unwrap() {
        Admitted::New(x) => x,
        other => panic!("expected New, got {other:?}"),
    }
}

async fn admit(s: &dyn Store, org: &OrgId, prj: &ProjectId) -> Sandbox {
    admit_spec(s, org, prj, spec_with(1, &[])).await
}

fn pool(name: &str, cap: Option<u32>) -> PoolSlot {
    PoolSlot {
        name: name.into(),
        max_concurrent: cap,
    }
}

fn tr(id: &SandboxId, from: &[SandboxStatus], to: SandboxStatus) -> Transition {
    Transition {
        id: id.clone(),
        from: from.to_vec(),
        to,
        reason: None,
        actor: Actor::System("test"),
    }
}

async fn activated(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Activated(x) => x,
        other => panic!("expected Activated, got {other:?}"),
    }
}

async fn waiting(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Waiting(x) => x,
        other => panic!("expected Waiting, got {other:?}"),
    }
}

/// Drives an activated sandbox to `terminated`, releasing its capacity.
async fn terminate(s: &dyn Store, id: &SandboxId) {
    let now = Utc::now();
    s.transition(tr(id, &[Provisioning, Running], Terminating), now)
        .await
        .unwrap();
    s.transition(tr(id, &[Terminating], Terminated), now)
        .await
        .unwrap();
}

async fn get(s: &dyn Store, id: &SandboxId) -> Sandbox {
    s.get_sandbox(id).await.unwrap().expect("sandbox exists")
}

async fn audit_len(s: &dyn Store) -> usize {
    s.audit_tail(10_000).await.unwrap().len()
}

fn ids(v: &[Sandbox]) -> Vec<SandboxId> {
    v.iter().map(|s| s.id.clone()).collect()
}

// ---------- admission ----------

pub async fn admit_inserts_queued_row_and_audit_record(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let sbx = new_sandbox(&org, &prj, Some("k1"));
    let got = match s
        .admit(admission(sbx.clone(), "h1", Some(10)))
        .await
        .unwrap()
    {
        Admitted::New(x) => x,
        other => panic!("expected New, got {other:?}"),
    };
    assert_eq!(got, sbx);
    let stored = get(s, &sbx.id).await;
    assert_eq!(stored, sbx);
    assert_eq!(stored.status, Queued);
    assert_eq!(stored.status_version, 1);
    let audit = s.audit_tail(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    let rec = &audit[0];
    assert_eq!(rec.action, "sandbox.admit");
    assert_eq!(rec.resource, sbx.id.to_string());
    assert_eq!(rec.org_id, Some(org.clone()));
    assert_eq!(rec.actor, "key:key_test");
    assert!(rec.seq > 0);
    // The new row is runnable at once.
    let runnable = s.runnable_queued(Utc::now(), 10).await.unwrap();
    assert_eq!(ids(&runnable), vec![sbx.id.clone()]);
}

pub async fn admit_requires_existing_org_and_project(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let unknown_org = new_sandbox(&OrgId::new(), &prj, None);
    assert!(matches!(
        s.admit(admission(unknown_org, "h", None)).await,
        Err(StoreError::NotFound)
    ));
    let unknown_project = new_sandbox(&org, &ProjectId::new(), None);
    assert!(matches!(
        s.admit(admission(unknown_project, "h", None)).await,
        Err(StoreError::NotFound)
    ));
    let (_, foreign_prj) = tenant(s).await;
    let foreign = new_sandbox(&org, &foreign_prj, None);
    assert!(matches!(
        s.admit(admission(foreign, "h", None)).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(audit_len(s).await, 0);
}

pub async fn replay_with_same_hash_returns_original(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let first = new_sandbox(&org, &prj, Some("same"));
    let Admitted::New(original) = s.admit(admission(first, "h1", None)).await.unwrap() else {
        panic!("first admission must be new");
    };
    let again = new_sandbox(&org, &prj, Some("same"));
    assert_ne!(again.id, original.id);
    match s.admit(admission(again.clone(), "h1", None)).await.unwrap() {
        Admitted::Replayed(x) => assert_eq!(x, original),
        other => panic!("expected Replayed, got {other:?}"),
    }
    assert!(s.get_sandbox(&again.id).await.unwrap().is_none());
    let all = s
        .list_sandboxes(&SandboxFilter {
            org_id: Some(org),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(&all), vec![original.id]);
    assert_eq!(audit_len(s).await, 1, "a replay writes no audit record");
}

pub async fn replay_with_different_hash_is_mismatch(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    s.admit(admission(new_sandbox(&org, &prj, Some("k")), "h1", None))
        .await
        .unwrap();
    let other = new_sandbox(&org, &prj, Some("k"));
    assert!(matches!(
        s.admit(admission(other.clone(), "h2", None)).await,
        Err(StoreError::IdempotencyMismatch)
    ));
    assert!(s.get_sandbox(&other.id).await.unwrap().is_none());
}

pub async fn same_key_in_another_project_is_independent(env: &Env) {
    let s = store(env);
    let (org, p1) = tenant(s).await;
    let p2 = another_project(s, &org).await;
    let a = s
        .admit(admission(new_sandbox(&org, &p1, Some("k")), "h1", None))
        .await
        .unwrap();
    let b = s
        .admit(admission(new_sandbox(&org, &p2, Some("k")), "h2", None))
        .await
        .unwrap();
    match (a, b) {
        (Admitted::New(a), Admitted::New(b)) => {
            assert_ne!(a.id, b.id);
            assert_eq!(b.project_id, p2);
        }
        other => panic!("expected two New, got {other:?}"),
    }
}

pub async fn max_queued_is_enforced(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let (other_org, other_prj) = tenant(s).await;
    let mut admitted = Vec::new();
    for _ in 0..2 {
        let r = s
            .admit(admission(new_sandbox(&org, &prj, None), "h", Some(2)))
            .await
            .unwrap();
        let Admitted::New(x) = r else {
            panic!("expected New")
        };
        admitted.push(x);
    }
    let third = new_sandbox(&org, &prj, None);
    match s.admit(admission(third.clone(), "h", Some(2))).await {
        Err(StoreError::QuotaExceeded(msg)) => assert_eq!(msg, "org queued limit 2 reached"),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert!(s.get_sandbox(&third.id).await.unwrap().is_none());
    // Another organization has its own limit.
    s.admit(admission(
        new_sandbox(&other_org, &other_prj, None),
        "h",
        Some(2),
    ))
    .await
    .unwrap();
    // Activating one frees a queued slot.
    activated(s, &admitted[0].id, &pool("p", None), &Quota::default()).await;
    assert!(matches!(
        s.admit(admission(third, "h", Some(2))).await.unwrap(),
        Admitted::New(_)
    ));
}

// ---------- activation ----------

pub async fn activate_respects_max_active(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let q = Quota {
        max_active: Some(2),
        ..Default::default()
    };
    let p = pool("p", None);
    let a = admit(s, &org, &prj).await;
    let b = admit(s, &org, &prj).await;
    let c = admit(s, &org, &prj).await;
    let before = audit_len(s).await;
    let act = activated(s, &a.id, &p, &q).await;
    assert_eq!(act.status, Provisioning);
    assert_eq!(act.pool.as_deref(), Some("p"));
    assert_eq!(act.attempts, 1);
    assert_eq!(act.status_version, 2);
    assert_eq!(act.status_reason, None);
    assert_eq!(get(s, &a.id).await, act);
    activated(s, &b.id, &p, &q).await;
    assert_eq!(audit_len(s).await, before + 2);
    let audit = s.audit_tail(1).await.unwrap();
    assert_eq!(audit[0].action, "sandbox.activate");

    let w = waiting(s, &c.id, &p, &q).await;
    assert_eq!(w.status, Queued);
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org active quota 2/2")
    );
    assert_eq!(w.status_version, 1);
    assert_eq!(w.attempts, 0);
    assert_eq!(w.pool, None);
    assert_eq!(get(s, &c.id).await, w);
    assert_eq!(
        audit_len(s).await,
        before + 2,
        "waiting writes no audit record"
    );

    terminate(s, &a.id).await;
    let act = activated(s, &c.id, &p, &q).await;
    assert_eq!(act.status_reason, None);
    assert_eq!(act.status_version, 2);
}

pub async fn activate_respects_max_cpu_and_stopped_frees_cpu(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let q = Quota {
        max_cpu: Some(4),
        ..Default::default()
    };
    let p = pool("p", None);
    let a = admit_spec(s, &org, &prj, spec_with(2, &[])).await;
    let b = admit_spec(s, &org, &prj, spec_with(2, &[])).await;
    let c = admit_spec(s, &org, &prj, spec_with(2, &[])).await;
    activated(s, &a.id, &p, &q).await;
    activated(s, &b.id, &p, &q).await;
    let w = waiting(s, &c.id, &p, &q).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org cpu quota 4/4")
    );
    // A stopped sandbox still counts as active but reserves no compute.
    s.mark_running(&a.id, "be-a", Utc::now()).await.unwrap();
    s.transition(tr(&a.id, &[Running], Stopped), Utc::now())
        .await
        .unwrap();
    activated(s, &c.id, &p, &q).await;
}

pub async fn activate_respects_memory_and_disk_quota(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let p = pool("p", None);
    // Default resources: 1024 MiB, 5 GiB.
    let a = admit(s, &org, &prj).await;
    let b = admit(s, &org, &prj).await;
    activated(s, &a.id, &p, &Quota::default()).await;
    let mem = Quota {
        max_memory_mib: Some(1024),
        ..Default::default()
    };
    let w = waiting(s, &b.id, &p, &mem).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org memory quota 1024/1024 MiB")
    );
    let disk = Quota {
        max_disk_gib: Some(9),
        ..Default::default()
    };
    let w = waiting(s, &b.id, &p, &disk).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org disk quota 5/9 GiB")
    );
    let roomy = Quota {
        max_memory_mib: Some(2048),
        max_disk_gib: Some(10),
        ..Default::default()
    };
    activated(s, &b.id, &p, &roomy).await;
}

pub async fn activate_respects_pool_cap(env: &Env) {
    let s = store(env);
    let (org_a, prj_a) = tenant(s).await;
    let (org_b, prj_b) = tenant(s).await;
    let capped = pool("p1", Some(2));
    let q = Quota::default();
    let a1 = admit(s, &org_a, &prj_a).await;
    let a2 = admit(s, &org_a, &prj_a).await;
    let b1 = admit(s, &org_b, &prj_b).await;
    let b2 = admit(s, &org_b, &prj_b).await;
    activated(s, &a1.id, &capped, &q).await;
    activated(s, &a2.id, &capped, &q).await;
    // The cap spans organizations.
    let w = waiting(s, &b1.id, &capped, &q).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: pool p1 full 2/2")
    );
    // Another pool is unaffected.
    let other = activated(s, &b2.id, &pool("p2", Some(2)), &q).await;
    assert_eq!(other.pool.as_deref(), Some("p2"));
    terminate(s, &a1.id).await;
    let act = activated(s, &b1.id, &capped, &q).await;
    assert_eq!(act.pool.as_deref(), Some("p1"));
}

pub async fn activate_not_queued_and_missing(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let p = pool("p", None);
    let act = activated(s, &a.id, &p, &Quota::default()).await;
    let before = audit_len(s).await;
    match s
        .activate(&a.id, &p, &Quota::default(), Utc::now())
        .await
        .unwrap()
    {
        Activation::NotQueued(x) => assert_eq!(x, act),
        other => panic!("expected NotQueued, got {other:?}"),
    }
    assert_eq!(get(s, &a.id).await, act);
    assert_eq!(audit_len(s).await, before);
    assert!(matches!(
        s.activate(&SandboxId::new(), &p, &Quota::default(), Utc::now())
            .await,
        Err(StoreError::NotFound)
    ));
}

pub async fn concurrent_activation_respects_pool_cap(env: &Env) {
    let s = store(env);
    // Five organizations, so only the pool lock (not one org lock) serializes them.
    let mut sandboxes = Vec::new();
    for _ in 0..5 {
        let (org, prj) = tenant(s).await;
        for _ in 0..2 {
            sandboxes.push(admit(s, &org, &prj).await);
        }
    }
    let p = pool("race", Some(3));
    let q = Quota::default();
    let now = Utc::now();
    let results =
        futures::future::join_all(sandboxes.iter().map(|sbx| s.activate(&sbx.id, &p, &q, now)))
            .await;
    let mut activated_n = 0;
    let mut waiting_n = 0;
    for r in results {
        match r.unwrap() {
            Activation::Activated(_) => activated_n += 1,
            Activation::Waiting(w) => {
                assert_eq!(
                    w.status_reason.as_deref(),
                    Some("waiting: pool race full 3/3")
                );
                waiting_n += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((activated_n, waiting_n), (3, 7));
    let provisioning = s
        .list_sandboxes(&SandboxFilter {
            status: Some(Provisioning),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(provisioning.len(), 3);
}

// ---------- status changes ----------

pub async fn mark_running_sets_times_and_bumps_version(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let act = activated(s, &a.id, &pool("p", None), &Quota::default()).await;
    let now = Utc::now();
    let r = s.mark_running(&a.id, "backend-1", now).await.unwrap();
    assert_eq!(r.status, Running);
    assert_eq!(r.backend_ref.as_deref(), Some("backend-1"));
    assert_eq!(r.started_at, Some(now));
    let ttl = TimeDelta::seconds(i64::try_from(a.spec.ttl_seconds).unwrap());
    assert_eq!(r.expires_at, Some(now + ttl));
    assert_eq!(r.status_version, act.status_version + 1);
    assert_eq!(r.updated_at, now);
    assert_eq!(r.pool.as_deref(), Some("p"));
    assert_eq!(get(s, &a.id).await, r);
    let audit = s.audit_tail(1).await.unwrap();
    assert_eq!(audit[0].action, "sandbox.running");
    assert_eq!(audit[0].resource, a.id.to_string());

    assert!(matches!(
        s.mark_running(&a.id, "backend-2", Utc::now()).await,
        Err(StoreError::StatusConflict { current: Running })
    ));
    assert_eq!(get(s, &a.id).await, r);
    assert!(matches!(
        s.mark_running(&SandboxId::new(), "x", Utc::now()).await,
        Err(StoreError::NotFound)
    ));
}

pub async fn cas_conflict_when_status_moved(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let before = audit_len(s).await;
    // The caller believes it is running; it is still queued.
    match s
        .transition(tr(&a.id, &[Running, Paused], Terminating), Utc::now())
        .await
    {
        Err(StoreError::StatusConflict { current }) => assert_eq!(current, Queued),
        other => panic!("expected StatusConflict, got {other:?}"),
    }
    assert_eq!(get(s, &a.id).await, a);
    assert_eq!(audit_len(s).await, before);
    // A requeue of a queued row conflicts too.
    assert!(matches!(
        s.requeue(&a.id, "x", Utc::now()).await,
        Err(StoreError::StatusConflict { current: Queued })
    ));
    assert!(matches!(
        s.transition(tr(&SandboxId::new(), &[Queued], Terminated), Utc::now())
            .await,
        Err(StoreError::NotFound)
    ));
}

pub async fn illegal_transition_writes_nothing(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let before = audit_len(s).await;
    match s
        .transition(tr(&a.id, &[Queued], Running), Utc::now())
        .await
    {
        Err(StoreError::IllegalTransition { from, to }) => {
            assert_eq!((from, to), (Queued, Running));
        }
        other => panic!("expected IllegalTransition, got {other:?}"),
    }
    assert_eq!(get(s, &a.id).await, a);
    assert_eq!(audit_len(s).await, before);
}

pub async fn final_transition_sets_ended_at(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let now = Utc::now();
    let mut t = tr(&a.id, &[Queued], Terminated);
    t.reason = Some("deleted while queued".into());
    t.actor = Actor::Key("key_del".into());
    let done = s.transition(t, now).await.unwrap();
    assert_eq!(done.status, Terminated);
    assert_eq!(done.ended_at, Some(now));
    assert_eq!(done.status_version, 2);
    assert_eq!(done.status_reason.as_deref(), Some("deleted while queued"));
    assert_eq!(get(s, &a.id).await, done);
    let rec = s.audit_tail(1).await.unwrap().remove(0);
    assert_eq!(rec.action, "sandbox.terminated");
    assert_eq!(rec.actor, "key:key_del");
    // Nothing leaves a final status.
    assert!(matches!(
        s.transition(tr(&a.id, &[Terminated], Failed), Utc::now())
            .await,
        Err(StoreError::IllegalTransition {
            from: Terminated,
            to: Failed
        })
    ));
}

pub async fn requeue_clears_pool_and_respects_not_before(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let act = activated(s, &a.id, &pool("p", None), &Quota::default()).await;
    let now = Utc::now();
    let not_before = now + TimeDelta::seconds(60);
    let r = s
        .requeue(&a.id, "create failed: boom", not_before)
        .await
        .unwrap();
    assert_eq!(r.status, Queued);
    assert_eq!(r.pool, None);
    assert_eq!(r.status_reason.as_deref(), Some("create failed: boom"));
    assert_eq!(r.status_version, act.status_version + 1);
    assert_eq!(r.attempts, 1);
    assert!(r.updated_at >= act.updated_at);
    assert_eq!(get(s, &a.id).await, r);
    assert_eq!(s.audit_tail(1).await.unwrap()[0].action, "sandbox.requeue");
    assert!(s.runnable_queued(now, 10).await.unwrap().is_empty());
    let later = s
        .runnable_queued(not_before + TimeDelta::seconds(1), 10)
        .await
        .unwrap();
    assert_eq!(ids(&later), vec![a.id.clone()]);
    // It can be activated again; attempts keep counting.
    let again = activated(s, &a.id, &pool("q", None), &Quota::default()).await;
    assert_eq!(again.attempts, 2);
    assert_eq!(again.pool.as_deref(), Some("q"));
}

pub async fn set_queued_reason_only_touches_queued_rows(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let a = admit(s, &org, &prj).await;
    let b = admit(s, &org, &prj).await;
    let now = Utc::now();
    let not_before = now + TimeDelta::seconds(30);
    s.set_queued_reason(&a.id, "waiting: no pool", not_before)
        .await
        .unwrap();
    let got = get(s, &a.id).await;
    assert_eq!(got.status_reason.as_deref(), Some("waiting: no pool"));
    assert_eq!(got.status_version, 1);
    assert_eq!(got.status, Queued);
    assert_eq!(
        ids(&s.runnable_queued(now, 10).await.unwrap()),
        vec![b.id.clone()]
    );
    let act = activated(s, &b.id, &pool("p", None), &Quota::default()).await;
    s.set_queued_reason(&b.id, "waiting: stale", not_before)
        .await
        .unwrap();
    assert_eq!(get(s, &b.id).await, act, "a non-queued row is left alone");
    assert!(matches!(
        s.set_queued_reason(&SandboxId::new(), "x", now).await,
        Err(StoreError::NotFound)
    ));
}

// ---------- selections ----------

pub async fn runnable_queued_in_id_order_with_limit(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let mut all = Vec::new();
    for _ in 0..4 {
        all.push(admit(s, &org, &prj).await.id);
    }
    all.sort(); // ids from the same millisecond are not in creation order
    let active = all.remove(1);
    activated(s, &active, &pool("p", None), &Quota::default()).await;
    let now = Utc::now();
    assert_eq!(ids(&s.runnable_queued(now, 10).await.unwrap()), all);
    assert_eq!(
        ids(&s.runnable_queued(now, 2).await.unwrap()),
        all[..2].to_vec()
    );
    let past = now - TimeDelta::hours(1);
    assert!(s.runnable_queued(past, 10).await.unwrap().is_empty());
}

pub async fn stale_selection(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let p = pool("p", None);
    let q = Quota::default();
    let now = Utc::now();
    let a = admit(s, &org, &prj).await;
    let b = admit(s, &org, &prj).await;
    let c = admit(s, &org, &prj).await;
    let old = now - TimeDelta::minutes(10);
    let older = now - TimeDelta::minutes(11);
    s.activate(&a.id, &p, &q, old).await.unwrap();
    s.activate(&b.id, &p, &q, now).await.unwrap();
    s.activate(&c.id, &p, &q, older).await.unwrap();
    let cutoff = now - TimeDelta::minutes(5);
    let got = s.stale(Provisioning, cutoff, 10).await.unwrap();
    assert_eq!(
        ids(&got),
        vec![c.id.clone(), a.id.clone()],
        "oldest update first"
    );
    assert_eq!(
        ids(&s.stale(Provisioning, cutoff, 1).await.unwrap()),
        vec![c.id.clone()]
    );
    assert!(s
        .stale(Running, now + TimeDelta::hours(1), 10)
        .await
        .unwrap()
        .is_empty());
    // Moving on makes it fresh in another status.
    s.mark_running(&c.id, "be", now).await.unwrap();
    assert_eq!(
        ids(&s.stale(Provisioning, cutoff, 10).await.unwrap()),
        vec![a.id.clone()]
    );
}

pub async fn expired_selection(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let p = pool("p", None);
    let q = Quota::default();
    let now = Utc::now();
    let long_ago = now - TimeDelta::hours(3); // default TTL is one hour
    let mut made = Vec::new();
    for _ in 0..5 {
        let x = admit(s, &org, &prj).await;
        activated(s, &x.id, &p, &q).await;
        made.push(x.id);
    }
    let [run_old, paused_old, stopped_old, term_old, fresh] =
        <[SandboxId; 5]>::try_from(made).unwrap();
    for id in [&run_old, &paused_old, &stopped_old, &term_old] {
        s.mark_running(id, "be", long_ago).await.unwrap();
    }
    s.mark_running(&fresh, "be", now).await.unwrap();
    s.transition(tr(&paused_old, &[Running], Paused), now)
        .await
        .unwrap();
    s.transition(tr(&stopped_old, &[Running], Stopped), now)
        .await
        .unwrap();
    s.transition(tr(&term_old, &[Running], Terminating), now)
        .await
        .unwrap();
    let got: HashSet<SandboxId> = ids(&s.expired(now, 10).await.unwrap())
        .into_iter()
        .collect();
    let want: HashSet<SandboxId> = [run_old, paused_old, stopped_old].into_iter().collect();
    assert_eq!(got, want);
    assert_eq!(s.expired(now, 2).await.unwrap().len(), 2);
    assert!(s.expired(long_ago, 10).await.unwrap().is_empty());
    let far = now + TimeDelta::hours(2);
    assert!(ids(&s.expired(far, 10).await.unwrap()).contains(&fresh));
}

pub async fn list_filters_and_cursor_pagination(env: &Env) {
    let s = store(env);
    let (org, p1) = tenant(s).await;
    let p2 = another_project(s, &org).await;
    let (other_org, other_prj) = tenant(s).await;
    let mut a_ids = Vec::new();
    for _ in 0..3 {
        a_ids.push(
            admit_spec(s, &org, &p1, spec_with(1, &[("team", "a")]))
                .await
                .id,
        );
    }
    let mut b_ids = Vec::new();
    for _ in 0..2 {
        b_ids.push(
            admit_spec(s, &org, &p2, spec_with(1, &[("team", "b"), ("x", "y")]))
                .await
                .id,
        );
    }
    a_ids.sort();
    b_ids.sort();
    let foreign = admit_spec(s, &other_org, &other_prj, spec_with(1, &[("team", "a")])).await;
    s.transition(tr(&a_ids[1], &[Queued], Terminated), Utc::now())
        .await
        .unwrap();

    let list = |f: SandboxFilter| async move { ids(&s.list_sandboxes(&f).await.unwrap()) };
    let of_org = SandboxFilter {
        org_id: Some(org.clone()),
        limit: 100,
        ..Default::default()
    };
    let mut everything: Vec<SandboxId> = a_ids.iter().chain(&b_ids).cloned().collect();
    everything.sort();
    assert_eq!(list(of_org.clone()).await, everything);
    assert_eq!(
        list(SandboxFilter {
            project_id: Some(p2.clone()),
            ..of_org.clone()
        })
        .await,
        b_ids
    );
    assert_eq!(
        list(SandboxFilter {
            status: Some(Terminated),
            ..of_org.clone()
        })
        .await,
        vec![a_ids[1].clone()]
    );
    assert_eq!(
        list(SandboxFilter {
            label: Some(("team".into(), "a".into())),
            ..of_org.clone()
        })
        .await,
        a_ids
    );
    assert_eq!(
        list(SandboxFilter {
            label: Some(("team".into(), "a".into())),
            limit: 100,
            ..Default::default()
        })
        .await,
        {
            let mut v: Vec<SandboxId> = a_ids.iter().cloned().chain([foreign.id.clone()]).collect();
            v.sort();
            v
        }
    );
    assert!(list(SandboxFilter {
        label: Some(("team".into(), "c".into())),
        ..of_org.clone()
    })
    .await
    .is_empty());
    assert_eq!(
        list(SandboxFilter {
            label: Some(("x".into(), "y".into())),
            status: Some(Queued),
            ..of_org.clone()
        })
        .await,
        b_ids
    );

    // Cursor pagination visits every row exactly once, in id order.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = list(SandboxFilter {
            org_id: Some(org.clone()),
            after: after.clone(),
            limit: 2,
            ..Default::default()
        })
        .await;
        assert!(page.len() <= 2);
        if page.is_empty() {
            break;
        }
        after = page.last().cloned();
        seen.extend(page);
    }
    assert_eq!(seen, everything);
}

pub async fn active_cpu_counts_only_compute_reserving_statuses(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let (idle_org, idle_prj) = tenant(s).await;
    let p = pool("p", None);
    let q = Quota::default();
    let now = Utc::now();
    let provisioning = admit_spec(s, &org, &prj, spec_with(2, &[])).await;
    let running = admit_spec(s, &org, &prj, spec_with(3, &[])).await;
    let stopped = admit_spec(s, &org, &prj, spec_with(5, &[])).await;
    let terminated = admit_spec(s, &org, &prj, spec_with(7, &[])).await;
    admit_spec(s, &org, &prj, spec_with(11, &[])).await; // stays queued
    admit_spec(s, &idle_org, &idle_prj, spec_with(13, &[])).await; // queued only
    for x in [&provisioning, &running, &stopped, &terminated] {
        activated(s, &x.id, &p, &q).await;
    }
    s.mark_running(&running.id, "be", now).await.unwrap();
    s.mark_running(&stopped.id, "be", now).await.unwrap();
    s.transition(tr(&stopped.id, &[Running], Stopped), now)
        .await
        .unwrap();
    terminate(s, &terminated.id).await;
    let by_org = s.active_cpu_by_org().await.unwrap();
    assert_eq!(by_org.get(&org).copied(), Some(5));
    assert_eq!(by_org.get(&idle_org).copied().unwrap_or(0), 0);
}

// ---------- installation and leadership ----------

pub async fn installation_id_is_stable(env: &Env) {
    let s = store(env);
    let first = s.installation_id().await.unwrap();
    assert!(first.as_str().starts_with("inst_"));
    assert_eq!(s.installation_id().await.unwrap(), first);
    let reopened = env.reopen().await;
    assert_eq!(reopened.installation_id().await.unwrap(), first);
}

pub async fn leadership_is_exclusive_and_released_on_drop(env: &Env) {
    let s = store(env);
    let other = env.reopen().await;
    let mut lead = s.try_lead().await.unwrap().expect("first try_lead wins");
    assert!(lead.still_held().await);
    assert!(other.try_lead().await.unwrap().is_none());
    assert!(s.try_lead().await.unwrap().is_none());
    assert!(lead.still_held().await);
    drop(lead);
    // Postgres releases the lock when it notices the closed session: poll briefly.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut second = loop {
        if let Some(l) = other.try_lead().await.unwrap() {
            break l;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "leadership not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(second.still_held().await);
    assert!(s.try_lead().await.unwrap().is_none());
}
