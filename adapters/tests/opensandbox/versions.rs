//! The adapter against the fake playing OpenSandbox 1.1.1, 1.2 and 1.3 (`fake_versions.rs`):
//! each version's quirks exist in the fake, and the adapter works with every one of them.

use std::time::{Duration, Instant};

use differently_adapters::{Adapter, AdapterError};
use differently_core::ids::InstallationId;
use serde_json::{json, Value};

use crate::fake_server::{FakeRuntime, Variant};
use crate::fake_versions::FakeVersion;
use crate::support::cases::{body, collect};
use crate::{at, cmd, create_req, running, setup, Setup, KEY};

const ALL: [FakeVersion; 3] = [FakeVersion::V1_1_1, FakeVersion::V1_2, FakeVersion::V1_3];

async fn on(version: FakeVersion, runtime: FakeRuntime, extra: Value) -> Setup {
    let s = setup(Variant::Real, runtime, extra).await;
    s.fake.set_version(version);
    s
}

fn fast() -> Value {
    json!({"runtime": "fastsandbox", "templateId": "tpl-1"})
}

/// A raw call to the fake's lifecycle API, as a client other than the adapter would make it.
async fn raw(s: &Setup, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .request(method, format!("{}{path}", s.fake.api_url()))
        .header("OPEN-SANDBOX-API-KEY", KEY);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, v)
}

// ---------------------------------------------------------------------------------------
// The fake's quirks, seen by a plain HTTP client

#[tokio::test]
async fn servers_from_1_2_refuse_unknown_fields_with_fastapi_s_422() {
    for version in ALL {
        let s = on(version, FakeRuntime::Docker, json!({})).await;
        let body = json!({"image": {"uri": "ubuntu:24.04"}, "entrypoint": ["tail", "-f", "/dev/null"],
                          "resourceLimits": {"cpu": "1", "memory": "512Mi"},
                          "metadata": {"a": "b"}, "bogusField": 1});
        let (status, v) = raw(&s, reqwest::Method::POST, "/sandboxes", Some(body)).await;
        if version == FakeVersion::V1_1_1 {
            assert_eq!(status, 202, "1.1.1 ignores unknown fields: {v}");
            continue;
        }
        assert_eq!(status, 422, "{version:?}: {v}");
        let item = &v["detail"][0];
        assert_eq!(item["type"], "extra_forbidden", "{v}");
        assert_eq!(item["loc"], json!(["body", "bogusField"]), "{v}");
        assert_eq!(item["msg"], "Extra inputs are not permitted", "{v}");
        assert!(
            s.fake.sandboxes().is_empty(),
            "nothing created on a refusal"
        );
    }
}

