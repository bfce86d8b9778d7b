//! Who may not: no key, a key without the scope, another tenant's key.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error};

#[tokio::test]
async fn a_call_without_a_key_is_401_unauthenticated() {
    let api = api().await;
    let a = api
        .call(Method::GET, "/v1/sandboxes", None, Value::Null, &[])
        .await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
}

#[tokio::test]
async fn a_malformed_or_unknown_key_is_401_too() {
    let api = api().await;
    for key in ["not-a-key", differently_api::generate_key().as_str()] {
        let a = api
            .call(Method::GET, "/v1/sandboxes", Some(key), Value::Null, &[])
            .await;
        assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    }
}

#[tokio::test]
async fn a_key_without_the_scope_is_403_permission_denied() {
    let api = api().await;
    let reader = api.key_with(None, &["sandboxes:read"]).await;
    let a = api
        .call(Method::POST, "/v1/sandboxes", Some(&reader), json!({}), &[])
        .await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
    // The same key may read.
    let a = api
        .call(
            Method::GET,
            "/v1/sandboxes",
            Some(&reader),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
}

#[tokio::test]
async fn another_tenants_sandbox_is_the_same_404_as_an_absent_one() {
    let api = api().await;
    let id = api.sandbox().await;
    let org = api
        .admin(Method::POST, "/v1/orgs", json!({ "name": "other" }))
        .await;
    assert_eq!(org.status, StatusCode::CREATED, "{}", org.body);
    let org_id = org.body["id"].as_str().expect("org id");
    let project = api
        .admin(
            Method::POST,
            "/v1/projects",
            json!({ "orgId": org_id, "name": "theirs" }),
        )
        .await;
    assert_eq!(project.status, StatusCode::CREATED, "{}", project.body);
    let other = api
        .key_with(Some(org_id), &["sandboxes:read", "sandboxes:write"])
        .await;

    let theirs = api
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&other),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&theirs, StatusCode::NOT_FOUND, "not_found");
    let absent = api
        .call(
            Method::GET,
            "/v1/sandboxes/sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV",
            Some(&other),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&absent, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(
        theirs.body["error"]["message"],
        absent.body["error"]["message"]
    );
    // Nor can it be changed.
    let delete = api
        .call(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Some(&other),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&delete, StatusCode::NOT_FOUND, "not_found");
    // The owner still sees it.
    let mine = api
        .admin(Method::GET, &format!("/v1/sandboxes/{id}"), Value::Null)
        .await;
    assert_eq!(mine.status, StatusCode::OK, "{}", mine.body);
}
