//! A key named twice in a facade's request body is refused as `/v1` refuses it in its own
//! bodies (a proxy or policy layer in front may read the first value, the facade would act
//! on the last), in the facade's error shape for malformed JSON, naming the key by its path.

use axum::http::{Method, StatusCode};
use serde_json::Value;

use crate::support::{api, Answer, Api};

const HOST: (&str, &str) = ("host", "facade.test:8080");
const JSON: (&str, &str) = ("content-type", "application/json");

async fn post(api: &Api, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Answer {
    api.call_raw(Method::POST, path, None, body.to_vec(), headers)
        .await
}

fn assert_refused(a: &Answer, code: Value, message: &str) {
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(a.body["code"], code, "{}", a.body);
    assert_eq!(a.body["message"], message, "{}", a.body);
}

#[tokio::test]
async fn the_e2b_control_plane_refuses_a_key_named_twice() {
    let api = api().await;
    let key = api.key.clone();
    let auth = [("x-api-key", key.as_str()), JSON];
    let a = post(
        &api,
        "/e2b/v2/sandboxes",
        br#"{"templateID":"base","metadata":{"a":"1","a":"2"}}"#,
        &auth,
    )
    .await;
    assert_refused(&a, 400.into(), "metadata.a: duplicate key");
    let a = post(
        &api,
        "/e2b/v2/sandboxes/sbx_1/connect",
        br#"{"timeout":60,"timeout":1}"#,
        &auth,
    )
    .await;
    assert_refused(&a, 400.into(), "timeout: duplicate key");
    let a = post(
        &api,
        "/e2b/sandboxes/sbx_1/snapshots",
        br#"{"name":"a","x":{"k":1,"k":2}}"#,
        &auth,
    )
    .await;
    assert_refused(&a, 400.into(), "x.k: duplicate key");
}

#[tokio::test]
async fn the_opensandbox_lifecycle_refuses_a_key_named_twice() {
    let api = api().await;
    let key = api.key.clone();
    let a = post(
        &api,
        "/opensandbox/v1/sandboxes",
        br#"{"image":{"uri":"img:1","uri":"img:2"},"timeout":600}"#,
        &[HOST, ("open-sandbox-api-key", &key), JSON],
    )
    .await;
    assert_refused(
        &a,
        "SANDBOX::INVALID_PARAMETER".into(),
        "image.uri: duplicate key",
    );
}

#[tokio::test]
async fn opensandbox_execd_refuses_a_key_named_twice() {
    let api = api().await;
    let id = api.live_sandbox().await;
    let tok = api.facade_execd_token(&id).await;
    let auth = [HOST, ("x-differently-execd-token", tok.as_str()), JSON];
    let x = |path: &str| format!("/opensandbox/execd/{id}{path}");
    let body_error = Value::from("INVALID_REQUEST_BODY");
    let a = post(
        &api,
        &x("/command"),
        br#"{"command":"true","envs":{"A":"1","A":"2"}}"#,
        &auth,
    )
    .await;
    assert_refused(&a, body_error.clone(), "envs.A: duplicate key");
    let a = post(&api, &x("/session"), br#"{"cwd":"/","cwd":"/tmp"}"#, &auth).await;
    assert_refused(&a, body_error.clone(), "cwd: duplicate key");
    let a = post(
        &api,
        &x("/directories"),
        br#"{"/d":{"mode":755},"/d":{"mode":700}}"#,
        &auth,
    )
    .await;
    assert_refused(&a, body_error.clone(), "/d: duplicate key");
    let a = post(&api, &x("/session"), br#"{"cwd":"/"}"#, &auth).await;
    let sid = a.body["session_id"]
        .as_str()
        .unwrap_or("session-x")
        .to_owned();
    let a = post(
        &api,
        &x(&format!("/session/{sid}/run")),
        br#"{"command":"true","timeout":1000,"timeout":1}"#,
        &auth,
    )
    .await;
    assert_refused(&a, body_error, "timeout: duplicate key");
    let multipart = "--b\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\r\n{\"path\":\"/tmp/a\",\"path\":\"/etc/a\"}\r\n--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nhi\r\n--b--\r\n";
    let a = post(
        &api,
        &x("/files/upload"),
        multipart.as_bytes(),
        &[
            HOST,
            ("x-differently-execd-token", tok.as_str()),
            ("content-type", "multipart/form-data; boundary=b"),
        ],
    )
    .await;
    assert_refused(&a, "INVALID_FILE_METADATA".into(), "path: duplicate key");
}

/// `POST /pty` needs a pool with `exec.pty`: the router's fake pool has none, devhost has.
#[tokio::test]
async fn opensandbox_pty_create_refuses_a_key_named_twice() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let _ops = api.complete_ops();
    let id = api.live_sandbox_on("devhost").await;
    let tok = api.facade_execd_token(&id).await;
    let a = post(
        &api,
        &format!("/opensandbox/execd/{id}/pty"),
        br#"{"cwd":"/","x":1,"x":2}"#,
        &[HOST, ("x-differently-execd-token", tok.as_str()), JSON],
    )
    .await;
    assert_refused(&a, "INVALID_REQUEST_BODY".into(), "x: duplicate key");
}
