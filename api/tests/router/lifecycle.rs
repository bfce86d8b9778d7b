//! Changes of a sandbox that has no backend yet: no scheduler runs here, so a create stays
//! queued, which is what these routes must handle without a backend call.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error, assert_field_error};

#[tokio::test]
async fn pausing_a_queued_sandbox_is_409_naming_its_status() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/pause"),
            Value::Null,
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    assert_eq!(a.body["error"]["details"]["status"], "queued", "{}", a.body);
}

#[tokio::test]
async fn exec_on_a_queued_sandbox_is_409_naming_its_status() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["true"] }),
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    assert_eq!(a.body["error"]["details"]["status"], "queued", "{}", a.body);
}

#[tokio::test]
async fn a_patch_out_of_range_is_422_naming_the_field() {
    let api = api().await;
    let id = api.sandbox().await;
    let a = api
        .admin(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            json!({ "ttlSeconds": 0 }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "ttlSeconds",
    );
    let labels = api
        .admin(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            json!({ "labels": { "team": "b" } }),
        )
        .await;
    assert_eq!(labels.status, StatusCode::OK, "{}", labels.body);
    assert_eq!(labels.body["labels"]["team"], "b", "{}", labels.body);
}

#[tokio::test]
async fn deleting_a_queued_sandbox_ends_it_and_a_second_delete_is_200() {
    let api = api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    let first = api.admin(Method::DELETE, &path, Value::Null).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["status"], "terminated", "{}", first.body);
    let again = api.admin(Method::DELETE, &path, Value::Null).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["status"], "terminated", "{}", again.body);
}

/// The statuses of `id` on the internal status stream, in order, up to its first final one
/// (the stream is read until then: every wait here ends with an event).
async fn internal_statuses(api: &crate::support::Api, id: &str) -> Vec<String> {
    use differently_bus_schema::StatusOnly;
    use futures::StreamExt;
    let stream = api.naming.events_stream().name;
    let filter = format!("{}.evt.>", api.naming.prefix());
    let mut events = api.bus.events(&stream, &filter, Some(0)).await.unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = ev.unwrap();
        let Some(env) = differently_bus::decode_event::<StatusOnly>(&ev) else {
            continue;
        };
        if env.sandbox_id.as_str() != id {
            continue;
        }
        seen.push(env.body.status.to_string());
        if env.body.status.is_final() {
            return seen;
        }
    }
    panic!("the internal stream ended after {seen:?}");
}

/// A create placed in its admission and a delete are changes the API made and answered:
/// their `provisioning` and `terminating` go out in public only, where tenants see every
/// status; the internal stream carries what its readers act on (running, the final status),
/// announced here by the store and announcer as a worker would.
#[tokio::test]
async fn the_apis_own_provisioning_and_terminating_are_public_only() {
    use chrono::Utc;
    use differently_core::{SandboxId, SandboxStatus};
    use differently_store::{Actor, Transition};
    let api = crate::support::api_with(differently_api::Limits {
        direct_placement: true,
        ..differently_api::Limits::default()
    })
    .await;
    let record = crate::support::api_pool(&api, "direct", None).await;
    assert!(api.pools.sync(vec![record]).is_empty());
    crate::support::healthy(&api, &["direct"]);
    let worker = differently_bus::Announcer::new(api.bus.clone(), api.naming.clone());
    let key = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;

    let body = json!({ "projectId": api.tenant.project.id });
    let created = api
        .call(Method::POST, "/v1/sandboxes", Some(&key), body, &[])
        .await;
    assert_eq!(created.status, StatusCode::ACCEPTED, "{}", created.body);
    assert_eq!(created.body["status"], "provisioning", "{}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();
    let sid = SandboxId::parse(&id).unwrap();
    let running = api
        .store
        .mark_running(&sid, "ref", Utc::now())
        .await
        .unwrap();
    worker.status(&running).await.unwrap();
    let path = format!("/v1/sandboxes/{id}");
    let deleted = api
        .call(Method::DELETE, &path, Some(&key), Value::Null, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::ACCEPTED, "{}", deleted.body);
    assert_eq!(deleted.body["status"], "terminating", "{}", deleted.body);
    let ended = api
        .store
        .transition(
            Transition {
                id: sid.clone(),
                from: vec![SandboxStatus::Terminating],
                to: SandboxStatus::Terminated,
                reason: None,
                actor: Actor::System("worker"),
            },
            Utc::now(),
        )
        .await
        .unwrap();
    worker.status(&ended).await.unwrap();

    assert_eq!(
        internal_statuses(&api, &id).await,
        ["running", "terminated"]
    );
    let public = crate::events::sse(
        &api,
        "/v1/events?after=0&format=public&types=sandbox.status.*",
        &key,
        4,
    )
    .await;
    let statuses: Vec<&str> = public
        .iter()
        .map(|(_, _, e)| e["data"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["provisioning", "running", "terminating", "terminated"]
    );
}
