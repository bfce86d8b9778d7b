//! Changes of a sandbox that has no backend yet: no scheduler runs here, so a create stays
//! queued, which is what these routes must handle without a backend call.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error, assert_field_error};

#[tokio::test]
async fn pausing_a_queued_sandbox_is_409_naming_its_status() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/pause"),
            Value::Null,
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    assert_eq!(a.body["error"]["details"]["status"], "queued", "{}", a.body);
}

#[tokio::test]
async fn exec_on_a_queued_sandbox_is_409_naming_its_status() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["true"] }),
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    assert_eq!(a.body["error"]["details"]["status"], "queued", "{}", a.body);
}

#[tokio::test]
async fn a_patch_out_of_range_is_422_naming_the_field() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            json!({ "ttlSeconds": 0 }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "ttlSeconds",
    );
    let labels = api
        .admin(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            json!({ "labels": { "team": "b" } }),
        )
        .await;
    assert_eq!(labels.status, StatusCode::OK, "{}", labels.body);
    assert_eq!(labels.body["labels"]["team"], "b", "{}", labels.body);
}

#[tokio::test]
async fn deleting_a_queued_sandbox_ends_it_and_a_second_delete_is_200() {
    let api = api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    let first = api.admin(Method::DELETE, &path, Value::Null).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["status"], "terminated", "{}", first.body);
    let again = api.admin(Method::DELETE, &path, Value::Null).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["status"], "terminated", "{}", again.body);
}
