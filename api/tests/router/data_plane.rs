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
