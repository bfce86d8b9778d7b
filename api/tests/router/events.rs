//! `/v1/events` serves the public events (`format=public`) and the flat status form, both
//! from the public stream, and `/v1/events/schemas` the schemas they fit.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use futures::StreamExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::support::{api, Api};

/// The first `n` SSE events (`event`, `id`, `data`) of `GET path`, within five seconds.
pub(crate) async fn sse(
    api: &Api,
    path: &str,
    key: &str,
    n: usize,
) -> Vec<(String, String, Value)> {
    let req = Request::builder()
        .method(Method::GET)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .body(Body::empty())
        .expect("request");
    let resp = api.router.clone().oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), StatusCode::OK, "{path}");
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while out.len() < n {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("{path}: only {} of {n} events: {out:?}", out.len()))
            .expect("the stream stays open")
            .expect("a chunk");
        text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                out.push((event, id, serde_json::from_str(&data).expect("JSON data")));
            }
        }
    }
    out
}

/// Checks that `e` has every field the schema served for its type requires, its `data` too;
/// answers the schema.
async fn fits_its_schema(api: &Api, key: &str, e: &Value) -> Value {
    let ty = e["type"].as_str().expect("a type");
    let schema = api
        .call(
            Method::GET,
            &format!("/v1/events/schemas/{ty}"),
            Some(key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(schema.status, StatusCode::OK, "{ty}");
    for field in schema.body["required"].as_array().expect("required") {
        let f = field.as_str().expect("name");
        assert!(e.get(f).is_some(), "{f} missing in {e}");
    }
    for field in schema.body["properties"]["data"]["required"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let f = field.as_str().expect("name");
        assert!(e["data"].get(f).is_some(), "data.{f} missing in {e}");
    }
    schema.body
}

#[tokio::test]
async fn a_create_is_one_public_status_event_with_its_cause_and_actor_and_no_internals() {
    let api = api().await;
    let key = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let body = json!({ "projectId": api.tenant.project.id });
    let created = api
        .call(Method::POST, "/v1/sandboxes", Some(&key), body, &[])
        .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    let id = created.body["id"].as_str().expect("id").to_owned();

    let public = sse(&api, "/v1/events?after=0&format=public", &key, 1).await;
    let (event, seq, e) = &public[0];
    assert_eq!(event, "sandbox.status.changed");
    assert_eq!(e["type"], "sandbox.status.changed");
    assert_eq!(e["version"], 1);
    assert_eq!(e["sandboxId"], id.as_str());
    assert_eq!(e["orgId"], api.tenant.org.id.to_string().as_str());
    assert_eq!(e["cause"], "user");
    assert!(
        e["actor"]["keyId"]
            .as_str()
            .is_some_and(|k| k.starts_with("key_")),
        "{e}"
    );
    assert_eq!(e["data"]["status"], "queued");
    assert_eq!(e["id"], format!("{id}:sandbox.status.changed:1").as_str());
    let text = e.to_string();
    assert!(
        !text.contains("backendRef") && !text.contains("auditHead"),
        "{text}"
    );
    // The key itself is nowhere, only its id.
    assert!(!text.contains(&key), "the key leaked");
    // It fits the schema the API serves for its type.
    let schema = fits_its_schema(&api, &key, e).await;
    assert_eq!(
        schema["properties"]["type"]["const"],
        "sandbox.status.changed"
    );

    // The flat form is the same event at the same sequence.
    let flat = sse(&api, "/v1/events?after=0", &key, 1).await;
    assert_eq!(flat[0].0, "status");
    assert_eq!(
        &flat[0].1, seq,
        "both forms share ids (resume works across them)"
    );
    assert_eq!(flat[0].2["sandboxId"], id.as_str());
    assert_eq!(flat[0].2["status"], "queued");
    assert_eq!(flat[0].2["statusVersion"], e["data"]["statusVersion"]);

    // `types` narrows; resuming after the event's id skips it.
    let deleted = api
        .call(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Some(&key),
            Value::Null,
            &[],
        )
        .await;
    assert!(deleted.status.is_success(), "{}", deleted.body);
    let after = sse(
        &api,
        &format!("/v1/events?after={seq}&format=public&types=sandbox.status.*"),
        &key,
        1,
    )
    .await;
    assert_eq!(after[0].2["data"]["status"], "terminated");
    assert_eq!(after[0].2["cause"], "user");
}

#[tokio::test]
async fn another_orgs_events_never_reach_a_stream() {
    let api = api().await;
    let org = api
        .admin(Method::POST, "/v1/orgs", json!({ "name": "other-events" }))
        .await;
    assert_eq!(org.status, StatusCode::CREATED, "{}", org.body);
    let other_org = org.body["id"].as_str().expect("org id").to_owned();
    let other = api
        .key_with(Some(&other_org), &["sandboxes:read", "sandboxes:write"])
        .await;
    let mine = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let project = api
        .admin(
            Method::POST,
            "/v1/projects",
            json!({ "orgId": other_org, "name": "p" }),
        )
        .await;
    assert_eq!(project.status, StatusCode::CREATED, "{}", project.body);
    // Theirs is published first: a stream that let it through would show it first.
    let theirs = api
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&other),
            json!({ "projectId": project.body["id"] }),
            &[],
        )
        .await;
    assert_eq!(theirs.status, StatusCode::ACCEPTED, "{}", theirs.body);
    let own = api
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&mine),
            json!({ "projectId": api.tenant.project.id }),
            &[],
        )
        .await;
    assert_eq!(own.status, StatusCode::ACCEPTED, "{}", own.body);
    let their_view = sse(&api, "/v1/events?after=0&format=public", &other, 1).await;
    assert_eq!(their_view[0].2["sandboxId"], theirs.body["id"]);
    let got = sse(&api, "/v1/events?after=0&format=public", &mine, 1).await;
    assert_eq!(got[0].2["sandboxId"], own.body["id"]);
    assert_eq!(got[0].2["orgId"], api.tenant.org.id.to_string().as_str());
}

