//! What the hybrid placement tests (`hybrid_placement`, `hybrid_providers`) share: creating a
//! sandbox in region `us` as a tenant, waiting for it to run, reading the placement
//! explanation, setting policies and waiting for a pool's health to reach every process.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{eventually, Cluster};
use crate::tenancy::Tenant;

/// How long a sandbox, or a pool's health, may take to settle on a busy machine.
const SETTLE: Duration = Duration::from_secs(60);

/// Asks for a sandbox of `body` in `t`'s project, region `us`; the status and body.
pub async fn create(c: &Cluster, t: &Tenant, mut body: Value) -> (u16, Value) {
    body["projectId"] = json!(t.project);
    body["region"] = json!("us");
    c.call(&t.key, Method::POST, "/v1/sandboxes", Some(body))
        .await
}

/// `id`'s state as its tenant reads it.
pub async fn status(c: &Cluster, t: &Tenant, id: &str) -> Value {
    let (_, r) = c
        .call(&t.key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    r
}

/// Waits (server side) for `id` to run and answers its state; fails the test with the
/// cluster's logs if it does not.
pub async fn wait_running(c: &Cluster, t: &Tenant, id: &str) -> Value {
    let (_, r) = c
        .call(
            &t.key,
            Method::GET,
            &format!(
                "/v1/sandboxes/{id}/wait?status=running&timeoutSeconds={}",
                SETTLE.as_secs()
            ),
            None,
        )
        .await;
    assert_eq!(r["status"], "running", "{r}\n{}", c.logs());
    r
}

/// Creates a sandbox with `body`, waits for it to run, and answers its id and pool.
pub async fn placed_on(c: &Cluster, t: &Tenant, body: Value) -> (String, String) {
    let (s, b) = create(c, t, body.clone()).await;
    assert_eq!(s, 202, "{body} -> {b}");
    let id = b["id"].as_str().unwrap().to_owned();
    let r = wait_running(c, t, &id).await;
    let pool = r["pool"].as_str();
    (
        id,
        pool.unwrap_or_else(|| panic!("no pool in {r}")).to_owned(),
    )
}

/// The whole placement explanation of `id`.
pub async fn explanation(c: &Cluster, t: &Tenant, id: &str) -> Value {
    let (s, why) = c
        .call(
            &t.key,
            Method::GET,
            &format!("/v1/sandboxes/{id}/placement"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{why}");
    why
}

/// Asserts that `id` is still queued and that its explanation says it waits for `pool`.
pub async fn waits_for(c: &Cluster, t: &Tenant, id: &str, pool: &str) {
    let r = status(c, t, id).await;
    assert_eq!(r["status"], "queued", "waits for the private pool: {r}");
    let whole = explanation(c, t, id).await;
    assert_eq!(whole["decision"], "waiting", "{whole}");
    assert!(
        whole["reason"].as_str().unwrap_or("").contains(pool),
        "the explanation names the pool it waits for: {whole}"
    );
}

/// The explanation's entry for `pool`.
pub async fn why(c: &Cluster, t: &Tenant, id: &str, pool: &str) -> Value {
    let whole = explanation(c, t, id).await;
    whole["pools"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == pool).cloned())
        .unwrap_or_else(|| panic!("{pool} not in the explanation: {whole}"))
}

/// Sets the policy at `path` (global, an org's or a project's) as the operator.
pub async fn put_policy(c: &Cluster, path: &str, body: Value) {
    let (s, e) = c.call(&c.key, Method::PUT, path, Some(body)).await;
    assert_eq!(s, 200, "{path}: {e}");
}

/// Waits until `pool`'s health is `healthy` and every process places by it.
pub async fn wait_health(c: &Cluster, pool: &str, healthy: bool) {
    c.wait_pool_health(pool, healthy, SETTLE).await;
    if !healthy {
        let seen = eventually(SETTLE, || {
            c.pool_changes("scheduler", pool, Some(false)) >= 1
        })
        .await;
        assert!(
            seen,
            "the scheduler never saw {pool} go unhealthy\n{}",
            c.logs()
        );
    }
    // The API process places at admission from its own copy of the health view, re-read
    // every 2 s: let it (and the scheduler) take the change up.
    tokio::time::sleep(Duration::from_millis(2500)).await;
}
