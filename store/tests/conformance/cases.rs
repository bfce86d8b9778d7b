//! The cases, each written once over `&Env`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use differently_core::resources::ResourcesRequest;
use differently_core::tenancy::{SandboxLimit, Scope};
use differently_core::KeyId;
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_store::{
    Activation, Actor, Admission, Admitted, ApiKeyRecord, Org, OrgStatus, PoolSlot, Project, Quota,
    QuotaScope, SandboxFilter, Store, StoreError, Transition, Usage,
};
use SandboxStatus::*;

use crate::Env;

// ---------- helpers ----------

fn store(env: &Env) -> &dyn Store {
    env.store.as_ref()
}

pub(crate) async fn tenant(s: &dyn Store) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        status: OrgStatus::Active,
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
        status: OrgStatus::Active,
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
        request_id: None,
        direct: None,
        sandbox,
        request_hash: hash.into(),
        defaults: Quota {
            max_queued,
            ..Default::default()
        },
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

pub(crate) async fn admit(s: &dyn Store, org: &OrgId, prj: &ProjectId) -> Sandbox {
    admit_spec(s, org, prj, spec_with(1, &[])).await
}

pub(crate) fn pool(name: &str, cap: Option<u32>) -> PoolSlot {
    PoolSlot {
        name: name.into(),
        max_concurrent: cap,
    }
}

pub(crate) fn tr(id: &SandboxId, from: &[SandboxStatus], to: SandboxStatus) -> Transition {
    Transition {
        id: id.clone(),
        from: from.to_vec(),
        to,
        reason: None,
        actor: Actor::System("test"),
    }
}

pub(crate) async fn activated(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Activated(x) => x,
        other => panic!("expected Activated, got {other:?}"),
    }
}

