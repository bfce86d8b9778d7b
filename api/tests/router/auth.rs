//! Failed authentications are throttled per presented key id, and per address only for
//! malformed keys; a valid key is never refused for another's failures.

use axum::http::{Method, StatusCode};
use differently_api::auth::throttle::parse_proxy;
use differently_api::Limits;
use serde_json::Value;

use crate::support::{api, api_with, assert_error, Answer, Api};

/// Failures allowed before 429 (the default burst).
const BURST: usize = 20;
const MALFORMED: &str = "dly_not-a-key";

async fn list(api: &Api, peer: &str, key: &str, xff: Option<&str>) -> Answer {
    let headers: Vec<(&str, &str)> = xff.map(|v| ("x-forwarded-for", v)).into_iter().collect();
    api.call_from(
        Some(peer),
        Method::GET,
        "/v1/sandboxes",
        Some(key),
        Value::Null,
        &headers,
    )
    .await
}

/// Sends `key` until it is refused with 429; asserts that takes exactly `BURST` 401s.
async fn exhaust(api: &Api, peer: &str, key: &str, xff: Option<&str>) -> Answer {
    for i in 0..BURST {
        let a = list(api, peer, key, xff).await;
        assert_eq!(
            a.status,
            StatusCode::UNAUTHORIZED,
            "failure {i}: {}",
            a.body
        );
    }
    let a = list(api, peer, key, xff).await;
    assert_error(&a, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    let wait: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(wait >= 1, "Retry-After {wait}");
    a
}

#[tokio::test]
async fn a_valid_key_works_while_another_key_id_is_throttled() {
    let api = api().await;
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    // Well formed (checksum right) but unknown: counted against its key id.
    let guessed = differently_api::generate_key();
    let refused = exhaust(&api, "192.0.2.1", &guessed, None).await;
    assert_eq!(
        refused.body["error"]["details"]["scope"], "key",
        "{}",
        refused.body
    );
    for key in [&tenant, &api.key] {
        let a = list(&api, "192.0.2.1", key, None).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "same address, other key: {}",
            a.body
        );
    }
    // Another unknown key id from the same address is only unauthenticated.
    let other = list(&api, "192.0.2.1", &differently_api::generate_key(), None).await;
    assert_error(&other, StatusCode::UNAUTHORIZED, "unauthenticated");
}

/// Found by the fault suite's noisy-neighbour test: wrong secrets sent under another
/// tenant's key id (ids are not secret: audit records and key listings show them) used to
/// lock that tenant's valid key out with 429 for as long as the failures kept coming.
#[tokio::test]
async fn a_valid_key_works_while_its_own_key_id_is_throttled() {
    let api = api().await;
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    let (id, _) = tenant.rsplit_once('_').unwrap();
    let stranger = differently_api::generate_key();
    let (_, wrong_secret) = stranger.rsplit_once('_').unwrap();
    let forged = format!("{id}_{wrong_secret}");
    let refused = exhaust(&api, "192.0.2.9", &forged, None).await;
    assert_eq!(
        refused.body["error"]["details"]["scope"], "key",
        "{}",
        refused.body
    );
    for peer in ["192.0.2.9", "192.0.2.10"] {
        let a = list(&api, peer, &tenant, None).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "the valid key from {peer}: {}",
            a.body
        );
    }
    // The wrong secret stays throttled.
    let again = list(&api, "192.0.2.9", &forged, None).await;
    assert_error(&again, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
}

#[tokio::test]
async fn malformed_keys_are_throttled_per_address_without_blocking_valid_keys() {
    let api = api().await;
    let tenant = api.key_with(None, &["sandboxes:read"]).await;
    let refused = exhaust(&api, "192.0.2.1", MALFORMED, None).await;
    assert_eq!(
        refused.body["error"]["details"]["scope"], "address",
        "{}",
        refused.body
    );
    let elsewhere = list(&api, "192.0.2.2", MALFORMED, None).await;
    assert_error(&elsewhere, StatusCode::UNAUTHORIZED, "unauthenticated");
    for key in [&tenant, &api.key] {
        let a = list(&api, "192.0.2.1", key, None).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "valid key, noisy address: {}",
            a.body
        );
    }
}

#[tokio::test]
async fn x_forwarded_for_is_ignored_from_an_untrusted_peer() {
    let api = api().await;
    exhaust(&api, "10.0.0.1", MALFORMED, Some("203.0.113.7")).await;
    // Another claimed client behind the same untrusted peer is the same address.
    let a = list(&api, "10.0.0.1", MALFORMED, Some("203.0.113.8")).await;
    assert_error(&a, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_behind_a_trusted_proxy() {
    let api = api_with(Limits {
        direct_placement: false,
        trusted_proxies: vec![parse_proxy("10.0.0.0/8").unwrap()],
        ..Limits::default()
    })
    .await;
    exhaust(&api, "10.0.0.1", MALFORMED, Some("203.0.113.7")).await;
    // Another client behind the same proxy is not throttled.
    let a = list(&api, "10.0.0.1", MALFORMED, Some("203.0.113.8")).await;
    assert_error(&a, StatusCode::UNAUTHORIZED, "unauthenticated");
    // Hops the client prepends do not change who it is: the rightmost untrusted hop is.
    let spoofed = list(
        &api,
        "10.0.0.1",
        MALFORMED,
        Some("198.51.100.9, 203.0.113.7, 10.0.0.5"),
    )
    .await;
    assert_error(&spoofed, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
}
