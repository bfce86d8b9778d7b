//! Strict JSON request bodies: malformed JSON, wrong types and unknown fields are a 400 that
//! names the field, before anything is written; a well-formed value that is not acceptable
//! is a 422 that names it too.

use axum::body::Bytes;
use differently_core::{ErrorCode, FieldError};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::ApiError;

/// Parses `bytes` as `T`, reporting the JSON path of the first problem; a NUL in any string
/// is refused (422 naming the field, see [`crate::nul`]).
pub fn parse_json<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    parse_json_allowing_nul(bytes, &[])
}

/// [`parse_json`], except that the top-level fields in `data` may hold a NUL (they carry the
/// caller's data, such as exec `stdin`, not names the stores keep).
pub fn parse_json_allowing_nul<T: DeserializeOwned>(
    bytes: &Bytes,
    data: &[&str],
) -> Result<T, ApiError> {
    let parsed: T = parse_strict(bytes)?;
    match crate::nul::find_in_body(bytes, data) {
        Some(field) => Err(crate::nul::body_error(field)),
        None => Ok(parsed),
    }
}

fn parse_strict<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path == "." { String::new() } else { path };
        let message = if field.is_empty() {
            format!("invalid JSON body: {inner}")
        } else {
            format!("{field}: {inner}")
        };
        ApiError::new(ErrorCode::InvalidArgument, message).with_details(json!({ "field": field }))
    })?;
    // One JSON value and nothing after it but whitespace: `{"ttlSeconds":60} junk` is not a
    // body this API understands, however well-formed its first value is.
    de.end().map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("invalid JSON body: data after the JSON value ({e})"),
        )
        .with_details(json!({ "field": "" }))
    })?;
    Ok(value)
}

/// 422 naming the field of a well-formed body that is not acceptable.
pub fn invalid(e: FieldError) -> ApiError {
    ApiError::field(ErrorCode::ValidationFailed, e)
}
