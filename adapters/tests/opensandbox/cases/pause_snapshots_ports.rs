//! Pausing and resuming (or stopping, on Kubernetes), snapshots and restore, ports, the Fast
//! Sandbox runtime (templates, pool size, the clock, an idle paused microVM), and what only the
//! real server does (routes without `/v1`, the unauthenticated proxy, execd's token).

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, AdapterError, InstanceState};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::{FakeRuntime, Variant};
use crate::{at, cmd, create_req, running, settings, setup};

use super::BOTH;

#[tokio::test]
async fn pause_and_resume_keep_the_sandbox() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        s.adapter.pause(&r).await.unwrap();
        assert_eq!(
            s.adapter.find(&r.sandbox_id).await.unwrap().unwrap().state,
            InstanceState::Paused
        );
        let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
        assert!(e.is_retryable(), "{e:?}");
        s.adapter.resume(&r).await.unwrap();
        assert_eq!(
            s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
            0
        );
        assert!(matches!(
            s.adapter.stop(&r).await,
            Err(AdapterError::Unsupported(_))
        ));
        assert!(matches!(
            s.adapter.start(&r).await,
            Err(AdapterError::Unsupported(_))
        ));
    }
}

#[tokio::test]
async fn kubernetes_stops_instead_of_pausing() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Kubernetes,
        json!({"runtime": "kubernetes"}),
    )
    .await;
    let r = running(&s).await;
    assert!(matches!(
        s.adapter.pause(&r).await,
        Err(AdapterError::Unsupported(_))
    ));
    s.adapter.stop(&r).await.unwrap();
    assert_eq!(
        s.adapter.find(&r.sandbox_id).await.unwrap().unwrap().state,
        InstanceState::Stopped
    );
    s.adapter.start(&r).await.unwrap();
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // No snapshot registry: OpenSandbox's RegistryNotConfigured is unsupported_operation.
    let e = s.adapter.snapshot(&r, "snp_1").await.unwrap_err();
    assert!(matches!(e, AdapterError::Unsupported(_)), "{e:?}");
    s.fake.knobs().registry = true;
    s.adapter.snapshot(&r, "snp_1").await.unwrap();
}

#[tokio::test]
async fn snapshots_and_restore() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let first = s.adapter.snapshot(&r, "snp_a").await.unwrap();
        assert!(!first.ready);
        let e = s
            .adapter
            .delete_snapshot(&first.backend_ref)
            .await
            .unwrap_err();
        assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
        if variant == Variant::Real {
            // The operator is told which of the two refusals it was.
            assert!(
                e.to_string()
                    .contains("still being written (SNAPSHOT::INVALID_STATE)"),
                "{e}"
            );
        }
        let mut info = first.clone();
        for _ in 0..10 {
            if info.ready {
                break;
            }
            info = s.adapter.snapshot(&r, "snp_a").await.unwrap();
        }
        assert!(info.ready);
        assert_eq!(
            info.backend_ref, first.backend_ref,
            "idempotent on the snapshot id"
        );
        assert_eq!(s.fake.snapshot_names().len(), 1);

        let mut req = create_req(&InstallationId::new());
        req.from_snapshot = Some(info.backend_ref.clone());
        let restored = s.adapter.create(&req).await.unwrap();
        let body = s.fake.record().create_bodies.last().unwrap().clone();
        assert_eq!(body["snapshotId"], info.backend_ref.as_str());
        assert!(body.get("image").is_none() && body.get("entrypoint").is_none());
        assert_eq!(
            s.fake
                .sandbox(&restored.backend_ref)
                .unwrap()
                .snapshot_id
                .as_deref(),
            Some(info.backend_ref.as_str())
        );

        // Recorded on the real server: while a sandbox restored from it exists, the delete is
        // refused (409 DELETE_CONFLICT), which is worth retrying, not final.
        if variant == Variant::Real {
            let e = s
                .adapter
                .delete_snapshot(&info.backend_ref)
                .await
                .unwrap_err();
            assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
            assert!(
                e.to_string()
                    .contains("in use by a sandbox restored from it"),
                "{e}"
            );
        }
        s.adapter.delete(&req.sandbox_id).await.unwrap();
        s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
        s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
        assert!(s.fake.snapshot_names().is_empty());
    }
}

#[tokio::test]
async fn ports_only_where_configured_and_never_with_headers() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    assert!(matches!(
        s.adapter.expose_port(&r, 8080, None).await,
        Err(AdapterError::Unsupported(_))
    ));

    let s = setup(
        Variant::Real,
        FakeRuntime::Kubernetes,
        json!({"runtime": "kubernetes", "ports": "signed"}),
    )
    .await;
    let r = running(&s).await;
    let body = s.fake.record().create_bodies[0].clone();
    assert_eq!(body["secureAccess"], true);
    let ep = s
        .adapter
        .expose_port(&r, 3000, Some(Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(
        ep.url.starts_with("https://gateway.example.test/"),
        "{}",
        ep.url
    );
    let exp = ep.expires_at.unwrap();
    assert!((exp - chrono::Utc::now()).num_seconds().abs() - 600 < 10);
    assert!(ep.url.contains(&exp.timestamp().to_string()));
    s.fake.knobs().endpoint_headers = BTreeMap::from([("X-Secure".to_owned(), "t".to_owned())]);
    assert!(matches!(
        s.adapter.expose_port(&r, 3000, None).await,
        Err(AdapterError::Permanent(_))
    ));

    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1", "features": "exec,ports.expose"}),
    )
    .await;
    let r = running(&s).await;
    let ep = s.adapter.expose_port(&r, 6080, None).await.unwrap();
    assert_eq!(
        ep.url,
        format!("https://gateway.example.test/scope-{}-6080", r.backend_ref)
    );
    assert_eq!(ep.expires_at, None);
}

