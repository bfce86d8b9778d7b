//! What the schemathesis run (`cli/tests/e2e/schemathesis.rs`) found, each fixed and kept
//! fixed here (issue #20, "make it permanent").

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::assert_field_error;

#[tokio::test]
async fn a_body_that_is_not_an_object_is_400_and_changes_nothing() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    let before = api.admin(Method::GET, &path, Value::Null).await;
    // serde reads a JSON array into a struct field by field: `[60]` was a TTL renew.
    for body in [json!([null, null]), json!([60]), json!("x"), json!(7)] {
        let a = api.admin(Method::PATCH, &path, body.clone()).await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", "");
        let create = api.admin(Method::POST, "/v1/sandboxes", body).await;
        assert_field_error(&create, StatusCode::BAD_REQUEST, "invalid_argument", "");
    }
    let after = api.admin(Method::GET, &path, Value::Null).await;
    assert_eq!(before.body["expiresAt"], after.body["expiresAt"]);
}

#[tokio::test]
async fn a_whole_number_written_with_a_fraction_is_that_integer() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    // JSON Schema's `integer` (the document's) includes 120.0 and 1.2e2.
    for ttl in [json!(120.0), json!(1.2e2)] {
        let a = api
            .admin(Method::PATCH, &path, json!({ "ttlSeconds": ttl }))
            .await;
        assert_eq!(a.status, StatusCode::OK, "{ttl}: {}", a.body);
    }
    let a = api
        .admin(Method::POST, "/v1/sandboxes", json!({ "priority": -5.0 }))
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    assert_eq!(a.body["priority"], -5, "{}", a.body);
    // Not a whole number: still the field's type error.
    let a = api
        .admin(Method::PATCH, &path, json!({ "ttlSeconds": 60.5 }))
        .await;
    assert_field_error(
        &a,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "ttlSeconds",
    );
    // A whole number beyond any 64-bit one is out of the field's bound, as a too large
    // integer is (docs/api.md, Bounds).
    let a = api
        .admin(Method::PATCH, &path, json!({ "ttlSeconds": 1e300 }))
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "ttlSeconds",
    );
}

#[tokio::test]
async fn a_malformed_org_cursor_is_400_for_a_tenant_key_too() {
    let api = crate::support::api().await;
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    let a = api
        .call(
            Method::GET,
            "/v1/orgs?cursor=null",
            Some(&tenant),
            Value::Null,
            &[],
        )
        .await;
    assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", "cursor");
    let a = api
        .call(Method::GET, "/v1/orgs", Some(&tenant), Value::Null, &[])
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
}

#[tokio::test]
async fn no_body_is_an_empty_object_but_only_whitespace_is_not_json() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    let key = api.key.clone();
    let json = [("content-type", "application/json")];
    let none = api
        .call_raw(Method::PATCH, &path, Some(&key), Vec::new(), &json)
        .await;
    assert_eq!(none.status, StatusCode::OK, "{}", none.body);
    for blank in ["\t", " ", "\n\n"] {
        let a = api
            .call_raw(Method::PATCH, &path, Some(&key), blank.into(), &json)
            .await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", "");
    }
}
