//! `/v1/webhooks`: the secret shown once (create, rotate, never on read or replay), URLs
//! refused at the boundary with `details.field: "url"`, scopes, and tenancy (another
//! tenant's webhook is a 404, a project-bound key sees its project's only).

use axum::http::{Method, StatusCode};
use differently_store::sealed::{self, SealKey};
use serde_json::{json, Value};

use crate::support::{api, assert_error, Api};

fn sealing() {
    let _ = sealed::set_process_key(SealKey::random().expect("key"));
}

async fn create(api: &Api, key: &str, body: Value) -> crate::support::Answer {
    api.call(Method::POST, "/v1/webhooks", Some(key), body, &[])
        .await
}

/// A second organization with an org-wide key and one project: (key, project id).
async fn other_tenant(api: &Api) -> (String, String) {
    let org = api
        .admin(
            Method::POST,
            "/v1/orgs",
            json!({ "name": format!("o-{}", ulid()) }),
        )
        .await;
    assert_eq!(org.status, StatusCode::CREATED, "{}", org.body);
    let org = org.body["id"].as_str().unwrap().to_owned();
    let key = api
        .key_with(Some(&org), &["sandboxes:read", "sandboxes:write"])
        .await;
    let p = api
        .call(
            Method::POST,
            "/v1/projects",
            Some(&key),
            json!({ "name": "p" }),
            &[],
        )
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{}", p.body);
    (key, p.body["id"].as_str().unwrap().to_owned())
}

fn ulid() -> String {
    differently_core::OrgId::new().as_str()[4..].to_owned()
}

