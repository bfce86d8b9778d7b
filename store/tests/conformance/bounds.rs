//! Stored values of any size never break a sweep's query (issue #20, defect 1): rows admitted
//! before the API bounded `idleTimeoutSeconds` may hold any `u64`; both stores treat a
//! timeout too large to reach as "never", and the other rows' timeouts still fire.

use chrono::{TimeDelta, Utc};
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec};
use differently_store::{Actor, Admission, Admitted, Quota, Store, StoreError};

use crate::cases::{activated, pool, tenant};
use crate::Env;

conformance!(
    bounds;
    huge_stored_timeouts_never_break_the_idle_query,
    idle_timeouts_count_from_the_last_write_or_activity,
    a_huge_ttl_renew_never_breaks_the_ttl_query,
    both_stores_refuse_nul_the_same_way,
    both_stores_refuse_nul_in_names_pools_and_snapshots,
);

/// A running sandbox whose stored spec has `idle` as its idle timeout, as old rows may.
async fn running_with(s: &dyn Store, org: &OrgId, prj: &ProjectId, idle: Option<u64>) -> SandboxId {
    let mut spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
    spec.idle_timeout_seconds = idle;
    let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
    let admission = Admission {
        request_id: None,
        direct: None,
        sandbox: sbx,
        request_hash: "h".into(),
        defaults: Quota::default(),
        actor: Actor::Key("key_test".into()),
    };
    let id = match s.admit(admission).await.unwrap() {
        Admitted::New(x) => x.id,
        other => panic!("expected New, got {other:?}"),
    };
    activated(s, &id, &pool("p", None), &Quota::default()).await;
    s.mark_running(&id, "be", Utc::now()).await.unwrap();
    id
}

pub async fn huge_stored_timeouts_never_break_the_idle_query(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let (other_org, other_prj) = tenant(s).await;
    let mut huge = Vec::new();
    for idle in [
        u64::MAX,
        i64::MAX as u64,
        10_000_000_000_000_000, // 1e16: fits i64, not a chrono TimeDelta
        9_223_372_036_854_776,  // just past TimeDelta::MAX in seconds
        8_000_000_000_000,      // a TimeDelta, but past the last representable time
    ] {
        huge.push(running_with(s, &org, &prj, Some(idle)).await);
    }
    let short = running_with(s, &other_org, &other_prj, Some(2)).await;
    let unset = running_with(s, &other_org, &other_prj, None).await;

    let later = Utc::now() + TimeDelta::seconds(10);
    let idle = s.idle_candidates(later, None, 100).await.unwrap();
    let ids: Vec<_> = idle.iter().map(|x| x.id.clone()).collect();
    assert_eq!(ids, vec![short.clone()], "only the short timeout fires");

    // A default applies only to rows without their own timeout, at any size.
    let idle = s.idle_candidates(later, Some(5), 100).await.unwrap();
    let mut ids: Vec<_> = idle.iter().map(|x| x.id.clone()).collect();
    ids.sort();
    let mut want = vec![short.clone(), unset.clone()];
    want.sort();
    assert_eq!(ids, want);
    let idle = s.idle_candidates(later, Some(u64::MAX), 100).await.unwrap();
    let ids: Vec<_> = idle.iter().map(|x| x.id.clone()).collect();
    assert_eq!(ids, vec![short]);
    // Even at the far end of time nothing fails.
    let end = chrono::DateTime::<Utc>::MAX_UTC - TimeDelta::days(1);
    let idle = s.idle_candidates(end, None, 100).await.unwrap();
    for id in &huge[..4] {
        assert!(idle.iter().all(|x| &x.id != id), "{id} can never be idle");
    }
}

