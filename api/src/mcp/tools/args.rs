//! Reading a tool's arguments: each missing or mistyped field is a tool error naming it, with
//! the `/v1` codes (`invalid_argument` for a missing or mistyped one, `validation_failed` for
//! a bad value).

use serde_json::{Map, Value};

use super::{ToolError, DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS};

/// `s` escaped for a path segment or query value.
pub(super) fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The refusal of a required argument left out: what `/v1` answers for a missing body field
/// (`invalid_argument`, `<field>: required`).
pub(super) fn missing(field: &str) -> ToolError {
    ToolError::field("invalid_argument", field, format!("{field}: required"))
}

pub(super) fn string<'a>(args: &'a Map<String, Value>, field: &str) -> Result<&'a str, ToolError> {
    match args.get(field) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => Err(missing(field)),
        Some(_) => Err(ToolError::field(
            "invalid_argument",
            field,
            format!("{field} must be a string"),
        )),
    }
}

pub(super) fn opt_string<'a>(
    args: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, ToolError> {
    match args.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => string(args, field).map(Some),
    }
}

pub(super) fn opt_int(args: &Map<String, Value>, field: &str) -> Result<Option<u64>, ToolError> {
    match args.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ToolError::field(
                "invalid_argument",
                field,
                format!("{field} must be a non-negative integer"),
            )
        }),
    }
}

/// The `sandboxId` argument, escaped for a path (an id `/v1` would not accept is its 404).
pub(super) fn sandbox_id(args: &Map<String, Value>) -> Result<String, ToolError> {
    let id = string(args, "sandboxId")?;
    if id.is_empty() {
        return Err(ToolError::field(
            "validation_failed",
            "sandboxId",
            "sandboxId must not be empty",
        ));
    }
    Ok(enc(id))
}

pub(super) fn wait_seconds(args: &mut Map<String, Value>) -> Result<u64, ToolError> {
    let w = opt_int(args, "waitSeconds")?.unwrap_or(DEFAULT_WAIT_SECONDS);
    args.remove("waitSeconds");
    if !(1..=MAX_WAIT_SECONDS).contains(&w) {
        return Err(ToolError::field(
            "validation_failed",
            "waitSeconds",
            format!("waitSeconds must be 1–{MAX_WAIT_SECONDS}"),
        ));
    }
    Ok(w)
}
