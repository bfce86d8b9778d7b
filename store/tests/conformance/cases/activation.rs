//! Activation: quotas and pool caps as placement checks them, and the usage they count.

use super::*;

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
