//! Numbers at the boundary: every duration and count is bounded, and the 422 names the field
//! and states the bound (issue #20: an unbounded idle timeout stopped the idle sweep).

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{assert_field_error, Answer};

/// Asserts a 422 `validation_failed` naming `field` whose message states `bound`.
fn assert_bound(a: &Answer, field: &str, bound: &str) {
    assert_field_error(
        a,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        field,
    );
    let message = a.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(bound), "{field}: {}", a.body);
}

#[tokio::test]
async fn an_idle_timeout_beyond_the_bound_is_422_on_create() {
    let api = crate::support::api().await;
    for idle in [json!(0), json!(2_592_001u64), json!(u64::MAX)] {
        let a = api
            .admin(
                Method::POST,
                "/v1/sandboxes",
                json!({ "idleTimeoutSeconds": idle }),
            )
            .await;
        assert_bound(&a, "idleTimeoutSeconds", "2592000");
    }
    let a = api
        .admin(
            Method::POST,
            "/v1/sandboxes",
            json!({ "idleTimeoutSeconds": 2_592_000u64 }),
        )
        .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.body);
}

#[tokio::test]
async fn an_idle_timeout_beyond_the_bound_is_422_on_patch_and_changes_nothing() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let path = format!("/v1/sandboxes/{id}");
    for idle in [json!(0), json!(10_000_000_000_000_000u64), json!(u64::MAX)] {
        let a = api
            .admin(
                Method::PATCH,
                &path,
                json!({ "idleTimeoutSeconds": idle, "labels": { "a": "b" } }),
            )
            .await;
        assert_bound(&a, "idleTimeoutSeconds", "2592000");
    }
    let a = api.admin(Method::GET, &path, Value::Null).await;
    assert_eq!(a.body["idleTimeoutSeconds"], Value::Null, "{}", a.body);
    assert_eq!(a.body["labels"], json!({}), "{}", a.body);
    let a = api
        .admin(Method::PATCH, &path, json!({ "idleTimeoutSeconds": 60 }))
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.body["idleTimeoutSeconds"], 60, "{}", a.body);
}

#[tokio::test]
async fn pool_numbers_beyond_their_bounds_are_422() {
    let api = crate::support::api().await;
    let cases = [
        ("maxConcurrent", json!(0), "1000000"),
        ("maxConcurrent", json!(4_000_000_000u64), "1000000"),
        ("costPerCpuHour", json!(-1.0), "1000000"),
        ("costPerCpuHour", json!(1e300), "1000000"),
        ("typicalCreateSeconds", json!(-0.5), "86400"),
        ("typicalCreateSeconds", json!(1e300), "86400"),
    ];
    for (field, value, bound) in cases {
        let mut body = json!({ "name": "extra", "kind": "fake", "settings": {} });
        body[field] = value;
        let a = api.admin(Method::POST, "/v1/admin/pools", body).await;
        assert_bound(&a, field, bound);
    }
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "extra", "kind": "fake", "settings": {}, "maxConcurrent": 5,
                    "costPerCpuHour": 0.5, "typicalCreateSeconds": 3.0 }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a = api
        .admin(
            Method::PATCH,
            "/v1/admin/pools/extra",
            json!({ "maxConcurrent": 2_000_000 }),
        )
        .await;
    assert_bound(&a, "maxConcurrent", "1000000");
}