#[tokio::test]
async fn version_1_3_removed_the_devops_diagnostics_routes() {
    for version in ALL {
        let s = on(version, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let path = format!("/sandboxes/{}/diagnostics/summary", r.backend_ref);
        let (status, v) = raw(&s, reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 404, "{version:?}: {v}");
        assert_eq!(v, json!({"detail": "Not Found"}));
        let hits = s.fake.record().removed_route_hits;
        assert_eq!(hits, u32::from(version == FakeVersion::V1_3), "{version:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Detection

#[tokio::test]
async fn the_version_is_asked_once_beside_v1() {
    for version in ALL {
        let s = on(version, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        for _ in 0..3 {
            let out = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
            assert_eq!(out.exit_code, 0);
        }
        s.adapter.health().await.unwrap();
        assert_eq!(s.fake.record().version_asks, 1, "{version:?}");
        let asked_under_v1 = s
            .fake
            .record()
            .requests
            .iter()
            .any(|r| r.ends_with("/v1/version"));
        assert!(!asked_under_v1, "the route is /version, beside /v1");
    }
}

// ---------------------------------------------------------------------------------------
// Bodies: no field the version does not know

/// Every body the adapter sends, on each runtime, passes a server that refuses unknown fields,
/// and nothing touches a route 1.3 removed.
#[tokio::test]
async fn every_body_the_adapter_sends_passes_a_strict_server() {
    let runtimes = [
        (
            FakeRuntime::Docker,
            json!({"egress": "allowlist", "egressAllow": ["pypi.org"]}),
        ),
        (FakeRuntime::Kubernetes, json!({"runtime": "kubernetes"})),
        (FakeRuntime::Fastsandbox, fast()),
    ];
    for version in [FakeVersion::V1_2, FakeVersion::V1_3] {
        for (runtime, extra) in runtimes.clone() {
            let s = on(version, runtime, extra).await;
            s.fake.knobs().registry = true;
            let mut req = create_req(&InstallationId::new());
            req.ttl_seconds = 600;
            if runtime == FakeRuntime::Fastsandbox {
                req.env.clear();
            }
            let r = at(&s.adapter.create(&req).await.unwrap());
            let mut stdin = cmd(&["cat"]);
            stdin.stdin = Some("in".to_owned());
            // `lineEndings: stripped` (execd 1.1) ends the last line.
            assert_eq!(s.adapter.exec(&r, &stdin).await.unwrap().stdout, "in\n");
            s.adapter
                .renew(&r, Duration::from_secs(3600))
                .await
                .unwrap();
            let snap = loop {
                let snap = s.adapter.snapshot(&r, "snp_v").await.unwrap();
                if snap.ready {
                    break snap;
                }
            };
            let mut fork = create_req(&InstallationId::new());
            fork.env.clear();
            fork.from_snapshot = Some(snap.backend_ref.clone());
            s.adapter.create(&fork).await.unwrap();
            let rec = s.fake.record();
            assert_eq!(rec.unknown_field_refusals, 0, "{version:?} {runtime:?}");
            assert_eq!(rec.removed_route_hits, 0, "{version:?} {runtime:?}");
            assert_eq!(rec.create_bodies.len(), 2, "{version:?} {runtime:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// 429 + Retry-After on create

#[tokio::test]
async fn a_throttled_create_waits_out_a_short_retry_after() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    s.fake
        .knobs()
        .throttle_creates
        .extend(["1".to_owned(), "1".to_owned()]);
    let started = Instant::now();
    let inst = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    assert_eq!(s.fake.record().throttled, 2);
    assert_eq!(
        s.fake.record().create_bodies.len(),
        1,
        "one create got through"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "both waits were honoured: {:?}",
        started.elapsed()
    );
    assert_eq!(s.fake.sandbox(&inst.backend_ref).unwrap().state, "Running");
}

#[tokio::test]
async fn a_long_retry_after_comes_back_transient_with_the_wait() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    s.fake.knobs().throttle_creates.push_back("120".to_owned());
    let started = Instant::now();
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(120)));
    assert!(e.to_string().contains("429"), "{e}");
    assert!(!e.to_string().contains(KEY), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a long wait is the worker's, not the adapter's: {:?}",
        started.elapsed()
    );
    assert_eq!(s.fake.record().throttled, 1);
    assert!(s.fake.sandboxes().is_empty());
}

// ---------------------------------------------------------------------------------------
// execd: direct with the sandbox's token from 1.3, the proxy as a setting

#[tokio::test]
async fn execd_is_reached_directly_from_1_3_and_through_the_proxy_before() {
    for version in ALL {
        let s = on(version, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let out = s.adapter.exec(&r, &cmd(&["echo", "hi"])).await.unwrap();
        assert_eq!(out.stdout, "hi\n");
        let rec = s.fake.record();
        if version == FakeVersion::V1_3 {
            assert!(rec.execd_direct > 0, "{version:?}");
            assert_eq!(rec.execd_proxied, 0, "{version:?}");
        } else {
            assert!(rec.execd_proxied > 0, "{version:?}");
            assert_eq!(rec.execd_direct, 0, "{version:?}");
        }
        assert_eq!(rec.key_seen_on_execd, 0, "the API key never goes to execd");
    }
    // The setting wins over the version.
    let s = on(
        FakeVersion::V1_3,
        FakeRuntime::Docker,
        json!({"useServerProxy": true}),
    )
    .await;
    let r = running(&s).await;
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    let rec = s.fake.record();
    assert!(rec.execd_proxied > 0);
    assert_eq!(rec.execd_direct, 0);
}

#[tokio::test]
async fn a_direct_execd_refuses_a_missing_token_on_1_3() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let url = format!(
        "{}/{}/proxy/44772/ping",
        s.fake.execd_origin(),
        r.backend_ref
    );
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("X-EXECD-ACCESS-TOKEN"));
}

#[tokio::test]
async fn a_rotated_execd_token_is_fetched_again() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    let endpoint_calls = |s: &Setup| {
        s.fake
            .record()
            .requests
            .iter()
            .filter(|q| q.contains("/endpoints/44772"))
            .count()
    };
    let before = endpoint_calls(&s);

    // Each kind of execd call after a rotation: a command, one with stdin, a file call.
    s.fake.knobs().execd_key_version += 1;
    let out = s.adapter.exec(&r, &cmd(&["echo", "again"])).await.unwrap();
    assert_eq!(out.stdout, "again\n");
    s.fake.knobs().execd_key_version += 1;
    let mut stdin = cmd(&["cat"]);
    stdin.stdin = Some("piped".to_owned());
    assert_eq!(s.adapter.exec(&r, &stdin).await.unwrap().stdout, "piped\n");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.txt").to_string_lossy().into_owned();
    s.adapter
        .upload(&r, &path, None, body(&[b"data"]))
        .await
        .unwrap();
    s.fake.knobs().execd_key_version += 1;
    let d = s.adapter.download(&r, &path, None).await.unwrap();
    assert_eq!(collect(d).await, b"data");
    assert_eq!(
        endpoint_calls(&s),
        before + 3,
        "one new endpoint per rotation"
    );
}

/// execd runs as PID 1 by default from 1.3 (OSEP-0018); the command API's exit codes,
/// signals and stdin read the same through the direct endpoint and its token.
#[tokio::test]
async fn exit_codes_signals_and_stdin_under_execd_as_init() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let code = |argv: &'static [&'static str]| {
        let s = &s;
        let r = r.clone();
        async move { s.adapter.exec(&r, &cmd(argv)).await.unwrap().exit_code }
    };
    assert_eq!(code(&["true"]).await, 0);
    assert_eq!(code(&["sh", "-c", "exit 3"]).await, 3);
    assert_eq!(code(&["sh", "-c", "kill -KILL $$"]).await, 137);
    let mut stdin = cmd(&["sh", "-c", "cat; exit 5"]);
    stdin.stdin = Some("line one\nline two\n".to_owned());
    let out = s.adapter.exec(&r, &stdin).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (5, "line one\nline two\n")
    );
    let mut slow = cmd(&["sleep", "30"]);
    slow.timeout_seconds = Some(1);
    assert_eq!(s.adapter.exec(&r, &slow).await.unwrap().exit_code, 124);
}

