//! Admission: what is admitted, replayed or refused, alone, in groups and at once, and
//! direct placement in the admission.

use super::*;

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
            assert_eq!(
                msg,
                "the org queue quota (maxQueued) of 2 is full: 2 queued"
            )
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
    assert_eq!(
        msg,
        "the project queue quota (maxQueued) of 1 is full: 1 queued"
    );
    assert_eq!(s.get_sandbox(&second.id).await.unwrap(), None);
    assert_eq!(audit_len(s).await, audit_before + 1);

    // Org queue from the defaults (the stored org quota has no maxQueued): 2 queued now.
    let full = Quota {
        max_queued: Some(2),
        ..defs
    };
    let third = sandbox_of_cpu(&org.id, &prj.id, 1);
    let msg = quota_exceeded(s.admit(defaults(full, third.clone())).await);
    assert_eq!(
        msg,
        "the org queue quota (maxQueued) of 2 is full: 2 queued"
    );
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
            "quota: the org queue quota (maxQueued) of 3 is full: 3 queued".into(),
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
