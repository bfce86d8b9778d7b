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
