//! The `cause` the API's public events carry is the one docs/events.md's publisher table
//! gives for their type: an exec or a file write by an operator's admin key says `admin`, and
//! a placement says `quota` (placement decides under quotas and capacity).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use futures::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{api, Api};

/// The first `n` public events of `GET /v1/events` filtered to `types`, within 30 seconds.
async fn public_events(api: &Api, types: &str, n: usize) -> Vec<Value> {
    let path = format!("/v1/events?after=0&format=public&types={types}");
    let req = Request::builder()
        .method(Method::GET)
        .uri(&path)
        .header("authorization", format!("Bearer {}", api.key))
        .body(Body::empty())
        .expect("request");
    let resp = api.router.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let mut body = resp.into_body().into_data_stream();
    let (mut text, mut out) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("{path}: only {} of {n} events: {out:?}", out.len()))
            .expect("the stream stays open")
            .expect("a chunk");
        text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let data: String = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            if !data.is_empty() {
                out.push(serde_json::from_str(&data).expect("JSON data"));
            }
        }
    }
    out
}

/// docs/events.md's "Who publishes what" table: each event type with the backticked words of
/// its Cause column. `` `snapshot.created` / `.failed` `` names two types.
fn documented_causes() -> Vec<(String, Vec<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/events.md");
    let doc = std::fs::read_to_string(path).expect("docs/events.md");
    let backticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with("| Type | Published by, when | Cause |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (types, cause) = (backticked(cells[1]), backticked(cells[3]));
        let first = types.first().cloned().unwrap_or_default();
        for t in &types {
            let full = match t.strip_prefix('.') {
                Some(last) => match first.rsplit_once('.') {
                    Some((base, _)) => format!("{base}.{last}"),
                    None => t.clone(),
                },
                None => t.clone(),
            };
            rows.push((full, cause.clone()));
        }
    }
    assert!(!rows.is_empty(), "no publisher table in docs/events.md");
    rows
}

/// Fails unless docs/events.md's publisher table names `e`'s cause for `e`'s type.
fn assert_documented_cause(table: &[(String, Vec<String>)], e: &Value) {
    let ty = e["type"].as_str().expect("a type");
    let cause = e["cause"].as_str().expect("a cause");
    let (_, causes) = table
        .iter()
        .find(|(t, _)| t == ty)
        .unwrap_or_else(|| panic!("docs/events.md's publisher table has no row for {ty}"));
    assert!(
        causes.iter().any(|c| c == cause),
        "{ty} says cause {cause}; docs/events.md's publisher table gives {causes:?}"
    );
}

#[tokio::test]
async fn execs_and_file_writes_by_the_admin_key_say_admin_as_documented() {
    let api = api().await;
    let id = api.live_sandbox().await;
    let exec = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["/usr/bin/env"] }),
        )
        .await;
    assert_eq!(exec.status, StatusCode::OK, "{}", exec.body);
    let put = api
        .call_raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/notes.txt"),
            Some(&api.key),
            b"a".to_vec(),
            &[("content-type", "application/octet-stream")],
        )
        .await;
    assert_eq!(put.status, StatusCode::NO_CONTENT, "{}", put.body);
    let got = public_events(&api, "sandbox.exec.*,sandbox.file.*", 3).await;
    let table = documented_causes();
    for e in &got {
        assert_eq!(e["cause"], "admin", "{e}");
        // An admin key's id is not shown to tenants.
        assert!(e["actor"].is_null(), "{e}");
        assert_documented_cause(&table, e);
    }
}

#[tokio::test]
async fn a_placement_says_quota_as_documented() {
    let api = api().await;
    let id = api.running_sandbox().await;
    let row = api
        .store
        .get_sandbox(&differently_core::SandboxId::parse(&id).expect("id"))
        .await
        .expect("read")
        .expect("the row");
    // What the leader and the admission both publish when they activate a sandbox.
    let announcer = differently_bus::Announcer::new(api.bus.clone(), api.naming.clone());
    announcer
        .placed(&row)
        .await
        .expect("an activated row has a pool")
        .expect("published");
    let got = public_events(&api, "placement.decided", 1).await;
    assert_eq!(got[0]["cause"], "quota", "{}", got[0]);
    assert_documented_cause(&documented_causes(), &got[0]);
}
