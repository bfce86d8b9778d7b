//! Request bodies through the very functions the handlers call: create sandbox
//! (`parse_create`), `PATCH /v1/sandboxes/{id}` (`parse_patch`) and exec (`parse_exec`).
//! Whatever the bytes, the answer is a value or a client error (400/422) naming its field,
//! never a panic or a 5xx; and nothing accepted carries a NUL (Postgres cannot store one).
#![no_main]

use bytes::Bytes;
use differently_api::error::ApiError;
use differently_api::routes::exec::parse_exec;
use differently_api::routes::sandboxes::{parse_create, parse_patch};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// A refusal must be the client's fault and say which field (`""` for the body as a whole).
fn check_refusal(which: &str, e: &ApiError) {
    let status = e.code.http_status();
    assert!(
        status == 400 || status == 422,
        "{which}: a body is refused with 400 or 422, not {status}: {}",
        e.message
    );
    assert!(
        e.details
            .as_ref()
            .is_some_and(|d| d.get("field").is_some_and(Value::is_string)),
        "{which}: a refused body names its field: {} {:?}",
        e.message,
        e.details
    );
}

/// Whether any string in `v` (a key or a value) holds a NUL, outside the top-level fields in
/// `data`.
fn has_nul(v: &Value, data: &[&str], top: bool) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(|i| has_nul(i, data, false)),
        Value::Object(map) => map.iter().any(|(k, item)| {
            if top && data.contains(&k.as_str()) {
                return false;
            }
            k.contains('\0') || has_nul(item, data, false)
        }),
        _ => false,
    }
}

fn accepted_has_no_nul(which: &str, body: &[u8], data: &[&str]) {
    // An accepted body is JSON (or blank, read as `{}`).
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        assert!(
            !has_nul(&v, data, true),
            "{which}: a body with a NUL outside {data:?} was accepted"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    match parse_create(&body) {
        Ok(_) => accepted_has_no_nul("create", data, &[]),
        Err(e) => check_refusal("create", &e),
    }
    match parse_patch(&body) {
        Ok(_) => accepted_has_no_nul("patch", data, &[]),
        Err(e) => check_refusal("patch", &e),
    }
    match parse_exec(&body) {
        Ok(_) => accepted_has_no_nul("exec", data, &["stdin"]),
        Err(e) => check_refusal("exec", &e),
    }
});
