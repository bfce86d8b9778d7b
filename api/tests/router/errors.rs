//! The error envelope: unknown routes, and the request's own id in every error body.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error};

#[tokio::test]
async fn an_unknown_route_is_a_404_json_envelope() {
    let api = api().await;
    let a = api
        .admin(Method::GET, "/v1/no-such-thing", Value::Null)
        .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(a.body["error"]["message"], "no such route");
    // Also without a key: the route is unknown before anyone is asked who they are.
    let a = api
        .call(Method::GET, "/nowhere", None, Value::Null, &[])
        .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn an_errors_request_id_is_the_served_x_request_id() {
    let api = api().await;
    let a = api
        .call(Method::GET, "/v1/sandboxes", None, Value::Null, &[])
        .await;
    // assert_error checks error.requestId against the header; here, that it is a real id
    // and not under details.
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    assert!(!a.request_id().is_empty());
    assert!(
        a.body["error"]["details"]["requestId"].is_null(),
        "{}",
        a.body
    );
    let b = api
        .call(Method::GET, "/v1/sandboxes", None, Value::Null, &[])
        .await;
    assert_ne!(a.request_id(), b.request_id(), "one id per request");
}

#[tokio::test]
async fn a_plain_caller_request_id_is_honoured_in_the_header_and_the_error() {
    let api = api().await;
    let a = api
        .call(
            Method::GET,
            "/v1/sandboxes/sbx_01ARZ3NDEKTSV4RRFFQ69G5FAV",
            Some(&api.key.clone()),
            Value::Null,
            &[("x-request-id", "router-req-1")],
        )
        .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(a.request_id(), "router-req-1");
    assert_eq!(a.body["error"]["requestId"], "router-req-1");
}

#[tokio::test]
async fn an_unusable_caller_request_id_is_replaced_everywhere() {
    let api = api().await;
    let a = api
        .call(
            Method::GET,
            "/v1/sandboxes",
            None,
            Value::Null,
            &[("x-request-id", "has spaces; and more")],
        )
        .await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    assert_ne!(a.request_id(), "has spaces; and more");
}

#[tokio::test]
async fn the_audit_records_of_a_request_carry_its_id() {
    let api = api().await;
    let refused = api
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&api.key.clone()),
            json!({ "ttlSeconds": "soon" }),
            &[("x-request-id", "router-audit-0")],
        )
        .await;
    assert_eq!(refused.body["error"]["requestId"], "router-audit-0");
    let created = api
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&api.key.clone()),
            json!({}),
            &[("x-request-id", "router-audit-1")],
        )
        .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    assert_eq!(created.request_id(), "router-audit-1");
    let id = created.body["id"].as_str().expect("id");
    let log = api
        .admin(
            Method::GET,
            &format!("/v1/audit?resource={id}"),
            Value::Null,
        )
        .await;
    assert_eq!(log.status, StatusCode::OK, "{}", log.body);
    let items = log.body["items"].as_array().expect("items");
    assert!(!items.is_empty(), "{}", log.body);
    for record in items {
        assert_eq!(record["requestId"], "router-audit-1", "{record}");
    }
}
