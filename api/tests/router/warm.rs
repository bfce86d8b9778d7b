//! `/v1/admin/pools/{name}/warm`: a pool's warm classes put and read back with their counts.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_error, assert_field_error};

/// An API with a registered pool `warmy` (the router's fake pool is not in the registry).
async fn api_with_pool() -> crate::support::Api {
    let api = api().await;
    let pool = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "warmy", "kind": "fake" }),
        )
        .await;
    assert_eq!(pool.status, StatusCode::CREATED, "{}", pool.body);
    api
}

fn class(name: &str) -> Value {
    json!({ "name": name, "size": 2, "refillPerSecond": 1 })
}

#[tokio::test]
async fn classes_put_are_served_with_their_counts_and_audited() {
    let api = api_with_pool().await;
    let empty = api
        .admin(Method::GET, "/v1/admin/pools/warmy/warm", Value::Null)
        .await;
    assert_eq!(empty.status, StatusCode::OK, "{}", empty.body);
    assert_eq!(empty.body, json!({ "classes": [] }));

    let mut py = class("py");
    py["template"] = json!("python:3.12");
    py["resources"] = json!({ "cpu": 2, "memoryMiB": 2048, "diskGiB": 5 });
    let put = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [class("default"), py] }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let classes = put.body["classes"].as_array().expect("classes");
    assert_eq!(classes.len(), 2, "{}", put.body);
    assert_eq!(classes[0]["name"], "default");
    assert_eq!(classes[0]["maxAgeSeconds"], 3600, "the default is served");
    assert_eq!(classes[0]["ready"], 0);
    assert_eq!(classes[0]["creating"], 0);
    assert_eq!(classes[1]["template"], "python:3.12");
    assert_eq!(classes[1]["resources"]["cpu"], 2);

    // An instance the refill leader reserved and one made ready show in the counts.
    let a = differently_core::SandboxId::new();
    let b = differently_core::SandboxId::new();
    let now = chrono::Utc::now();
    api.store.warm_begin("warmy", "py", &a, now).await.unwrap();
    api.store.warm_begin("warmy", "py", &b, now).await.unwrap();
    assert!(api.store.warm_ready(&b, "be-b", now).await.unwrap());
    let got = api
        .admin(Method::GET, "/v1/admin/pools/warmy/warm", Value::Null)
        .await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["classes"][1]["ready"], 1, "{}", got.body);
    assert_eq!(got.body["classes"][1]["creating"], 1, "{}", got.body);
    assert_eq!(got.body["classes"][0]["ready"], 0, "{}", got.body);

    // Installation records are not an organization's, so the store is read directly.
    let sets: Vec<_> = api
        .store
        .audit_tail(1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.action == "pool.warm.set")
        .collect();
    assert_eq!(sets.len(), 1, "one record for the one change: {sets:?}");
    assert_eq!(sets[0].resource, "pool:warmy");
    assert_eq!(sets[0].detail["new"]["classes"][1]["name"], "py");

    // `[]` removes every class.
    let cleared = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [] }),
        )
        .await;
    assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.body);
    assert_eq!(cleared.body, json!({ "classes": [] }));
}

#[tokio::test]
async fn an_invalid_class_is_a_422_naming_its_index_and_field() {
    let api = api_with_pool().await;
    let mut bad = class("b");
    bad["size"] = json!(5000);
    let a = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [class("a"), bad] }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "classes[1].size",
    );
    let dup = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [class("a"), class("a")] }),
        )
        .await;
    assert_field_error(
        &dup,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "classes[1].name",
    );
    let mut res = class("a");
    res["resources"] = json!({ "cpu": 0, "memoryMiB": 1024, "diskGiB": 5 });
    let a = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [res] }),
        )
        .await;
    assert_field_error(
        &a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "classes[0].resources.cpu",
    );
    // Nothing was written.
    let got = api
        .admin(Method::GET, "/v1/admin/pools/warmy/warm", Value::Null)
        .await;
    assert_eq!(got.body, json!({ "classes": [] }));
}

#[tokio::test]
async fn an_unknown_pool_is_404_and_a_tenant_key_is_refused() {
    let api = api_with_pool().await;
    for method in [Method::GET, Method::PUT] {
        let body = if method == Method::PUT {
            json!({ "classes": [class("a")] })
        } else {
            Value::Null
        };
        let a = api
            .admin(method.clone(), "/v1/admin/pools/nope/warm", body.clone())
            .await;
        assert_error(&a, StatusCode::NOT_FOUND, "not_found");
        let key = api
            .key_with(None, &["sandboxes:write", "sandboxes:read"])
            .await;
        let a = api
            .call(method, "/v1/admin/pools/warmy/warm", Some(&key), body, &[])
            .await;
        assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
    }
}

