//! `/ui`: the dashboard is served by the router itself, from the bytes embedded at compile
//! time, with its security headers on every answer (errors and 304s included).

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use tower::ServiceExt;

use crate::support::api;

async fn get(
    router: &axum::Router,
    path: &str,
    headers: &[(&str, &str)],
) -> axum::response::Response {
    let mut req = Request::builder().uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    router
        .clone()
        .oneshot(req.body(Body::empty()).expect("request"))
        .await
        .expect("infallible")
}

fn assert_secure(resp: &axum::response::Response, path: &str) {
    let h = resp.headers();
    let csp = h
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("{path}: no CSP"));
    assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
    assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
    assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{path}: {csp}"
    );
    assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
    assert_eq!(h["x-frame-options"], "DENY", "{path}");
    assert_eq!(h["referrer-policy"], "no-referrer", "{path}");
    assert!(h.get(header::SET_COOKIE).is_none(), "{path}: sets a cookie");
}

#[tokio::test]
async fn ui_serves_the_embedded_assets_with_security_headers() {
    let api = api().await;
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/ui"));
    for asset in differently_api::ui::ASSETS {
        let path = format!("/ui/{}", asset.path);
        let resp = get(&api.router, &path, &[]).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_secure(&resp, &path);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            asset.content_type,
            "{path}"
        );
        let etag = resp.headers()[header::ETAG]
            .to_str()
            .expect("etag")
            .to_owned();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 22)
            .await
            .expect("body");
        // What is served is what was embedded, and what was embedded is the file in the tree
        // this test was built from.
        assert_eq!(&body[..], asset.bytes, "{path}");
        let on_disk = std::fs::read(dir.join(asset.path)).expect("asset file");
        assert_eq!(
            &body[..],
            &on_disk[..],
            "{path} differs from api/ui/{}",
            asset.path
        );
        // Revalidation answers 304, still with the headers.
        let again = get(&api.router, &path, &[("if-none-match", &etag)]).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
        assert_secure(&again, &path);
    }
    for path in ["/ui", "/ui/"] {
        let resp = get(&api.router, path, &[]).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        assert_secure(&resp, path);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 22)
            .await
            .expect("body");
        assert_eq!(
            &body[..],
            differently_api::ui::ASSETS[0].bytes,
            "{path} is index.html"
        );
    }
}

#[tokio::test]
async fn ui_answers_unknown_files_with_the_envelope_and_the_headers() {
    let api = api().await;
    for path in ["/ui/nope.js", "/ui/js/../../v1/sandboxes", "/ui/js/"] {
        let resp = get(&api.router, path, &[]).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
        assert_secure(&resp, path);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v["error"]["code"], "not_found", "{path}: {v}");
    }
}

#[tokio::test]
async fn ui_needs_no_key_and_ignores_one() {
    // The assets are the same for everyone; a key sent along changes nothing (and a bad one
    // is not an error, since the page never needs one to load).
    let api = api().await;
    let resp = get(
        &api.router,
        "/ui/js/app.js",
        &[("authorization", "Bearer nonsense")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The dashboard learns at sign-in which organization and project its key acts in from the
/// key's own record. The bootstrap key is configuration, not a stored row, and still answers
/// for itself (a 404 there was every operator sign-in's first request); no other key reads it.
#[tokio::test]
async fn the_bootstrap_key_reads_its_own_record_and_nobody_else_does() {
    use axum::http::Method;
    use serde_json::Value;

    let api = api().await;
    let id = api
        .key
        .strip_prefix("dly_")
        .and_then(|rest| rest.rsplit_once('_'))
        .map(|(id, _)| id.to_owned())
        .expect("the bootstrap key reads dly_key_<ulid>_<secret>");
    let own = api
        .admin(Method::GET, &format!("/v1/keys/{id}"), Value::Null)
        .await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.body);
    assert_eq!(own.body["id"], id.as_str());
    assert_eq!(own.body["orgId"], api.tenant.org.id.to_string());
    assert_eq!(own.body["projectId"], api.tenant.project.id.to_string());
    let scopes = own.body["scopes"].as_array().expect("scopes");
    assert!(scopes.iter().any(|s| s == "admin"), "{}", own.body);
    assert!(own.body.get("hash").is_none(), "{}", own.body);

    // Another admin key of the same org: the bootstrap key is not a record it can list or read.
    let other = api.key_with(None, &["admin"]).await;
    let theirs = api
        .call(
            Method::GET,
            &format!("/v1/keys/{id}"),
            Some(&other),
            Value::Null,
            &[],
        )
        .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.body);
}
