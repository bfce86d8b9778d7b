//! Every error is the JSON envelope, whichever layer refused the request: trailing data after
//! the body, a body over the limit, a wrong method, a long target, an id that is not UTF-8.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error, assert_field_error};

#[tokio::test]
async fn data_after_the_json_body_is_refused() {
    let api = api().await;
    let key = api.key.clone();
    let json = [("content-type", "application/json")];
    let a = api
        .call_raw(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            br#"{"ttlSeconds":60} junk"#.to_vec(),
            &json,
        )
        .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("after the JSON value"),
        "{}",
        a.body
    );
    assert_eq!(a.body["error"]["details"]["field"], "");
    // A second value is trailing data too; trailing whitespace is not.
    let a = api
        .call_raw(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            br#"{"ttlSeconds":60}{}"#.to_vec(),
            &json,
        )
        .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    let a = api
        .call_raw(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            b"{\"ttlSeconds\":60} \n".to_vec(),
            &json,
        )
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
    // Every JSON body goes through the same parser: PATCH too.
    let id = api.sandbox().await;
    let a = api
        .call_raw(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(&key),
            br#"{"labels":{}} x"#.to_vec(),
            &json,
        )
        .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
}

/// A key named twice in a body is refused, not read as its last value: a proxy or policy
/// layer that reads the first would see another request than the one the server runs.
#[tokio::test]
async fn a_key_named_twice_in_a_body_is_refused_by_its_path() {
    let api = api().await;
    let key = api.key.clone();
    let json = [("content-type", "application/json")];
    let id = api.sandbox().await;
    let cases: [(Method, String, &[u8], &str); 5] = [
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            br#"{"command":["echo","1"],"command":["echo","2"]}"#,
            "command",
        ),
        (
            Method::POST,
            "/v1/orgs".to_owned(),
            br#"{"name":"a","name":"b"}"#,
            "name",
        ),
        (
            Method::POST,
            "/v1/sandboxes".to_owned(),
            br#"{"resources":{"cpu":1,"cpu":2}}"#,
            "resources.cpu",
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            br#"{"command":["true"],"env":{"A":"1","B":"2","A":"3"}}"#,
            "env.A",
        ),
        // Found before the body is read as its type: inside a field the route does not know.
        (
            Method::PATCH,
            format!("/v1/sandboxes/{id}"),
            br#"{"x":[{"k":1},{"k":2,"k":3}]}"#,
            "x[1].k",
        ),
    ];
    for (method, path, body, field) in cases {
        let a = api
            .call_raw(method, &path, Some(&key), body.to_vec(), &json)
            .await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
        assert_eq!(
            a.body["error"]["message"],
            format!("{field}: duplicate key"),
            "{}",
            a.body
        );
    }
    // Nothing was made of the refused body.
    let orgs = api.admin(Method::GET, "/v1/orgs", Value::Null).await;
    assert!(
        !orgs.body.to_string().contains(r#""name":"b""#),
        "{}",
        orgs.body
    );
}

/// A required field left out is named in `details.field` by its full JSON path (serde names
/// only the object that lacks it; the path gets the field's name), as every other refusal
/// of a body names its field.
#[tokio::test]
async fn a_missing_field_is_named_by_its_json_path() {
    let api = api().await;
    let id = api.sandbox().await;
    let org = api.tenant.org.id.to_string();
    let cases = [
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            json!({}),
            "command",
        ),
        (Method::POST, "/v1/orgs".to_owned(), json!({}), "name"),
        (Method::POST, "/v1/webhooks".to_owned(), json!({}), "url"),
        (
            Method::PUT,
            format!("/v1/orgs/{org}/quota"),
            json!({ "maxSandbox": { "cpu": 1 } }),
            "maxSandbox.memoryMiB",
        ),
    ];
    for (method, path, body, field) in cases {
        let a = api.admin(method, &path, body).await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
        assert_eq!(
            a.body["error"]["message"],
            format!("{field}: required"),
            "{}",
            a.body
        );
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_envelope_stating_the_limit() {
    let api = api().await;
    let key = api.key.clone();
    let limit = differently_api::requests::middleware::MAX_BODY_BYTES;
    let a = api
        .call_raw(
            Method::POST,
            "/v1/sandboxes",
            Some(&key),
            vec![b' '; limit + 1],
            &[("content-type", "application/json")],
        )
        .await;
    assert_error(&a, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&limit.to_string()),
        "{}",
        a.body
    );
    assert_eq!(a.body["error"]["details"]["limitBytes"], limit);
}

#[tokio::test]
async fn a_wrong_method_is_a_405_envelope_with_allow() {
    let api = api().await;
    let a = api.admin(Method::PUT, "/v1/sandboxes", Value::Null).await;
    assert_error(&a, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    let allow = a.headers["allow"].to_str().unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    // The message lists the same methods as the header (it once said `allowed: ` with none).
    let message = a.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("(allowed: {allow})")),
        "{message} / Allow: {allow}"
    );
    // A route of one method: the same.
    let a = api.admin(Method::DELETE, "/healthz", Value::Null).await;
    assert_error(&a, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    let message = a.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("DELETE is not allowed") && message.contains("GET"),
        "{message}"
    );
}

#[tokio::test]
async fn a_long_target_is_a_414_envelope() {
    let api = api().await;
    let long = format!(
        "/v1/sandboxes?label=a={}",
        "x".repeat(differently_api::requests::middleware::MAX_URI_BYTES)
    );
    let a = api.admin(Method::GET, &long, Value::Null).await;
    assert_error(&a, StatusCode::URI_TOO_LONG, "uri_too_long");
}

#[tokio::test]
async fn an_id_that_is_not_utf8_is_a_400_envelope() {
    let api = api().await;
    let a = api
        .admin(Method::GET, "/v1/sandboxes/%FF%FE", Value::Null)
        .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
}
