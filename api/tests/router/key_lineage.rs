//! A key made by a key lives no longer than it and is revoked with it.

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};

use crate::support::{api, assert_field_error, Answer, Api};

/// Asks for an org-wide key of the bootstrap org (one that may make keys) with `by`.
async fn make_key(a: &Api, by: &str, expires_at: Option<DateTime<Utc>>) -> Answer {
    let mut body = json!({
        "orgId": a.tenant.org.id.as_str(),
        "name": "lineage",
        "scopes": ["sandboxes:read", "sandboxes:write"],
    });
    if let Some(t) = expires_at {
        body["expiresAt"] = json!(t);
    }
    a.call(Method::POST, "/v1/keys", Some(by), body, &[]).await
}

/// `(secret, id, record)` of a key just created.
fn created(ans: &Answer) -> (String, String, Value) {
    assert_eq!(ans.status, StatusCode::CREATED, "create key: {}", ans.body);
    (
        ans.body["key"].as_str().expect("key").to_owned(),
        ans.body["id"].as_str().expect("id").to_owned(),
        ans.body.clone(),
    )
}

fn expiry(v: &Value) -> Option<DateTime<Utc>> {
    v["expiresAt"].as_str().map(|s| s.parse().expect("a time"))
}

async fn works(a: &Api, key: &str) -> StatusCode {
    a.call(Method::GET, "/v1/sandboxes", Some(key), Value::Null, &[])
        .await
        .status
}

#[tokio::test]
async fn a_key_made_by_an_expiring_key_expires_no_later() {
    let a = api().await;
    let admin = a.key.clone();
    let parent_expiry = Utc::now() + TimeDelta::seconds(8);
    let (parent, _, _) = created(&make_key(&a, &admin, Some(parent_expiry)).await);

    // Asked for nothing: it gets its parent's expiry, not "never".
    let (child, _, record) = created(&make_key(&a, &parent, None).await);
    let got = expiry(&record).expect("the child expires");
    assert_eq!(got, parent_expiry);

    // Asked for later than its parent: refused, naming the field.
    let later = make_key(&a, &parent, Some(parent_expiry + TimeDelta::days(1))).await;
    assert_field_error(
        &later,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "expiresAt",
    );
    // Sooner is the caller's to choose.
    let sooner = parent_expiry - TimeDelta::seconds(4);
    let (_, _, record) = created(&make_key(&a, &parent, Some(sooner)).await);
    assert_eq!(expiry(&record), Some(sooner));

    // Once the parent has expired, the key it made no longer works either.
    assert_eq!(works(&a, &child).await, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(60);
    while works(&a, &parent).await != StatusCode::UNAUTHORIZED {
        assert!(Instant::now() < deadline, "the parent never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(works(&a, &child).await, StatusCode::UNAUTHORIZED);

    // A key that never expires may still make one that never expires.
    let (_, _, record) = created(&make_key(&a, &admin, None).await);
    assert_eq!(expiry(&record), None);
}

#[tokio::test]
async fn revoking_a_key_revokes_the_keys_it_made_at_once() {
    let a = api().await;
    let admin = a.key.clone();
    let (parent, parent_id, _) = created(&make_key(&a, &admin, None).await);
    let (child, child_id, _) = created(&make_key(&a, &parent, None).await);
    let (grandchild, _, _) = created(&make_key(&a, &child, None).await);
    let (sibling, _, _) = created(&make_key(&a, &admin, None).await);
    // Each is used once, so this process holds its record.
    for k in [&parent, &child, &grandchild, &sibling] {
        assert_eq!(works(&a, k).await, StatusCode::OK);
    }

    let revoked = a
        .admin(
            Method::DELETE,
            &format!("/v1/keys/{parent_id}"),
            Value::Null,
        )
        .await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);

    // At once, as for the revoked key itself: no cached record is served.
    assert_eq!(works(&a, &parent).await, StatusCode::UNAUTHORIZED);
    assert_eq!(works(&a, &child).await, StatusCode::UNAUTHORIZED);
    assert_eq!(works(&a, &grandchild).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        works(&a, &sibling).await,
        StatusCode::OK,
        "not a key it made"
    );
    let shown = a
        .admin(Method::GET, &format!("/v1/keys/{child_id}"), Value::Null)
        .await;
    assert!(shown.body["revokedAt"].is_string(), "{}", shown.body);
}
