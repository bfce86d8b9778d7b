//! Creating (idempotent, tagged, waiting for a pending sandbox and execd), deleting, listing
//! and renewing sandboxes, and how the server's failures map to adapter errors.

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, AdapterError, InstanceState};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::{FakeRuntime, FakeServer, Variant};
use crate::{at, create_req, key_file, running, settings, setup, KEY};

use super::BOTH;

#[tokio::test]
async fn create_is_idempotent_and_tags_the_sandbox() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let inst_id = InstallationId::new();
        let mut req = create_req(&inst_id);
        req.ttl_seconds = 30;
        let a = s.adapter.create(&req).await.unwrap();
        assert_eq!(a.state, InstanceState::Running);
        let b = s.adapter.create(&req).await.unwrap();
        assert_eq!(a, b, "{variant:?}");
        let bodies = s.fake.record().create_bodies.clone();
        assert_eq!(bodies.len(), 1, "{variant:?}: one backend create");
        let body = &bodies[0];
        assert_eq!(
            body["metadata"]["differently-sandbox-id"],
            req.sandbox_id.as_str()
        );
        assert_eq!(
            body["metadata"]["differently-installation-id"],
            inst_id.as_str()
        );
        assert_eq!(
            body["resourceLimits"],
            json!({"cpu": "2", "memory": "2048Mi"})
        );
        assert_eq!(
            body["timeout"], 60,
            "TTL below OpenSandbox's minimum is raised to 60"
        );
        assert_eq!(body["image"]["uri"], "ubuntu:24.04");
        assert_eq!(body["entrypoint"], json!(["tail", "-f", "/dev/null"]));
        assert_eq!(body["env"]["SANDBOX_VAR"], "from-create");
        assert!(body.get("networkPolicy").is_none());

        let found = s.adapter.find(&req.sandbox_id).await.unwrap();
        assert_eq!(found.as_ref(), Some(&a));
        let listed = s.adapter.list(&inst_id).await.unwrap();
        assert_eq!(listed, vec![a.clone()]);
        assert!(s
            .adapter
            .list(&InstallationId::new())
            .await
            .unwrap()
            .is_empty());

        s.adapter.delete(&req.sandbox_id).await.unwrap();
        assert_eq!(s.adapter.find(&req.sandbox_id).await.unwrap(), None);
        s.adapter.delete(&req.sandbox_id).await.unwrap();
        assert!(s.fake.sandboxes().is_empty());
    }
}

#[tokio::test]
async fn create_waits_for_a_pending_sandbox_and_execd() {
    let s = setup(Variant::Spec, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    let a = s.adapter.create(&req).await.unwrap();
    assert_eq!(s.fake.sandbox(&a.backend_ref).unwrap().state, "Running");
    let reqs = s.fake.record().requests.clone();
    let gets = reqs
        .iter()
        .filter(|r| *r == &format!("GET /v1/sandboxes/{}", a.backend_ref))
        .count();
    assert!(gets >= 3, "polled through Pending: {reqs:?}");
    assert!(
        reqs.iter().any(|r| r.ends_with("/proxy/44772/ping")),
        "pinged execd: {reqs:?}"
    );
}

#[tokio::test]
async fn create_finds_an_earlier_pending_instance_and_clears_a_failed_one() {
    let s = setup(Variant::Spec, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    let meta = BTreeMap::from([
        (
            "differently-sandbox-id".to_owned(),
            req.sandbox_id.as_str().to_owned(),
        ),
        (
            "differently-installation-id".to_owned(),
            req.installation_id.as_str().to_owned(),
        ),
    ]);
    let pending = s.fake.insert(meta.clone(), "Pending");
    let a = s.adapter.create(&req).await.unwrap();
    assert_eq!(a.backend_ref, pending);
    assert!(s.fake.record().create_bodies.is_empty());

    let req2 = create_req(&InstallationId::new());
    let mut meta2 = meta;
    meta2.insert(
        "differently-sandbox-id".to_owned(),
        req2.sandbox_id.as_str().to_owned(),
    );
    let failed = s.fake.insert(meta2, "Failed");
    let b = s.adapter.create(&req2).await.unwrap();
    assert_ne!(b.backend_ref, failed);
    assert!(
        s.fake.sandbox(&failed).is_none(),
        "the failed leftover is deleted"
    );
}

#[tokio::test]
async fn delete_removes_every_instance_of_a_sandbox() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let req = create_req(&InstallationId::new());
    s.adapter.create(&req).await.unwrap();
    // A second instance, as two racing creators could leave.
    s.fake.insert(
        BTreeMap::from([(
            "differently-sandbox-id".to_owned(),
            req.sandbox_id.as_str().to_owned(),
        )]),
        "Running",
    );
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    assert!(s.fake.sandboxes().is_empty());
}

#[tokio::test]
async fn image_pull_failures_name_the_image_and_keep_the_pool_healthy() {
    for (variant, runtime, transient) in [
        (Variant::Real, FakeRuntime::Docker, false),
        (Variant::Spec, FakeRuntime::Docker, false),
        (Variant::Real, FakeRuntime::Kubernetes, true),
    ] {
        let s = setup(variant, runtime, json!({})).await;
        s.fake.knobs().bad_images.push("nosuch/image:1".to_owned());
        let mut req = create_req(&InstallationId::new());
        req.template = Some("nosuch/image:1".to_owned());
        let e = s.adapter.create(&req).await.unwrap_err();
        assert_eq!(
            matches!(e, AdapterError::Transient(_)),
            transient,
            "{variant:?} {runtime:?}: {e:?}"
        );
        assert!(!matches!(e, AdapterError::Unavailable(_)));
        assert!(e.to_string().contains("nosuch/image:1"), "{e}");
        for internal in ["http+docker", "192.0.2.53", "registry-1.docker.io"] {
            assert!(
                !e.to_string().contains(internal),
                "the server's internals are not passed on: {e}"
            );
        }
        s.adapter.health().await.unwrap();
        assert_eq!(
            s.adapter.find(&req.sandbox_id).await.unwrap(),
            None,
            "nothing left behind"
        );
    }
}

#[tokio::test]
async fn lifecycle_errors_map_by_status() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        // 422 (real) or 400 (spec) validation: permanent, naming the field.
        let mut req = create_req(&InstallationId::new());
        req.resources.cpu = 0;
        let e = s.adapter.create(&req).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::Permanent(m) if m.contains("resourceLimits")),
            "{variant:?}: {e:?}"
        );
        // 5xx: transient, and the retry works.
        s.fake
            .knobs()
            .fail_next
            .push_back(("/sandboxes".to_owned(), 503));
        let req = create_req(&InstallationId::new());
        assert!(matches!(
            s.adapter.create(&req).await,
            Err(AdapterError::Transient(_))
        ));
        let inst = s.adapter.create(&req).await.unwrap();
        // 404: not found.
        s.fake
            .knobs()
            .fail_next
            .push_back(("/pause".to_owned(), 404));
        assert_eq!(
            s.adapter.pause(&at(&inst)).await,
            Err(AdapterError::NotFound)
        );
        // 409 from a second pause is not an error; a 409 for another reason is.
        s.adapter.pause(&at(&inst)).await.unwrap();
        s.adapter.pause(&at(&inst)).await.unwrap();
        let e = s.adapter.snapshot(&at(&inst), "snp_1").await.unwrap_err();
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
        s.adapter.resume(&at(&inst)).await.unwrap();
        s.adapter.resume(&at(&inst)).await.unwrap();
    }
}