async fn waiting(s: &dyn Store, id: &SandboxId, p: &PoolSlot, q: &Quota) -> Sandbox {
    match s.activate(id, p, q, Utc::now()).await.unwrap() {
        Activation::Waiting(x, wall) => {
            // The typed wall and the reason a person reads always agree.
            let reason = x.status_reason.clone().unwrap_or_default();
            let want = if reason.starts_with("waiting: org") {
                differently_store::Wall::Org
            } else if reason.starts_with("waiting: project") {
                differently_store::Wall::Project
            } else {
                assert!(reason.starts_with("waiting: pool"), "{reason}");
                differently_store::Wall::Pool
            };
            assert_eq!(wall, want, "{reason}");
            x
        }
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
        Err(StoreError::QuotaExceeded(msg)) => {
            assert_eq!(msg, "organization queue is full (2 queued)")
        }
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

/// Starting a stopped sandbox reserves its CPU again, so it is checked like an activation;
/// a refused start changes nothing, and stopping never needs room.
pub async fn starting_a_stopped_sandbox_rechecks_quota(env: &Env) {
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
    for x in [&a, &b] {
        activated(s, &x.id, &p, &q).await;
        s.mark_running(&x.id, "be", Utc::now()).await.unwrap();
    }
    // a stops: its 2 cpu go to c.
    s.transition_within_quota(tr(&a.id, &[Running], Stopped), &q, Utc::now())
        .await
        .unwrap();
    activated(s, &c.id, &p, &q).await;
    let before = s.audit_tail(1000).await.unwrap().len();
    let refused = s
        .transition_within_quota(tr(&a.id, &[Stopped], Running), &q, Utc::now())
        .await
        .unwrap_err();
    match refused {
        StoreError::QuotaExceeded(m) => assert_eq!(m, "org cpu quota would be 6/4"),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
    assert_eq!(
        get(s, &a.id).await.status,
        Stopped,
        "a refused start changes nothing"
    );
    assert_eq!(s.audit_tail(1000).await.unwrap().len(), before);
    // A project quota refuses it too, with the project named.
    s.transition(tr(&c.id, &[Provisioning], Failed), Utc::now())
        .await
        .unwrap();
    s.put_quota(
        &QuotaScope::Project(prj.clone()),
        &Quota {
            max_cpu: Some(3),
            ..Default::default()
        },
        &Actor::System("test"),
    )
    .await
    .unwrap();
    match s
        .transition_within_quota(tr(&a.id, &[Stopped], Running), &q, Utc::now())
        .await
    {
        Err(StoreError::QuotaExceeded(m)) => assert_eq!(m, "project cpu quota would be 4/3"),
        other => panic!("expected the project's quota, got {other:?}"),
    }
    s.put_quota(
        &QuotaScope::Project(prj.clone()),
        &Quota::default(),
        &Actor::System("test"),
    )
    .await
    .unwrap();
    let started = s
        .transition_within_quota(tr(&a.id, &[Stopped], Running), &q, Utc::now())
        .await
        .unwrap();
    assert_eq!(started.status, Running);
    // Over quota now (4/4 after a restart at a lowered limit): stopping is still allowed.
    let tight = Quota {
        max_cpu: Some(1),
        ..Default::default()
    };
    s.transition_within_quota(tr(&a.id, &[Running], Stopped), &tight, Utc::now())
        .await
        .unwrap();
}

/// A group activated at once is decided item by item in order, each seeing the ones before
/// it: pool caps and quotas fill up inside the group exactly as one by one.
pub async fn activate_many_decides_in_order_like_one_by_one(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let other_prj = another_project(s, &org).await;
    let (org2, prj2) = tenant(s).await;
    s.put_quota(
        &QuotaScope::Org(org.clone()),
        &Quota {
            max_active: Some(3),
            ..Default::default()
        },
        &Actor::System("test"),
    )
    .await
    .unwrap();
    let small = pool("small", Some(2));
    let big = pool("big", None);
    let a = admit(s, &org, &prj).await;
    let b = admit(s, &org2, &prj2).await;
    let c = admit(s, &org, &prj).await;
    let d = admit(s, &org, &other_prj).await;
    let e = admit(s, &org, &prj).await;
    let f = admit(s, &org2, &prj2).await;
    let item = |x: &Sandbox, p: &PoolSlot| differently_store::ActivationItem {
        id: x.id.clone(),
        pool: p.clone(),
        explanation: Some(serde_json::json!({ "for": x.id.as_str() })),
    };
    let out = s
        .activate_many(
            &[
                item(&a, &small),
                item(&b, &small),
                item(&c, &small), // small is full (2/2)
                item(&d, &big),
                item(&a, &big), // already activated above
                item(&e, &big), // a and d are active, c waits: e is the org's third of 3
                item(&f, &big),
            ],
            &Quota::default(),
            Utc::now(),
        )
        .await
        .unwrap();
    let kinds: Vec<String> = out
        .iter()
        .map(|x| match x {
            Activation::Activated(s) => format!("activated {}", s.pool.as_deref().unwrap_or("")),
            Activation::Waiting(s, wall) => {
                format!(
                    "waiting {wall:?} {}",
                    s.status_reason.as_deref().unwrap_or("")
                )
            }
            Activation::NotQueued(s) => format!("not queued {}", s.status),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "activated small".to_owned(),
            "activated small".to_owned(),
            "waiting Pool waiting: pool small full 2/2".to_owned(),
            "activated big".to_owned(),
            "not queued provisioning".to_owned(),
            "activated big".to_owned(),
            "activated big".to_owned(),
        ]
    );
    // The org's maxActive 3 is now reached (a, d, e): one more waits on the org.
    let g = admit(s, &org, &prj).await;
    let out = s
        .activate_many(&[item(&g, &big)], &Quota::default(), Utc::now())
        .await
        .unwrap();
    assert!(
        matches!(&out[0], Activation::Waiting(w, differently_store::Wall::Org)
            if w.status_reason.as_deref() == Some("waiting: org active quota 3/3")),
        "{out:?}"
    );
    // Explanations are stored with activations only.
    for x in [&a, &d] {
        assert_eq!(
            s.get_placement(&x.id).await.unwrap(),
            Some(serde_json::json!({ "for": x.id.as_str() }))
        );
    }
    assert_eq!(get(s, &c.id).await.status, Queued);
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    // The group's audit records (two orgs' chains, appended together) are contiguous and
    // verify, one `sandbox.activate` per activation.
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
    let activations = s
        .audit_tail(1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.action == "sandbox.activate")
        .count();
    assert_eq!(activations, 5);
    // A missing sandbox fails the whole group and changes nothing.
    let ghost = new_sandbox(&org, &prj, None);
    let h = admit(s, &org2, &prj2).await;
    let err = s
        .activate_many(
            &[item(&h, &big), item(&ghost, &big)],
            &Quota::default(),
            Utc::now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "{err:?}");
    assert_eq!(get(s, &h.id).await.status, Queued);
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
            Activation::Waiting(w, wall) => {
                assert_eq!(
                    w.status_reason.as_deref(),
                    Some("waiting: pool race full 3/3")
                );
                assert_eq!(wall, differently_store::Wall::Pool);
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

pub async fn briefs_answer_many_ids_at_once(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let other_prj = another_project(s, &org).await;
    let queued = admit(s, &org, &prj).await;
    let gone = admit(s, &org, &other_prj).await;
    activated(s, &gone.id, &pool("p", None), &Quota::default()).await;
    terminate(s, &gone.id).await;
    let unknown = SandboxId::new();
    let briefs = s
        .sandbox_briefs(&[queued.id.clone(), unknown.clone(), gone.id.clone()])
        .await
        .unwrap();
    assert_eq!(briefs.len(), 2, "{briefs:?}");
    let q = &briefs[&queued.id];
    assert_eq!((&q.org_id, &q.project_id, q.status), (&org, &prj, Queued));
    let g = &briefs[&gone.id];
    assert_eq!(
        (&g.org_id, &g.project_id, g.status),
        (&org, &other_prj, Terminated)
    );
    assert!(!briefs.contains_key(&unknown));
    assert!(s.sandbox_briefs(&[]).await.unwrap().is_empty());
}

pub async fn live_rows_missing_from_a_listing(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let mut on_p = Vec::new();
    for _ in 0..3 {
        let a = admit(s, &org, &prj).await;
        activated(s, &a.id, &pool("p", None), &Quota::default()).await;
        s.mark_running(&a.id, "ref", Utc::now()).await.unwrap();
        on_p.push(a.id);
    }
    let elsewhere = admit(s, &org, &prj).await;
    activated(s, &elsewhere.id, &pool("q", None), &Quota::default()).await;
    s.mark_running(&elsewhere.id, "ref", Utc::now())
        .await
        .unwrap();
    let provisioning = admit(s, &org, &prj).await;
    activated(s, &provisioning.id, &pool("p", None), &Quota::default()).await;
    let later = Utc::now() + TimeDelta::seconds(1);

    let listed = [on_p[0].clone(), SandboxId::new()];
    let mut missing = ids(&s.live_not_listed("p", later, &listed, 10).await.unwrap());
    missing.sort();
    let mut want = vec![on_p[1].clone(), on_p[2].clone()];
    want.sort();
    assert_eq!(
        missing, want,
        "only live rows of the pool that were not listed"
    );
    assert_eq!(
        s.live_not_listed("p", later, &listed, 1)
            .await
            .unwrap()
            .len(),
        1,
        "the limit holds"
    );
    assert!(s
        .live_not_listed("p", later, &on_p, 10)
        .await
        .unwrap()
        .is_empty());
    let before_all = Utc::now() - TimeDelta::seconds(60);
    assert!(
        s.live_not_listed("p", before_all, &[], 10)
            .await
            .unwrap()
            .is_empty(),
        "rows changed after the listing began are not judged by it"
    );
}

pub async fn rows_that_drifted_from_their_listed_instance(env: &Env) {
    use differently_store::lifecycle::{OpRecord, OpState};
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let mut rows = Vec::new();
    for _ in 0..4 {
        let a = admit(s, &org, &prj).await;
        activated(s, &a.id, &pool("p", None), &Quota::default()).await;
        rows.push(s.mark_running(&a.id, "ref", Utc::now()).await.unwrap());
    }
    let paused = s
        .transition(
            Transition {
                id: rows[3].id.clone(),
                from: vec![Running],
                to: Paused,
                reason: None,
                actor: Actor::System("test"),
            },
            Utc::now(),
        )
        .await
        .unwrap();
    // rows[2] has an operation in flight: its backend may already have moved.
    let op = OpRecord::new(
        &rows[2],
        "pause",
        true,
        serde_json::json!({}),
        "key:test".into(),
        Utc::now(),
    );
    s.begin_op(&op).await.unwrap();
    let later = Utc::now() + TimeDelta::seconds(1);
    let listed = [
        (rows[0].id.clone(), Running), // agrees
        (rows[1].id.clone(), Paused),  // drifted
        (rows[2].id.clone(), Paused),  // drifted, but an operation is pending
        (paused.id.clone(), Running),  // drifted the other way
        (SandboxId::new(), Stopped),   // no row
    ];
    let found: Vec<(SandboxId, SandboxStatus)> = s
        .drifted("p", later, &listed, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.id, r.status))
        .collect();
    let mut want = vec![(rows[1].id.clone(), Running), (paused.id.clone(), Paused)];
    want.sort();
    assert_eq!(
        found, want,
        "drifted rows, in id order, as the store holds them"
    );
    assert_eq!(s.drifted("p", later, &listed, 1).await.unwrap().len(), 1);
    assert!(
        s.drifted("q", later, &listed, 10).await.unwrap().is_empty(),
        "another pool's listing judges nothing here"
    );
    let before_all = Utc::now() - TimeDelta::seconds(60);
    assert!(
        s.drifted("p", before_all, &listed, 10)
            .await
            .unwrap()
            .is_empty(),
        "rows changed after the listing began are not judged by it"
    );
    s.finish_op(
        &op.id,
        OpState::Done,
        serde_json::Value::Null,
        None,
        Utc::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        s.drifted("p", later, &listed, 10).await.unwrap().len(),
        3,
        "once the operation finished, its row is judged too"
    );
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
            labels: [("team".into(), "a".into())].into(),
            ..of_org.clone()
        })
        .await,
        a_ids
    );
    assert_eq!(
        list(SandboxFilter {
            labels: [("team".into(), "a".into())].into(),
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
        labels: [("team".into(), "c".into())].into(),
        ..of_org.clone()
    })
    .await
    .is_empty());
    assert_eq!(
        list(SandboxFilter {
            labels: [("x".into(), "y".into())].into(),
            status: Some(Queued),
            ..of_org.clone()
        })
        .await,
        b_ids
    );
    // Several labels: every one must match.
    assert_eq!(
        list(SandboxFilter {
            labels: [("team".into(), "b".into()), ("x".into(), "y".into())].into(),
            ..of_org.clone()
        })
        .await,
        b_ids
    );
    assert!(list(SandboxFilter {
        labels: [("team".into(), "a".into()), ("x".into(), "y".into())].into(),
        ..of_org.clone()
    })
    .await
    .is_empty());

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

// ---------- tenancy ----------

const ADMIN: &str = "key_admin";

fn admin() -> Actor {
    Actor::Key(ADMIN.into())
}

fn new_org(name: &str) -> Org {
    Org {
        id: OrgId::new(),
        name: name.into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    }
}

async fn create_org(s: &dyn Store, name: &str) -> Org {
    let org = new_org(name);
    s.create_org(&org, &admin()).await.unwrap();
    org
}

fn new_project(org: &OrgId, name: &str) -> Project {
    Project {
        id: ProjectId::new(),
        org_id: org.clone(),
        name: name.into(),
        created_at: Utc::now(),
    }
}

async fn create_project(s: &dyn Store, org: &OrgId, name: &str) -> Project {
    let p = new_project(org, name);
    s.create_project(&p, &admin()).await.unwrap();
    p
}

fn new_key(org: &OrgId, project: Option<&ProjectId>, hash: &str) -> ApiKeyRecord {
    ApiKeyRecord {
        id: KeyId::new(),
        org_id: org.clone(),
        project_id: project.cloned(),
        name: "deploy key".into(),
        scopes: vec![Scope::SandboxesRead, Scope::SandboxesWrite],
        hash: hash.into(),
        created_at: Utc::now(),
        expires_at: Some(Utc::now() + TimeDelta::days(30)),
        revoked_at: None,
        last_used_at: None,
    }
}

fn already_exists(r: Result<impl std::fmt::Debug, StoreError>) -> String {
    match r {
        Err(StoreError::AlreadyExists(m)) => m,
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
}

fn has_dependents(r: Result<impl std::fmt::Debug, StoreError>) -> String {
    match r {
        Err(StoreError::HasDependents(m)) => m,
        other => panic!("expected HasDependents, got {other:?}"),
    }
}

fn quota_exceeded(r: Result<Admitted, StoreError>) -> String {
    match r {
        Err(StoreError::QuotaExceeded(m)) => m,
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
}

/// A refusal of a sandbox that could never fit: (the request field, the message).
fn never_fits(r: Result<Admitted, StoreError>) -> (String, String) {
    match r {
        Err(StoreError::NeverFits(f)) => (f.field, f.message),
        other => panic!("expected NeverFits, got {other:?}"),
    }
}

fn defaults(q: Quota, sandbox: Sandbox) -> Admission {
    Admission {
        request_id: None,
        direct: None,
        sandbox,
        request_hash: "h".into(),
        defaults: q,
        actor: admin(),
    }
}

fn sandbox_of_cpu(org: &OrgId, prj: &ProjectId, cpu: u32) -> Sandbox {
    Sandbox::queued(
        org.clone(),
        prj.clone(),
        spec_with(cpu, &[]),
        None,
        Utc::now(),
    )
}

fn org_ids(v: &[Org]) -> Vec<OrgId> {
    v.iter().map(|o| o.id.clone()).collect()
}

pub async fn org_create_get_list_and_unique_names(env: &Env) {
    let s = store(env);
    let mut created = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        created.push(create_org(s, name).await);
    }
    assert_eq!(
        s.get_org(&created[1].id).await.unwrap(),
        Some(created[1].clone())
    );
    assert_eq!(s.get_org(&OrgId::new()).await.unwrap(), None);

    let mut want = org_ids(&created);
    want.sort();
    let page1 = s.list_orgs(None, 2).await.unwrap();
    assert_eq!(org_ids(&page1), want[..2]);
    let page2 = s.list_orgs(Some(&page1[1].id), 2).await.unwrap();
    assert_eq!(org_ids(&page2), want[2..]);
    assert!(s.list_orgs(Some(&want[2]), 2).await.unwrap().is_empty());
    assert_eq!(org_ids(&s.list_orgs(None, 0).await.unwrap()), want);

    // A taken name is refused and nothing is written.
    let audit_before = audit_len(s).await;
    let dup = new_org("beta");
    let msg = already_exists(s.create_org(&dup, &admin()).await);
    assert_eq!(msg, "organization name \"beta\"");
    assert_eq!(s.get_org(&dup.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before);
    // The same id twice is refused too.
    let again = Org {
        name: "delta".into(),
        ..created[0].clone()
    };
    already_exists(s.create_org(&again, &admin()).await);
    assert_eq!(
        s.get_org(&again.id).await.unwrap(),
        Some(created[0].clone())
    );
}

pub async fn org_update_and_delete(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    create_org(s, "beta").await;

    let suspended = s
        .update_org(&org.id, None, Some(OrgStatus::Suspended), &admin())
        .await
        .unwrap();
    assert_eq!(suspended.status, OrgStatus::Suspended);
    assert_eq!(suspended.name, "alpha");
    assert_eq!(s.get_org(&org.id).await.unwrap(), Some(suspended.clone()));

    let msg = already_exists(s.update_org(&org.id, Some("beta"), None, &admin()).await);
    assert_eq!(msg, "organization name \"beta\"");
    // Keeping its own name is not a conflict.
    s.update_org(&org.id, Some("alpha"), None, &admin())
        .await
        .unwrap();
    let renamed = s
        .update_org(&org.id, Some("omega"), Some(OrgStatus::Active), &admin())
        .await
        .unwrap();
    assert_eq!(
        (renamed.name.as_str(), renamed.status),
        ("omega", OrgStatus::Active)
    );
    assert_eq!(s.get_org(&org.id).await.unwrap(), Some(renamed));
    // The old name is free again.
    create_org(s, "alpha").await;
    assert!(matches!(
        s.update_org(&OrgId::new(), None, Some(OrgStatus::Active), &admin())
            .await,
        Err(StoreError::NotFound)
    ));

    // Refused while a project exists; the key and quota survive the refusal.
    let prj = create_project(s, &org.id, "web").await;
    let key = new_key(&org.id, None, "hash-org-wide");
    s.create_key(&key, &admin()).await.unwrap();
    let q = Quota {
        max_active: Some(3),
        ..Default::default()
    };
    s.put_quota(&QuotaScope::Org(org.id.clone()), &q, &admin())
        .await
        .unwrap();
    let msg = has_dependents(s.delete_org(&org.id, &admin()).await);
    assert_eq!(msg, "organization has 1 projects");
    assert!(s.get_org(&org.id).await.unwrap().is_some());
    assert!(s.get_key(&key.id).await.unwrap().is_some());

    s.delete_project(&prj.id, &admin()).await.unwrap();
    s.delete_org(&org.id, &admin()).await.unwrap();
    assert_eq!(s.get_org(&org.id).await.unwrap(), None);
    assert_eq!(s.get_key(&key.id).await.unwrap(), None);
    assert_eq!(
        s.get_quota(&QuotaScope::Org(org.id.clone())).await.unwrap(),
        None
    );
    assert!(matches!(
        s.delete_org(&org.id, &admin()).await,
        Err(StoreError::NotFound)
    ));
    // Its name can be used again.
    create_org(s, "omega").await;
}

pub async fn project_create_rename_and_list(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let other = create_org(s, "beta").await;

    let orphan = new_project(&OrgId::new(), "web");
    assert!(matches!(
        s.create_project(&orphan, &admin()).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(s.get_project(&orphan.id).await.unwrap(), None);

    let web = create_project(s, &org.id, "web").await;
    assert_eq!(s.get_project(&web.id).await.unwrap(), Some(web.clone()));
    let dup = new_project(&org.id, "web");
    let msg = already_exists(s.create_project(&dup, &admin()).await);
    assert_eq!(msg, "project name \"web\"");
    assert_eq!(s.get_project(&dup.id).await.unwrap(), None);
    // Names are unique within an organization only.
    let other_web = create_project(s, &other.id, "web").await;

    let api = create_project(s, &org.id, "api").await;
    let msg = already_exists(s.rename_project(&api.id, "web", &admin()).await);
    assert_eq!(msg, "project name \"web\"");
    let renamed = s
        .rename_project(&api.id, "backend", &admin())
        .await
        .unwrap();
    assert_eq!(renamed.name, "backend");
    assert_eq!(renamed.org_id, org.id);
    assert_eq!(s.get_project(&api.id).await.unwrap(), Some(renamed.clone()));
    // The old name is free again.
    let api2 = create_project(s, &org.id, "api").await;
    assert!(matches!(
        s.rename_project(&ProjectId::new(), "x", &admin()).await,
        Err(StoreError::NotFound)
    ));

    let mut want = vec![web.id.clone(), api.id.clone(), api2.id.clone()];
    want.sort();
    let p_ids = |v: Vec<Project>| v.into_iter().map(|p| p.id).collect::<Vec<_>>();
    let page1 = p_ids(s.list_projects(&org.id, None, 2).await.unwrap());
    assert_eq!(page1, want[..2]);
    let page2 = p_ids(s.list_projects(&org.id, Some(&page1[1]), 2).await.unwrap());
    assert_eq!(page2, want[2..]);
    assert_eq!(
        p_ids(s.list_projects(&org.id, None, 0).await.unwrap()),
        want
    );
    assert_eq!(
        p_ids(s.list_projects(&other.id, None, 0).await.unwrap()),
        vec![other_web.id]
    );
    assert!(s
        .list_projects(&OrgId::new(), None, 0)
        .await
        .unwrap()
        .is_empty());
}

pub async fn project_delete_waits_for_live_sandboxes(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let keep = create_project(s, &org.id, "keep").await;
    let bound = new_key(&org.id, Some(&prj.id), "hash-bound");
    let org_wide = new_key(&org.id, None, "hash-wide");
    s.create_key(&bound, &admin()).await.unwrap();
    s.create_key(&org_wide, &admin()).await.unwrap();
    let scope = QuotaScope::Project(prj.id.clone());
    let q = Quota {
        max_active: Some(5),
        ..Default::default()
    };
    s.put_quota(&scope, &q, &admin()).await.unwrap();

    let done = admit(s, &org.id, &prj.id).await;
    s.transition(tr(&done.id, &[Queued], Terminated), Utc::now())
        .await
        .unwrap();
    let sbx = admit(s, &org.id, &prj.id).await;
    activated(s, &sbx.id, &pool("p", None), &Quota::default()).await;
    s.mark_running(&sbx.id, "be-1", Utc::now()).await.unwrap();
    let elsewhere = admit(s, &org.id, &keep.id).await;

    let audit_before = audit_len(s).await;
    let msg = has_dependents(s.delete_project(&prj.id, &admin()).await);
    assert_eq!(msg, "project has 1 live sandboxes");
    assert_eq!(audit_len(s).await, audit_before);
    assert!(s.get_project(&prj.id).await.unwrap().is_some());
    assert!(s.get_key(&bound.id).await.unwrap().is_some());
    assert_eq!(s.get_quota(&scope).await.unwrap(), Some(q));

    terminate(s, &sbx.id).await;
    s.delete_project(&prj.id, &admin()).await.unwrap();
    assert_eq!(s.get_project(&prj.id).await.unwrap(), None);
    // Its finished sandboxes, bound keys and quota went with it; nothing else did.
    assert_eq!(s.get_sandbox(&sbx.id).await.unwrap(), None);
    assert_eq!(s.get_sandbox(&done.id).await.unwrap(), None);
    assert_eq!(s.get_key(&bound.id).await.unwrap(), None);
    assert_eq!(s.get_quota(&scope).await.unwrap(), None);
    assert!(s.get_key(&org_wide.id).await.unwrap().is_some());
    assert!(s.get_sandbox(&elsewhere.id).await.unwrap().is_some());
    assert!(s.get_project(&keep.id).await.unwrap().is_some());
    assert!(matches!(
        s.delete_project(&prj.id, &admin()).await,
        Err(StoreError::NotFound)
    ));
    // A queued sandbox is live too.
    let msg = has_dependents(s.delete_project(&keep.id, &admin()).await);
    assert_eq!(msg, "project has 1 live sandboxes");
}

fn snapshot_of(sbx: &Sandbox) -> differently_store::lifecycle::SnapshotRecord {
    let now = Utc::now();
    differently_store::lifecycle::SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: sbx.org_id.clone(),
        project_id: sbx.project_id.clone(),
        sandbox_id: sbx.id.clone(),
        pool: "p".into(),
        name: None,
        status: differently_store::lifecycle::SnapshotStatus::Ready,
        status_reason: None,
        backend_ref: Some("snap-1".into()),
        created_at: now,
        updated_at: now,
    }
}

/// No snapshot outlives its project: a project with snapshots is not deleted (they must be
/// deleted first, backend side too), and no snapshot is recorded into a deleted project.
pub async fn project_delete_refuses_while_it_has_snapshots(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let sbx = admit(s, &org.id, &prj.id).await;
    let snap = snapshot_of(&sbx);
    s.insert_snapshot(&snap).await.unwrap();
    s.transition(tr(&sbx.id, &[Queued], Terminated), Utc::now())
        .await
        .unwrap();

    let audit_before = audit_len(s).await;
    let msg = has_dependents(s.delete_project(&prj.id, &admin()).await);
    assert!(msg.starts_with("project has 1 snapshots"), "{msg}");
    assert_eq!(audit_len(s).await, audit_before);
    assert!(s.get_project(&prj.id).await.unwrap().is_some());
    assert!(s.get_sandbox(&sbx.id).await.unwrap().is_some());
    assert_eq!(s.get_snapshot(&snap.id).await.unwrap(), Some(snap.clone()));

    s.remove_snapshot(&snap.id).await.unwrap();
    s.delete_project(&prj.id, &admin()).await.unwrap();
    assert_eq!(s.get_project(&prj.id).await.unwrap(), None);
    // A snapshot of a deleted project is never recorded.
    assert!(matches!(
        s.insert_snapshot(&snapshot_of(&sbx)).await,
        Err(StoreError::NotFound)
    ));
    assert!(s
        .list_snapshots(&org.id, None, None, 10)
        .await
        .unwrap()
        .is_empty());
}

pub async fn keys_create_get_list_revoke_touch(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let other = create_org(s, "beta").await;
    let prj = create_project(s, &org.id, "web").await;
    let foreign_prj = create_project(s, &other.id, "web").await;

    let mut keys = vec![
        new_key(&org.id, None, "hash-1"),
        new_key(&org.id, Some(&prj.id), "hash-2"),
        new_key(&org.id, None, "hash-3"),
    ];
    for k in &keys {
        s.create_key(k, &admin()).await.unwrap();
    }
    let theirs = new_key(&other.id, None, "hash-4");
    s.create_key(&theirs, &admin()).await.unwrap();

    // The hash is kept although the serialized record never carries it.
    let got = s.get_key(&keys[1].id).await.unwrap().unwrap();
    assert_eq!(got, keys[1]);
    assert_eq!(got.hash, "hash-2");
    assert_eq!(s.get_key(&KeyId::new()).await.unwrap(), None);
    already_exists(s.create_key(&keys[0], &admin()).await);

    assert!(matches!(
        s.create_key(&new_key(&OrgId::new(), None, "h"), &admin())
            .await,
        Err(StoreError::NotFound)
    ));
    let cross = new_key(&org.id, Some(&foreign_prj.id), "hash-x");
    assert!(matches!(
        s.create_key(&cross, &admin()).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(s.get_key(&cross.id).await.unwrap(), None);

    keys.sort_by(|a, b| a.id.cmp(&b.id));
    let page1 = s.list_keys(&org.id, None, 2).await.unwrap();
    assert_eq!(page1, keys[..2]);
    let page2 = s.list_keys(&org.id, Some(&page1[1].id), 2).await.unwrap();
    assert_eq!(page2, keys[2..]);
    assert_eq!(s.list_keys(&org.id, None, 0).await.unwrap(), keys);
    assert_eq!(s.list_keys(&other.id, None, 0).await.unwrap(), vec![theirs]);

    let first = Utc::now();
    let revoked = s.revoke_key(&keys[0].id, first, &admin()).await.unwrap();
    assert_eq!(revoked.revoked_at, Some(first));
    assert_eq!(revoked.hash, keys[0].hash);
    let audit_before = audit_len(s).await;
    let again = s
        .revoke_key(&keys[0].id, first + TimeDelta::hours(1), &admin())
        .await
        .unwrap();
    assert_eq!(again.revoked_at, Some(first));
    assert_eq!(audit_len(s).await, audit_before);
    assert_eq!(s.get_key(&keys[0].id).await.unwrap(), Some(revoked.clone()));
    assert!(matches!(
        s.revoke_key(&KeyId::new(), first, &admin()).await,
        Err(StoreError::NotFound)
    ));

    let used = Utc::now() + TimeDelta::seconds(5);
    s.touch_key(&keys[0].id, used).await.unwrap();
    let touched = s.get_key(&keys[0].id).await.unwrap().unwrap();
    assert_eq!(touched.last_used_at, Some(used));
    assert_eq!(
        touched,
        ApiKeyRecord {
            last_used_at: Some(used),
            ..revoked
        }
    );
    // Touch is not audited.
    assert_eq!(audit_len(s).await, audit_before);
    assert!(matches!(
        s.touch_key(&KeyId::new(), used).await,
        Err(StoreError::NotFound)
    ));
}

pub async fn quota_put_get_replace(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let org_scope = QuotaScope::Org(org.id.clone());
    let prj_scope = QuotaScope::Project(prj.id.clone());
    assert_eq!(s.get_quota(&org_scope).await.unwrap(), None);

    let q1 = Quota {
        max_active: Some(4),
        max_cpu: Some(16),
        max_queued: Some(10),
        max_sandbox: Some(SandboxLimit {
            cpu: 4,
            memory_mib: 8192,
            disk_gib: 20,
        }),
        ..Default::default()
    };
    s.put_quota(&org_scope, &q1, &admin()).await.unwrap();
    assert_eq!(s.get_quota(&org_scope).await.unwrap(), Some(q1));
    // Replaced as a whole, not merged.
    let q2 = Quota {
        max_memory_mib: Some(4096),
        ..Default::default()
    };
    s.put_quota(&org_scope, &q2, &admin()).await.unwrap();
    assert_eq!(s.get_quota(&org_scope).await.unwrap(), Some(q2));
    // Project level is independent of the org level.
    assert_eq!(s.get_quota(&prj_scope).await.unwrap(), None);
    s.put_quota(&prj_scope, &q1, &admin()).await.unwrap();
    assert_eq!(s.get_quota(&prj_scope).await.unwrap(), Some(q1));
    assert_eq!(s.get_quota(&org_scope).await.unwrap(), Some(q2));

    let audit = s.audit_tail(3).await.unwrap();
    let puts: Vec<_> = audit.iter().filter(|r| r.action == "quota.put").collect();
    assert_eq!(puts.len(), 3);
    assert_eq!(puts[0].resource, org_scope.key());
    assert_eq!(puts[0].detail["old"], serde_json::json!(null));
    assert_eq!(puts[0].detail["new"], serde_json::to_value(q1).unwrap());
    assert_eq!(puts[1].detail["old"], serde_json::to_value(q1).unwrap());
    assert_eq!(puts[1].detail["new"], serde_json::to_value(q2).unwrap());
    assert_eq!(puts[2].resource, prj_scope.key());
    assert_eq!(puts[2].org_id, Some(org.id.clone()));

    for missing in [
        QuotaScope::Org(OrgId::new()),
        QuotaScope::Project(ProjectId::new()),
    ] {
        assert!(matches!(
            s.put_quota(&missing, &q1, &admin()).await,
            Err(StoreError::NotFound)
        ));
        assert_eq!(s.get_quota(&missing).await.unwrap(), None);
    }
}

pub async fn usage_matches_the_accounting_table(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let other = create_project(s, &org.id, "other").await;
    let p = pool("p", None);
    let now = Utc::now();

    // One sandbox in every status, each with its own size so sums are checked.
    let mut cpu = 0;
    let mut sized = || {
        cpu += 1;
        spec_with(cpu, &[])
    };
    let mut ids_by_status = Vec::new();
    for target in SandboxStatus::ALL {
        let sbx = admit_spec(s, &org.id, &prj.id, sized()).await;
        let path: &[SandboxStatus] = match target {
            Queued => &[],
            Provisioning => &[Provisioning],
            Running => &[Provisioning, Running],
            Paused => &[Provisioning, Running, Paused],
            Stopped => &[Provisioning, Running, Stopped],
            Terminating => &[Provisioning, Running, Terminating],
            Terminated => &[Provisioning, Running, Terminating, Terminated],
            Failed => &[Provisioning, Failed],
        };
        for step in path {
            match step {
                Provisioning => {
                    activated(s, &sbx.id, &p, &Quota::default()).await;
                }
                Running => {
                    s.mark_running(&sbx.id, "be", now).await.unwrap();
                }
                to => {
                    let from = get(s, &sbx.id).await.status;
                    s.transition(tr(&sbx.id, &[from], *to), now).await.unwrap();
                }
            }
        }
        assert_eq!(get(s, &sbx.id).await.status, target);
        ids_by_status.push(sbx.id);
    }
    // A running sandbox in another project counts for the org only.
    let elsewhere = admit_spec(s, &org.id, &other.id, spec_with(7, &[])).await;
    activated(s, &elsewhere.id, &p, &Quota::default()).await;

    // Expected values from the core accounting table over the stored rows.
    let mut want_prj = Usage::default();
    let mut want_org = Usage::default();
    for sbx in s.list_sandboxes(&SandboxFilter::default()).await.unwrap() {
        want_org.add(sbx.status, &sbx.spec.resources);
        if sbx.project_id == prj.id {
            want_prj.add(sbx.status, &sbx.spec.resources);
        }
    }
    let got_prj = s.usage(&QuotaScope::Project(prj.id.clone())).await.unwrap();
    let got_org = s.usage(&QuotaScope::Org(org.id.clone())).await.unwrap();
    assert_eq!(got_prj, want_prj);
    assert_eq!(got_org, want_org);
    // And spelled out, so a drift in both the table and the stores is caught too:
    // queued=1, active = provisioning, running, paused, stopped, terminating (cpu 2..6),
    // compute = provisioning, running, paused, terminating (cpu 2+3+4+6).
    let mem = spec_with(1, &[]).resources.memory_mib;
    let disk = spec_with(1, &[]).resources.disk_gib;
    assert_eq!(
        got_prj,
        Usage {
            active: 5,
            cpu: 2 + 3 + 4 + 6,
            memory_mib: 4 * mem,
            disk_gib: 5 * disk,
            queued: 1,
        }
    );
    assert_eq!(got_org.active, 6);
    // Postgres keeps these as trigger-maintained counters: a recount finds nothing to fix.
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    assert_eq!(got_org.cpu, got_prj.cpu + 7);

    for missing in [
        QuotaScope::Org(OrgId::new()),
        QuotaScope::Project(ProjectId::new()),
    ] {
        assert!(matches!(s.usage(&missing).await, Err(StoreError::NotFound)));
    }
    let empty = create_project(s, &org.id, "empty").await;
    assert_eq!(
        s.usage(&QuotaScope::Project(empty.id)).await.unwrap(),
        Usage::default()
    );
}

/// A sandbox that could never run under its org's (defaults included) or project's total
/// limits is refused at admission, not queued behind a wall that never moves; one exactly at
/// the limit is admitted.
pub async fn admit_refuses_a_sandbox_larger_than_a_total_limit(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let defs = Quota {
        max_cpu: Some(2),
        ..Default::default()
    };
    let audit_before = audit_len(s).await;
    let big = sandbox_of_cpu(&org.id, &prj.id, 3);
    let (field, msg) = never_fits(s.admit(defaults(defs, big.clone())).await);
    assert!(msg.contains("org cpu quota (maxCpu) of 2"), "{msg}");
    assert_eq!(field, "resources.cpu");
    assert_eq!(s.get_sandbox(&big.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before);
    let exact = sandbox_of_cpu(&org.id, &prj.id, 2);
    assert!(matches!(
        s.admit(defaults(defs, exact)).await.unwrap(),
        Admitted::New(_)
    ));
    s.put_quota(
        &QuotaScope::Project(prj.id.clone()),
        &Quota {
            max_active: Some(0),
            ..Default::default()
        },
        &admin(),
    )
    .await
    .unwrap();
    let one = sandbox_of_cpu(&org.id, &prj.id, 1);
    let msg = quota_exceeded(s.admit(defaults(defs, one.clone())).await);
    assert!(
        msg.contains("project active quota (maxActive) is 0"),
        "{msg}"
    );
    assert_eq!(s.get_sandbox(&one.id).await.unwrap(), None);
}

pub async fn admit_enforces_max_sandbox_and_queue_limits(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let small = create_project(s, &org.id, "small").await;
    let limit = |cpu| SandboxLimit {
        cpu,
        memory_mib: 1 << 20,
        disk_gib: 1 << 10,
    };
    let defs = Quota {
        max_sandbox: Some(limit(2)),
        ..Default::default()
    };

    // Defaults apply while the org has no quota of its own.
    let audit_before = audit_len(s).await;
    let big = sandbox_of_cpu(&org.id, &prj.id, 3);
    let (field, msg) = never_fits(s.admit(defaults(defs, big.clone())).await);
    assert_eq!(
        msg,
        "resources.cpu 3 CPU exceeds the org max sandbox size (maxSandbox.cpu) of 2 CPU"
    );
    assert_eq!(field, "resources.cpu");
    assert_eq!(s.get_sandbox(&big.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before);

    // The org's stored quota wins over the defaults, field by field.
    let org_q = Quota {
        max_sandbox: Some(limit(4)),
        ..Default::default()
    };
    s.put_quota(&QuotaScope::Org(org.id.clone()), &org_q, &admin())
        .await
        .unwrap();
    assert!(matches!(
        s.admit(defaults(defs, big.clone())).await.unwrap(),
        Admitted::New(_)
    ));
    let huge = sandbox_of_cpu(&org.id, &prj.id, 8);
    let (_, msg) = never_fits(s.admit(defaults(defs, huge.clone())).await);
    assert_eq!(
        msg,
        "resources.cpu 8 CPU exceeds the org max sandbox size (maxSandbox.cpu) of 4 CPU"
    );
    assert_eq!(s.get_sandbox(&huge.id).await.unwrap(), None);

    // A project's own max sandbox applies on top of the org's.
    let prj_q = Quota {
        max_sandbox: Some(limit(1)),
        max_queued: Some(1),
        ..Default::default()
    };
    s.put_quota(&QuotaScope::Project(small.id.clone()), &prj_q, &admin())
        .await
        .unwrap();
    let audit_before = audit_len(s).await;
    let two = sandbox_of_cpu(&org.id, &small.id, 2);
    let (_, msg) = never_fits(s.admit(defaults(defs, two.clone())).await);
    assert_eq!(
        msg,
        "resources.cpu 2 CPU exceeds the project max sandbox size (maxSandbox.cpu) of 1 CPU"
    );
    assert_eq!(s.get_sandbox(&two.id).await.unwrap(), None);

    // Project queue: one queued fills it; another project of the org still admits.
    let first = sandbox_of_cpu(&org.id, &small.id, 1);
    s.admit(defaults(defs, first)).await.unwrap();
    let second = sandbox_of_cpu(&org.id, &small.id, 1);
    let msg = quota_exceeded(s.admit(defaults(defs, second.clone())).await);
    assert_eq!(msg, "project queue is full (1 queued)");
    assert_eq!(s.get_sandbox(&second.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before + 1);

    // Org queue from the defaults (the stored org quota has no maxQueued): 2 queued now.
    let full = Quota {
        max_queued: Some(2),
        ..defs
    };
    let third = sandbox_of_cpu(&org.id, &prj.id, 1);
    let msg = quota_exceeded(s.admit(defaults(full, third.clone())).await);
    assert_eq!(msg, "organization queue is full (2 queued)");
    assert_eq!(s.get_sandbox(&third.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before + 1);
    let roomy = Quota {
        max_queued: Some(3),
        ..defs
    };
    assert!(matches!(
        s.admit(defaults(roomy, third)).await.unwrap(),
        Admitted::New(_)
    ));
}

pub async fn activation_waits_on_project_quota(env: &Env) {
    let s = store(env);
    let org = create_org(s, "alpha").await;
    let prj = create_project(s, &org.id, "web").await;
    let free = create_project(s, &org.id, "free").await;
    let third = create_project(s, &org.id, "third").await;
    let p = pool("p", None);
    let defs = Quota {
        max_active: Some(10),
        ..Default::default()
    };
    s.put_quota(
        &QuotaScope::Project(prj.id.clone()),
        &Quota {
            max_active: Some(1),
            ..Default::default()
        },
        &admin(),
    )
    .await
    .unwrap();

    let a = admit(s, &org.id, &prj.id).await;
    let b = admit(s, &org.id, &prj.id).await;
    activated(s, &a.id, &p, &defs).await;
    let w = waiting(s, &b.id, &p, &defs).await;
    assert_eq!(w.status, Queued);
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: project active quota 1/1")
    );
    assert_eq!(get(s, &b.id).await.status_reason, w.status_reason);
    // The org has room: another project activates.
    let c = admit(s, &org.id, &free.id).await;
    activated(s, &c.id, &p, &defs).await;

    // The org level is checked first, and its stored quota wins over the defaults.
    s.put_quota(
        &QuotaScope::Org(org.id.clone()),
        &Quota {
            max_active: Some(2),
            ..Default::default()
        },
        &admin(),
    )
    .await
    .unwrap();
    let w = waiting(s, &b.id, &p, &defs).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org active quota 2/2")
    );
    let d = admit(s, &org.id, &third.id).await;
    let w = waiting(s, &d.id, &p, &defs).await;
    assert_eq!(
        w.status_reason.as_deref(),
        Some("waiting: org active quota 2/2")
    );

    // Freeing the project's slot lets its queued sandbox in.
    terminate(s, &a.id).await;
    activated(s, &b.id, &p, &defs).await;
}

pub async fn tenancy_changes_are_audited_without_key_hash(env: &Env) {
    let s = store(env);
    let before = audit_len(s).await;
    let org = create_org(s, "alpha").await;
    s.update_org(&org.id, Some("beta"), Some(OrgStatus::Suspended), &admin())
        .await
        .unwrap();
    let prj = create_project(s, &org.id, "web").await;
    s.rename_project(&prj.id, "api", &admin()).await.unwrap();
    let secret = "5ec3e7-hash-never-logged";
    let key = new_key(&org.id, Some(&prj.id), secret);
    s.create_key(&key, &admin()).await.unwrap();
    s.revoke_key(&key.id, Utc::now(), &admin()).await.unwrap();
    let q = Quota {
        max_cpu: Some(8),
        ..Default::default()
    };
    s.put_quota(&QuotaScope::Org(org.id.clone()), &q, &admin())
        .await
        .unwrap();
    s.delete_project(&prj.id, &admin()).await.unwrap();
    s.delete_org(&org.id, &admin()).await.unwrap();

    let audit = s.audit_tail(100).await.unwrap();
    let recs = &audit[before..];
    let actions: Vec<&str> = recs.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "org.create",
            "org.update",
            "project.create",
            "project.rename",
            "key.create",
            "key.revoke",
            "quota.put",
            "project.delete",
            "org.delete",
        ]
    );
    let resources: Vec<&str> = recs.iter().map(|r| r.resource.as_str()).collect();
    let org_quota = QuotaScope::Org(org.id.clone()).key();
    assert_eq!(
        resources,
        [
            org.id.as_str(),
            org.id.as_str(),
            prj.id.as_str(),
            prj.id.as_str(),
            key.id.as_str(),
            key.id.as_str(),
            org_quota.as_str(),
            prj.id.as_str(),
            org.id.as_str(),
        ]
    );
    for r in recs {
        assert_eq!(r.org_id, Some(org.id.clone()), "{}", r.action);
        assert_eq!(r.actor, format!("key:{ADMIN}"), "{}", r.action);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains(secret), "{} leaks the key hash", r.action);
    }
    let update = &recs[1].detail;
    assert_eq!(update["old"]["name"], "alpha");
    assert_eq!(update["new"]["name"], "beta");
    assert_eq!(update["new"]["status"], "suspended");
    assert_eq!(recs[3].detail["old"], "web");
    assert_eq!(recs[3].detail["new"], "api");
    assert_eq!(recs[4].detail["name"], key.name.as_str());
    assert_eq!(recs[6].detail["new"], serde_json::to_value(q).unwrap());
    assert!(recs[6].detail["old"].is_null());
}

fn outcome_kind(r: &Result<Admitted, StoreError>) -> String {
    match r {
        Ok(Admitted::New(_)) => "new".into(),
        Ok(Admitted::Replayed(x)) => format!("replayed {}", x.id),
        Err(StoreError::QuotaExceeded(m)) => format!("quota: {m}"),
        Err(e) => format!("{e:?}"),
    }
}

pub async fn admit_many_decides_in_order_like_one_by_one(env: &Env) {
    let s = store(env);
    let (a, a1) = tenant(s).await;
    let a2 = another_project(s, &a).await;
    let (b, b1) = tenant(s).await;
    let earlier = new_sandbox(&a, &a1, Some("k0"));
    s.admit(admission(earlier.clone(), "h", None))
        .await
        .unwrap();
    let mut not_queued = new_sandbox(&a, &a1, None);
    not_queued.status = Running;
    let group = vec![
        admission(new_sandbox(&a, &a1, None), "h", Some(3)),
        admission(new_sandbox(&a, &a1, Some("k0")), "h", Some(3)),
        admission(new_sandbox(&a, &a1, Some("k0")), "other", Some(3)),
        admission(new_sandbox(&a, &a2, Some("k1")), "h", Some(3)),
        admission(new_sandbox(&a, &a2, Some("k1")), "h", Some(3)),
        admission(new_sandbox(&b, &b1, None), "h", Some(3)),
        admission(new_sandbox(&a, &a1, None), "h", Some(3)),
        admission(new_sandbox(&a, &b1, None), "h", Some(3)),
        admission(not_queued, "h", Some(3)),
    ];
    let mut group = group;
    group[0].request_id = Some("req_group_0".into());
    let ids: Vec<SandboxId> = group.iter().map(|g| g.sandbox.id.clone()).collect();
    let audit_before = s.audit_tail(10_000).await.unwrap().len();
    let out = s.admit_many(group).await;
    let kinds: Vec<String> = out.iter().map(outcome_kind).collect();
    assert_eq!(
        kinds,
        vec![
            "new".to_string(),
            format!("replayed {}", earlier.id),
            "IdempotencyMismatch".into(),
            "new".into(),
            format!("replayed {}", ids[3]),
            "new".into(),
            "quota: organization queue is full (3 queued)".into(),
            "NotFound".into(),
            "StatusConflict { current: Running }".into(),
        ]
    );
    // Exactly the new ones are stored, each with its audit record, and the chains verify.
    for (i, id) in ids.iter().enumerate() {
        let stored = s.get_sandbox(id).await.unwrap();
        assert_eq!(stored.is_some(), [0, 3, 5].contains(&i), "item {i}");
    }
    let audit = s.audit_tail(10_000).await.unwrap();
    let admits: HashSet<&str> = audit[audit_before..]
        .iter()
        .filter(|r| r.action == "sandbox.admit")
        .map(|r| r.resource.as_str())
        .collect();
    let expected: HashSet<&str> = [0, 3, 5].iter().map(|&i| ids[i].as_str()).collect();
    assert_eq!(admits, expected);
    let first = s
        .list_audit(&differently_store::audit::AuditFilter {
            resource: Some(ids[0].to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].request_id.as_deref(),
        Some("req_group_0"),
        "each record carries its own request's id, whichever task wrote it"
    );
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
    let usage = s.usage(&QuotaScope::Org(a.clone())).await.unwrap();
    assert_eq!(usage.queued, 3);
    assert_eq!(
        s.usage(&QuotaScope::Project(a2)).await.unwrap().queued,
        1,
        "the replayed duplicate is not counted twice"
    );
}

pub async fn concurrent_admission_groups_never_exceed_the_queue_limit(env: &Env) {
    let (org, prj) = tenant(store(env)).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s = env.reopen().await;
        let (org, prj) = (org.clone(), prj.clone());
        tasks.push(tokio::spawn(async move {
            let mut new = 0;
            for _ in 0..3 {
                let group = (0..10)
                    .map(|_| admission(new_sandbox(&org, &prj, None), "h", Some(25)))
                    .collect();
                for r in s.admit_many(group).await {
                    match r {
                        Ok(Admitted::New(_)) => new += 1,
                        Err(StoreError::QuotaExceeded(_)) => {}
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
            new
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 25);
    let s = store(env);
    assert_eq!(s.usage(&QuotaScope::Org(org)).await.unwrap().queued, 25);
    let rows = s
        .list_sandboxes(&SandboxFilter {
            project_id: Some(prj),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 25);
}

pub async fn activity_batches_keep_the_latest_time(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let (a, b) = (admit(s, &org, &prj).await.id, admit(s, &org, &prj).await.id);
    // Microseconds, as Postgres keeps them.
    let t0 = differently_store::audit::stored_time(Utc::now());
    let t1 = t0 + TimeDelta::seconds(5);
    s.touch_activity(&a, t1).await.unwrap();
    // A batch with a duplicate and an older time for `a`: nothing moves back.
    s.touch_activity_many(&[(a.clone(), t0), (b.clone(), t0), (b.clone(), t1)])
        .await
        .unwrap();
    assert_eq!(s.last_activity(&a).await.unwrap(), Some(t1));
    assert_eq!(s.last_activity(&b).await.unwrap(), Some(t1));
    s.touch_activity_many(&[]).await.unwrap();
}

/// Many one-row changes at once (which Postgres commits in groups): each row changes once,
/// a second change of the same row sees the first, usage follows every row, and the audit
/// chains verify.
pub async fn concurrent_status_changes_each_apply_once(env: &Env) {
    let s = env.store.clone();
    let (org, prj) = tenant(s.as_ref()).await;
    let (org2, prj2) = tenant(s.as_ref()).await;
    let p = pool("p", None);
    let mut ids = Vec::new();
    for i in 0..30 {
        let (o, pr) = if i % 2 == 0 {
            (&org, &prj)
        } else {
            (&org2, &prj2)
        };
        let a = admit(s.as_ref(), o, pr).await;
        activated(s.as_ref(), &a.id, &p, &Quota::default()).await;
        ids.push(a.id);
    }
    // Half are marked running, half stay provisioning; every row is then asked, twice and
    // concurrently, to terminate.
    let mut tasks = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let (s, id) = (s.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                s.mark_running(&id, &format!("ref-{i}"), Utc::now())
                    .await
                    .map(|_| ())
            } else {
                Ok(())
            }
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let mut tasks = Vec::new();
    for id in ids.iter().chain(ids.iter()) {
        let (s, id) = (s.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            s.transition(tr(&id, &[Running, Provisioning], Terminating), Utc::now())
                .await
        }));
    }
    let (mut ok, mut conflict) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(x) => {
                assert_eq!(x.status, Terminating);
                ok += 1;
            }
            Err(StoreError::StatusConflict { current }) => {
                assert_eq!(current, Terminating);
                conflict += 1;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!((ok, conflict), (30, 30));
    for (i, id) in ids.iter().enumerate() {
        let row = get(s.as_ref(), id).await;
        assert_eq!(row.status, Terminating);
        assert_eq!(row.backend_ref.is_some(), i % 2 == 0, "{i}");
    }
    // Terminating still counts as active until terminated.
    assert_eq!(
        s.usage(&QuotaScope::Org(org.clone())).await.unwrap().active,
        15
    );
    let mut tasks = Vec::new();
    for id in &ids {
        let (s, id) = (s.clone(), id.clone());
        tasks.push(tokio::spawn(async move {
            s.transition(tr(&id, &[Terminating], Terminated), Utc::now())
                .await
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status, Terminated);
    }
    for o in [&org, &org2] {
        let u = s.usage(&QuotaScope::Org(o.clone())).await.unwrap();
        assert_eq!((u.active, u.cpu, u.queued), (0, 0, 0));
    }
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

/// Concurrent lone `admit` calls (which Postgres groups per org): each caller gets its own
/// sandbox or its own refusal, the queue limit holds, and each audit record keeps the id of
/// the request that asked, whichever task wrote it.
pub async fn concurrent_admits_each_get_their_own_outcome(env: &Env) {
    let s = env.store.clone();
    let (org, prj) = tenant(s.as_ref()).await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (s, org, prj) = (s.clone(), org.clone(), prj.clone());
        tasks.push(tokio::spawn(async move {
            let sbx = new_sandbox(&org, &prj, None);
            let id = sbx.id.clone();
            let out = differently_core::request_id::with_request_id(
                format!("req_{i}"),
                s.admit(admission(sbx, "h", Some(25))),
            )
            .await;
            (i, id, out)
        }));
    }
    let mut admitted = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, id, Ok(Admitted::New(x))) => {
                assert_eq!(x.id, id, "each caller gets its own sandbox back");
                admitted.push((i, id));
            }
            (_, id, Err(StoreError::QuotaExceeded(_))) => {
                assert!(s.get_sandbox(&id).await.unwrap().is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 25);
    for (i, id) in admitted {
        let recs = s
            .list_audit(&differently_store::audit::AuditFilter {
                resource: Some(id.to_string()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(recs.len(), 1);
        assert_eq!(
            recs[0].request_id.as_deref(),
            Some(format!("req_{i}").as_str())
        );
    }
}

// ---------- direct placement (admission that also activates) ----------

fn direct(sandbox: Sandbox, max_active: u32, pool_name: &str, cap: Option<u32>) -> Admission {
    let mut a = admission(sandbox, "h", None);
    a.defaults.max_active = Some(max_active);
    a.direct = Some(differently_store::DirectPlacement {
        pool: pool(pool_name, cap),
        explanation: serde_json::json!({ "by": "test", "pool": pool_name }),
        warm_class: None,
        claim_call: false,
    });
    a
}

fn new_of(r: Result<Admitted, StoreError>) -> Sandbox {
    match r {
        Ok(Admitted::New(x)) => x,
        other => panic!("expected New, got {other:?}"),
    }
}

pub async fn direct_admission_places_only_when_nothing_waits(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let org_scope = QuotaScope::Org(org.clone());

    // Nothing waits and the quota admits it: inserted provisioning on the pool, with the
    // admission's record and then the activation's, and its explanation.
    let a = new_of(
        s.admit(direct(new_sandbox(&org, &prj, None), 1, "p", None))
            .await,
    );
    assert_eq!(a.status, Provisioning);
    assert_eq!(a.pool.as_deref(), Some("p"));
    assert_eq!((a.status_version, a.attempts), (2, 1));
    assert_eq!(get(s, &a.id).await, a);
    let recs = s
        .list_audit(&differently_store::audit::AuditFilter {
            resource: Some(a.id.to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
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
    assert_eq!(recs[1].detail["direct"], serde_json::json!(true));
    assert_eq!(recs[1].detail["pool"], serde_json::json!("p"));
    assert_eq!(
        s.get_placement(&a.id).await.unwrap(),
        Some(serde_json::json!({ "by": "test", "pool": "p" }))
    );
    let u = s.usage(&org_scope).await.unwrap();
    assert_eq!((u.queued, u.active), (0, 1));
    assert!(s.runnable_queued(Utc::now(), 10).await.unwrap().is_empty());

    // At maxActive 1 the next one waits in the queue, saying why, with no placement.
    let b = new_of(
        s.admit(direct(new_sandbox(&org, &prj, None), 1, "p", None))
            .await,
    );
    assert_eq!(b.status, Queued);
    assert_eq!(b.pool, None);
    assert_eq!(
        b.status_reason.as_deref(),
        Some("waiting: org active quota 1/1")
    );
    assert_eq!(s.get_placement(&b.id).await.unwrap(), None);

    // Capacity frees, but b still waits: a newcomer must not overtake it.
    terminate(s, &a.id).await;
    let c = new_of(
        s.admit(direct(new_sandbox(&org, &prj, None), 5, "p", None))
            .await,
    );
    assert_eq!(
        c.status, Queued,
        "an org with a queued sandbox places nothing directly"
    );

    // Another org with nothing queued, but its only pool is capped: the leader's to order.
    let (other, other_prj) = tenant(s).await;
    let d = new_of(
        s.admit(direct(
            new_sandbox(&other, &other_prj, None),
            5,
            "capped",
            Some(9),
        ))
        .await,
    );
    assert_eq!(d.status, Queued);
    assert_eq!(
        ids(&s.runnable_queued(Utc::now(), 10).await.unwrap()),
        vec![b.id.clone(), c.id.clone(), d.id.clone()]
    );
    let u = s.usage(&org_scope).await.unwrap();
    assert_eq!((u.queued, u.active), (2, 0));
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

pub async fn direct_admissions_in_one_group_place_in_order(env: &Env) {
    let s = store(env);
    let (a, a1) = tenant(s).await;
    let a2 = another_project(s, &a).await;
    let (b, b1) = tenant(s).await;
    let mut queued_first = direct(new_sandbox(&a, &a1, None), 10, "p", None);
    queued_first.direct = None;
    let group = vec![
        direct(new_sandbox(&a, &a1, None), 10, "p", None),
        direct(new_sandbox(&a, &a2, None), 10, "q", None),
        queued_first,
        direct(new_sandbox(&a, &a1, None), 10, "p", None),
        direct(new_sandbox(&b, &b1, None), 10, "q", None),
        direct(new_sandbox(&b, &b1, None), 1, "p", None),
    ];
    let out: Vec<(SandboxStatus, Option<String>)> = s
        .admit_many(group)
        .await
        .into_iter()
        .map(|r| {
            let x = new_of(r);
            (x.status, x.pool)
        })
        .collect();
    assert_eq!(
        out,
        vec![
            (Provisioning, Some("p".into())),
            (Provisioning, Some("q".into())),
            // Not offered a placement: queued, and the org's later items queue behind it.
            (Queued, None),
            (Queued, None),
            (Provisioning, Some("q".into())),
            // maxActive 1 counts the group's earlier placement of the same org.
            (Queued, None),
        ]
    );
    let ua = s.usage(&QuotaScope::Org(a.clone())).await.unwrap();
    assert_eq!((ua.queued, ua.active), (2, 2));
    let ub = s.usage(&QuotaScope::Org(b.clone())).await.unwrap();
    assert_eq!((ub.queued, ub.active), (1, 1));
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let activations = s
        .audit_tail(10_000)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.action == "sandbox.activate")
        .count();
    assert_eq!(activations, 3);
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

pub async fn concurrent_direct_admissions_and_activations_respect_max_active(env: &Env) {
    let (org, prj) = tenant(store(env)).await;
    let mut tasks = Vec::new();
    // Three "API processes" placing directly while a "leader" activates whatever queues.
    for _ in 0..3 {
        let s = env.reopen().await;
        let (org, prj) = (org.clone(), prj.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let group = (0..5)
                    .map(|_| direct(new_sandbox(&org, &prj, None), 6, "p", None))
                    .collect();
                for r in s.admit_many(group).await {
                    new_of(r);
                }
            }
        }));
    }
    let leader = {
        let s = env.reopen().await;
        tokio::spawn(async move {
            let quota = Quota {
                max_active: Some(6),
                ..Default::default()
            };
            for _ in 0..20 {
                for q in s.runnable_queued(Utc::now(), 10).await.unwrap() {
                    s.activate(&q.id, &pool("p", None), &quota, Utc::now())
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    leader.await.unwrap();
    let s = store(env);
    let rows = s
        .list_sandboxes(&SandboxFilter {
            project_id: Some(prj),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 60);
    let active = rows.iter().filter(|r| r.status == Provisioning).count();
    assert_eq!(active, 6, "exactly maxActive are placed, by whichever path");
    let u = s.usage(&QuotaScope::Org(org)).await.unwrap();
    assert_eq!((u.queued, u.active), (54, 6));
    assert_eq!(s.reconcile_usage().await.unwrap(), Vec::new());
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}

// ---------- Idempotency-Key ----------

pub async fn idempotency_keys_replay_refuse_and_expire(env: &Env) {
    use differently_store::idempotency::{Claim, IdemKey, KEPT_FOR, PENDING_FOR};
    use serde_json::json;
    let s = store(env);
    let k = IdemKey {
        owner: "key_a".into(),
        route: "POST /v1/keys".into(),
        key: "retry-1".into(),
    };
    let t0 = Utc::now();
    assert_eq!(
        s.claim_idempotency(&k, "h1", t0).await.unwrap(),
        Claim::Fresh
    );
    // While the first request runs, a retry is told so, whatever its body.
    assert_eq!(
        s.claim_idempotency(&k, "h1", t0).await.unwrap(),
        Claim::InFlight
    );
    assert_eq!(
        s.claim_idempotency(&k, "h2", t0).await.unwrap(),
        Claim::Mismatch
    );
    s.finish_idempotency(&k, 201, &json!({ "id": "key_1" }))
        .await
        .unwrap();
    // Finished: the same body gets the same answer (also through another handle), another
    // body is refused, and a release no longer gives the key up.
    let other = env.reopen().await;
    assert_eq!(
        other.claim_idempotency(&k, "h1", t0).await.unwrap(),
        Claim::Replay {
            status: 201,
            body: json!({ "id": "key_1" })
        }
    );
    assert_eq!(
        s.claim_idempotency(&k, "h2", t0).await.unwrap(),
        Claim::Mismatch
    );
    s.release_idempotency(&k).await.unwrap();
    assert!(matches!(
        s.claim_idempotency(&k, "h1", t0).await.unwrap(),
        Claim::Replay { status: 201, .. }
    ));
    // The same key is independent per owner and per route.
    for k2 in [
        IdemKey {
            owner: "key_b".into(),
            ..k.clone()
        },
        IdemKey {
            route: "POST /v1/orgs".into(),
            ..k.clone()
        },
    ] {
        assert_eq!(
            s.claim_idempotency(&k2, "h1", t0).await.unwrap(),
            Claim::Fresh
        );
    }
    // An answer is kept for KEPT_FOR; then the key starts afresh.
    let later = t0 + TimeDelta::from_std(KEPT_FOR).unwrap() + TimeDelta::seconds(1);
    assert_eq!(
        s.claim_idempotency(&k, "h2", later).await.unwrap(),
        Claim::Fresh
    );
    // A failed request releases its claim: the retry goes ahead at once.
    s.release_idempotency(&k).await.unwrap();
    assert_eq!(
        s.claim_idempotency(&k, "h3", later).await.unwrap(),
        Claim::Fresh
    );
    // A claim whose request never answered blocks retries for PENDING_FOR only.
    let soon = later + TimeDelta::from_std(PENDING_FOR).unwrap() - TimeDelta::seconds(1);
    assert_eq!(
        s.claim_idempotency(&k, "h3", soon).await.unwrap(),
        Claim::InFlight
    );
    let gone = later + TimeDelta::from_std(PENDING_FOR).unwrap() + TimeDelta::seconds(1);
    assert_eq!(
        s.claim_idempotency(&k, "h3", gone).await.unwrap(),
        Claim::Fresh
    );
}
