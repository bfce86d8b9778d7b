//! Orgs, projects, keys, quotas, policies and the admin routes, through the client.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenancy_quotas_policies_and_admin_routes() {
    let dev = Dev::start();
    let c = dev.client();
    let org = c.create_org("acme", None).await.expect("org");
    let project = c
        .create_project(Some(&org.id), "web", None)
        .await
        .expect("project");
    assert_eq!(project.org_id, org.id);
    let projects: Vec<_> = c
        .list_projects(Some(&org.id))
        .try_collect()
        .await
        .expect("projects");
    assert_eq!(
        projects.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["web"]
    );
    let renamed = c.rename_project(&project.id, "site").await.expect("rename");
    assert_eq!(renamed.name, "site");
    assert_eq!(c.get_project(&project.id).await.expect("get").name, "site");
    let orgs: Vec<_> = c.list_orgs().try_collect().await.expect("orgs");
    assert!(orgs.iter().any(|o| o.id == org.id));
    let suspended = c
        .update_org(
            &org.id,
            &UpdateOrg {
                status: Some("suspended".into()),
                name: None,
            },
        )
        .await
        .expect("suspend");
    assert_eq!(suspended.status, "suspended");
    c.update_org(
        &org.id,
        &UpdateOrg {
            status: Some("active".into()),
            name: None,
        },
    )
    .await
    .expect("reactivate");
    assert_eq!(c.get_org(&org.id).await.expect("get org").status, "active");

    // A key for the project: it works, it is in the list, revoking it ends it.
    let created = c
        .create_key(
            &CreateKey {
                org_id: Some(org.id.clone()),
                project_id: Some(project.id.clone()),
                name: "ci".into(),
                scopes: vec!["sandboxes:read".into(), "sandboxes:write".into()],
                expires_at: None,
            },
            None,
        )
        .await
        .expect("key");
    assert!(
        !format!("{created:?}").contains(&created.key),
        "Debug shows the secret"
    );
    let as_tenant = Client::new(&dev.url, &created.key).expect("tenant client");
    let none: Vec<_> = as_tenant
        .list_sandboxes(&SandboxFilter::default())
        .try_collect()
        .await
        .expect("tenant list");
    assert!(none.is_empty());
    let keys: Vec<_> = c
        .list_keys(Some(&org.id))
        .try_collect()
        .await
        .expect("keys");
    assert_eq!(
        keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
        [created.record.id.as_str()]
    );
    assert_eq!(
        c.get_key(&created.record.id).await.expect("get key").name,
        "ci"
    );
    let revoked = c.revoke_key(&created.record.id).await.expect("revoke");
    assert!(revoked.revoked_at.is_some());
    let e = as_tenant
        .list_sandboxes_page(&SandboxFilter::default(), None)
        .await
        .expect_err("revoked");
    assert_eq!(
        (e.status(), e.code()),
        (Some(401), Some("unauthenticated")),
        "{e}"
    );

    // Quotas and policies.
    let q = c
        .put_quota(
            Scope::Org(&org.id),
            &Quota {
                max_active: Some(3),
                ..Quota::default()
            },
        )
        .await
        .expect("put quota");
    assert_eq!(q.quota.max_active, Some(3));
    assert_eq!(
        c.quota(Scope::Org(&org.id))
            .await
            .expect("quota")
            .effective
            .max_active,
        Some(3)
    );
    let pq = c
        .put_quota(
            Scope::Project(&project.id),
            &Quota {
                max_active: Some(2),
                ..Quota::default()
            },
        )
        .await
        .expect("project quota");
    assert_eq!(pq.effective.max_active, Some(2));
    let mut policy = c.policy(Scope::Global).await.expect("global policy");
    policy.denied_pools = Some(vec!["elsewhere".into()]);
    let put = c
        .put_policy(Scope::Global, &policy)
        .await
        .expect("put global");
    assert_eq!(
        put.denied_pools.as_deref(),
        Some(&["elsewhere".to_owned()][..])
    );
    let org_policy = differently_client::Policy {
        allowed_classifications: Some(vec!["internal".into()]),
        ..Default::default()
    };
    c.put_policy(Scope::Org(&org.id), &org_policy)
        .await
        .expect("org policy");
    assert_eq!(
        c.policy(Scope::Org(&org.id)).await.expect("read"),
        org_policy
    );
    c.put_policy(Scope::Project(&project.id), &org_policy)
        .await
        .expect("project policy");
    assert_eq!(
        c.policy(Scope::Project(&project.id)).await.expect("read"),
        org_policy
    );
    let e = c
        .put_quota(Scope::Org("org_bad"), &Quota::default())
        .await
        .expect_err("bad id");
    assert!(matches!(e.status(), Some(400 | 404 | 422)), "{e}");

    c.delete_project(&project.id).await.expect("delete project");
    c.delete_org(&org.id).await.expect("delete org");
    assert_eq!(
        c.get_org(&org.id).await.expect_err("gone").status(),
        Some(404)
    );

    // Operators' routes.
    let pools: Vec<_> = c.list_pools().try_collect().await.expect("pools");
    assert_eq!(
        pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["local"]
    );
    assert_eq!(c.get_pool("local").await.expect("pool").kind, "devhost");
    let made = c
        .create_pool(&differently_client::PoolRequest {
            name: Some("extra".into()),
            kind: Some("fake".into()),
            ..Default::default()
        })
        .await
        .expect("create pool");
    assert_eq!(
        (made["name"].as_str(), made["source"].as_str()),
        (Some("extra"), Some("api"))
    );
    let changed = c
        .update_pool(
            "extra",
            &differently_client::PoolRequest {
                max_concurrent: Some(4),
                ..Default::default()
            },
        )
        .await
        .expect("update pool");
    assert_eq!(changed["maxConcurrent"], 4, "{changed}");
    c.delete_pool("extra").await.expect("delete pool");
    assert_eq!(
        c.get_pool("extra").await.expect_err("gone").status(),
        Some(404)
    );
    // Warm classes of the dev pool: put, read back with counts, refused when invalid.
    let put = c
        .put_warm_classes(
            "local",
            &[differently_client::WarmClass {
                name: "default".into(),
                size: 0,
                refill_per_second: 1.0,
                ..Default::default()
            }],
        )
        .await
        .expect("put warm classes");
    assert_eq!(put.classes.len(), 1, "{put:?}");
    assert_eq!(put.classes[0].class.max_age_seconds, Some(3600));
    assert_eq!(put.classes[0].ready, 0);
    assert_eq!(c.warm_classes("local").await.expect("warm"), put);
    let bad = c
        .put_warm_classes(
            "local",
            &[differently_client::WarmClass {
                name: "Bad".into(),
                refill_per_second: 1.0,
                ..Default::default()
            }],
        )
        .await
        .expect_err("bad name");
    assert_eq!(bad.status(), Some(422), "{bad}");
    assert_eq!(
        c.warm_classes("nope").await.expect_err("no pool").status(),
        Some(404)
    );
    let none: &[differently_client::WarmClass] = &[];
    c.put_warm_classes("local", none).await.expect("clear");
    assert_eq!(c.ready().await.expect("ready")["status"], "ready");
    let secret = c
        .put_secret("backend-token", "s3cr3t-value")
        .await
        .expect("secret");
    assert!(!secret.to_string().contains("s3cr3t-value"), "{secret}");
    let secrets: Vec<_> = c.list_secrets().try_collect().await.expect("secrets");
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    let report = c.trust_report().await.expect("trust report");
    assert!(report["pools"].is_array(), "{report}");
    let audit: Vec<_> = c
        .list_audit(&AuditFilter {
            org_id: Some(org.id.clone()),
            action: Some("org.create".into()),
            ..AuditFilter::default()
        })
        .try_collect()
        .await
        .expect("audit");
    assert_eq!(audit.len(), 1, "{audit:?}");
    let verified = c.verify_audit().await.expect("verify");
    assert_eq!(verified["ok"], true, "{verified}");
    let mut export = Vec::new();
    let n = c.export_audit(&mut export).await.expect("export");
    assert_eq!(n as usize, export.len());
    let lines = String::from_utf8(export).expect("utf8");
    assert!(lines.lines().count() > 5, "{lines}");
    for line in lines.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("a JSON line");
    }
    let first = c.checkpoint_audit().await.expect("checkpoint");
    assert!(
        first.is_some(),
        "records since the start: a checkpoint is written"
    );
    assert_eq!(
        c.checkpoint_audit().await.expect("again"),
        None,
        "nothing changed: 204"
    );
    let e = c
        .segment_audit("drill")
        .await
        .expect_err("all signatures verify");
    assert_eq!(e.status(), Some(409), "{e}");
}
