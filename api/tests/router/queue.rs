//! `GET /v1/admin/queue` and `GET /v1/admin/metrics/summary`: admin only, and the queue is
//! the store's queued rows per organization with the wall each waits behind.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error};

#[tokio::test]
async fn the_queue_counts_queued_rows_per_org_with_their_wall() {
    let api = api().await;
    // Nothing is placed here (no scheduler): every create waits.
    let a = api.sandbox().await;
    let b = api.sandbox().await;
    let q = api.admin(Method::GET, "/v1/admin/queue", Value::Null).await;
    assert_eq!(q.status, StatusCode::OK, "{}", q.body);
    assert_eq!(q.body["total"], 2, "{}", q.body);
    assert_eq!(q.body["truncated"], false);
    let orgs = q.body["orgs"].as_array().expect("orgs");
    assert_eq!(orgs.len(), 1, "{}", q.body);
    let org = &orgs[0];
    assert_eq!(org["orgId"], json!(api.tenant.org.id.to_string()));
    assert_eq!(org["depth"], 2);
    assert_eq!(org["oldestSandboxId"], json!(a.min(b)));
    let walls: u64 = org["walls"]
        .as_object()
        .expect("walls")
        .values()
        .map(|n| n.as_u64().expect("count"))
        .sum();
    assert_eq!(walls, 2, "every row is counted under one wall: {}", q.body);

    // A second organization's rows get an entry of their own, with its name. (The wall of a
    // row waiting behind a quota is the e2e suite's: here nothing is ever placed.)
    let org2 = api
        .admin(Method::POST, "/v1/orgs", json!({ "name": "waiting-org" }))
        .await;
    let org2 = org2.body["id"].as_str().expect("org id").to_owned();
    let p = api
        .admin(
            Method::POST,
            "/v1/projects",
            json!({ "orgId": org2, "name": "p" }),
        )
        .await;
    let project = p.body["id"].as_str().expect("project id").to_owned();
    let put = api
        .admin(
            Method::PUT,
            &format!("/v1/orgs/{org2}/quota"),
            json!({ "maxQueued": 5, "maxCpu": 1 }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let key = api
        .key_with(Some(&org2), &["sandboxes:read", "sandboxes:write"])
        .await;
    for _ in 0..2 {
        let c = api
            .call(
                Method::POST,
                "/v1/sandboxes",
                Some(&key),
                json!({ "projectId": project }),
                &[],
            )
            .await;
        assert_eq!(c.status, StatusCode::ACCEPTED, "{}", c.body);
    }
    let q = api.admin(Method::GET, "/v1/admin/queue", Value::Null).await;
    assert_eq!(q.body["total"], 4, "{}", q.body);
    let entry = q.body["orgs"]
        .as_array()
        .expect("orgs")
        .iter()
        .find(|o| o["orgId"] == json!(org2))
        .unwrap_or_else(|| panic!("no entry for {org2}: {}", q.body))
        .clone();
    assert_eq!(entry["orgName"], "waiting-org");
    assert_eq!(entry["depth"], 2);

    // Tenants may not read it.
    let tenant = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let a = api
        .call(
            Method::GET,
            "/v1/admin/queue",
            Some(&tenant),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
}

#[tokio::test]
async fn the_metrics_summary_is_admin_only_and_says_when_nothing_is_kept() {
    let api = api().await;
    let a = api
        .admin(Method::GET, "/v1/admin/metrics/summary", Value::Null)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // No recorder in this test process: disabled, empty.
    assert_eq!(a.body["enabled"], false, "{}", a.body);
    assert_eq!(a.body["admissions"], json!({}));
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    let a = api
        .call(
            Method::GET,
            "/v1/admin/metrics/summary",
            Some(&tenant),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
}

/// `POST /v1/placement/dry-run` answers what the create would get now, quotas included: a
/// size above a quota and a full queue are `rejected` with `quota_exceeded` (the create's
/// 429), a used-up quota makes it `waiting` behind its wall (the create queues), and
/// otherwise it is placed.
#[tokio::test]
async fn a_dry_run_meets_the_quotas_the_create_would() {
    let api = api().await;
    let org = api.tenant.org.id.to_string();
    let dry = |body: Value| api.admin(Method::POST, "/v1/placement/dry-run", body);
    let quota_path = format!("/v1/orgs/{org}/quota");
    let quota = |body: Value| api.admin(Method::PUT, &quota_path, body);
    crate::support::healthy(&api, &["fake"]);
    let one_cpu = json!({ "resources": { "cpu": 1, "memoryMiB": 512, "diskGiB": 1 } });
    let placed = dry(one_cpu.clone()).await;
    assert_eq!(placed.status, StatusCode::OK, "{}", placed.body);
    assert_eq!(placed.body["decision"], "placed", "{}", placed.body);
    assert_eq!(placed.body["pool"], "fake", "{}", placed.body);

    let put = quota(json!({ "maxCpu": 1 })).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let two = dry(json!({ "resources": { "cpu": 2, "memoryMiB": 512, "diskGiB": 1 } })).await;
    assert_eq!(two.body["decision"], "rejected", "{}", two.body);
    assert_eq!(two.body["code"], "quota_exceeded", "{}", two.body);
    assert!(
        two.body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("maxCpu") && r.contains("could never run")),
        "{}",
        two.body
    );
    assert!(two.body.get("pool").is_none(), "{}", two.body);
    let create = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "resources": { "cpu": 2, "memoryMiB": 512, "diskGiB": 1 } }),
        )
        .await;
    assert_error(&create, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");

    // One CPU runs already (the quota's whole): a create now queues behind the org.
    api.running_sandbox().await;
    let waits = dry(one_cpu.clone()).await;
    assert_eq!(waits.body["decision"], "waiting", "{}", waits.body);
    assert_eq!(waits.body["wall"], "org", "{}", waits.body);
    assert!(
        waits.body["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("waiting: org cpu quota")),
        "{}",
        waits.body
    );
    assert!(waits.body.get("pool").is_none(), "{}", waits.body);
    assert!(
        waits.body["pools"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "every pool is still explained: {}",
        waits.body
    );

    // A full queue: the create's 429, named.
    let put = quota(json!({ "maxCpu": 1, "maxQueued": 1 })).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    api.sandbox().await;
    let full = dry(one_cpu.clone()).await;
    assert_eq!(full.body["decision"], "rejected", "{}", full.body);
    assert_eq!(full.body["code"], "quota_exceeded", "{}", full.body);
    assert_eq!(
        full.body["reason"], "the org queue quota (maxQueued) of 1 is full: 1 queued",
        "{}",
        full.body
    );
    let create = api.admin(Method::POST, "/v1/sandboxes", one_cpu).await;
    assert_error(&create, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    assert!(
        create.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("maxQueued")),
        "{}",
        create.body
    );
}
