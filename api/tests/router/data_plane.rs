//! The data plane's one walk as a client sees it: a call on a row this process remembers
//! running is recorded guarded on that row, and when the row moved behind the process's back
//! the call reads it again: it runs if the row still runs, and is refused with no record if
//! it does not.

use axum::http::{Method, StatusCode};
use chrono::Utc;
use differently_core::{SandboxId, SandboxStatus};
use differently_store::{Actor, Transition};
use serde_json::{json, Value};

use crate::support::{api, assert_error, Api};

/// Moves the row of `id` from `from` to `to` in the store alone, with no event: the API
/// process keeps remembering it as it was.
async fn move_unseen(api: &Api, id: &str, from: SandboxStatus, to: SandboxStatus) {
    let t = Transition {
        id: SandboxId::parse(id).expect("sandbox id"),
        from: vec![from],
        to,
        reason: None,
        actor: Actor::System("test"),
    };
    api.store.transition(t, Utc::now()).await.expect("move");
}

async fn exec(api: &Api, id: &str, word: &str) -> crate::support::Answer {
    api.admin(
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({ "command": ["echo", word] }),
    )
    .await
}

/// The `sandbox.exec` records of sandbox `id`.
async fn exec_records(api: &Api, id: &str) -> usize {
    let log = api
        .admin(Method::GET, "/v1/audit?action=sandbox.exec", Value::Null)
        .await;
    assert_eq!(log.status, StatusCode::OK, "{}", log.body);
    log.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|r| r["resource"].as_str().is_some_and(|res| res.contains(id)))
        .count()
}

#[tokio::test]
async fn a_remembered_row_that_moved_is_read_again_and_each_call_has_one_record() {
    let api = api().await;
    let id = api.live_sandbox().await;

    // Read, recorded, and remembered for the next call.
    let first = exec(&api, &id, "one").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(first.body["stdout"], "one\n");
    assert_eq!(exec_records(&api, &id).await, 1);

    // Paused and resumed unseen: the remembered row is two versions behind, so its guarded
    // record is refused and the call reads the row, which runs.
    move_unseen(&api, &id, SandboxStatus::Running, SandboxStatus::Paused).await;
    move_unseen(&api, &id, SandboxStatus::Paused, SandboxStatus::Running).await;
    let second = exec(&api, &id, "two").await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    assert_eq!(second.body["stdout"], "two\n");
    assert_eq!(
        exec_records(&api, &id).await,
        2,
        "the refused attempt writes nothing"
    );

    // Paused unseen: the remembered row says running, the row does not; the call is refused
    // and leaves no record.
    move_unseen(&api, &id, SandboxStatus::Running, SandboxStatus::Paused).await;
    let third = exec(&api, &id, "three").await;
    assert_error(&third, StatusCode::CONFLICT, "conflict");
    assert_eq!(
        exec_records(&api, &id).await,
        2,
        "a call refused for its row has no record"
    );
}

/// A `cwd` that does not exist (checked by the backend, here a devhost pool's) is the same
/// 422 naming `cwd` for buffered exec and for streamed exec in both formats: the stream's
/// head waits for the command to start, so a refusal before it is the usual JSON error, not
/// a 200 with an `error` event. A command that does start is streamed as ever.
#[tokio::test]
async fn a_missing_cwd_is_a_422_for_buffered_and_streamed_exec_alike() {
    let root = tempfile::tempdir().expect("devhost root");
    let api = crate::support::api_with_devhost(root.path()).await;
    let id = api.live_sandbox_on("devhost").await;
    let key = api.key.clone();
    let bad = json!({ "command": ["ls"], "cwd": "/nonexistent" });
    for (path, accept) in [
        (format!("/v1/sandboxes/{id}/exec"), None),
        (format!("/v1/sandboxes/{id}/exec/stream"), None),
        (
            format!("/v1/sandboxes/{id}/exec/stream"),
            Some("application/vnd.differently.exec-stream"),
        ),
    ] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let a = api
            .call(Method::POST, &path, Some(&key), bad.clone(), &headers)
            .await;
        crate::support::assert_field_error(
            &a,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "cwd",
        );
    }
    // The same command with a directory that is there streams its output and exit.
    let req = axum::http::Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/sandboxes/{id}/exec/stream"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({ "command": ["echo", "here"], "cwd": "/" }).to_string(),
        ))
        .expect("request");
    let resp = tower::ServiceExt::oneshot(api.router.clone(), req)
        .await
        .expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("event: stdout") && text.contains("here"),
        "{text}"
    );
    assert!(text.contains("event: exit"), "{text}");
}
