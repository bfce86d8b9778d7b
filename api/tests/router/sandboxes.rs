//! Create as a client sees it: the 202 body, field-naming refusals, idempotent replay.

use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::support::{api, assert_error, assert_field_error};

#[tokio::test]
async fn create_is_202_with_the_queued_sandbox() {
    let api = api().await;
    let a = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "labels": { "team": "a" }, "ttlSeconds": 600 }),
        )
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    let b = &a.body;
    assert!(b["id"].as_str().is_some_and(|id| !id.is_empty()), "{b}");
    assert_eq!(b["status"], "queued", "{b}");
    assert_eq!(b["orgId"], json!(api.tenant.org.id), "{b}");
    assert_eq!(b["projectId"], json!(api.tenant.project.id), "{b}");
    assert_eq!(b["labels"]["team"], "a", "{b}");
    assert!(b["pool"].is_null(), "not placed yet: {b}");
    assert!(b.get("error").is_none(), "{b}");
    // And it reads back the same.
    let read = api
        .admin(
            Method::GET,
            &format!("/v1/sandboxes/{}", b["id"].as_str().unwrap_or("")),
            serde_json::Value::Null,
        )
        .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["id"], b["id"]);
}

#[tokio::test]
async fn a_body_of_the_wrong_type_is_400_naming_the_field() {
    let api = api().await;
    let a = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "ttlSeconds": "soon" }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "ttlSeconds",
    );
}

#[tokio::test]
async fn a_well_formed_but_unacceptable_value_is_422_naming_the_field() {
    let api = api().await;
    let a = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "classification": "top-secret" }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "classification",
    );
}

#[tokio::test]
async fn a_repeated_idempotency_key_replays_the_first_answer() {
    let api = api().await;
    let key = api.key.clone();
    let create = || {
        api.call(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            json!({ "labels": { "run": "1" } }),
            &[("idempotency-key", "router-create-1")],
        )
    };
    let first = create().await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = create().await;
    assert_eq!(again.status, StatusCode::ACCEPTED, "{}", again.body);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body["id"], first.body["id"]);
    // The same key with another body is a conflict, not a second sandbox.
    let other = api
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            json!({ "labels": { "run": "2" } }),
            &[("idempotency-key", "router-create-1")],
        )
        .await;
    assert_error(&other, StatusCode::CONFLICT, "conflict");
}

#[tokio::test]
async fn a_sandbox_larger_than_a_quota_total_is_refused_naming_the_limit() {
    let api = api().await;
    let org = api.tenant.org.id.to_string();
    let project = api.tenant.project.id.to_string();
    let put = api
        .admin(
            Method::PUT,
            &format!("/v1/orgs/{org}/quota"),
            json!({ "maxCpu": 2 }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let big = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "resources": { "cpu": 4 } }),
        )
        .await;
    assert_error(&big, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    let message = big.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("org cpu quota (maxCpu) of 2"), "{message}");
    // At the limit it is admitted (it waits for room if the org uses some).
    let fits = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "resources": { "cpu": 2 } }),
        )
        .await;
    assert_eq!(fits.status, StatusCode::ACCEPTED, "{}", fits.body);

    let put = api
        .admin(
            Method::PUT,
            &format!("/v1/projects/{project}/quota"),
            json!({ "maxMemoryMiB": 512 }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let big = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "resources": { "cpu": 1, "memoryMiB": 1024 } }),
        )
        .await;
    assert_error(&big, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    let message = big.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("project memory quota (maxMemoryMiB) of 512 MiB"),
        "{message}"
    );
    assert_eq!(big.body["error"]["details"]["field"], "resources.memoryMiB");

    // Above one sandbox's maximum: the same shape — level, what was asked, the limit, field.
    let put = api
        .admin(
            Method::PUT,
            &format!("/v1/orgs/{org}/quota"),
            json!({ "maxCpu": 8, "maxSandbox": { "cpu": 2, "memoryMiB": 2048, "diskGiB": 10 } }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let big = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "resources": { "cpu": 4 } }),
        )
        .await;
    assert_error(&big, StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    assert_eq!(
        big.body["error"]["message"],
        "resources.cpu 4 CPU exceeds the org max sandbox size (maxSandbox.cpu) of 2 CPU"
    );
    assert_eq!(big.body["error"]["details"]["field"], "resources.cpu");
}

/// Found by the SDKs: `?label=` given twice was a 400 "duplicate field". It repeats, and every
/// label must match; another parameter given twice is a 400 naming it.
#[tokio::test]
async fn several_label_filters_must_all_match() {
    let api = api().await;
    let mut ids = vec![];
    for labels in [
        json!({ "team": "a", "env": "prod" }),
        json!({ "team": "a", "env": "dev" }),
        json!({ "team": "b", "env": "prod" }),
    ] {
        let a = api
            .admin(Method::POST, "/v1/sandboxes", json!({ "labels": labels }))
            .await;
        assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
        ids.push(a.body["id"].as_str().unwrap().to_owned());
    }
    let listed = |q: &'static str| {
        let api = &api;
        async move {
            let a = api
                .admin(
                    Method::GET,
                    &format!("/v1/sandboxes?{q}"),
                    serde_json::Value::Null,
                )
                .await;
            assert_eq!(a.status, StatusCode::OK, "{q}: {}", a.body);
            a.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(listed("label=team=a").await, ids[..2].to_vec());
    assert_eq!(
        listed("label=team=a&label=env=prod").await,
        vec![ids[0].clone()]
    );
    assert_eq!(
        listed("label=env%3Dprod&label=team=b").await,
        vec![ids[2].clone()]
    );
    assert!(listed("label=team=a&label=team=b").await.is_empty());
    let twice = api
        .admin(
            Method::GET,
            "/v1/sandboxes?limit=1&limit=2",
            serde_json::Value::Null,
        )
        .await;
    assert_field_error(&twice, StatusCode::BAD_REQUEST, "invalid_argument", "limit");
    let unknown = api
        .admin(
            Method::GET,
            "/v1/sandboxes?colour=red",
            serde_json::Value::Null,
        )
        .await;
    assert_error(&unknown, StatusCode::BAD_REQUEST, "invalid_argument");
}