/// A row's own idle timeout overrides the default either way, and both count from its last
/// write or its last recorded activity, whichever is newer (the two halves of the Postgres
/// query, migration 0020, and the memory store agree).
pub async fn idle_timeouts_count_from_the_last_write_or_activity(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let own_short = running_with(s, &org, &prj, Some(30)).await;
    let own_long = running_with(s, &org, &prj, Some(200)).await;
    let unset = running_with(s, &org, &prj, None).await;
    let t0 = Utc::now();
    let at = |secs: i64| t0 + TimeDelta::seconds(secs);
    let idle = |now, default| async move {
        let mut ids: Vec<SandboxId> = s
            .idle_candidates(now, default, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|x| x.id)
            .collect();
        ids.sort();
        ids
    };
    let sorted = |mut v: Vec<SandboxId>| {
        v.sort();
        v
    };
    assert_eq!(idle(at(60), None).await, vec![own_short.clone()]);
    assert_eq!(
        idle(at(60), Some(40)).await,
        sorted(vec![own_short.clone(), unset.clone()]),
        "the default applies only where a row has no timeout of its own"
    );
    // Activity 15 s before: neither timeout has passed since.
    s.touch_activity_many(&[(own_short.clone(), at(45)), (unset.clone(), at(45))])
        .await
        .unwrap();
    assert_eq!(idle(at(60), Some(40)).await, Vec::<SandboxId>::new());
    assert_eq!(
        idle(at(100), Some(40)).await,
        sorted(vec![own_short.clone(), unset.clone()])
    );
    assert_eq!(
        idle(at(300), Some(40)).await,
        sorted(vec![own_short, own_long, unset]),
        "a longer timeout of its own holds until it passes"
    );
}

pub async fn a_huge_ttl_renew_never_breaks_the_ttl_query(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let forever = running_with(s, &org, &prj, None).await;
    let r = s.renew_ttl(&forever, u64::MAX, Utc::now()).await.unwrap();
    assert_eq!(
        r.expires_at, None,
        "past the representable time: never expires"
    );
    let soon = running_with(s, &org, &prj, None).await;
    s.renew_ttl(&soon, 1, Utc::now()).await.unwrap();
    let later = Utc::now() + TimeDelta::seconds(10);
    let expired = s.expired(later, 100).await.unwrap();
    let ids: Vec<_> = expired.iter().map(|x| x.id.clone()).collect();
    assert_eq!(ids, vec![soon]);
}

/// A change to a valid spec that makes one field unstorable.
type SpecChange<'a> = Box<dyn Fn(&mut SandboxSpec) + 'a>;

