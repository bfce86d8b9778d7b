//! Per pool, the backend version detected and how far its adapter is verified, in
//! `GET /v1/admin/pools` and the trust report (#44 item 6).
//!
//! The OpenSandbox pool talks to a loopback server answering the two routes a health probe
//! uses, shaped as OpenSandbox 1.1.1 answers them: `GET /version` → `{"version":"1.1.1"}`
//! (recorded, see `docs/opensandbox.md`, *Server versions*) and `GET /v1/sandboxes` → a page
//! `{"items":[],"pagination":{…}}` (the lifecycle spec's `ListSandboxesResponse`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// A server saying `version`; counts the `/version` calls.
async fn opensandbox(version: &'static str) -> (String, Arc<AtomicUsize>) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = Router::new()
        .route(
            "/version",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Json(json!({ "version": version })) }
            }),
        )
        .route(
            "/v1/sandboxes",
            get(|| async {
                Json(json!({ "items": [], "pagination": {
                    "page": 1, "pageSize": 1, "totalItems": 0, "totalPages": 0,
                    "hasNextPage": false } }))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), asked)
}

fn pool_named<'a>(items: &'a Value, name: &str) -> &'a Value {
    items
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pool {name} in {items}"))
}

#[tokio::test]
async fn the_fake_pool_is_live_and_says_no_version() {
    let api = crate::support::api().await;
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "local", "kind": "fake",
                    "settings": { "capabilities": ["exec", "exec.stream", "files", "snapshots"] } }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a = api.admin(Method::GET, "/v1/admin/pools", Value::Null).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let fake = pool_named(&a.body["items"], "local");
    assert_eq!(fake["verified"], "live", "{fake}");
    assert!(fake["backendVersion"].is_null(), "{fake}");
    assert!(
        !fake["verifiedBasis"].as_str().unwrap().is_empty(),
        "{fake}"
    );
    // The canonical order of `Capability` (core/src/capability.rs), whatever order the pool's
    // settings list them in.
    assert_eq!(
        fake["capabilities"],
        json!(["exec", "files", "exec.stream", "snapshots"])
    );
    let one = api
        .admin(Method::GET, "/v1/admin/pools/local", Value::Null)
        .await;
    assert_eq!(one.body["verified"], "live", "{}", one.body);
    let report = api
        .admin(Method::GET, "/v1/admin/trust-report", Value::Null)
        .await;
    let fake = pool_named(&report.body["pools"], "local");
    assert_eq!(fake["verified"], "live", "{fake}");
    assert!(fake["backendVersion"].is_null(), "{fake}");
    assert!(fake.get("versions").is_none(), "{fake}");
}

/// Registers `name` over `url` on `runtime`; the key file it answers must outlive the test.
async fn register(
    api: &crate::support::Api,
    name: &str,
    url: &str,
    runtime: &str,
) -> tempfile::NamedTempFile {
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), "test-key\n").unwrap();
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": name, "kind": "opensandbox", "trust": "private",
                    "settings": { "apiURL": url, "runtime": runtime, "trust": "private",
                                  "apiKeyFile": key.path(), "image": "python:3.12" } }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    key
}

async fn served(api: &crate::support::Api, name: &str) -> (Value, Value) {
    let one = api
        .admin(Method::GET, &format!("/v1/admin/pools/{name}"), Value::Null)
        .await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.body);
    let report = api
        .admin(Method::GET, "/v1/admin/trust-report", Value::Null)
        .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.body);
    let entry = pool_named(&report.body["pools"], name).clone();
    (one.body, entry)
}

#[tokio::test]
async fn an_opensandbox_pool_shows_the_version_its_probe_detected() {
    let api = crate::support::api().await;
    let (url, asked) = opensandbox("1.1.1").await;
    let _key = register(&api, "os", &url, "docker").await;

    // Before any call: nothing detected, so nothing claimed.
    let (pool, entry) = served(&api, "os").await;
    assert!(pool["backendVersion"].is_null(), "{pool}");
    assert_eq!(pool["verified"], "unknown", "{pool}");
    assert_eq!(entry["verified"], "unknown", "{entry}");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "GET served must not call out"
    );

    let health = api.pools.get("os").unwrap().probe("test").await;
    assert!(health.healthy, "{:?}", health.error);
    let (pool, entry) = served(&api, "os").await;
    for p in [&pool, &entry] {
        assert_eq!(p["backendVersion"], "1.1.1", "{p}");
        assert_eq!(p["verified"], "live", "{p}");
        assert!(
            p["verifiedBasis"].as_str().unwrap().contains("Docker"),
            "{p}"
        );
    }
    assert!(pool["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c == "exec"));
    // Asked once, kept.
    api.pools.get("os").unwrap().probe("test").await;
    assert_eq!(asked.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_version_checked_only_against_the_fake_says_so() {
    let api = crate::support::api().await;
    let (new, _) = opensandbox("1.3.0").await;
    let (old, _) = opensandbox("1.1.1").await;
    let _k1 = register(&api, "os13", &new, "docker").await;
    let _k2 = register(&api, "os-k8s", &old, "kubernetes").await;
    for name in ["os13", "os-k8s"] {
        api.pools.get(name).unwrap().probe("test").await;
    }
    let (pool, entry) = served(&api, "os13").await;
    for p in [&pool, &entry] {
        assert_eq!(p["backendVersion"], "1.3.0", "{p}");
        assert_eq!(p["verified"], "fake-only", "{p}");
    }
    // 1.1.1 ran live on Docker only.
    let (pool, _) = served(&api, "os-k8s").await;
    assert_eq!(pool["backendVersion"], "1.1.1", "{pool}");
    assert_eq!(pool["verified"], "fake-only", "{pool}");
}

/// In a split deployment the workers probe and the API processes do not: what a worker's
/// probe detected reaches every API process through the stored pool health, and is served
/// in the pool's own fields, not twice in its `health`.
#[tokio::test]
async fn a_version_a_worker_detected_is_shown_by_an_api_that_never_called_the_backend() {
    let api = crate::support::api().await;
    let (url, asked) = opensandbox("1.1.1").await;
    let _key = register(&api, "os", &url, "docker").await;
    // The worker's view: its own adapter, probed, its health reported to the store.
    let records = api.store.list_pools().await.unwrap();
    let (worker_pools, bad) = differently_adapters::pools::PoolSet::from_records(records);
    assert!(bad.is_empty(), "{bad:?}");
    let health = worker_pools.get("os").unwrap().probe("worker:1").await;
    assert!(health.healthy, "{:?}", health.error);
    api.store.report_pool_health(&health).await.unwrap();

    let (pool, entry) = served(&api, "os").await;
    for p in [&pool, &entry] {
        assert_eq!(p["backendVersion"], "1.1.1", "{p}");
        assert_eq!(p["verified"], "live", "{p}");
        assert!(p["health"]["healthy"].as_bool().unwrap(), "{p}");
        assert!(p["health"].get("backend").is_none(), "served twice: {p}");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1, "only the worker asked");
}
