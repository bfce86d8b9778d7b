//! Status changes: compare-and-set, the rules, requeues, activity, and many at once.

use super::*;

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

/// A change of a row the caller saw (`transition_seen`) answers and writes exactly what the
/// plain change would, whether what it saw is current, a version behind (a TTL renewal in
/// between is kept, as it moved no status), or of another status (refused, nothing written).
pub async fn a_change_from_a_seen_row_is_the_plain_change(env: &Env) {
    let s = store(env);
    let (org, prj) = tenant(s).await;
    let seen_at = |sbx: &Sandbox, version: i64| differently_store::SeenRow {
        org_id: sbx.org_id.clone(),
        project_id: sbx.project_id.clone(),
        status_version: version,
    };
    let t = |id: &SandboxId| Transition {
        reason: Some("deleted".into()),
        ..tr(id, &[Running], Terminating)
    };
    // Seen as it is, after a TTL renewal that kept its status version.
    let a = admit(s, &org, &prj).await;
    activated(s, &a.id, &pool("p", None), &Quota::default()).await;
    s.mark_running(&a.id, "ref-a", Utc::now()).await.unwrap();
    let renewed = s.renew_ttl(&a.id, 7200, Utc::now()).await.unwrap();
    let now = Utc::now();
    let mut expected = renewed.clone();
    differently_core::accounting::transition(
        &mut expected,
        &[Running],
        Terminating,
        Some("deleted".into()),
        now,
    )
    .unwrap();
    let changed = s
        .transition_seen(t(&a.id), seen_at(&renewed, renewed.status_version), now)
        .await
        .unwrap();
    assert_eq!(changed, expected);
    assert_eq!(get(s, &a.id).await, expected);
    assert_eq!(changed.spec.ttl_seconds, 7200, "the renewal is kept");
    let record = s.audit_tail(1).await.unwrap().remove(0);
    assert_eq!(record.action, "sandbox.terminating");
    assert_eq!(record.resource, a.id.to_string());
    assert_eq!(
        record.detail,
        serde_json::json!({"from": "running", "to": "terminating", "reason": "deleted"})
    );

    // Seen a version behind (it was provisioning then): the change still applies, once.
    let b = admit(s, &org, &prj).await;
    let act = activated(s, &b.id, &pool("p", None), &Quota::default()).await;
    let running = s.mark_running(&b.id, "ref-b", Utc::now()).await.unwrap();
    let changed = s
        .transition_seen(t(&b.id), seen_at(&act, act.status_version), Utc::now())
        .await
        .unwrap();
    assert_eq!(changed.status, Terminating);
    assert_eq!(changed.status_version, running.status_version + 1);
    assert_eq!(get(s, &b.id).await, changed);

    // Seen running, but it is terminating now: refused as the plain change is, nothing written.
    let before = audit_len(s).await;
    let refused = s
        .transition_seen(
            t(&b.id),
            seen_at(&running, running.status_version),
            Utc::now(),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(StoreError::StatusConflict {
                current: Terminating
            })
        ),
        "{refused:?}"
    );
    assert_eq!(get(s, &b.id).await, changed);
    assert_eq!(audit_len(s).await, before);
    let gone = s
        .transition_seen(t(&SandboxId::new()), seen_at(&running, 3), Utc::now())
        .await;
    assert!(matches!(gone, Err(StoreError::NotFound)), "{gone:?}");
    let report = s.verify_audit().await.unwrap();
    assert!(report.ok, "{report:?}");
}
