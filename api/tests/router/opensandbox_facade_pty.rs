//! execd's PTY routes through the facade in process, before any terminal: the endpoint token
//! (never the key), a pool without `exec.pty` answering 501 `NOT_SUPPORTED`, another tenant's
//! sandbox 404, the exec scope, and unknown sessions answered as execd does. (The terminal
//! itself is the e2e suite's, `opensandbox_facade_pty`: `oneshot` has no connection to
//! upgrade.)

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, Answer, Api, EXECD_TOKEN, FACADE_HOST};

fn assert_osb_error(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert!(a.body["message"].is_string(), "{}", a.body);
}

async fn execd(
    api: &Api,
    auth: (&str, &str),
    m: Method,
    id: &str,
    path: &str,
    body: Value,
) -> Answer {
    api.call(
        m,
        &format!("/opensandbox/execd/{id}{path}"),
        None,
        body,
        &[FACADE_HOST, auth],
    )
    .await
}

#[tokio::test]
async fn a_pool_without_exec_pty_answers_501_and_the_pty_routes_keep_execd_auth() {
    let api = api().await;
    // The router's fake pool has exec, files and snapshots, not exec.pty.
    let id = api.live_sandbox().await;
    let tok = api.facade_execd_token(&id).await;
    let auth = (EXECD_TOKEN, tok.as_str());
    let a = execd(
        &api,
        auth,
        Method::POST,
        &id,
        "/pty",
        json!({"command": "bash"}),
    )
    .await;
    assert_osb_error(&a, StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED");
    let msg = a.body["message"].as_str().unwrap();
    assert!(msg.contains("exec.pty") && msg.contains("fake"), "{msg}");

    // No token, a tampered one, the token of another sandbox: 401 as every execd route.
    let a = api
        .call(
            Method::POST,
            &format!("/opensandbox/execd/{id}/pty"),
            None,
            json!({}),
            &[FACADE_HOST],
        )
        .await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    let bad = format!("{tok}A");
    let a = execd(
        &api,
        (EXECD_TOKEN, &bad),
        Method::POST,
        &id,
        "/pty",
        json!({}),
    )
    .await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    let other = api.live_sandbox().await;
    let other_tok = api.facade_execd_token(&other).await;
    let a = execd(
        &api,
        (EXECD_TOKEN, &other_tok),
        Method::POST,
        &id,
        "/pty",
        json!({}),
    )
    .await;
    assert_osb_error(&a, StatusCode::UNAUTHORIZED, "UNAUTHORIZED");

    // Another tenant's key (server-proxy mode) finds no such sandbox; a key without the
    // exec scope is refused.
    let org = api
        .admin(Method::POST, "/v1/orgs", json!({"name": "pty-b"}))
        .await;
    assert_eq!(org.status, StatusCode::CREATED, "{}", org.body);
    let b = api
        .key_with(
            org.body["id"].as_str(),
            &["sandboxes:read", "sandboxes:exec"],
        )
        .await;
    let a = execd(
        &api,
        ("open-sandbox-api-key", &b),
        Method::POST,
        &id,
        "/pty",
        json!({}),
    )
    .await;
    assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
    let reader = api.key_with(None, &["sandboxes:read"]).await;
    let a = execd(
        &api,
        ("open-sandbox-api-key", &reader),
        Method::POST,
        &id,
        "/pty",
        json!({}),
    )
    .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);

    // Sessions the facade never issued: execd's 404 on every session route, socket included
    // (answered before the upgrade is looked at).
    for (m, path) in [
        (Method::GET, "/pty/pty_nope"),
        (Method::DELETE, "/pty/pty_nope"),
        (Method::GET, "/pty/pty_nope/ws"),
    ] {
        let a = execd(&api, auth, m.clone(), &id, path, Value::Null).await;
        assert_osb_error(&a, StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND");
    }
    // Other execd routes the facade does not serve still say so.
    let a = execd(&api, auth, Method::GET, &id, "/code/contexts", Value::Null).await;
    assert_osb_error(&a, StatusCode::NOT_IMPLEMENTED, "NOT_SUPPORTED");
}

/// `POST /pty` on a killed sandbox is the 404 `/ping` and `POST /session` answer there, not a
/// session id whose socket can only be refused.
#[tokio::test]
async fn a_killed_sandbox_issues_no_pty_session() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let _ops = api.complete_ops();
    let id = api.live_sandbox_on("devhost").await;
    let tok = api.facade_execd_token(&id).await;
    let auth = (EXECD_TOKEN, tok.as_str());
    // The pool has `exec.pty`: a live sandbox gets a session.
    let a = execd(&api, auth, Method::POST, &id, "/pty", json!({})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let key = api.key.clone();
    let a = api
        .call(
            Method::DELETE,
            &format!("/opensandbox/v1/sandboxes/{id}"),
            None,
            Value::Null,
            &[FACADE_HOST, ("open-sandbox-api-key", &key)],
        )
        .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.body);
    let a = execd(&api, auth, Method::POST, &id, "/pty", json!({})).await;
    assert_osb_error(&a, StatusCode::NOT_FOUND, "DIFFERENTLY::SANDBOX_NOT_FOUND");
}
