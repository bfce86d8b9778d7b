//! Tenancy end to end: organizations, projects, scoped keys, the cross-tenant matrix, rate
//! limits, and bad input on the tenancy routes.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{Cluster, Opts};

/// Ids and keys of one tenant.
pub struct Tenant {
    pub org: String,
    pub project: String,
    pub key: String,
    pub key_id: String,
}

/// Creates an org, a project and an org-wide key with every sandbox scope.
pub async fn tenant(c: &Cluster, name: &str) -> Tenant {
    let admin = c.key.clone();
    let (s, org) = c
        .call(
            &admin,
            Method::POST,
            "/v1/orgs",
            Some(json!({"name": name})),
        )
        .await;
    assert_eq!(s, 201, "{org}");
    let org = org["id"].as_str().unwrap().to_owned();
    let (s, project) = c
        .call(
            &admin,
            Method::POST,
            "/v1/projects",
            Some(json!({"orgId": org, "name": "main"})),
        )
        .await;
    assert_eq!(s, 201, "{project}");
    let project = project["id"].as_str().unwrap().to_owned();
    let (s, key) = c
        .call(
            &admin,
            Method::POST,
            "/v1/keys",
            Some(json!({"orgId": org, "name": "ci", "scopes": ["sandboxes:read", "sandboxes:write", "sandboxes:exec"]})),
        )
        .await;
    assert_eq!(s, 201, "{key}");
    Tenant {
        org,
        project,
        key: key["key"].as_str().unwrap().to_owned(),
        key_id: key["id"].as_str().unwrap().to_owned(),
    }
}

