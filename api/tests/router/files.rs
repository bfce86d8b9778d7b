//! The files routes' refusals of a path the sandbox's filesystem makes impossible: the root
//! directory can be listed, but not read, written or deleted.

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{api, assert_field_error};

/// A read or write of a directory (the root is one) is the 409 `is_a_directory` any
/// directory gets; a delete of the root can never succeed and is 422 naming `path`, before
/// anything reaches the sandbox (it once reached each adapter, refused there with no field).
#[tokio::test]
async fn the_root_can_be_listed_but_not_read_written_or_deleted() {
    let api = api().await;
    let id = api.live_sandbox().await;
    let files = format!("/v1/sandboxes/{id}/files");
    let key = api.key.clone();
    let listed = api
        .admin(Method::GET, &format!("{files}/list?path=/"), Value::Null)
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    for root in ["/", "//", "/.", "/./"] {
        let q = format!("{files}?path={root}");
        let read = api.admin(Method::GET, &q, Value::Null).await;
        assert_field_error(&read, StatusCode::CONFLICT, "conflict", "path");
        assert_eq!(
            read.body["error"]["details"]["reason"], "is_a_directory",
            "{root}: {}",
            read.body
        );
        let written = api
            .call_raw(Method::PUT, &q, Some(&key), b"x".to_vec(), &[])
            .await;
        assert_field_error(&written, StatusCode::CONFLICT, "conflict", "path");
        assert_eq!(
            written.body["error"]["details"]["reason"], "is_a_directory",
            "{root}: {}",
            written.body
        );
        let deleted = api.admin(Method::DELETE, &q, Value::Null).await;
        assert_field_error(
            &deleted,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
            "path",
        );
        assert_eq!(
            deleted.body["error"]["message"],
            json!("path: the root directory cannot be deleted"),
            "{root}: {}",
            deleted.body
        );
    }
    // Below the root, a directory reads as any directory does.
    let made = api
        .admin(
            Method::POST,
            &format!("{files}/directories"),
            json!({ "path": "/work" }),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let read = api
        .admin(Method::GET, &format!("{files}?path=/work"), Value::Null)
        .await;
    assert_field_error(&read, StatusCode::CONFLICT, "conflict", "path");
}
