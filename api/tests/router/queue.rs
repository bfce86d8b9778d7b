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
