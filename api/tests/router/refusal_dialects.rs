//! A refusal made before any route runs (a long target, a NUL in the query) or by axum itself
//! (a body over the limit) is served in the error shape of the path it was made on: the
//! OpenSandbox facade's `{code, message}` under `/opensandbox`, E2B's `{code: <status>,
//! message}` under `/e2b` (a Connect error for envd's RPCs), `/v1`'s envelope elsewhere.
//! (The late body's 408 needs a real listener: `listener.rs`.)

use axum::http::{Method, StatusCode};
use differently_api::requests::middleware::{MAX_BODY_BYTES, MAX_URI_BYTES};
use serde_json::Value;

use crate::support::{api, assert_error, Answer, Api};

const HOST: (&str, &str) = ("host", "facade.test:8080");

async fn get(api: &Api, path: &str, headers: &[(&str, &str)]) -> Answer {
    api.call(Method::GET, path, None, Value::Null, headers)
        .await
}

fn assert_osb(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert!(a.body["message"].is_string(), "{}", a.body);
    assert!(
        a.body.get("error").is_none(),
        "the /v1 envelope: {}",
        a.body
    );
}

fn assert_e2b(a: &Answer, status: StatusCode) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.body["code"], status.as_u16(), "{}", a.body);
    assert!(a.body["message"].is_string(), "{}", a.body);
    assert!(
        a.body.get("error").is_none(),
        "the /v1 envelope: {}",
        a.body
    );
}

#[tokio::test]
async fn a_long_target_is_refused_in_the_shape_of_its_path() {
    let api = api().await;
    let key = api.key.clone();
    let long = "x".repeat(MAX_URI_BYTES);
    let a = get(
        &api,
        &format!("/opensandbox/v1/sandboxes?metadata=a%3D{long}"),
        &[HOST, ("open-sandbox-api-key", &key)],
    )
    .await;
    assert_osb(&a, StatusCode::URI_TOO_LONG, "DIFFERENTLY::URI_TOO_LONG");
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains(&MAX_URI_BYTES.to_string()),
        "{}",
        a.body
    );
    let a = get(
        &api,
        &format!("/e2b/v2/sandboxes?metadata=a%3D{long}"),
        &[("x-api-key", &key)],
    )
    .await;
    assert_e2b(&a, StatusCode::URI_TOO_LONG);
    // `/v1` keeps its envelope.
    let a = get(&api, &format!("/v1/sandboxes?label=a={long}"), &[]).await;
    assert_error(&a, StatusCode::URI_TOO_LONG, "uri_too_long");
}

#[tokio::test]
async fn a_nul_in_the_query_is_refused_in_the_shape_of_its_path() {
    let api = api().await;
    let key = api.key.clone();
    let a = get(
        &api,
        "/opensandbox/v1/sandboxes?metadata=a%00b",
        &[HOST, ("open-sandbox-api-key", &key)],
    )
    .await;
    assert_osb(&a, StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER");
    assert!(
        a.body["message"].as_str().unwrap().starts_with("metadata:"),
        "{}",
        a.body
    );
    let a = get(&api, "/e2b/v2/sandboxes?state=%00", &[("x-api-key", &key)]).await;
    assert_e2b(&a, StatusCode::BAD_REQUEST);
    // envd's RPCs answer a Connect error.
    let a = api
        .call(
            Method::POST,
            "/e2b/envd/process.Process/List?x=%00",
            None,
            Value::Null,
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(a.body["code"], "invalid_argument", "{}", a.body);
    // `/v1` keeps its envelope.
    let a = get(&api, "/v1/sandboxes?label=a%00b", &[]).await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    assert_eq!(a.body["error"]["details"]["field"], "label", "{}", a.body);
}

/// E2B's SDKs decode every error body as `{code: int, message}` (Python fails on another
/// shape): axum's own refusals under `/e2b` take it too.
#[tokio::test]
async fn a_body_over_the_limit_under_e2b_is_e2bs_shape() {
    let api = api().await;
    let key = api.key.clone();
    let a = api
        .call_raw(
            Method::POST,
            "/e2b/v2/sandboxes",
            None,
            vec![b' '; MAX_BODY_BYTES + 1],
            &[("x-api-key", &key), ("content-type", "application/json")],
        )
        .await;
    assert_e2b(&a, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        a.body["message"]
            .as_str()
            .unwrap()
            .contains(&MAX_BODY_BYTES.to_string()),
        "{}",
        a.body
    );
}
