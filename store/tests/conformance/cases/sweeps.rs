//! What the sweeps and listings select: stale, expired, runnable, listed against the
//! backend, and pages.

use super::*;

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
