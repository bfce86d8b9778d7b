//! Strict JSON request bodies: malformed JSON, wrong types, unknown and missing fields are a
//! 400 that names the field, before anything is written; a well-formed value that is not
//! acceptable (a number beyond its bound included) is a 422 that names it too. What serde
//! refuses is stated by [`crate::requests::decode`], the one mapping bodies and queries share.

use axum::body::Bytes;
use differently_core::{ErrorCode, FieldError};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::requests::decode::{refusal, Source};

/// Parses `bytes` as `T`, reporting the JSON path of the first problem; a NUL in any string
/// is refused (422 naming the field, see [`crate::requests::nul`]).
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
    match crate::requests::nul::find_in_body(bytes, data) {
        Some(field) => Err(crate::requests::nul::body_error(field)),
        None => Ok(parsed),
    }
}

fn parse_strict<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    // No body is `{}` (every field optional); a body of only whitespace is not JSON.
    let text: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    let whole_body = |message: String| {
        ApiError::new(ErrorCode::InvalidArgument, message).with_details(json!({ "field": "" }))
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let mut value =
        Value::deserialize(&mut de).map_err(|e| whole_body(format!("invalid JSON body: {e}")))?;
    // One JSON value and nothing after it but whitespace: `{"ttlSeconds":60} junk` is not a
    // body this API understands, however well-formed its first value is.
    de.end().map_err(|e| {
        whole_body(format!(
            "invalid JSON body: data after the JSON value ({e})"
        ))
    })?;
    // Every body is an object: serde would otherwise read `[null, null]` into a struct,
    // field by field in order.
    if !value.is_object() {
        return Err(whole_body(
            "invalid JSON body: expected a JSON object".to_owned(),
        ));
    }
    integral_numbers(&mut value);
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let source = Source::Body {
            type_name: std::any::type_name::<T>(),
        };
        refusal(source, e.path(), &e.inner().to_string(), &value)
    })
}

/// Turns every number written with a fraction or exponent that is a whole number in the
/// 64-bit range (`60.0`, `6e1`) into that integer: JSON (and the OpenAPI document's
/// `integer`) does not tell `60` from `60.0`, so neither may the API. Others stay as they are
/// (and fail an integer field's type check, naming it).
fn integral_numbers(v: &mut Value) {
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64() {
                // `as` saturates; the round trip tells a whole number in range from the rest.
                if f.fract() == 0.0 && f >= -(2f64.powi(63)) && f < 2f64.powi(64) {
                    let whole = if f < 0.0 {
                        Value::from(f as i64)
                    } else {
                        Value::from(f as u64)
                    };
                    *v = whole;
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}

/// 422 naming the field of a well-formed body that is not acceptable.
pub fn invalid(e: FieldError) -> ApiError {
    ApiError::field(ErrorCode::ValidationFailed, e)
}