// ---------------------------------------------------------------------------------------
// rootfsOnly snapshots

#[tokio::test]
async fn fast_sandbox_snapshots_are_rootfs_only_from_1_3() {
    for version in ALL {
        let s = on(version, FakeRuntime::Fastsandbox, fast()).await;
        let r = running(&s).await;
        s.adapter.snapshot(&r, "snp_r").await.unwrap();
        let sent = s.fake.record().snapshot_bodies.clone();
        let want = if version == FakeVersion::V1_3 {
            json!([{"name": "snp_r", "mode": "rootfsOnly"}])
        } else {
            json!([{"name": "snp_r"}])
        };
        assert_eq!(json!(sent), want, "{version:?}");
    }
    // Other runtimes keep their one kind of snapshot.
    let s = on(FakeVersion::V1_3, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    s.adapter.snapshot(&r, "snp_d").await.unwrap();
    assert_eq!(
        json!(s.fake.record().snapshot_bodies),
        json!([{"name": "snp_d"}])
    );
}

/// A server replaced by an older one behind the adapter's back: the refused field makes the
/// adapter ask the version again, and the retry sends only what the older one knows.
#[tokio::test]
async fn a_refused_field_makes_the_adapter_ask_the_version_again() {
    let s = on(FakeVersion::V1_3, FakeRuntime::Fastsandbox, fast()).await;
    let r = running(&s).await;
    assert_eq!(s.fake.record().version_asks, 1);
    s.fake.set_version(FakeVersion::V1_2);
    let e = s.adapter.snapshot(&r, "snp_x").await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(e.to_string().contains("body.mode"), "names the field: {e}");
    s.adapter.snapshot(&r, "snp_x").await.unwrap();
    let rec = s.fake.record();
    assert_eq!(rec.version_asks, 2);
    assert_eq!(rec.unknown_field_refusals, 1);
    assert_eq!(rec.snapshot_bodies.last(), Some(&json!({"name": "snp_x"})));
}