#[tokio::test]
async fn a_webhook_is_created_read_changed_rotated_and_deleted_with_its_secret_shown_once() {
    sealing();
    let api = api().await;
    let key = api.key.clone();
    let a = create(
        &api,
        &key,
        json!({ "url": "https://hooks.example.com/in", "eventTypes": ["sandbox.status.changed", "sandbox.exec.*"], "description": "ci" }),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let id = a.body["id"].as_str().unwrap().to_owned();
    let secret = a.body["secret"].as_str().unwrap().to_owned();
    assert!(
        id.starts_with("whk_") && secret.starts_with("whsec_"),
        "{}",
        a.body
    );
    assert_eq!(a.body["projectId"], json!(api.tenant.project.id));
    assert_eq!(a.body["enabled"], json!(true));

    let got = api
        .admin(Method::GET, &format!("/v1/webhooks/{id}"), Value::Null)
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert!(got.body.get("secret").is_none(), "{}", got.body);
    assert!(!got.body.to_string().contains(&secret[6..]));
    let listed = api.admin(Method::GET, "/v1/webhooks", Value::Null).await;
    assert_eq!(listed.body["items"][0]["id"], json!(id));
    assert!(!listed.body.to_string().contains(&secret[6..]));

    let patched = api
        .admin(
            Method::PATCH,
            &format!("/v1/webhooks/{id}"),
            json!({ "enabled": false, "description": null }),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["enabled"], json!(false));
    assert_eq!(patched.body["description"], Value::Null);
    assert_eq!(
        patched.body["eventTypes"],
        json!(["sandbox.status.changed", "sandbox.exec.*"])
    );

    let rotated = api
        .admin(
            Method::POST,
            &format!("/v1/webhooks/{id}/rotate-secret"),
            Value::Null,
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let new = rotated.body["secret"].as_str().unwrap();
    assert!(new.starts_with("whsec_") && new != secret);
    assert!(rotated.body["previousSecretExpiresAt"].is_string());

    let log = api
        .admin(
            Method::GET,
            &format!("/v1/webhooks/{id}/deliveries"),
            Value::Null,
        )
        .await;
    assert_eq!(log.status, StatusCode::OK);
    assert_eq!(log.body["items"], json!([]));
    let none = api
        .admin(
            Method::POST,
            &format!("/v1/webhooks/{id}/deliveries/whd_01ARZ3NDEKTSV4RRFFQ69G5FAV/redeliver"),
            Value::Null,
        )
        .await;
    assert_error(&none, StatusCode::NOT_FOUND, "not_found");

    let gone = api
        .admin(Method::DELETE, &format!("/v1/webhooks/{id}"), Value::Null)
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let after = api
        .admin(Method::GET, &format!("/v1/webhooks/{id}"), Value::Null)
        .await;
    assert_error(&after, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn urls_and_filters_are_checked_at_the_boundary() {
    sealing();
    let api = api().await;
    let key = api.key.clone();
    for url in [
        "http://hooks.example.com/in",
        "https://127.0.0.1/in",
        "https://localhost:8443/in",
        "https://[::1]/in",
        "https://10.0.0.7/in",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.1.1/",
        "https://224.0.0.1/",
        "https://0.0.0.0/",
        "ftp://hooks.example.com/",
        "not a url",
    ] {
        let a = create(&api, &key, json!({ "url": url })).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed");
        assert_eq!(
            a.body["error"]["details"]["field"],
            json!("url"),
            "{url}: {}",
            a.body
        );
    }
    // A refusal names every switch that would allow the URL, and none when no switch would.
    const HTTP: &str = "DIFFERENTLY_WEBHOOKS_ALLOW_HTTP";
    const PRIVATE: &str = "DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE";
    for (url, named, not_named) in [
        ("ftp://127.0.0.1/x", &[][..], &[HTTP, PRIVATE][..]),
        ("ftp://hooks.example.com/", &[], &[HTTP, PRIVATE]),
        ("http://hooks.example.com/in", &[HTTP], &[PRIVATE]),
        ("http://10.0.0.1/x", &[HTTP, PRIVATE], &[]),
        ("http://127.0.0.1/x", &[HTTP, PRIVATE], &[]),
        ("https://10.0.0.7/in", &[PRIVATE], &[HTTP]),
        ("http://u:p@hooks.example.com/", &[], &[HTTP, PRIVATE]),
    ] {
        let a = create(&api, &key, json!({ "url": url })).await;
        assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed");
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("url: "), "{url}: {message}");
        for switch in named {
            assert!(message.contains(switch), "{url}: {message}");
        }
        for switch in not_named {
            assert!(!message.contains(switch), "{url}: {message}");
        }
    }
    let a = create(&api, &key, json!({ "url": "ftp://127.0.0.1/x" })).await;
    assert_eq!(a.body["error"]["message"], json!("url: must use https"));
    let a = create(
        &api,
        &key,
        json!({ "url": "https://h.example.com/", "eventTypes": ["sandbox.nope"] }),
    )
    .await;
    assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed");
    assert_eq!(a.body["error"]["details"]["field"], json!("eventTypes"));
    let a = create(
        &api,
        &key,
        json!({ "url": "https://h.example.com/", "secret": "mine" }),
    )
    .await;
    assert_error(&a, StatusCode::BAD_REQUEST, "invalid_argument");
    // A change is checked the same way.
    let ok = create(&api, &key, json!({ "url": "https://h.example.com/" })).await;
    let id = ok.body["id"].as_str().unwrap();
    let a = api
        .admin(
            Method::PATCH,
            &format!("/v1/webhooks/{id}"),
            json!({ "url": "https://192.168.0.1/" }),
        )
        .await;
    assert_error(&a, StatusCode::UNPROCESSABLE_ENTITY, "validation_failed");
    assert_eq!(a.body["error"]["details"]["field"], json!("url"));
}

#[tokio::test]
async fn another_tenants_webhooks_are_not_found_and_scopes_are_checked() {
    sealing();
    let api = api().await;
    let mine = create(
        &api,
        &api.key.clone(),
        json!({ "url": "https://h.example.com/a" }),
    )
    .await;
    let mine = mine.body["id"].as_str().unwrap().to_owned();
    let (other_key, other_project) = other_tenant(&api).await;
    // An org-wide key names its project.
    let a = create(
        &api,
        &other_key,
        json!({ "url": "https://h.example.com/b" }),
    )
    .await;
    assert_eq!(
        a.body["error"]["details"]["field"],
        json!("projectId"),
        "{}",
        a.body
    );
    let theirs = create(
        &api,
        &other_key,
        json!({ "url": "https://h.example.com/b", "projectId": other_project }),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.body);
    let theirs = theirs.body["id"].as_str().unwrap().to_owned();
    // Neither sees the other's, by id or in a list.
    for (key, id) in [
        (other_key.as_str(), mine.as_str()),
        (api.key.as_str(), theirs.as_str()),
    ] {
        for (m, path) in [
            (Method::GET, format!("/v1/webhooks/{id}")),
            (Method::PATCH, format!("/v1/webhooks/{id}")),
            (Method::DELETE, format!("/v1/webhooks/{id}")),
            (Method::POST, format!("/v1/webhooks/{id}/rotate-secret")),
            (Method::GET, format!("/v1/webhooks/{id}/deliveries")),
        ] {
            let body = if m == Method::PATCH {
                json!({ "enabled": false })
            } else {
                Value::Null
            };
            let a = api.call(m.clone(), &path, Some(key), body, &[]).await;
            assert_error(&a, StatusCode::NOT_FOUND, "not_found");
        }
    }
    let list = api
        .call(
            Method::GET,
            "/v1/webhooks",
            Some(&other_key),
            Value::Null,
            &[],
        )
        .await;
    let ids: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(ids, [theirs.as_str()]);
    // Another org's project cannot be named.
    let a = create(
        &api,
        &other_key,
        json!({ "url": "https://h.example.com/c", "projectId": api.tenant.project.id }),
    )
    .await;
    assert_error(&a, StatusCode::NOT_FOUND, "not_found");
    // Reading takes sandboxes:read; changing sandboxes:write.
    let reader = api.key_with(None, &["sandboxes:read"]).await;
    let a = create(
        &api,
        &reader,
        json!({ "url": "https://h.example.com/d", "projectId": api.tenant.project.id }),
    )
    .await;
    assert_error(&a, StatusCode::FORBIDDEN, "permission_denied");
    let a = api
        .call(
            Method::GET,
            &format!("/v1/webhooks/{mine}"),
            Some(&reader),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn an_idempotent_create_never_shows_the_secret_twice() {
    sealing();
    let api = api().await;
    let key = api.key.clone();
    let body = json!({ "url": "https://h.example.com/idem" });
    let first = api
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(&key),
            body.clone(),
            &[("idempotency-key", "k1")],
        )
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = api
        .call(
            Method::POST,
            "/v1/webhooks",
            Some(&key),
            body,
            &[("idempotency-key", "k1")],
        )
        .await;
    assert_error(&again, StatusCode::CONFLICT, "conflict");
    assert_eq!(again.body["error"]["details"]["id"], first.body["id"]);
    let message = again.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("created a webhook"), "{message}");
    assert!(!again.body.to_string().contains("whsec_"));
    let list = api.admin(Method::GET, "/v1/webhooks", Value::Null).await;
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
}
