//! `GET /v1/sandboxes/{id}/pty` before the upgrade: scope, every bad query parameter named,
//! and a request that is not a WebSocket upgrade. (The terminal itself is the e2e suite's:
//! `oneshot` has no connection to upgrade.)

use axum::http::{Method, StatusCode};
use serde_json::Value;

use crate::support::{api, assert_error, assert_field_error};

#[tokio::test]
async fn pty_query_errors_name_the_parameter_before_the_upgrade() {
    let api = api().await;
    let id = api.running_sandbox().await;
    let key = api.key.clone();
    for (query, field) in [
        ("cols=0", "cols"),
        ("rows=1001", "rows"),
        ("cols=eighty", "cols"),
        ("env=NOVALUE", "env"),
        ("env=9X=1", "env.9X"),
        ("env=A=1&env=A=2", "env.A"),
        ("cwd=tmp", "cwd"),
        ("command=", "command[0]"),
        ("command=sh%00", "command"),
        ("tty=1", "tty"),
        ("session=pty_x&rows=3", "session"),
    ] {
        let path = format!("/v1/sandboxes/{id}/pty?{query}");
        let a = api
            .call(Method::GET, &path, Some(&key), Value::Null, &[])
            .await;
        if query.contains("%00") {
            // NUL in a query is refused by the shared NUL guard, naming the parameter.
            assert_eq!(a.status, StatusCode::BAD_REQUEST, "{query}: {}", a.body);
            continue;
        }
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
    // Good parameters, but not a WebSocket request.
    let a = api
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/pty?cols=100&rows=30&command=sh"),
            Some(&key),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("WebSocket"),
        "{}",
        a.body
    );
}

#[tokio::test]
async fn pty_needs_the_exec_scope() {
    let api = api().await;
    let id = api.running_sandbox().await;
    let reader = api.key_with(None, &["sandboxes:read"]).await;
    let a = api
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/pty"),
            Some(&reader),
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
    let a = api
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/pty"),
            None,
            Value::Null,
            &[],
        )
        .await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
}