#[tokio::test]
async fn fast_sandbox_uses_templates_pool_size_and_sets_the_clock() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1", "poolCPU": "2", "poolMemory": "4Gi",
               "egress": "allowlist", "egressAllow": ["pypi.org"]}),
    )
    .await;
    let installation = InstallationId::new();
    let mut req = create_req(&installation);
    assert!(
        matches!(s.adapter.create(&req).await, Err(AdapterError::Permanent(m)) if m.contains("env"))
    );
    req.env.clear();
    req.ttl_seconds = 0;
    let inst = s.adapter.create(&req).await.unwrap();
    let body = s.fake.record().create_bodies.last().unwrap().clone();
    assert_eq!(body["templateId"], "tpl-1");
    assert_eq!(body["timeout"], 86400);
    assert_eq!(
        body["networkPolicy"],
        json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]})
    );
    for f in [
        "image",
        "entrypoint",
        "resourceLimits",
        "env",
        "secureAccess",
    ] {
        assert!(body.get(f).is_none(), "{f} sent in template mode");
    }
    let clock = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(clock.starts_with("date -u -s @"), "{clock}");

    let snap = loop {
        let i = s.adapter.snapshot(&at(&inst), "snp_f").await.unwrap();
        if i.ready {
            break i;
        }
    };
    let mut restore = create_req(&installation);
    restore.env.clear();
    restore.from_snapshot = Some(snap.backend_ref.clone());
    s.adapter.create(&restore).await.unwrap();
    let body = s.fake.record().create_bodies.last().unwrap().clone();
    assert_eq!(body["resourceLimits"], json!({"cpu": "2", "memory": "4Gi"}));

    let mut other = create_req(&installation);
    other.env.clear();
    other.template = Some("tpl-2".to_owned());
    assert!(matches!(
        s.adapter.create(&other).await,
        Err(AdapterError::Permanent(_))
    ));

    s.adapter.pause(&at(&inst)).await.unwrap();
    s.adapter.resume(&at(&inst)).await.unwrap();
    let clock = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        clock.starts_with("date -u -s @"),
        "clock set after resume: {clock}"
    );
}

#[tokio::test]
async fn routes_without_v1_and_the_unauthenticated_proxy_are_real_server_only() {
    for (variant, works, proxy_status) in [(Variant::Real, true, 200), (Variant::Spec, false, 401)]
    {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let cfg: OpenSandboxConfig = serde_json::from_value(settings(
            s.fake.api_url().trim_end_matches("/v1"),
            &s.key,
            json!({}),
        ))
        .unwrap();
        let bare = OpenSandboxAdapter::new(cfg).unwrap();
        let res = bare.health().await;
        assert_eq!(res.is_ok(), works, "{variant:?}: {res:?}");
        if !works {
            assert!(
                matches!(&res, Err(AdapterError::Permanent(m)) if m.contains("apiURL")),
                "{res:?}"
            );
        }
        let url = format!(
            "{}/sandboxes/{}/proxy/44772/ping",
            s.fake.api_url(),
            r.backend_ref
        );
        let status = reqwest::get(url).await.unwrap().status().as_u16();
        assert_eq!(status, proxy_status, "{variant:?}: proxy without the key");
    }
}

#[tokio::test]
async fn execd_refusing_its_token_is_permanent() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    let r = running(&s).await;
    s.fake.knobs().execd_token = Some("needed".to_owned());
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("access token")),
        "{e:?}"
    );
}

#[tokio::test]
async fn fast_sandbox_exec_resumes_an_idle_paused_microvm() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Fastsandbox,
        json!({"runtime": "fastsandbox", "templateId": "tpl-1"}),
    )
    .await;
    let r = running(&s).await;
    s.fake.set_state(&r.backend_ref, "Paused");
    let out = s.adapter.exec(&r, &cmd(&["echo", "awake"])).await.unwrap();
    assert_eq!(out.stdout, "awake\n");
    assert_eq!(s.fake.sandbox(&r.backend_ref).unwrap().state, "Running");
    // Docker does not resume behind the caller's back.
    let d = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&d).await;
    d.fake.set_state(&r.backend_ref, "Paused");
    assert!(d
        .adapter
        .exec(&r, &cmd(&["true"]))
        .await
        .unwrap_err()
        .is_retryable());
    assert_eq!(d.fake.sandbox(&r.backend_ref).unwrap().state, "Paused");
}

#[tokio::test]
async fn exit_code_from_command_status_and_missing_sandboxes() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    s.fake.knobs().evalue_text = true;
    let out = s
        .adapter
        .exec(&r, &cmd(&["sh", "-c", "exit 5"]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 5);
    assert!(s
        .fake
        .record()
        .requests
        .iter()
        .any(|q| q.contains("/command/status/")));

    // The sandbox is gone: exec through a cached endpoint and through a fresh lookup.
    s.adapter.delete(&r.sandbox_id).await.unwrap();
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
    let fresh = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let gone = differently_adapters::InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "doesnotexist".to_owned(),
    };
    assert_eq!(
        fresh
            .adapter
            .exec(&gone, &cmd(&["true"]))
            .await
            .unwrap_err(),
        AdapterError::NotFound
    );
    assert_eq!(
        fresh.adapter.pause(&gone).await.unwrap_err(),
        AdapterError::NotFound
    );
    assert!(matches!(
        fresh.adapter.list_files(&gone, "/", 1).await,
        Err(AdapterError::NotFound)
    ));
}
