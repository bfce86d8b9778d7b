//! Placement policy end to end with a private and an external pool: classification,
//! region and strategy decide as configured; explanations name excluded pools and why;
//! dry-run matches the real decision; an unhealthy pool gets no new work and fails nothing.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{eventually, Cluster, Opts};
use crate::tenancy::{tenant, Tenant};

const MORE_POOLS: &str = r#"
[[pools]]
name = "ext"
kind = "fake"
trust = "external"
region = "us"
cost_per_cpu_hour = 0.01

[pools.settings]
ledger = "{ledger}"
"#;

async fn create(c: &Cluster, t: &Tenant, body: Value) -> (u16, Value) {
    let mut body = body;
    body["projectId"] = json!(t.project);
    c.call(&t.key, Method::POST, "/v1/sandboxes", Some(body))
        .await
}

async fn placed_on(c: &Cluster, t: &Tenant, body: Value) -> (String, String) {
    let (s, b) = create(c, t, body.clone()).await;
    assert_eq!(s, 202, "{body} -> {b}");
    let id = b["id"].as_str().unwrap().to_owned();
    let (_, r) = c
        .call(
            &t.key,
            Method::GET,
            &format!("/v1/sandboxes/{id}/wait?status=running&timeoutSeconds=20"),
            None,
        )
        .await;
    assert_eq!(r["status"], "running", "{body} -> {r}\n{}", c.logs());
    (id, r["pool"].as_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_decides_and_explains() {
    let extra = "".to_owned();
    let c = Cluster::started(Opts {
        more_pools: MORE_POOLS.to_owned(),
        extra_toml: extra,
        ..Opts::default()
    })
    .await;
    let admin = c.key.clone();
    let a = tenant(&c, "org-a").await;
    let b = tenant(&c, "org-b").await;
    // The fake pool of the harness is private with no region; give it one through config? It
    // has none, so region-constrained requests can only go where a region is declared.
    // Before any policy allows external pools, a request only the external pool can serve is
    // refused; once allowed (below), the very next create takes it: the create's policy view
    // is cleared by the write, not left to expire.
    let (s, e) = create(&c, &a, json!({"classification": "public", "region": "us"})).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = c
        .call(
            &admin,
            Method::PUT,
            "/v1/admin/policies/global",
            Some(json!({"allowExternal": true, "externalPools": ["ext"]})),
        )
        .await;
    assert_eq!(s, 200, "{e}");
    for (path, body) in [
        (
            format!("/v1/orgs/{}/policy", a.org),
            json!({"allowExternal": true}),
        ),
        (
            format!("/v1/projects/{}/policy", a.project),
            json!({"allowExternal": true}),
        ),
    ] {
        let (s, e) = c.call(&admin, Method::PUT, &path, Some(body)).await;
        assert_eq!(s, 200, "{path}: {e}");
    }
    let (_, pool) = placed_on(&c, &a, json!({"classification": "public", "region": "us"})).await;
    assert_eq!(pool, "ext", "the policy written a moment ago applies");

    // Public data, cheapest first, external allowed at every level: the cheap external pool.
    let (_, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "ext");
    // Confidential data never leaves private pools, whatever the ranking says.
    let (conf, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "confidential", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "fake");
    let (s, why) = c
        .call(
            &a.key,
            Method::GET,
            &format!("/v1/sandboxes/{conf}/placement"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{why}");
    let ext = why["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ext")
        .unwrap()
        .clone();
    assert_eq!(ext["eligible"], false, "{why}");
    assert!(
        ext["reason"].as_str().unwrap().contains("confidential"),
        "{why}"
    );
    // Private-first (the default) prefers the private pool even when it costs more.
    let (_, pool) = placed_on(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(pool, "fake");
    // Region is a hard constraint.
    let (_, pool) = placed_on(&c, &a, json!({"classification": "public", "region": "us"})).await;
    assert_eq!(pool, "ext");
    let (s, e) = create(&c, &a, json!({"region": "mars"})).await;
    assert_eq!(s, 422, "{e}");
    assert_eq!(e["error"]["code"], "no_eligible_pool");
    // Org B never allowed external placement: the external pool is out of reach.
    let (_, pool) = placed_on(
        &c,
        &b,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "fake");
    let (s, e) = create(
        &c,
        &b,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert_eq!(e["error"]["code"], "no_eligible_pool");

    // Dry-run gives the decision a create would get, and writes nothing.
    let body = json!({"projectId": a.project, "classification": "public", "strategy": "cheapest"});
    let (s, dry) = c
        .call(&a.key, Method::POST, "/v1/placement/dry-run", Some(body))
        .await;
    assert_eq!(s, 200, "{dry}");
    assert_eq!(dry["decision"], "placed");
    assert_eq!(dry["pool"], "ext");
    let (_, dry) = c
        .call(
            &b.key,
            Method::POST,
            "/v1/placement/dry-run",
            Some(json!({"projectId": b.project, "region": "mars"})),
        )
        .await;
    assert_eq!(dry["decision"], "rejected", "{dry}");
    assert_eq!(dry["code"], "no_eligible_pool");

    // Bad input names the field.
    for (body, code, field) in [
        (
            json!({"capabilities": ["teleport"]}),
            "unsupported_capability",
            "capabilities",
        ),
        (
            json!({"strategy": "random"}),
            "validation_failed",
            "strategy",
        ),
        (
            json!({"classification": "secret"}),
            "validation_failed",
            "classification",
        ),
        (
            json!({"external": "sometimes"}),
            "validation_failed",
            "external",
        ),
    ] {
        let (s, e) = create(&c, &a, body.clone()).await;
        assert_eq!(s, 422, "{body} -> {e}");
        assert_eq!(e["error"]["code"], code, "{body} -> {e}");
        assert_eq!(e["error"]["details"]["field"], field, "{body} -> {e}");
    }
    let (s, e) = c
        .call(
            &admin,
            Method::PUT,
            "/v1/admin/policies/global",
            Some(json!({"allowedClassifications": ["top-secret"]})),
        )
        .await;
    assert_eq!(s, 422, "{e}");
    let (s, _) = c
        .call(
            &a.key,
            Method::PUT,
            &format!("/v1/orgs/{}/policy", a.org),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 403, "tenants cannot change policy");

    // The trust report lists who went external, where, and under which policy.
    let (s, report) = c
        .call(&admin, Method::GET, "/v1/admin/trust-report", None)
        .await;
    assert_eq!(s, 200, "{report}");
    let ext_pool = report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ext")
        .unwrap()
        .clone();
    assert_eq!(ext_pool["trust"], "external");
    let placements = report["externalPlacements"].as_array().unwrap();
    assert_eq!(placements.len(), 1, "only org A went external: {report}");
    assert_eq!(placements[0]["orgId"], a.org.as_str());
    assert_eq!(placements[0]["orgName"], "org-a");
    assert_eq!(placements[0]["pool"], "ext");
    assert_eq!(placements[0]["sandboxes"], 3, "{report}");
    assert!(placements[0]["policy"].is_object(), "{report}");
    assert_eq!(report["telemetry"], "none");
    assert!(!report["notEnforced"].as_array().unwrap().is_empty());
    let (s, _) = c
        .call(&a.key, Method::GET, "/v1/admin/trust-report", None)
        .await;
    assert_eq!(s, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_pool_gets_no_new_work_and_fails_nothing() {
    let c = Cluster::started(Opts::default()).await;
    let admin = c.key.clone();
    let a = tenant(&c, "org-a").await;
    let ledger = c.ledger.display().to_string();
    // A cheaper private pool registered through the API; the workers pick it up.
    let (s, p) = c
        .call(
            &admin,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({"name": "cheap", "kind": "fake", "costPerCpuHour": 0.001, "settings": {"ledger": ledger}})),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    assert_eq!(p["source"], "api");
    assert_eq!(p["trust"], "private");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, info) = c
            .call(&admin, Method::GET, "/v1/admin/pools/cheap", None)
            .await;
        if info["healthy"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new pool never became healthy: {info}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (first, pool) = placed_on(&c, &a, json!({"strategy": "cheapest"})).await;
    assert_eq!(pool, "cheap");

    // Its backend stops answering.
    let (s, e) = c
        .call(
            &admin,
            Method::PATCH,
            "/v1/admin/pools/cheap",
            Some(json!({"settings": {"ledger": ledger, "unavailable": true}})),
        )
        .await;
    assert_eq!(s, 200, "{e}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, info) = c
            .call(&admin, Method::GET, "/v1/admin/pools/cheap", None)
            .await;
        if info["healthy"] == false {
            assert!(info["health"]["error"].is_string(), "{info}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never went unhealthy: {info}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The API process saw it; every other process re-reads the shared health view within one
    // sync interval (2 s). Placement in the scheduler process follows that view: wait until
    // the scheduler says it took the change up.
    let seen = eventually(Duration::from_secs(20), || {
        c.pool_changes("scheduler", "cheap", Some(false)) >= 1
    })
    .await;
    assert!(
        seen,
        "the scheduler never saw cheap go unhealthy\n{}",
        c.logs()
    );
    let (_, pool) = placed_on(&c, &a, json!({"strategy": "cheapest"})).await;
    assert_eq!(pool, "fake", "new work goes elsewhere");
    let (_, r) = c
        .call(&a.key, Method::GET, &format!("/v1/sandboxes/{first}"), None)
        .await;
    assert_eq!(
        r["status"], "running",
        "nothing already running is failed for it"
    );

    // Config pools are read-only through the API; bad registrations name the field.
    let (s, _) = c
        .call(&admin, Method::DELETE, "/v1/admin/pools/fake", None)
        .await;
    assert_eq!(s, 409);
    for (body, field) in [
        (json!({"name": "Bad Name", "kind": "fake"}), "name"),
        (
            json!({"name": "ds", "kind": "daytona", "trust": "private"}),
            "trust",
        ),
        (json!({"name": "os", "kind": "opensandbox"}), "trust"),
        (
            json!({"name": "x", "kind": "fake", "maxConcurrent": 0}),
            "maxConcurrent",
        ),
        (json!({"name": "y", "kind": "nope"}), "kind"),
        (
            json!({"name": "z", "kind": "fake", "settings": {"latencyMs": "slow"}}),
            "settings.latencyMs",
        ),
    ] {
        let (s, e) = c
            .call(&admin, Method::POST, "/v1/admin/pools", Some(body.clone()))
            .await;
        assert_eq!(s, 422, "{body} -> {e}");
        assert_eq!(e["error"]["details"]["field"], field, "{body} -> {e}");
    }
    let (s, _) = c.call(&a.key, Method::GET, "/v1/admin/pools", None).await;
    assert_eq!(s, 403);
}

/// A pool changed through the admin API is used by the worker's next call without a
/// restart: after its fake ledger is pointed at another file, the next create lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_pool_is_used_by_the_running_worker() {
    let c = Cluster::started(Opts::default()).await;
    let admin = c.key.clone();
    let a = tenant(&c, "org-a").await;
    let dir = tempfile::tempdir().unwrap();
    let (first_ledger, second_ledger) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let settings = |ledger: &std::path::Path| json!({"ledger": ledger.display().to_string()});
    let (s, p) = c
        .call(
            &admin,
            Method::POST,
            "/v1/admin/pools",
            Some(
                json!({"name": "hot", "kind": "fake", "costPerCpuHour": 0.001,
                        "settings": settings(&first_ledger)}),
            ),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, info) = c
            .call(&admin, Method::GET, "/v1/admin/pools/hot", None)
            .await;
        if info["healthy"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never healthy: {info}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Placement follows the health view, which every process re-reads every 2 s: wait until
    // the scheduler's view has hot healthy.
    let seen = eventually(Duration::from_secs(20), || {
        c.pool_changes("scheduler", "hot", Some(true)) >= 1
    })
    .await;
    assert!(seen, "the scheduler never saw hot healthy\n{}", c.logs());
    let worker_saw = c.pool_changes("worker", "hot", None);
    let (one, pool) = placed_on(&c, &a, json!({"strategy": "cheapest"})).await;
    assert_eq!(pool, "hot");
    let (s, e) = c
        .call(
            &admin,
            Method::PATCH,
            "/v1/admin/pools/hot",
            Some(json!({"settings": settings(&second_ledger)})),
        )
        .await;
    assert_eq!(s, 200, "{e}");
    // Every process re-reads the registry within one sync interval (2 s): wait until the
    // worker, which makes the next create, has taken up the new settings.
    let seen = eventually(Duration::from_secs(20), || {
        c.pool_changes("worker", "hot", None) > worker_saw
    })
    .await;
    assert!(
        seen,
        "the worker never took up the changed pool\n{}",
        c.logs()
    );
    let (two, pool) = placed_on(&c, &a, json!({"strategy": "cheapest"})).await;
    assert_eq!(pool, "hot");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    assert!(
        read(&first_ledger).contains(&one),
        "first create on the first ledger"
    );
    assert!(
        read(&second_ledger).contains(&two),
        "the running worker used the changed pool\n{}",
        c.logs()
    );
    assert!(!read(&first_ledger).contains(&two));
}
