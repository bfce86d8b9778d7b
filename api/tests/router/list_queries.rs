//! A list's whole query is checked before the answers that need no rows: a key bound to one
//! project asking for another, or two values for one label, still get 400 for a bad `limit` or
//! `cursor`, as any other caller does.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_field_error, Api};

/// A well-formed project id no key of these tests is bound to.
const OTHER_PROJECT: &str = "prj_00000000000000000000000000";

/// A `sandboxes:read` key bound to the tenant's project.
async fn project_key(api: &Api) -> String {
    let a = api
        .admin(
            Method::POST,
            "/v1/keys",
            json!({
                "name": "bound",
                "scopes": ["sandboxes:read"],
                "projectId": api.tenant.project.id,
            }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    a.body["key"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn another_projects_list_is_empty_but_its_query_is_still_checked() {
    let api = api().await;
    let key = project_key(&api).await;
    for list in ["/v1/sandboxes", "/v1/snapshots"] {
        // The short-cut itself: an empty page, not a 404 that would say the project exists.
        let ok = api
            .call(
                Method::GET,
                &format!("{list}?projectId={OTHER_PROJECT}"),
                Some(&key),
                Value::Null,
                &[],
            )
            .await;
        assert_eq!(ok.status, StatusCode::OK, "{list}: {}", ok.body);
        assert_eq!(ok.body["items"], json!([]), "{list}: {}", ok.body);
        for (bad, field) in [
            ("limit=true", "limit"),
            ("limit=5000", "limit"),
            ("limit=0", "limit"),
            ("cursor=not-a-cursor", "cursor"),
        ] {
            let path = format!("{list}?{bad}&projectId={OTHER_PROJECT}");
            let a = api
                .call(Method::GET, &path, Some(&key), Value::Null, &[])
                .await;
            assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
        }
    }
}

#[tokio::test]
async fn contradictory_labels_still_get_their_query_checked() {
    let api = api().await;
    let base = "/v1/sandboxes?label=a%3D1&label=a%3D2";
    let ok = api.admin(Method::GET, base, Value::Null).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(ok.body["items"], json!([]), "{}", ok.body);
    for (bad, field) in [
        ("limit=5000", "limit"),
        ("cursor=nope", "cursor"),
        ("label=novalue", "label"),
    ] {
        let a = api
            .admin(Method::GET, &format!("{base}&{bad}"), Value::Null)
            .await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
}

#[tokio::test]
async fn another_orgs_audit_projects_and_keys_still_get_their_query_checked() {
    let api = api().await;
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    const OTHER_ORG: &str = "org_00000000000000000000000000";
    // Without a bad parameter: the other organization looks absent.
    for path in [
        format!("/v1/audit?orgId={OTHER_ORG}"),
        format!("/v1/projects?orgId={OTHER_ORG}"),
        format!("/v1/keys?orgId={OTHER_ORG}"),
    ] {
        let a = api
            .call(Method::GET, &path, Some(&tenant), Value::Null, &[])
            .await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{path}: {}", a.body);
    }
    for (path, field) in [
        (format!("/v1/audit?orgId={OTHER_ORG}&cursor=x"), "cursor"),
        (format!("/v1/audit?orgId={OTHER_ORG}&since=soon"), "since"),
        (format!("/v1/audit?orgId={OTHER_ORG}&until=later"), "until"),
        (
            format!("/v1/projects?orgId={OTHER_ORG}&limit=5000"),
            "limit",
        ),
        (format!("/v1/projects?orgId={OTHER_ORG}&cursor=x"), "cursor"),
        (format!("/v1/keys?orgId={OTHER_ORG}&limit=5000"), "limit"),
        (format!("/v1/keys?orgId={OTHER_ORG}&cursor=x"), "cursor"),
    ] {
        let a = api
            .call(Method::GET, &path, Some(&tenant), Value::Null, &[])
            .await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
}

/// Every query goes through the API's own reader: an unknown parameter, or one given twice,
/// is a 400 naming it in `details.field`, in the API's words (never the HTTP framework's
/// "Failed to deserialize query string"), on every route that takes a query.
#[tokio::test]
async fn an_unknown_or_repeated_parameter_is_a_400_naming_it_on_every_route() {
    let api = api().await;
    let id = api.sandbox().await;
    let routes = [
        "/v1/sandboxes".to_owned(),
        format!("/v1/sandboxes/{id}/wait"),
        format!("/v1/sandboxes/{id}/snapshots"),
        format!("/v1/sandboxes/{id}/files"),
        format!("/v1/sandboxes/{id}/files/list"),
        format!("/v1/sandboxes/{id}/processes"),
        format!("/v1/sandboxes/{id}/processes/1/output"),
        "/v1/snapshots".to_owned(),
        "/v1/orgs".to_owned(),
        "/v1/projects".to_owned(),
        "/v1/keys".to_owned(),
        "/v1/audit".to_owned(),
        "/v1/webhooks".to_owned(),
        "/v1/webhooks/whk_00000000000000000000000000/deliveries".to_owned(),
        "/v1/events".to_owned(),
        "/v1/admin/pools".to_owned(),
    ];
    for route in &routes {
        let a = api
            .admin(Method::GET, &format!("{route}?bogus=1"), Value::Null)
            .await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{route}: {}", a.body);
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", "bogus");
        let message = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("bogus: unknown parameter `bogus`"),
            "{route}: {}",
            a.body
        );
        let a = api
            .admin(
                Method::GET,
                &format!("{route}?limit=1&limit=2"),
                Value::Null,
            )
            .await;
        let field = a.body["error"]["details"]["field"].as_str();
        // `limit` is a parameter of the lists; elsewhere it is unknown, and named so.
        assert_eq!(field, Some("limit"), "{route}: {}", a.body);
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{route}: {}", a.body);
    }
}

/// `GET /v1/admin/pools` pages like every list: by name, `limit` and `cursor` checked (it
/// once answered every pool whatever they said).
#[tokio::test]
async fn the_pools_list_pages_by_name_and_checks_its_query() {
    let api = api().await;
    for name in ["zeta", "alpha"] {
        let a = api
            .admin(
                Method::POST,
                "/v1/admin/pools",
                json!({ "name": name, "kind": "fake", "settings": {} }),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    }
    let all = api.admin(Method::GET, "/v1/admin/pools", Value::Null).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    let mut expected: Vec<String> = all.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(expected.len() >= 2, "{}", all.body);
    expected.sort();
    let mut seen = Vec::new();
    let mut path = "/v1/admin/pools?limit=1".to_owned();
    loop {
        let a = api.admin(Method::GET, &path, Value::Null).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        let items = a.body["items"].as_array().unwrap();
        assert!(items.len() <= 1, "{}", a.body);
        seen.extend(items.iter().map(|p| p["name"].as_str().unwrap().to_owned()));
        match a.body["nextCursor"].as_str() {
            Some(c) => path = format!("/v1/admin/pools?limit=1&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, expected);
    for (bad, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("cursor=garbage", "cursor"),
        ("cursor=pool_", "cursor"),
    ] {
        let a = api
            .admin(Method::GET, &format!("/v1/admin/pools?{bad}"), Value::Null)
            .await;
        assert_field_error(&a, StatusCode::BAD_REQUEST, "invalid_argument", field);
    }
}
