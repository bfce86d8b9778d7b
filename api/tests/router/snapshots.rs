//! Snapshots: their idempotency scope and their lifetime against their project's.

use axum::http::{Method, StatusCode};
use chrono::Utc;
use differently_core::ids::SnapshotId;
use differently_core::{ProjectId, SandboxId};
use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};
use serde_json::{json, Value};

use crate::support::{api, assert_error, assert_field_error, Api};

#[tokio::test]
async fn one_idempotency_key_on_two_sandboxes_makes_two_snapshots() {
    let api = api().await;
    let _ops = api.complete_ops();
    let (x, y) = (api.running_sandbox().await, api.running_sandbox().await);
    let key = api.key.clone();
    let snapshot = |id: String| {
        let key = key.clone();
        let api = &api;
        async move {
            api.call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(&key),
                Value::Null,
                &[("idempotency-key", "snap-1")],
            )
            .await
        }
    };
    let first = snapshot(x.clone()).await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.body);
    assert_eq!(first.body["sandboxId"], x.as_str(), "{}", first.body);
    let other = snapshot(y.clone()).await;
    assert_eq!(other.status, StatusCode::ACCEPTED, "{}", other.body);
    assert!(
        other.headers.get("idempotent-replayed").is_none(),
        "another sandbox's snapshot is not a replay: {}",
        other.body
    );
    assert_eq!(other.body["sandboxId"], y.as_str(), "{}", other.body);
    assert_ne!(other.body["id"], first.body["id"]);
    // The same key on the same sandbox still replays.
    let again = snapshot(x.clone()).await;
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body["id"], first.body["id"]);
}

/// A ready snapshot of `project` recorded directly in the store, taken from `sandbox` (which
/// need not exist: a snapshot whose source row is gone).
async fn stored_snapshot(api: &Api, project: &str, sandbox: &str) -> String {
    let now = Utc::now();
    let snap = SnapshotRecord {
        id: SnapshotId::new(),
        org_id: api.tenant.org.id.clone(),
        project_id: ProjectId::parse(project).unwrap(),
        sandbox_id: SandboxId::parse(sandbox).unwrap(),
        pool: "fake".into(),
        name: None,
        status: SnapshotStatus::Ready,
        status_reason: None,
        backend_ref: Some("fake-snap-router".into()),
        created_at: now,
        updated_at: now,
    };
    api.store.insert_snapshot(&snap).await.unwrap();
    snap.id.to_string()
}

async fn new_project(api: &Api, name: &str) -> String {
    let a = api
        .admin(Method::POST, "/v1/projects", json!({ "name": name }))
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    a.body["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_project_with_snapshots_is_not_deleted() {
    let api = api().await;
    let project = new_project(&api, "web").await;
    let snap = stored_snapshot(&api, &project, SandboxId::new().as_str()).await;
    let a = api
        .admin(
            Method::DELETE,
            &format!("/v1/projects/{project}"),
            Value::Null,
        )
        .await;
    assert_error(&a, StatusCode::CONFLICT, "conflict");
    let message = a.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("1 snapshots"), "{message}");
    let kept = SnapshotId::parse(&snap).unwrap();
    assert!(api.store.get_snapshot(&kept).await.unwrap().is_some());

    // The project's snapshots are an org-wide key's (the admin key is bound to another).
    let org_wide = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let gone = api
        .call(
            Method::DELETE,
            &format!("/v1/snapshots/{snap}"),
            Some(&org_wide),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.body);
    let a = api
        .admin(
            Method::DELETE,
            &format!("/v1/projects/{project}"),
            Value::Null,
        )
        .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.body);
}

#[tokio::test]
async fn a_snapshot_whose_source_row_is_gone_can_still_be_deleted() {
    let api = api().await;
    let project = api.tenant.project.id.to_string();
    let snap = stored_snapshot(&api, &project, SandboxId::new().as_str()).await;
    let a = api
        .admin(
            Method::DELETE,
            &format!("/v1/snapshots/{snap}"),
            Value::Null,
        )
        .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.body);
    let read = api
        .admin(Method::GET, &format!("/v1/snapshots/{snap}"), Value::Null)
        .await;
    assert_error(&read, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn a_snapshot_is_not_restored_into_another_project() {
    let api = api().await;
    let org_wide = api
        .key_with(None, &["sandboxes:read", "sandboxes:write"])
        .await;
    let other = new_project(&api, "other").await;
    let source = api.running_sandbox().await;
    let snap = stored_snapshot(&api, api.tenant.project.id.as_str(), &source).await;
    let create = |project: String| {
        api.call(
            Method::POST,
            "/v1/sandboxes",
            Some(&org_wide),
            json!({ "projectId": project, "fromSnapshot": snap }),
            &[],
        )
    };
    let a = create(other.clone()).await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "fromSnapshot",
    );
    let same = create(api.tenant.project.id.to_string()).await;
    assert_eq!(same.status, StatusCode::ACCEPTED, "{}", same.body);
}

/// A dry run of a restore is decided as the create is: an unknown or malformed snapshot is
/// the create's 404 naming `fromSnapshot`, and a known one pins the request to the pool that
/// holds it, every other pool excluded with the reason the create's explanation gives.
#[tokio::test]
async fn a_dry_run_of_a_restore_is_pinned_to_the_snapshots_pool() {
    let api = api().await;
    let dry = |body: Value| api.admin(Method::POST, "/v1/placement/dry-run", body);
    for unknown in ["snp_00000000000000000000000000", "garbage"] {
        let a = dry(json!({ "fromSnapshot": unknown })).await;
        assert_field_error(&a, StatusCode::NOT_FOUND, "not_found", "fromSnapshot");
    }
    let source = api.running_sandbox().await;
    let snap = stored_snapshot(&api, api.tenant.project.id.as_str(), &source).await;
    // A second pool the snapshot is not on.
    let other = crate::support::api_pool(&api, "elsewhere", None).await;
    let fake = api.pools.get("fake").expect("the fake pool").record.clone();
    assert!(api.pools.sync(vec![fake, other]).is_empty());
    crate::support::healthy(&api, &["fake", "elsewhere"]);
    let a = dry(json!({ "fromSnapshot": snap })).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["decision"], "placed", "{}", a.body);
    assert_eq!(a.body["pool"], "fake", "{}", a.body);
    let elsewhere = a.body["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|v| v["name"] == "elsewhere"))
        .unwrap_or_else(|| panic!("the other pool is explained: {}", a.body));
    assert_eq!(elsewhere["eligible"], false, "{}", a.body);
    assert!(
        elsewhere["reason"]
            .as_str()
            .is_some_and(|r| r.contains("pinned to pool fake")),
        "{}",
        a.body
    );
}