/// Postgres cannot store a NUL character and the memory store could: both refuse it alike
/// (issue #20, defect 3), naming the field, and nothing is written.
pub async fn both_stores_refuse_nul_the_same_way(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let nul = "a\u{0}b".to_owned();
    let specs: Vec<(SpecChange, &str)> = vec![
        (
            Box::new(|sp| {
                sp.labels.insert("k".into(), nul.clone());
            }),
            "labels.k",
        ),
        (
            Box::new(|sp| {
                sp.labels.insert(nul.clone(), "v".into());
            }),
            "labels",
        ),
        (
            Box::new(|sp| {
                sp.env.insert("TOKEN".into(), nul.clone());
            }),
            "env.TOKEN",
        ),
        (Box::new(|sp| sp.template = Some(nul.clone())), "template"),
        (Box::new(|sp| sp.region = Some(nul.clone())), "region"),
    ];
    for (change, field) in specs {
        let mut spec = SandboxSpec::build(&CreateSandboxRequest::default()).unwrap();
        change(&mut spec);
        let sbx = Sandbox::queued(org.clone(), prj.clone(), spec, None, Utc::now());
        let id = sbx.id.clone();
        let admitted = s
            .admit(Admission {
                request_id: None,
                direct: None,
                sandbox: sbx,
                request_hash: "h".into(),
                defaults: Quota::default(),
                actor: Actor::Key("key_test".into()),
            })
            .await;
        match admitted {
            Err(StoreError::InvalidValue(e)) => assert_eq!(e.field, field),
            other => panic!("{field}: expected InvalidValue, got {other:?}"),
        }
        assert_eq!(
            s.get_sandbox(&id).await.unwrap(),
            None,
            "{field}: nothing written"
        );
    }
    let id = running_with(s, &org, &prj, None).await;
    let labels = [("k".to_owned(), nul.clone())].into_iter().collect();
    match s.update_spec(&id, Some(labels), None).await {
        Err(StoreError::InvalidValue(e)) => assert_eq!(e.field, "labels.k"),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    assert!(s
        .get_sandbox(&id)
        .await
        .unwrap()
        .unwrap()
        .spec
        .labels
        .is_empty());
}

/// The other records both stores keep: organization and project names (create, ensure,
/// rename), pool records (names, region, any settings string) and snapshot records (name,
/// pool, reason) with a NUL are refused alike, naming the field, and nothing is written.
pub async fn both_stores_refuse_nul_in_names_pools_and_snapshots(env: &Env) {
    use differently_core::pool::{PoolRecord, PoolSource, Trust};
    use differently_core::tenancy::{Org, OrgStatus, Project};
    use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};

    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let nul = "a\u{0}b";
    let field = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::InvalidValue(e)) => e.field,
        other => panic!("{what}: expected InvalidValue, got {other:?}"),
    };
    let system = Actor::System("test");

    let bad_org = Org {
        id: OrgId::new(),
        name: nul.into(),
        status: OrgStatus::Active,
        created_at: Utc::now(),
    };
    assert_eq!(field(s.create_org(&bad_org, &system).await, "org"), "name");
    assert_eq!(s.get_org(&bad_org.id).await.unwrap(), None);
    let bad_project = Project {
        id: ProjectId::new(),
        org_id: org.clone(),
        name: nul.into(),
        created_at: Utc::now(),
    };
    assert_eq!(
        field(s.create_project(&bad_project, &system).await, "project"),
        "name"
    );
    assert_eq!(s.get_project(&bad_project.id).await.unwrap(), None);
    let good_org = Org {
        name: "fine".into(),
        ..bad_org.clone()
    };
    assert_eq!(
        field(s.ensure_tenant(&good_org, &bad_project).await, "ensure"),
        "name"
    );
    assert_eq!(s.get_org(&good_org.id).await.unwrap(), None);
    assert_eq!(
        field(
            s.update_org(&org, Some(nul), None, &system)
                .await
                .map(|_| ()),
            "org rename"
        ),
        "name"
    );
    assert_eq!(s.get_org(&org).await.unwrap().unwrap().name, "acme");
    assert_eq!(
        field(
            s.rename_project(&prj, nul, &system).await.map(|_| ()),
            "project rename"
        ),
        "name"
    );
    assert_eq!(s.get_project(&prj).await.unwrap().unwrap().name, "default");

    let now = Utc::now();
    let pool = PoolRecord {
        name: "edge".into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: None,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: None,
        settings: serde_json::json!({}),
        source: PoolSource::Api,
        created_at: now,
        updated_at: now,
    };
    for (bad, want) in [
        (
            PoolRecord {
                region: Some(nul.into()),
                ..pool.clone()
            },
            "region",
        ),
        (
            PoolRecord {
                settings: serde_json::json!({"ledger": nul}),
                ..pool.clone()
            },
            "settings.ledger",
        ),
        (
            PoolRecord {
                settings: serde_json::json!({"features": ["exec", nul]}),
                ..pool.clone()
            },
            "settings.features[1]",
        ),
    ] {
        assert_eq!(field(s.upsert_pool(&bad, &system).await, want), want);
    }
    assert!(s
        .list_pools()
        .await
        .unwrap()
        .iter()
        .all(|p| p.name != "edge"));

    let snap = SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: org.clone(),
        project_id: prj.clone(),
        sandbox_id: SandboxId::new(),
        pool: "fake".into(),
        name: Some(nul.into()),
        status: SnapshotStatus::Creating,
        status_reason: None,
        backend_ref: None,
        created_at: now,
        updated_at: now,
    };
    assert_eq!(field(s.insert_snapshot(&snap).await, "snapshot"), "name");
    assert_eq!(s.get_snapshot(&snap.id).await.unwrap(), None);
    let ok = SnapshotRecord {
        name: Some("fine".into()),
        ..snap.clone()
    };
    s.insert_snapshot(&ok).await.unwrap();
    let reason = SnapshotRecord {
        status_reason: Some(nul.into()),
        ..ok.clone()
    };
    assert_eq!(
        field(s.update_snapshot(&reason).await, "snapshot update"),
        "statusReason"
    );
    assert_eq!(
        s.get_snapshot(&ok.id).await.unwrap().unwrap().status_reason,
        None
    );
}