/// Creates a sandbox in `t`'s project and returns its id.
pub async fn sandbox(c: &Cluster, t: &Tenant) -> String {
    let (s, b) = c
        .call(
            &t.key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"projectId": t.project})),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    b["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_tenant_matrix_scopes_and_key_lifecycle() {
    let c = Cluster::started(Opts::default()).await;
    let a = tenant(&c, "org-a").await;
    let b = tenant(&c, "org-b").await;
    let sa = sandbox(&c, &a).await;
    let id = differently_core::SandboxId::parse(&sa).unwrap();
    // The bootstrap key lives in its own org; wait through A's key.
    let (s, _) = c
        .call(
            &a.key,
            Method::GET,
            &format!("/v1/sandboxes/{sa}/wait?status=running&timeoutSeconds=20"),
            None,
        )
        .await;
    assert_eq!(s, 200);

    // Tenant B with A's ids: the same 404 as for something that does not exist.
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/v1/sandboxes/{sa}"), None),
        (
            Method::GET,
            format!("/v1/sandboxes/{sa}/wait?timeoutSeconds=0"),
            None,
        ),
        (Method::DELETE, format!("/v1/sandboxes/{sa}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{sa}/exec"),
            Some(json!({"command": ["echo", "x"]})),
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            Some(json!({"projectId": a.project})),
        ),
        (Method::GET, format!("/v1/orgs/{}", a.org), None),
        (
            Method::PATCH,
            format!("/v1/orgs/{}", a.org),
            Some(json!({"name": "x"})),
        ),
        (Method::DELETE, format!("/v1/orgs/{}", a.org), None),
        (Method::GET, format!("/v1/orgs/{}/quota", a.org), None),
        (
            Method::PUT,
            format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 1})),
        ),
        (Method::GET, format!("/v1/projects/{}", a.project), None),
        (
            Method::PATCH,
            format!("/v1/projects/{}", a.project),
            Some(json!({"name": "x"})),
        ),
        (Method::DELETE, format!("/v1/projects/{}", a.project), None),
        (
            Method::GET,
            format!("/v1/projects/{}/quota", a.project),
            None,
        ),
        (
            Method::PUT,
            format!("/v1/projects/{}/quota", a.project),
            Some(json!({"maxActive": 1})),
        ),
        (Method::GET, format!("/v1/projects?orgId={}", a.org), None),
        (
            Method::POST,
            "/v1/projects".into(),
            Some(json!({"orgId": a.org, "name": "evil"})),
        ),
        (Method::GET, format!("/v1/keys/{}", a.key_id), None),
        (Method::DELETE, format!("/v1/keys/{}", a.key_id), None),
        (Method::GET, format!("/v1/keys?orgId={}", a.org), None),
        (
            Method::POST,
            "/v1/keys".into(),
            Some(json!({"orgId": a.org, "name": "evil", "scopes": ["sandboxes:read"]})),
        ),
    ];
    for (m, path, body) in &routes {
        let (s, json) = c.call(&b.key, m.clone(), path, body.clone()).await;
        assert_eq!(s, 404, "B {m} {path} -> {s} {json}");
        assert_eq!(json["error"]["code"], "not_found");
    }
    // The operator's admin key manages tenancy across orgs, not their sandboxes: A's
    // sandbox is the same 404 to it on every sandbox route, data plane included.
    let sandbox_routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/v1/sandboxes/{sa}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{sa}/exec"),
            Some(json!({"command": ["echo", "x"]})),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{sa}/files/list?path=/"),
            None,
        ),
        (Method::POST, format!("/v1/sandboxes/{sa}/pause"), None),
        (Method::DELETE, format!("/v1/sandboxes/{sa}"), None),
    ];
    for (m, path, body) in &sandbox_routes {
        let (s, json) = c.call(&c.key, m.clone(), path, body.clone()).await;
        assert_eq!(s, 404, "admin {m} {path} -> {s} {json}");
        assert_eq!(json["error"]["code"], "not_found");
    }
    let (_, list) = c.call(&b.key, Method::GET, "/v1/sandboxes", None).await;
    assert!(
        list["items"].as_array().unwrap().is_empty(),
        "B lists none of A's sandboxes"
    );
    let (_, orgs) = c.call(&b.key, Method::GET, "/v1/orgs", None).await;
    assert_eq!(
        orgs["items"].as_array().unwrap().len(),
        1,
        "B sees only its own org: {orgs}"
    );
    // A's sandbox is untouched by all of that.
    assert_eq!(
        c.call(&a.key, Method::GET, &format!("/v1/sandboxes/{sa}"), None)
            .await
            .1["status"],
        "running"
    );

    // Scopes: a read-only key of A.
    let (s, ro) = c
        .call(
            &a.key,
            Method::POST,
            "/v1/keys",
            Some(json!({"name": "ro", "scopes": ["sandboxes:read"]})),
        )
        .await;
    assert_eq!(s, 201, "{ro}");
    let ro_key = ro["key"].as_str().unwrap().to_owned();
    for (m, path, body) in [
        (
            Method::POST,
            "/v1/sandboxes".to_owned(),
            Some(json!({"projectId": a.project})),
        ),
        (Method::DELETE, format!("/v1/sandboxes/{sa}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{sa}/exec"),
            Some(json!({"command": ["echo"]})),
        ),
        (
            Method::POST,
            "/v1/projects".to_owned(),
            Some(json!({"name": "p2"})),
        ),
        (
            Method::POST,
            "/v1/keys".to_owned(),
            Some(json!({"name": "k", "scopes": ["sandboxes:read"]})),
        ),
        (
            Method::PUT,
            format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 1})),
        ),
    ] {
        let (s, json) = c.call(&ro_key, m.clone(), &path, body).await;
        assert_eq!(s, 403, "read-only {m} {path} -> {json}");
        assert_eq!(json["error"]["code"], "permission_denied");
    }
    assert_eq!(
        c.call(&ro_key, Method::GET, &format!("/v1/sandboxes/{sa}"), None)
            .await
            .0,
        200
    );
    // No escalation: an org key cannot mint admin keys; only admins create orgs or set quotas.
    let (s, _) = c
        .call(
            &a.key,
            Method::POST,
            "/v1/keys",
            Some(json!({"name": "x", "scopes": ["admin"]})),
        )
        .await;
    assert_eq!(s, 403);
    let (s, _) = c
        .call(&a.key, Method::POST, "/v1/orgs", Some(json!({"name": "x"})))
        .await;
    assert_eq!(s, 403);
    let (s, _) = c
        .call(
            &a.key,
            Method::PUT,
            &format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 9})),
        )
        .await;
    assert_eq!(s, 403);

    // Project-bound key: sees its project only.
    let (s, p2) = c
        .call(
            &a.key,
            Method::POST,
            "/v1/projects",
            Some(json!({"name": "second"})),
        )
        .await;
    assert_eq!(s, 201);
    let p2 = p2["id"].as_str().unwrap().to_owned();
    let (_, bound) = c
        .call(&a.key, Method::POST, "/v1/keys", Some(json!({"name": "b", "projectId": p2, "scopes": ["sandboxes:read", "sandboxes:write"]})))
        .await;
    let bound_key = bound["key"].as_str().unwrap().to_owned();
    assert_eq!(
        c.call(
            &bound_key,
            Method::GET,
            &format!("/v1/sandboxes/{sa}"),
            None
        )
        .await
        .0,
        404
    );
    let (s, created) = c
        .call(&bound_key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(s, 202, "{created}");
    assert_eq!(created["projectId"], p2.as_str());

    // Keys are never served with hashes or secrets, except the secret once at creation.
    let (_, keys) = c.call(&a.key, Method::GET, "/v1/keys", None).await;
    let text = keys.to_string();
    assert!(keys["items"].as_array().unwrap().len() >= 3, "{keys}");
    for secret in [&a.key, &ro_key, &bound_key] {
        let tail = secret.rsplit_once('_').unwrap().1;
        assert!(!text.contains(tail), "a secret leaked in the key list");
    }
    assert!(!text.contains("hash"), "{text}");
    // Use is recorded, off the request path (so possibly just after the answer).
    let bound_id = bound["id"].as_str().unwrap().to_owned();
    let mut last_used = Value::Null;
    for _ in 0..100 {
        let (_, k) = c
            .call(&a.key, Method::GET, &format!("/v1/keys/{bound_id}"), None)
            .await;
        last_used = k["lastUsedAt"].clone();
        if last_used.is_string() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        last_used.is_string(),
        "lastUsedAt never recorded: {last_used}"
    );

    // Revocation and expiry: 401 at once.
    let (s, revoked) = c
        .call(
            &a.key,
            Method::DELETE,
            &format!("/v1/keys/{}", ro["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert!(revoked["revokedAt"].is_string());
    assert_eq!(
        c.call(&ro_key, Method::GET, "/v1/sandboxes", None).await.0,
        401
    );
    let expires = (chrono::Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let (_, short) = c
        .call(
            &a.key,
            Method::POST,
            "/v1/keys",
            Some(json!({"name": "short", "scopes": ["sandboxes:read"], "expiresAt": expires})),
        )
        .await;
    let short_key = short["key"].as_str().unwrap().to_owned();
    assert_eq!(
        c.call(&short_key, Method::GET, "/v1/sandboxes", None)
            .await
            .0,
        200
    );
    // Refused once it expires, 1.5 s after it was made (polled, bounded at 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut status = 200;
    while status != 401 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = c
            .call(&short_key, Method::GET, "/v1/sandboxes", None)
            .await
            .0;
    }
    assert_eq!(status, 401, "an expired key is refused");
    let malformed = format!("{}x", a.key);
    assert_eq!(
        c.call(&malformed, Method::GET, "/v1/sandboxes", None)
            .await
            .0,
        401
    );

    // A project with a live sandbox cannot be deleted; once it is gone, it can.
    let (s, e) = c
        .call(
            &a.key,
            Method::DELETE,
            &format!("/v1/projects/{}", a.project),
            None,
        )
        .await;
    assert_eq!(s, 409, "{e}");
    assert_eq!(
        c.call(&a.key, Method::DELETE, &format!("/v1/sandboxes/{sa}"), None)
            .await
            .0,
        202
    );
    let (_, done) = c
        .call(
            &a.key,
            Method::GET,
            &format!("/v1/sandboxes/{sa}/wait?status=terminated&timeoutSeconds=20"),
            None,
        )
        .await;
    assert_eq!(done["status"], "terminated");
    let _ = id;
    let (s, e) = c
        .call(
            &a.key,
            Method::DELETE,
            &format!("/v1/projects/{}", a.project),
            None,
        )
        .await;
    assert_eq!(s, 204, "{e}");

    // Suspension: the org's keys can only read.
    let (s, o) = c
        .call(
            &c.key,
            Method::PATCH,
            &format!("/v1/orgs/{}", b.org),
            Some(json!({"status": "suspended"})),
        )
        .await;
    assert_eq!(s, 200, "{o}");
    assert_eq!(o["status"], "suspended");
    let (s, e) = c
        .call(
            &b.key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"projectId": b.project})),
        )
        .await;
    assert_eq!(s, 403, "{e}");
    assert_eq!(
        c.call(&b.key, Method::GET, "/v1/sandboxes", None).await.0,
        200
    );
    for name in ["api", "scheduler", "worker"] {
        assert!(!c.log(name).contains(&a.key), "{name} logged a key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tenancy_input_is_refused_and_writes_nothing() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.wait_ready().await;
    let a = tenant(&c, "org-a").await;
    let admin = c.key.clone();
    let quota_path = format!("/v1/orgs/{}/quota", a.org);
    let cases: Vec<(Method, &str, Value, u16, &str)> = vec![
        (
            Method::PUT,
            quota_path.as_str(),
            // Out of the field's bound (docs/api.md, Bounds).
            json!({"maxCpu": -1}),
            422,
            "maxCpu",
        ),
        (
            Method::PUT,
            quota_path.as_str(),
            json!({"maxCpu": 1_000_000_000_000u64}),
            422,
            "maxCpu",
        ),
        (
            Method::PUT,
            quota_path.as_str(),
            json!({"maxQueueSeconds": 0}),
            422,
            "maxQueueSeconds",
        ),
        (
            Method::PUT,
            quota_path.as_str(),
            json!({"maxSandbox": {"cpu": 0, "memoryMiB": 1024, "diskGiB": 1}}),
            422,
            "maxSandbox.cpu",
        ),
        (
            Method::PUT,
            quota_path.as_str(),
            json!({"maxAktive": 3}),
            400,
            "maxAktive",
        ),
        (
            Method::POST,
            "/v1/keys",
            json!({"orgId": a.org, "name": "k", "scopes": ["sandboxes:delete"]}),
            400,
            "scopes[0]",
        ),
        (
            Method::POST,
            "/v1/keys",
            json!({"orgId": a.org, "name": "k", "scopes": []}),
            422,
            "scopes",
        ),
        (
            Method::POST,
            "/v1/keys",
            json!({"orgId": a.org, "name": "", "scopes": ["admin"]}),
            422,
            "name",
        ),
        (
            Method::POST,
            "/v1/keys",
            json!({"orgId": a.org, "name": "k", "scopes": ["admin"], "expiresAt": "2001-01-01T00:00:00Z"}),
            422,
            "expiresAt",
        ),
        (
            Method::POST,
            "/v1/orgs",
            json!({"name": "   "}),
            422,
            "name",
        ),
        (Method::POST, "/v1/orgs", json!({"name": 5}), 400, "name"),
        (
            Method::POST,
            "/v1/projects",
            json!({"orgId": "org_bad", "name": "x"}),
            400,
            "orgId",
        ),
    ];
    for (m, path, body, status, field) in &cases {
        let (s, json) = c.call(&admin, m.clone(), path, Some(body.clone())).await;
        assert_eq!(s, *status, "{m} {path} {body} -> {json}");
        assert_eq!(
            json["error"]["details"]["field"], *field,
            "{m} {path} {body} -> {json}"
        );
    }
    let (s, e) = c
        .call(
            &admin,
            Method::POST,
            "/v1/orgs",
            Some(json!({"name": "org-a"})),
        )
        .await;
    assert_eq!(s, 409, "duplicate name: {e}");
    let (_, q) = c.call(&admin, Method::GET, &quota_path, None).await;
    assert_eq!(
        q["quota"],
        json!({"maxActive": null, "maxCpu": null, "maxMemoryMiB": null, "maxDiskGiB": null, "maxQueued": null, "maxQueueSeconds": null, "maxSandbox": null}),
        "{q}"
    );
    let (_, keys) = c
        .call(
            &admin,
            Method::GET,
            &format!("/v1/keys?orgId={}", a.org),
            None,
        )
        .await;
    assert_eq!(
        keys["items"].as_array().unwrap().len(),
        1,
        "only the tenant's key exists: {keys}"
    );
    let (_, orgs) = c.call(&admin, Method::GET, "/v1/orgs", None).await;
    assert_eq!(
        orgs["items"].as_array().unwrap().len(),
        2,
        "bootstrap + org-a: {orgs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_rate_limit_and_failed_auth_throttle() {
    let extra = "[api]\nkey_requests_per_second = 1\nkey_burst = 3\nauth_failures_per_minute = 5\n"
        .to_owned();
    let mut c = Cluster::new(Opts {
        extra_toml: extra,
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.wait_ready().await;
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..5 {
        let r = c.req(Method::GET, "/v1/sandboxes").send().await.unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "rate_limited");
        }
    }
    assert_eq!(&statuses[..3], &[200, 200, 200], "{statuses:?}");
    assert!(statuses[3..].contains(&429), "{statuses:?}");
    assert!(retry_after.is_some_and(|v| v.parse::<u64>().unwrap() >= 1));

    let bad = "dly_key_01J00000000000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let mut codes = Vec::new();
    for _ in 0..8 {
        codes.push(c.call(bad, Method::GET, "/v1/sandboxes", None).await.0);
    }
    assert_eq!(&codes[..5], &[401; 5], "{codes:?}");
    assert_eq!(
        codes[7], 429,
        "repeated failures from one address are throttled: {codes:?}"
    );
}