#[tokio::test]
async fn schemas_are_listed_and_bad_queries_refused() {
    let api = api().await;
    let key = api.key_with(None, &["sandboxes:read"]).await;
    let list = api
        .call(
            Method::GET,
            "/v1/events/schemas",
            Some(&key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(list.status, StatusCode::OK);
    let types: Vec<&str> = list.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["type"].as_str())
        .collect();
    assert!(types.contains(&"sandbox.exec.finished") && types.contains(&"placement.decided"));
    let missing = api
        .call(
            Method::GET,
            "/v1/events/schemas/sandbox.nope",
            Some(&key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    // Each refusal names the parameter (or header) the bad value came from, in the API's
    // words, never the HTTP framework's.
    for (q, header, field) in [
        ("format=xml", None, "format"),
        ("types=nope&format=public", None, "types"),
        ("types=sandbox.status.changed", None, "types"),
        ("after=-1", None, "after"),
        ("after=99999999999999999999", None, "after"),
        ("bogus=1", None, "bogus"),
        ("after=1&after=2", None, "after"),
        ("", Some("-1"), "Last-Event-ID"),
        ("after=-1", Some("x"), "Last-Event-ID"),
    ] {
        let headers: Vec<(&str, &str)> = header.map(|h| ("last-event-id", h)).into_iter().collect();
        let a = api
            .call(
                Method::GET,
                &format!("/v1/events?{q}"),
                Some(&key),
                Value::Null,
                &headers,
            )
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{q}: {}", a.body);
        assert_eq!(
            a.body["error"]["details"]["field"], field,
            "{q}: {}",
            a.body
        );
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("{field}: ")),
            "{q}: {}",
            a.body
        );
        assert!(!message.contains("deserialize"), "{q}: {}", a.body);
    }
}

#[tokio::test]
async fn credentials_without_a_nats_callout_are_a_clear_501_after_the_body_is_checked() {
    let api = api().await;
    let key = api.key_with(None, &["sandboxes:read"]).await;
    let a = api
        .call(
            Method::POST,
            "/v1/events/credentials",
            Some(&key),
            json!({}),
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::NOT_IMPLEMENTED, "{}", a.body);
    assert_eq!(a.code(), "unsupported_operation");
    assert!(
        a.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("auth callout")),
        "{}",
        a.body
    );
    let bad = api
        .call(
            Method::POST,
            "/v1/events/credentials",
            Some(&key),
            json!({ "ttlSeconds": 5 }),
            &[],
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert_eq!(bad.body["error"]["details"]["field"], "ttlSeconds");
    let revoke = api
        .call(
            Method::DELETE,
            "/v1/events/credentials/evc_01JD0000000000000000000009",
            Some(&key),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(
        revoke.status,
        StatusCode::NOT_IMPLEMENTED,
        "{}",
        revoke.body
    );
}

#[tokio::test]
async fn a_lifecycle_request_is_a_public_operation_requested_event_of_its_key() {
    let api = std::sync::Arc::new(api().await);
    let key = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let id = api.running_sandbox().await;
    // No worker runs here: the snapshot is requested and stays pending; the call may wait.
    let (caller, path, k) = (
        api.clone(),
        format!("/v1/sandboxes/{id}/snapshots"),
        key.clone(),
    );
    let call = tokio::spawn(async move {
        caller
            .call(Method::POST, &path, Some(&k), json!({}), &[])
            .await
    });
    if let Ok(done) = tokio::time::timeout(Duration::from_secs(1), call).await {
        let a = done.expect("the call");
        panic!(
            "the snapshot call answered at once: {} {}",
            a.status, a.body
        );
    }
    let got = sse(
        &api,
        "/v1/events?after=0&format=public&types=sandbox.operation.*",
        &key,
        1,
    )
    .await;
    let e = &got[0].2;
    assert_eq!(e["type"], "sandbox.operation.requested", "{e}");
    assert_eq!(e["sandboxId"], id.as_str());
    assert_eq!(e["data"]["operation"], "snapshot");
    assert_eq!(e["cause"], "user");
    assert!(e["actor"]["keyId"].as_str().is_some(), "{e}");
}

#[tokio::test]
async fn an_exec_and_a_file_write_are_public_events_without_arguments_env_or_content() {
    let api = api().await;
    let key = api
        .key_with(
            None,
            &[
                "sandboxes:read",
                "sandboxes:exec",
                "files:write",
                "files:read",
            ],
        )
        .await;
    let id = api.live_sandbox().await;
    let exec = api
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&key),
            json!({
                "command": ["/usr/bin/env", "ARG_SECRET_1"],
                "env": { "TOKEN": "ENV_SECRET_2" },
            }),
            &[],
        )
        .await;
    assert_eq!(exec.status, StatusCode::OK, "{}", exec.body);
    let put = api
        .call_raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path=/tmp/notes.txt"),
            Some(&key),
            b"CONTENT_SECRET_3".to_vec(),
            &[("content-type", "application/octet-stream")],
        )
        .await;
    assert_eq!(put.status, StatusCode::NO_CONTENT, "{}", put.body);

    let got = sse(
        &api,
        "/v1/events?after=0&format=public&types=sandbox.exec.*,sandbox.file.*",
        &key,
        3,
    )
    .await;
    let types: Vec<&str> = got.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "sandbox.exec.started",
            "sandbox.exec.finished",
            "sandbox.file.written"
        ],
        "{got:?}"
    );
    let (started, finished, written) = (&got[0].2, &got[1].2, &got[2].2);
    assert_eq!(started["sandboxId"], id.as_str());
    assert_eq!(started["data"]["program"], "env", "{started}");
    assert_eq!(started["cause"], "user");
    assert!(started["actor"]["keyId"].as_str().is_some(), "{started}");
    assert_eq!(
        finished["data"]["execId"], started["data"]["execId"],
        "one exec id for both"
    );
    assert_eq!(
        finished["data"]["exitCode"], exec.body["exitCode"],
        "{finished}"
    );
    assert_eq!(finished["data"]["timedOut"], false);
    assert!(finished["data"]["durationMs"].is_u64(), "{finished}");
    assert_eq!(written["data"]["path"], "/tmp/notes.txt");
    assert_eq!(written["data"]["sizeBytes"], 16);
    for (ty, _, e) in &got {
        let text = e.to_string();
        for secret in [
            "ARG_SECRET_1",
            "ENV_SECRET_2",
            "CONTENT_SECRET_3",
            key.as_str(),
        ] {
            assert!(!text.contains(secret), "{ty} carries {secret}: {text}");
        }
        fits_its_schema(&api, &key, e).await;
    }
}

