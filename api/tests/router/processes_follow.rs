//! A process start answers with the new process for in-process callers to follow (the E2B
//! facade's `Start`, one request inside the API): the answer's extension reads the real
//! supervised output and end, and the same process is there for a `/v1` re-attach.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use differently_api::processes::entry::{Ending, Stream};
use differently_api::processes::follow::{Attached, Piece};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_answer_carries_the_process_to_follow_in_place() {
    let a = api().await;
    let id = a.live_sandbox().await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/sandboxes/{id}/processes"))
        .header("authorization", format!("Bearer {}", a.key))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({ "command": ["echo", "in", "place"] }).to_string(),
        ))
        .expect("request");
    let mut resp = a.router.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let attached = resp
        .extensions_mut()
        .remove::<Attached>()
        .expect("the start's answer carries the process");
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let body: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(body["pid"], json!(attached.pid()), "{body}");

    let pid = attached.pid();
    let mut follow = attached.follow(0);
    let mut out = Vec::new();
    let ending = loop {
        let piece = tokio::time::timeout(Duration::from_secs(30), follow.next())
            .await
            .expect("the echo ends well within 30 s");
        match piece {
            Piece::Output(chunks) => {
                for c in chunks {
                    assert_eq!(c.stream, Stream::Stdout);
                    assert_eq!(c.at, out.len() as u64, "offsets follow on");
                    out.extend_from_slice(&c.bytes);
                }
            }
            Piece::End(e) => break e,
            Piece::Behind { .. } => panic!("a few bytes never fall behind"),
        }
    };
    assert_eq!(out, b"in place\n");
    assert!(
        matches!(ending, Ending::Exit { exit_code: 0, .. }),
        "{ending:?}"
    );
    // The /v1 view of the same process agrees.
    let got = a
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{id}/processes/{pid}"),
            Some(&a.key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(
        (
            &got.body["status"],
            &got.body["exitCode"],
            &got.body["outputBytes"]
        ),
        (&json!("exited"), &json!(0), &json!(9)),
        "{}",
        got.body
    );
}
