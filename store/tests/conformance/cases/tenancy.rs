//! Tenancy: the installation, leadership, organizations, projects, keys and quotas.

use super::*;

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