/// A command that outlives the start grace has its `started` event published while it still
/// runs, stamped with its start; a quick one has both once it answers (the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_exec_is_announced_as_started_while_it_runs() {
    let api = api().await;
    let key = api
        .key_with(None, &["sandboxes:read", "sandboxes:exec"])
        .await;
    let id = api.live_sandbox().await;
    let before = chrono::Utc::now();
    let exec = Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/sandboxes/{id}/exec"))
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({ "command": ["sleep", "1.5"] }).to_string(),
        ))
        .expect("request");
    let running = tokio::spawn(api.router.clone().oneshot(exec));
    let got = sse(
        &api,
        "/v1/events?after=0&format=public&types=sandbox.exec.*",
        &key,
        1,
    )
    .await;
    assert!(!running.is_finished(), "started came only after the answer");
    assert_eq!(got[0].0, "sandbox.exec.started", "{got:?}");
    let at: chrono::DateTime<chrono::Utc> = got[0].2["time"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a time: {}", got[0].2));
    assert!(
        at >= before && at < before + chrono::Duration::milliseconds(500),
        "stamped at the start ({before}), not when published: {at}"
    );
    let answer = running.await.expect("joined").expect("infallible");
    assert_eq!(answer.status(), StatusCode::OK);
    let both = sse(
        &api,
        "/v1/events?after=0&format=public&types=sandbox.exec.*",
        &key,
        2,
    )
    .await;
    let types: Vec<&str> = both.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(types, ["sandbox.exec.started", "sandbox.exec.finished"]);
}
