//! Conformance of `PlacementStore`: policies per level, the pool registry, fleet health,
//! slots in use and stored explanations — the same behaviour from memory and Postgres.

use chrono::Utc;
use differently_core::policy::{EffectivePolicy, Policy};
use differently_core::pool::{PoolHealth, PoolRecord, PoolSource, Trust};
use differently_core::tenancy::{Org, OrgStatus, Project, Quota};
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxSpec};
use differently_store::placement::{effective_policy, PolicyScope};
use differently_store::{Activation, Actor, Admission, Admitted, PoolSlot, StoreError};

use crate::Env;

async fn tenant(env: &Env) -> (OrgId, ProjectId) {
    let org = Org {
        id: OrgId::new(),
        name: format!("o-{}", OrgId::new()),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    let prj = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "p".into(),
        created_at: Utc::now(),
    };
    env.store.ensure_tenant(&org, &prj).await.unwrap();
    (org.id, prj.id)
}

fn record(name: &str, trust: Trust) -> PoolRecord {
    PoolRecord {
        name: name.into(),
        kind: "fake".into(),
        trust,
        region: Some("eu".into()),
        max_concurrent: Some(2),
        isolation: None,
        cost_per_cpu_hour: 0.5,
        typical_create_seconds: Some(1.0),
        settings: serde_json::json!({"latencyMs": 0}),
        source: PoolSource::Api,
        created_at: Utc::now(),
        updated_at: Utc::now(),
    }
}

async fn running_on(env: &Env, org: &OrgId, prj: &ProjectId, pool: &str) -> Sandbox {
    let spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
    let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
    let adm = Admission {
        request_id: None,
        direct: None,
        sandbox: sbx,
        request_hash: "h".into(),
        defaults: Quota::default(),
        actor: Actor::System("test"),
    };
    let Admitted::New(s) = env.store.admit(adm).await.unwrap() else {
        panic!("replayed")
    };
    let slot = PoolSlot {
        name: pool.into(),
        max_concurrent: None,
    };
    match env
        .store
        .activate(&s.id, &slot, &Quota::default(), Utc::now())
        .await
        .unwrap()
    {
        Activation::Activated(a) => a,
        other => panic!("{other:?}"),
    }
}

pub async fn policies_per_level_and_their_intersection(env: &Env) {
    let (org, prj) = tenant(env).await;
    let actor = Actor::System("test");
    assert_eq!(
        env.store.get_policy(&PolicyScope::Global).await.unwrap(),
        None
    );
    let global = Policy {
        allow_external: Some(true),
        external_pools: Some(vec!["ext".into()]),
        ..Default::default()
    };
    env.store
        .put_policy(&PolicyScope::Global, &global, &actor)
        .await
        .unwrap();
    let org_policy = Policy {
        allow_external: Some(true),
        ..Default::default()
    };
    env.store
        .put_policy(&PolicyScope::Org(org.clone()), &org_policy, &actor)
        .await
        .unwrap();
    assert_eq!(
        env.store.get_policy(&PolicyScope::Global).await.unwrap(),
        Some(global.clone())
    );
    // Several levels at once come back in the order asked, missing ones as None.
    let levels = env
        .store
        .get_policies(&[
            PolicyScope::Project(prj.clone()),
            PolicyScope::Org(org.clone()),
            PolicyScope::Global,
        ])
        .await
        .unwrap();
    assert_eq!(
        levels,
        vec![None, Some(org_policy.clone()), Some(global.clone())]
    );
    // The project level says nothing: external placement is not allowed (fails closed).
    let eff = effective_policy(env.store.as_ref(), &org, &prj)
        .await
        .unwrap();
    assert!(!eff.allows_external());
    env.store
        .put_policy(
            &PolicyScope::Project(prj.clone()),
            &Policy {
                allow_external: Some(true),
                ..Default::default()
            },
            &actor,
        )
        .await
        .unwrap();
    let eff = effective_policy(env.store.as_ref(), &org, &prj)
        .await
        .unwrap();
    assert!(eff.allows_external());
    assert_eq!(
        eff,
        EffectivePolicy::intersect(
            &global,
            &org_policy,
            &Policy {
                allow_external: Some(true),
                ..Default::default()
            }
        )
    );
    // Replacing is audited with the old and new values in the org's chain.
    let audit = env.store.audit_tail(1000).await.unwrap();
    let org_rec = audit
        .iter()
        .find(|r| r.action == "policy.put" && r.org_id.as_ref() == Some(&org))
        .unwrap();
    assert!(
        org_rec.detail["new"]["allowExternal"] == true,
        "{:?}",
        org_rec.detail
    );
    assert!(audit
        .iter()
        .any(|r| r.action == "policy.put" && r.resource == "global"));
}

