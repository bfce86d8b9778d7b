//! `Idempotency-Key` on the creating POSTs besides sandbox create (organizations, projects,
//! keys, snapshots): a retry gets the first answer instead of a second thing, another body is
//! refused, a failed request frees its key, and a new key's secret is never shown twice.

use reqwest::Method;
use serde_json::{json, Value};

use crate::dataplane::{cluster, running};
use crate::harness::{Cluster, Opts};

/// `POST path` with the admin key, `Idempotency-Key: key` and `body`: status, replay header,
/// answer.
async fn post_once(c: &Cluster, path: &str, key: &str, body: Value) -> (u16, bool, Value) {
    let r = c
        .req(Method::POST, path)
        .header("idempotency-key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    (status, replayed, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_posts_honour_idempotency_keys() {
    let c = cluster(Opts::default()).await;

    // An organization: the retry answers the same one, marked as replayed.
    let (s1, r1, org) = post_once(&c, "/v1/orgs", "org-1", json!({"name": "idem"})).await;
    assert_eq!((s1, r1), (201, false), "{org}");
    let (s2, r2, again) = post_once(&c, "/v1/orgs", "org-1", json!({"name": "idem"})).await;
    assert_eq!((s2, r2), (201, true), "{again}");
    assert_eq!(again, org);
    // The same key with another body is refused and creates nothing.
    let (s3, _, other) = post_once(&c, "/v1/orgs", "org-1", json!({"name": "idem-2"})).await;
    assert_eq!(
        (s3, other["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{other}"
    );
    let (_, orgs) = c
        .call(&c.key, Method::GET, "/v1/orgs?limit=1000", None)
        .await;
    let names: Vec<&str> = orgs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["name"].as_str())
        .collect();
    assert!(!names.contains(&"idem-2"), "{names:?}");
    let org_id = org["id"].as_str().unwrap();

    // A project.
    let body = json!({"orgId": org_id, "name": "p"});
    let (s, _, p1) = post_once(&c, "/v1/projects", "prj-1", body.clone()).await;
    assert_eq!(s, 201, "{p1}");
    let (s, replayed, p2) = post_once(&c, "/v1/projects", "prj-1", body).await;
    assert_eq!((s, replayed), (201, true));
    assert_eq!(p1["id"], p2["id"]);

    // A key: its secret is shown once, so a retry is told which key it made instead.
    let body = json!({"orgId": org_id, "name": "ci", "scopes": ["sandboxes:read"]});
    let (s, _, k1) = post_once(&c, "/v1/keys", "key-1", body.clone()).await;
    assert_eq!(s, 201, "{k1}");
    assert!(k1["key"].as_str().is_some_and(|k| k.starts_with("dly_")));
    let (s, _, k2) = post_once(&c, "/v1/keys", "key-1", body).await;
    assert_eq!(
        (s, k2["error"]["code"].as_str()),
        (409, Some("conflict")),
        "{k2}"
    );
    assert_eq!(k2["error"]["details"]["id"], k1["id"]);
    assert!(!k2.to_string().contains("dly_"), "a secret in {k2}");
    let (_, keys) = c
        .call(
            &c.key,
            Method::GET,
            &format!("/v1/keys?orgId={org_id}"),
            None,
        )
        .await;
    assert_eq!(keys["items"].as_array().unwrap().len(), 1, "{keys}");

    // A request that fails frees its key: the corrected retry goes ahead.
    let (s, _, bad) = post_once(&c, "/v1/orgs", "org-2", json!({"name": ""})).await;
    assert_eq!(s, 422, "{bad}");
    let (s, replayed, good) = post_once(&c, "/v1/orgs", "org-2", json!({"name": "idem-3"})).await;
    assert_eq!((s, replayed), (201, false), "{good}");

    // Keys are per caller: another API key's "prj-1" is its own, not a mismatch.
    let body =
        json!({"orgId": org_id, "name": "writer", "scopes": ["sandboxes:read", "sandboxes:write"]});
    let (s, _, writer) = post_once(&c, "/v1/keys", "key-2", body).await;
    assert_eq!(s, 201, "{writer}");
    let r = c
        .req_as(
            writer["key"].as_str().unwrap(),
            Method::POST,
            "/v1/projects",
        )
        .header("idempotency-key", "prj-1")
        .json(&json!({"orgId": org_id, "name": "p2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let p3: Value = r.json().await.unwrap();
    assert_ne!(p3["id"], p1["id"]);

    // A snapshot.
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let path = format!("/v1/sandboxes/{id}/snapshots");
    let (s, _, snap1) = post_once(&c, &path, "snap-1", json!({"name": "one"})).await;
    assert_eq!(s, 202, "{snap1}");
    let (s, replayed, snap2) = post_once(&c, &path, "snap-1", json!({"name": "one"})).await;
    assert_eq!((s, replayed), (202, true), "{snap2}");
    assert_eq!(snap1["id"], snap2["id"]);
    let (_, list) = c.call(&c.key, Method::GET, &path, None).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // Sandbox create keeps its key on the row; its replay is marked the same way.
    let (s, replayed, sbx1) = post_once(&c, "/v1/sandboxes", "sbx-1", json!({})).await;
    assert_eq!((s, replayed), (202, false), "{sbx1}");
    let (s, replayed, sbx2) = post_once(&c, "/v1/sandboxes", "sbx-1", json!({})).await;
    assert_eq!((s, replayed), (202, true), "{sbx2}");
    assert_eq!(sbx1["id"], sbx2["id"]);

    // A header that is no key is refused before anything happens.
    let (s, _, e) = post_once(&c, "/v1/orgs", &"k".repeat(256), json!({"name": "x"})).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (400, Some("invalid_argument")),
        "{e}"
    );
}