#[tokio::test]
async fn slow_and_unreachable_servers() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"timeouts": {"requestSeconds": 1}}),
    )
    .await;
    s.fake.knobs().delay_ms = 1500;
    let e = s.adapter.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Transient(m) if m.contains("timed out")),
        "{e:?}"
    );
    s.fake.knobs().delay_ms = 0;
    s.adapter.health().await.unwrap();

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let key = key_file(KEY);
    let cfg: OpenSandboxConfig =
        serde_json::from_value(settings(&format!("http://{addr}/v1"), &key, json!({}))).unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();
    assert!(matches!(
        a.health().await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.find(&SandboxId::new()).await,
        Err(AdapterError::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_wrong_api_url_is_not_a_missing_sandbox() {
    let fake = FakeServer::start(Variant::Real, FakeRuntime::Docker, KEY).await;
    let key = key_file(KEY);
    let url = fake.api_url().replace("/v1", "/v2");
    let cfg: OpenSandboxConfig = serde_json::from_value(settings(&url, &key, json!({}))).unwrap();
    let a = OpenSandboxAdapter::new(cfg).unwrap();
    let e = a.health().await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("apiURL")),
        "{e:?}"
    );
}

#[tokio::test]
async fn orphans_are_listed_for_the_reaper() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let installation = InstallationId::new();
    let orphan = SandboxId::new();
    let backend = s.fake.insert(
        BTreeMap::from([
            (
                "differently-sandbox-id".to_owned(),
                orphan.as_str().to_owned(),
            ),
            (
                "differently-installation-id".to_owned(),
                installation.as_str().to_owned(),
            ),
        ]),
        "Running",
    );
    // Someone else's sandbox and an untagged one are not ours.
    s.fake.insert(
        BTreeMap::from([(
            "differently-installation-id".to_owned(),
            "inst_other".to_owned(),
        )]),
        "Running",
    );
    s.fake.insert(BTreeMap::new(), "Running");
    let listed = s.adapter.list(&installation).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].sandbox_id, orphan);
    assert_eq!(listed[0].backend_ref, backend);
    s.adapter.delete(&orphan).await.unwrap();
    assert_eq!(s.fake.sandboxes().len(), 2);
}

#[tokio::test]
async fn list_follows_pages() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let installation = InstallationId::new();
    for _ in 0..205 {
        s.fake.insert(
            BTreeMap::from([
                (
                    "differently-sandbox-id".to_owned(),
                    SandboxId::new().as_str().to_owned(),
                ),
                (
                    "differently-installation-id".to_owned(),
                    installation.as_str().to_owned(),
                ),
            ]),
            "Running",
        );
    }
    assert_eq!(s.adapter.list(&installation).await.unwrap().len(), 205);
}

#[tokio::test]
async fn renew_moves_the_backstop_past_our_expiry() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        s.adapter
            .renew(&r, Duration::from_secs(3600))
            .await
            .unwrap();
        let exp = s.fake.sandbox(&r.backend_ref).unwrap().expires_at.unwrap();
        let want = chrono::Utc::now() + chrono::Duration::seconds(3900);
        assert!((exp - want).num_seconds().abs() < 10, "{exp} vs {want}");
        // Shortening: the spec's server refuses an earlier time; the later backstop stays.
        s.adapter.renew(&r, Duration::from_secs(60)).await.unwrap();
    }
}
