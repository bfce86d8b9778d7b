//! The terminal's key as a WebSocket subprotocol (`differently.bearer.<key>`), the way a
//! browser must send it: it authenticates an upgrade request exactly like the header, and
//! nothing else. (`oneshot` cannot upgrade, so a request that passed authentication and the
//! scope check gets the route's "not a WebSocket" 400; the upgrade itself is the dashboard's
//! browser suite's, `ui-tests/`.)

use axum::http::{Method, StatusCode};
use serde_json::Value;

use crate::support::{api, assert_error};

fn protocols(key: &str) -> String {
    format!("differently.pty.v1, differently.bearer.{key}")
}

const UPGRADE: [(&str, &str); 4] = [
    ("connection", "upgrade"),
    ("upgrade", "websocket"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
];

#[tokio::test]
async fn a_key_offered_as_subprotocol_authenticates_a_pty_upgrade() {
    let api = api().await;
    let id = api.running_sandbox().await;
    let path = format!("/v1/sandboxes/{id}/pty");
    let call = |headers: Vec<(&'static str, String)>| {
        let api = &api;
        let path = path.clone();
        async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            api.call(Method::GET, &path, None, Value::Null, &h).await
        }
    };
    let with = |key: &str| {
        let mut h: Vec<(&'static str, String)> =
            UPGRADE.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        h.push(("sec-websocket-protocol", protocols(key)));
        h
    };
    // The admin key gets past authentication and the scope check to the upgrade itself.
    let a = call(with(&api.key)).await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    assert!(a.body.to_string().contains("WebSocket"), "{}", a.body);
    // A key without `sandboxes:exec` is recognised (403, not 401).
    let reader = api.key_with(None, &["sandboxes:read"]).await;
    let a = call(with(&reader)).await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
    // A wrong key is refused like a wrong header.
    let mut wrong = api.key.clone();
    wrong.pop();
    wrong.push(if api.key.ends_with('A') { 'B' } else { 'A' });
    let a = call(with(&wrong)).await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    // Without `Upgrade: websocket` the subprotocol is not a credential.
    let a = call(vec![("sec-websocket-protocol", protocols(&api.key))]).await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    // The header wins when both are sent: a bad header is not rescued by a good subprotocol.
    let mut h = with(&api.key);
    h.push(("authorization", "Bearer nonsense".to_owned()));
    let a = call(h).await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
}

#[tokio::test]
async fn a_subprotocol_key_is_not_accepted_by_other_routes_without_an_upgrade() {
    let api = api().await;
    let a = api
        .call(
            Method::GET,
            "/v1/sandboxes",
            None,
            Value::Null,
            &[("sec-websocket-protocol", &protocols(&api.key))],
        )
        .await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
}
