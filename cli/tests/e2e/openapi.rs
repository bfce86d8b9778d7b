//! `GET /v1/openapi.json` is served without a key, and every operation it lists is a route
//! the running API serves: public ones answer without a key, the others (asked with the
//! admin key and placeholder ids, so mostly 400 or 404) never answer "no such route" or 405.

use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

/// `method path` with `key` and a body that is invalid everywhere is refused for the scope
/// (403), not for the body: a handler that read it before the scope would answer 400.
async fn assert_refused(c: &Cluster, key: &str, method: &str, path: &str, why: &str) {
    let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let (status, body) = c
        .call(key, m, path, Some(json!({ "notAField": true })))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("permission_denied")),
        "{method} {path} {why}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_lists_only_served_routes() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.wait_ready().await;
    let http = reqwest::Client::new();

    let resp = http
        .get(format!("{}/v1/openapi.json", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();

    let mut checked = 0;
    for (path, item) in paths {
        let concrete = path
            .replace("{id}", "sbx_00000000000000000000000000")
            .replace("{name}", "x");
        for (method, op) in item.as_object().unwrap() {
            let public = op["security"].as_array().is_some_and(Vec::is_empty);
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let resp = if public {
                http.request(m, format!("{}{concrete}", c.url()))
                    .send()
                    .await
                    .unwrap()
            } else {
                c.req(m, &concrete).send().await.unwrap()
            };
            let status = resp.status().as_u16();
            // A stream (the event feed) is never read to its end; its status says enough.
            let json = resp
                .headers()
                .get("content-type")
                .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
            let body: Value = if json {
                resp.json().await.unwrap()
            } else {
                Value::Null
            };
            if public {
                assert_eq!(status, 200, "{method} {path}: {body}");
            } else {
                assert_ne!(status, 405, "{method} {path}: {body}");
                assert_ne!(
                    body["error"]["message"], "no such route",
                    "{method} {path} is listed but not served"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} operations listed");

    // What the document says an organization's own key may not do, it may not: every
    // operation listed as admin-only refuses a key with every other scope. The body is
    // invalid everywhere, so a handler that looked at it before the scope would answer 400.
    let t = crate::tenancy::tenant(&c, "org-a").await;
    let mut admin_only = 0;
    for (path, item) in paths {
        // The tenant's own things, so that only the scope can be the reason to refuse.
        let own = if path.starts_with("/v1/projects/") {
            &t.project
        } else {
            &t.org
        };
        let concrete = path.replace("{id}", own).replace("{name}", "x");
        for (method, op) in item.as_object().unwrap() {
            if op["x-differently-access"] != "scope admin" {
                continue;
            }
            assert_refused(&c, &t.key, method, &concrete, "with an organization's key").await;
            admin_only += 1;
        }
    }
    assert!(admin_only > 15, "only {admin_only} admin-only operations");

    // And an operation that names one scope refuses a key with all the others.
    let scopes = [
        "sandboxes:read",
        "sandboxes:write",
        "sandboxes:exec",
        "files:read",
        "files:write",
    ];
    let mut scoped = 0;
    for missing in scopes {
        let others: Vec<&str> = scopes.iter().copied().filter(|s| *s != missing).collect();
        let (status, key) = c
            .call(
                &c.key,
                reqwest::Method::POST,
                "/v1/keys",
                Some(json!({ "orgId": t.org, "name": missing, "scopes": others })),
            )
            .await;
        assert_eq!(status, 201, "{key}");
        let key = key["key"].as_str().unwrap().to_owned();
        for (path, item) in paths {
            let concrete = path
                .replace("{id}", "sbx_00000000000000000000000000")
                .replace("{name}", "x");
            for (method, op) in item.as_object().unwrap() {
                if op["x-differently-access"] != format!("scope {missing}").as_str() {
                    continue;
                }
                let why = format!("without {missing}");
                assert_refused(&c, &key, method, &concrete, &why).await;
                scoped += 1;
            }
        }
    }
    assert!(
        scoped > 25,
        "only {scoped} operations checked for their scope"
    );

    // The check above can fail: a route that is not served answers exactly that.
    let (status, body) = c
        .call(&c.key, reqwest::Method::GET, "/v1/nowhere", None)
        .await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (404, Some("no such route"))
    );
    // And a listed route still wants a key.
    let resp = http
        .get(format!("{}/v1/sandboxes", c.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}