pub async fn pool_registry_health_and_slots(env: &Env) {
    let actor = Actor::System("test");
    let (org, prj) = tenant(env).await;
    env.store
        .upsert_pool(&record("b", Trust::Private), &actor)
        .await
        .unwrap();
    env.store
        .upsert_pool(&record("a", Trust::External), &actor)
        .await
        .unwrap();
    let before = env.store.audit_tail(1000).await.unwrap().len();
    // Re-registering the same definition (every start does) changes and audits nothing.
    env.store
        .upsert_pool(&record("a", Trust::External), &actor)
        .await
        .unwrap();
    assert_eq!(env.store.audit_tail(1000).await.unwrap().len(), before);
    let mut changed = record("a", Trust::External);
    changed.max_concurrent = Some(5);
    env.store.upsert_pool(&changed, &actor).await.unwrap();
    let pools = env.store.list_pools().await.unwrap();
    assert_eq!(
        pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(pools[0].max_concurrent, Some(5));
    let audit = env.store.audit_tail(1000).await.unwrap();
    assert!(audit
        .iter()
        .any(|r| r.action == "pool.register" && r.resource == "pool:b"));
    assert!(audit
        .iter()
        .any(|r| r.action == "pool.update" && r.resource == "pool:a"));

    let h = PoolHealth {
        name: "a".into(),
        healthy: false,
        capabilities: vec!["exec".into()],
        error: Some("down".into()),
        checked_at: Utc::now(),
        checked_by: "t:1".into(),
        backend: None,
    };
    env.store.report_pool_health(&h).await.unwrap();
    // What the prober's adapter detected is kept with the record, for API processes that
    // never called the backend themselves.
    let h2 = PoolHealth {
        healthy: true,
        error: None,
        backend: Some(differently_core::pool::BackendSeen {
            version: Some("1.1.1".into()),
            verified: differently_core::pool::VerifiedStatus::Live,
            verified_basis: "run here".into(),
        }),
        ..h.clone()
    };
    env.store.report_pool_health(&h2).await.unwrap();
    let health = env.store.pool_health().await.unwrap();
    assert_eq!(health.len(), 1, "last probe wins");
    assert!(health[0].healthy);
    assert_eq!(health[0].backend, h2.backend);

    let s = running_on(env, &org, &prj, "a").await;
    assert_eq!(
        env.store.pool_slots_used().await.unwrap().get("a"),
        Some(&1)
    );
    match env.store.delete_pool("a", &actor).await {
        Err(StoreError::HasDependents(m)) => assert!(m.contains("1 live"), "{m}"),
        other => panic!("deleting a pool in use: {other:?}"),
    }
    let explanation = serde_json::json!({"decision": "placed", "pool": "a", "pools": []});
    env.store.save_placement(&s.id, &explanation).await.unwrap();
    assert_eq!(
        env.store.get_placement(&s.id).await.unwrap(),
        Some(explanation)
    );
    env.store.delete_pool("b", &actor).await.unwrap();
    assert!(matches!(
        env.store.delete_pool("b", &actor).await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(env.store.list_pools().await.unwrap().len(), 1);
}

conformance!(placement; policies_per_level_and_their_intersection, pool_registry_health_and_slots);
