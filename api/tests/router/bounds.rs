//! Numbers at the boundary: every duration and count is bounded, and the 422 names the field
//! and states the bound (issue #20: an unbounded idle timeout stopped the idle sweep).

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{assert_field_error, Answer};

/// Asserts a 422 `validation_failed` naming `field` whose message states `bound`.
fn assert_bound(a: &Answer, field: &str, bound: &str) {
    assert_field_error(
        a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        field,
    );
    let message = a.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(bound), "{field}: {}", a.body);
}

#[tokio::test]
async fn an_idle_timeout_beyond_the_bound_is_422_on_create() {
    let api = crate::support::api().await;
    for idle in [json!(0), json!(2_592_001u64), json!(u64::MAX)] {
        let a = api
            .admin(
                Method::POST,
                "/v1/sandboxes",
                json!({ "idleTimeoutSeconds": idle }),
            )
            .await;
        assert_bound(&a, "idleTimeoutSeconds", "2592000");
    }
    let a = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "idleTimeoutSeconds": 2_592_000u64 }),
        )
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
}

#[tokio::test]
async fn an_idle_timeout_beyond_the_bound_is_422_on_patch_and_changes_nothing() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    for idle in [json!(0), json!(10_000_000_000_000_000u64), json!(u64::MAX)] {
        let a = api
            .admin(
                Method::PATCH,
                &path,
                json!({ "idleTimeoutSeconds": idle, "labels": { "a": "b" } }),
            )
            .await;
        assert_bound(&a, "idleTimeoutSeconds", "2592000");
    }
    let a = api.admin(Method::GET, &path, Value::Null).await;
    assert_eq!(a.body["idleTimeoutSeconds"], Value::Null, "{}", a.body);
    assert_eq!(a.body["labels"], json!({}), "{}", a.body);
    let a = api
        .admin(Method::PATCH, &path, json!({ "idleTimeoutSeconds": 60 }))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["idleTimeoutSeconds"], 60, "{}", a.body);
}

#[tokio::test]
async fn pool_numbers_beyond_their_bounds_are_422() {
    let api = crate::support::api().await;
    let cases = [
        ("maxConcurrent", json!(0), "1000000"),
        ("maxConcurrent", json!(4_000_000_000u64), "1000000"),
        ("costPerCpuHour", json!(-1.0), "1000000"),
        ("costPerCpuHour", json!(1e300), "1000000"),
        ("typicalCreateSeconds", json!(-0.5), "86400"),
        ("typicalCreateSeconds", json!(1e300), "86400"),
    ];
    for (field, value, bound) in cases {
        let mut body = json!({ "name": "extra", "kind": "fake", "settings": {} });
        body[field] = value;
        let a = api.admin(Method::POST, "/v1/admin/pools", body).await;
        assert_bound(&a, field, bound);
    }
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "extra", "kind": "fake", "settings": {}, "maxConcurrent": 5,
                    "costPerCpuHour": 0.5, "typicalCreateSeconds": 3.0 }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a = api
        .admin(
            Method::PATCH,
            "/v1/admin/pools/extra",
            json!({ "maxConcurrent": 2_000_000 }),
        )
        .await;
    assert_bound(&a, "maxConcurrent", "1000000");
}