/// An API placing creates in their admission over two identical uncapped fake pools,
/// `a-cold` (ranked first: ties go in configured order) and `b-warm`, both healthy and
/// registered, `b-warm` with a warm class `default` matching a create that asks for nothing.
async fn api_with_two_pools() -> crate::support::Api {
    use differently_api::Limits;
    let api = crate::support::api_with(Limits {
        direct_placement: true,
        ..Limits::default()
    })
    .await;
    let records = vec![
        crate::support::api_pool(&api, "a-cold", None).await,
        crate::support::api_pool(&api, "b-warm", None).await,
    ];
    assert!(api.pools.sync(records).is_empty());
    crate::support::healthy(&api, &["a-cold", "b-warm"]);
    let put = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/b-warm/warm",
            json!({ "classes": [class("default")] }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    api
}

/// Makes one instance of `b-warm`'s class ready, as the refill leader and a worker would.
async fn ready_instance(api: &crate::support::Api) -> differently_core::SandboxId {
    let id = differently_core::SandboxId::new();
    let now = chrono::Utc::now();
    api.store
        .warm_begin("b-warm", "default", &id, now)
        .await
        .unwrap();
    assert!(api.store.warm_ready(&id, "be-warm", now).await.unwrap());
    id
}

fn reason_of(explained: &Value, pool: &str) -> String {
    explained["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|v| v["name"] == pool)
        .and_then(|v| v["reason"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_matching_create_ranks_the_pool_with_a_ready_instance_first_and_claims_it() {
    let api = api_with_two_pools().await;
    // Nothing ready: policy's ranking stands, and the warm pool says none is ready.
    let dry = api
        .admin(Method::POST, "/v1/placement/dry-run", json!({}))
        .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.body);
    assert_eq!(dry.body["pool"], "a-cold", "{}", dry.body);
    assert!(
        reason_of(&dry.body, "b-warm").contains("warm: none ready (class default)"),
        "{}",
        dry.body
    );

    let warm_id = ready_instance(&api).await;
    let dry = api
        .admin(Method::POST, "/v1/placement/dry-run", json!({}))
        .await;
    assert_eq!(dry.body["pool"], "b-warm", "{}", dry.body);
    assert!(
        reason_of(&dry.body, "b-warm").contains("warm: ready (class default)"),
        "{}",
        dry.body
    );
    // A create the class does not match is placed as policy ranks it.
    let other = api
        .admin(
            Method::POST,
            "/v1/placement/dry-run",
            json!({ "resources": { "cpu": 2 } }),
        )
        .await;
    assert_eq!(other.body["pool"], "a-cold", "{}", other.body);
    assert!(
        !reason_of(&other.body, "b-warm").contains("warm"),
        "{}",
        other.body
    );

    // The create claims the instance in its admission: running at once, under its id.
    let made = api.admin(Method::POST, "/v1/sandboxes", json!({})).await;
    assert_eq!(made.status, StatusCode::ACCEPTED, "{}", made.body);
    assert_eq!(made.body["id"], warm_id.to_string(), "{}", made.body);
    assert_eq!(made.body["status"], "running", "{}", made.body);
    assert_eq!(made.body["pool"], "b-warm", "{}", made.body);
    let placement = api
        .admin(
            Method::GET,
            &format!("/v1/sandboxes/{warm_id}/placement"),
            Value::Null,
        )
        .await;
    assert_eq!(placement.status, StatusCode::OK, "{}", placement.body);
    assert_eq!(placement.body["pool"], "b-warm", "{}", placement.body);
    assert!(
        reason_of(&placement.body, "b-warm").contains("warm: ready (class default)"),
        "{}",
        placement.body
    );
    let counts = api.store.warm_counts("b-warm").await.unwrap();
    assert_eq!((counts[0].ready, counts[0].creating), (0, 0), "{counts:?}");

    // None left: this process knows it took the last one, so policy's ranking stands and
    // the next create is placed cold.
    let next = api.admin(Method::POST, "/v1/sandboxes", json!({})).await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{}", next.body);
    assert_eq!(next.body["pool"], "a-cold", "{}", next.body);
    assert_eq!(next.body["status"], "provisioning", "{}", next.body);
}

#[tokio::test]
async fn warm_capacity_never_brings_a_pool_policy_excluded() {
    let api = api_with_two_pools().await;
    let warm_id = ready_instance(&api).await;
    let policy = api
        .admin(
            Method::PUT,
            "/v1/admin/policies/global",
            json!({ "deniedPools": ["b-warm"] }),
        )
        .await;
    assert_eq!(policy.status, StatusCode::OK, "{}", policy.body);
    let dry = api
        .admin(Method::POST, "/v1/placement/dry-run", json!({}))
        .await;
    assert_eq!(dry.body["pool"], "a-cold", "{}", dry.body);
    assert!(
        !reason_of(&dry.body, "b-warm").contains("warm"),
        "{}",
        dry.body
    );
    let made = api.admin(Method::POST, "/v1/sandboxes", json!({})).await;
    assert_eq!(made.status, StatusCode::ACCEPTED, "{}", made.body);
    assert_eq!(made.body["pool"], "a-cold", "{}", made.body);
    assert_ne!(made.body["id"], warm_id.to_string(), "{}", made.body);
    let counts = api.store.warm_counts("b-warm").await.unwrap();
    assert_eq!(
        counts[0].ready, 1,
        "the instance is still there: {counts:?}"
    );
}

#[tokio::test]
async fn deleting_a_pool_drains_its_warm_instances_first() {
    let api = api_with_pool().await;
    let put = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/warmy/warm",
            json!({ "classes": [class("default")] }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let now = chrono::Utc::now();
    let ids = [
        differently_core::SandboxId::new(),
        differently_core::SandboxId::new(),
    ];
    for id in &ids {
        api.store
            .warm_begin("warmy", "default", id, now)
            .await
            .unwrap();
    }
    assert!(api.store.warm_ready(&ids[0], "be-0", now).await.unwrap());
    // The refill leader and the pool's workers, as they answer emptied classes: retire every
    // row, then delete each instance (here: its row) once deleted on the backend.
    let store = api.store.clone();
    let drainer = tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        while !store
            .warm_classes("warmy")
            .await
            .unwrap()
            .classes
            .is_empty()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "classes never emptied"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let rows: Vec<_> = store
            .warm_instances("warmy")
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        store.warm_retire(&rows).await.unwrap();
        for id in &rows {
            assert!(store.warm_gone(id).await.unwrap());
        }
        rows.len()
    });
    let deleted = api
        .admin(Method::DELETE, "/v1/admin/pools/warmy", Value::Null)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    assert_eq!(drainer.await.unwrap(), 2, "both instances were drained");
    assert!(api.store.warm_instances("warmy").await.unwrap().is_empty());
    assert!(api
        .store
        .all_warm_classes()
        .await
        .unwrap()
        .iter()
        .all(|(p, _)| p != "warmy"));
    // The emptying is audited like any change of classes.
    let sets = api
        .store
        .list_audit(&differently_store::audit::AuditFilter {
            action: Some("pool.warm.set".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        sets.iter().any(|r| r.detail["new"]["classes"] == json!([])),
        "{sets:?}"
    );
    let gone = api
        .admin(Method::GET, "/v1/admin/pools/warmy/warm", Value::Null)
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND, "{}", gone.body);
}

#[tokio::test]
async fn a_capped_pool_is_claimed_from_in_admission_and_otherwise_queues() {
    use differently_api::Limits;
    let api = crate::support::api_with(Limits {
        direct_placement: true,
        ..Limits::default()
    })
    .await;
    let now = chrono::Utc::now();
    let record = crate::support::api_pool(&api, "c-warm", Some(5)).await;
    assert!(api.pools.sync(vec![record]).is_empty());
    crate::support::healthy(&api, &["c-warm"]);
    let put = api
        .admin(
            Method::PUT,
            "/v1/admin/pools/c-warm/warm",
            json!({ "classes": [class("default")] }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    let id = differently_core::SandboxId::new();
    api.store
        .warm_begin("c-warm", "default", &id, now)
        .await
        .unwrap();
    assert!(api.store.warm_ready(&id, "be-c", now).await.unwrap());

    // The capped pool's ready instance is claimed in the admission: running, its id.
    let made = api.admin(Method::POST, "/v1/sandboxes", json!({})).await;
    assert_eq!(made.status, StatusCode::ACCEPTED, "{}", made.body);
    assert_eq!(
        (made.body["id"].clone(), made.body["status"].clone()),
        (json!(id.to_string()), json!("running")),
        "{}",
        made.body
    );
    // None left: queued for the leader, never placed cold in the admission.
    let next = api.admin(Method::POST, "/v1/sandboxes", json!({})).await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{}", next.body);
    assert_eq!(next.body["status"], "queued", "{}", next.body);
    // One hit, one miss (the queued one), as the warm document serves them.
    let doc = api
        .admin(Method::GET, "/v1/admin/pools/c-warm/warm", Value::Null)
        .await;
    assert_eq!(doc.status, StatusCode::OK, "{}", doc.body);
    assert_eq!(
        doc.body["classes"][0]["hitRatio"],
        json!(0.5),
        "{}",
        doc.body
    );
    let per_minute = doc.body["classes"][0]["claimsPerMinute"]
        .as_f64()
        .expect("claimsPerMinute");
    assert!(
        per_minute > 0.0 && per_minute <= 1.0 / 9.0,
        "one claim over 9-10 minutes: {}",
        doc.body
    );
}