/// The admin pools body's bounds in the document are the handler's: for each bound the
/// document states, the value at it is taken and the value just beyond is refused (422
/// naming the field), on create as on update. (The document once stated none of them.)
#[tokio::test]
async fn the_pool_bodys_documented_bounds_are_the_ones_enforced() {
    let api = crate::support::api().await;
    let doc = api
        .call(Method::GET, "/v1/openapi.json", None, Value::Null, &[])
        .await;
    let props = doc.body["components"]["schemas"]["PoolRequest"]["properties"].clone();
    let stated = |field: &str, key: &str| props[field][key].as_f64();
    let mut checked = 0;
    for field in ["maxConcurrent", "costPerCpuHour", "typicalCreateSeconds"] {
        let (min, max) = (stated(field, "minimum"), stated(field, "maximum"));
        let (Some(min), Some(max)) = (min, max) else {
            panic!("{field}: no bounds stated: {}", props[field]);
        };
        let step = if props[field]["type"][0] == "integer" {
            1.0
        } else {
            0.5
        };
        for (value, taken) in [
            (min, true),
            (max, true),
            (min - step, false),
            (max + step, false),
        ] {
            let value = if step == 1.0 {
                json!(value as i64)
            } else {
                json!(value)
            };
            let mut body = json!({ "name": format!("p{checked}"), "kind": "fake", "settings": {} });
            body[field] = value.clone();
            let a = api.admin(Method::POST, "/v1/admin/pools", body).await;
            if taken {
                assert_eq!(
                    a.status,
                    StatusCode::CREATED,
                    "{field} = {value}: {}",
                    a.body
                );
                let a = api
                    .admin(
                        Method::PATCH,
                        &format!("/v1/admin/pools/p{checked}"),
                        json!({ field: value }),
                    )
                    .await;
                assert_eq!(a.status, StatusCode::OK, "{field} = {value}: {}", a.body);
            } else {
                assert_bound(&a, field, &format!("{}", max as u64));
            }
            checked += 1;
        }
    }
    // The region: 1 to its stated length, no control character.
    let max = props["region"]["maxLength"]
        .as_u64()
        .expect("region's maxLength") as usize;
    assert_eq!(props["region"]["minLength"], 1);
    let pattern = props["region"]["pattern"]
        .as_str()
        .expect("region's pattern");
    assert!(pattern.contains("\\u001f"), "{pattern}");
    for (region, taken) in [
        ("é".repeat(max), true),
        ("é".repeat(max + 1), false),
        (String::new(), false),
        ("eu\twest".to_owned(), false),
    ] {
        let body = json!({ "name": format!("p{checked}"), "kind": "fake", "settings": {}, "region": region });
        let a = api.admin(Method::POST, "/v1/admin/pools", body).await;
        if taken {
            assert_eq!(a.status, StatusCode::CREATED, "{region:?}: {}", a.body);
        } else {
            assert_bound(&a, "region", &max.to_string());
        }
        checked += 1;
    }
    // The name: the document's pattern is the handler's alphabet and length.
    assert_eq!(props["name"]["pattern"], "^[a-z0-9][a-z0-9-]{0,62}$");
    for name in ["-lead", "Upper", &"a".repeat(64)] {
        let a = api
            .admin(
                Method::POST,
                "/v1/admin/pools",
                json!({ "name": name, "kind": "fake", "settings": {} }),
            )
            .await;
        crate::support::assert_field_error(
            &a,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "name",
        );
    }
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "a".repeat(63), "kind": "fake", "settings": {} }),
        )
        .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
}

/// A whole number outside the range of its field's type (a negative count, one too large for
/// 32 or 64 bits) is out of bounds like any other: 422 naming the field and the bound the
/// field's own check states, never serde's `expected u64`. One mapping does it for every body.
#[tokio::test]
async fn a_number_beyond_its_type_is_a_422_stating_the_fields_bound() {
    let api = crate::support::api().await;
    let id = api.sandbox().await;
    let org = api.tenant.org.id.to_string();
    let cases = [
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["ls"], "timeoutSeconds": -1 }),
            "timeoutSeconds",
            "between 1 and 86400",
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["ls"], "timeoutSeconds": 1e30 }),
            "timeoutSeconds",
            "between 1 and 86400",
        ),
        (
            Method::PUT,
            format!("/v1/orgs/{org}/quota"),
            json!({ "maxActive": -1 }),
            "maxActive",
            "between 0 and 1000000",
        ),
        (
            Method::POST,
            "/v1/sandboxes".to_owned(),
            json!({ "resources": { "cpu": -1 } }),
            "resources.cpu",
            "between 1 and 256",
        ),
        (
            Method::POST,
            "/v1/sandboxes".to_owned(),
            json!({ "priority": 3_000_000_000u64 }),
            "priority",
            "between -100 and 100",
        ),
        (
            Method::PATCH,
            format!("/v1/sandboxes/{id}"),
            json!({ "ttlSeconds": -60 }),
            "ttlSeconds",
            "between 1 and 2592000",
        ),
    ];
    for (method, path, body, field, bound) in cases {
        let a = api.admin(method, &path, body).await;
        assert_bound(&a, field, bound);
        let message = a.body["error"]["message"].as_str().unwrap_or("");
        assert_eq!(message, format!("{field}: must be {bound}"), "{}", a.body);
    }
    // A pool's count too: the document states its check's bound, so a number beyond the
    // type is refused with the same words as one beyond the bound (a field without a stated
    // bound gets its type's range: `requests::decode`'s unit test).
    let a = api
        .admin(
            Method::POST,
            "/v1/admin/pools",
            json!({ "name": "extra", "kind": "fake", "settings": {}, "maxConcurrent": -5 }),
        )
        .await;
    assert_bound(&a, "maxConcurrent", "between 1 and 1000000");
    assert_eq!(
        a.body["error"]["message"], "maxConcurrent: must be between 1 and 1000000",
        "{}",
        a.body
    );
    // A fraction is no whole number at all: a wrong type (400), in words, not Rust's.
    let a = api
        .admin(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            json!({ "command": ["ls"], "timeoutSeconds": 1.5 }),
        )
        .await;
    crate::support::assert_field_error(
        &a,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        "timeoutSeconds",
    );
    let message = a.body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.ends_with("expected a whole number ≥ 0"),
        "{}",
        a.body
    );
}
