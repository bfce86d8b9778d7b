//! The one mapping from serde's decode errors to the API's refusals, for JSON bodies
//! ([`crate::requests::body`]) and query strings ([`crate::requests::query`]) alike, so a
//! client reads every refusal the same way:
//!
//! - `details.field` is the JSON path of the problem (`resources.cpu`, `classes[1].name`); for
//!   a missing field, the path of the object that lacks it with the field's name appended
//!   (serde reports the object, and the name only in its message);
//! - the message names the field, in words for API users rather than Rust types (`expected a
//!   whole number`, not `expected u64`);
//! - a whole number outside the range of its field's type (`-1` for a count, `5e9` for a
//!   32-bit one) is out of bounds, not malformed: in a body the 422 `validation_failed` every
//!   other bound gets, stating the bound the OpenAPI document gives the field (docs/api.md,
//!   *Bounds*); in a query the 400 every bad parameter gets.

use differently_core::ErrorCode;
use serde_json::{json, Value};
use serde_path_to_error::{Path, Segment};

use crate::error::ApiError;

/// Where a refused value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A JSON body read as the type named (`std::any::type_name`), whose schema in the
    /// OpenAPI document states its fields' bounds.
    Body { type_name: &'static str },
    /// A query string (every parameter a string the route parses itself).
    Query,
}

/// The refusal of `value` (the whole body or query, as JSON) that serde could not read
/// into its type: `message` (serde's) is about the value at `path`.
pub(crate) fn refusal(source: Source, path: &Path, message: &str, value: &Value) -> ApiError {
    let at = dotted(path);
    if let Some(name) = missing_field(message) {
        let field = if at.is_empty() {
            name.to_owned()
        } else {
            format!("{at}.{name}")
        };
        return named(ErrorCode::InvalidArgument, field, "required");
    }
    if let Some((lo, hi)) = integer_range(expected(message)) {
        if value_at(value, path).is_some_and(is_whole_number) {
            let (lo, hi) = match source {
                Source::Body { type_name } => {
                    let stated = crate::openapi::number_bounds(type_name, path);
                    (
                        stated.minimum.unwrap_or_else(|| lo.to_string()),
                        stated.maximum.unwrap_or_else(|| hi.to_string()),
                    )
                }
                Source::Query => (lo.to_string(), hi.to_string()),
            };
            let code = match source {
                Source::Body { .. } => ErrorCode::ValidationFailed,
                Source::Query => ErrorCode::InvalidArgument,
            };
            return named(code, at, format!("must be between {lo} and {hi}"));
        }
    }
    let words = plain_words(message, source);
    match (source, at.is_empty()) {
        (Source::Body { .. }, true) => ApiError::new(
            ErrorCode::InvalidArgument,
            format!("invalid JSON body: {words}"),
        )
        .with_details(json!({ "field": "" })),
        (Source::Query, true) => {
            ApiError::new(ErrorCode::InvalidArgument, format!("query: {words}"))
                .with_details(json!({ "field": "" }))
        }
        (_, false) => named(ErrorCode::InvalidArgument, at, words),
    }
}

/// The 400 for a key an object of a body names twice: `details.field` is the key's path.
pub(crate) fn duplicate_key(path: String) -> ApiError {
    named(ErrorCode::InvalidArgument, path, "duplicate key")
}

/// `code` with the message `field: what` and `details.field`.
fn named(code: ErrorCode, field: String, what: impl std::fmt::Display) -> ApiError {
    ApiError::new(code, format!("{field}: {what}")).with_details(json!({ "field": field }))
}

/// `path` as `details.field` writes it: `resources.cpu`, `command[0]`; empty for the whole
/// value.
fn dotted(path: &Path) -> String {
    if path.iter().next().is_none() {
        String::new()
    } else {
        path.to_string()
    }
}

/// The field serde's `missing field `x`` names.
fn missing_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("missing field `")?;
    let (name, _) = rest.split_once('`')?;
    Some(name)
}

/// What serde's message says was expected (`u64` in `invalid value: integer `-1`, expected
/// u64`), if it says.
fn expected(message: &str) -> &str {
    message
        .rsplit_once("expected ")
        .map_or("", |(_, what)| what.trim())
}

/// The range of the integer type serde names as expected (its `Visitor::expecting` is the
/// type's name: `u32`, `i64`; `a nonzero u32` for the non-zero ones).
fn integer_range(expected: &str) -> Option<(i128, i128)> {
    let (nonzero, ty) = match expected.strip_prefix("a nonzero ") {
        Some(ty) => (true, ty),
        None => (false, expected),
    };
    let (lo, hi): (i128, i128) = match ty {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" => (0, u64::MAX.into()),
        "usize" => (0, u64::MAX.into()),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" | "isize" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    };
    Some((if nonzero && lo == 0 { 1 } else { lo }, hi))
}

/// The value at `path` of `root`.
fn value_at<'v>(root: &'v Value, path: &Path) -> Option<&'v Value> {
    path.iter().try_fold(root, |v, segment| match segment {
        Segment::Map { key } => v.get(key.as_str()),
        Segment::Seq { index } => v.get(*index),
        Segment::Enum { .. } | Segment::Unknown => None,
    })
}

/// A JSON number without a fraction (`-1`, `5000000000`, `1e30`).
fn is_whole_number(v: &Value) -> bool {
    match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => true,
        Value::Number(n) => n
            .as_f64()
            .is_some_and(|f| f.is_finite() && f.fract() == 0.0),
        _ => false,
    }
}

/// serde's message in the API's words: numbers by what they must be, not by Rust type,
/// and a query's fields as parameters.
fn plain_words(message: &str, source: Source) -> String {
    let mut words = match message.rsplit_once("expected ") {
        Some((head, ty)) if integer_range(ty.trim()).is_some() => {
            let unsigned = integer_range(ty.trim()).is_some_and(|(lo, _)| lo >= 0);
            let what = if unsigned {
                "a whole number ≥ 0"
            } else {
                "a whole number"
            };
            format!("{head}expected {what}")
        }
        Some((head, "f32" | "f64")) => format!("{head}expected a number"),
        _ => message.to_owned(),
    };
    if source == Source::Query {
        words = words.replace("unknown field", "unknown parameter");
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        cpu: u32,
        name: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        command: Vec<String>,
        timeout_seconds: Option<u64>,
        priority: Option<i32>,
        inner: Option<Inner>,
        items: Option<Vec<Inner>>,
        ratio: Option<f64>,
    }

    fn refuse(body: Value) -> ApiError {
        let err = serde_path_to_error::deserialize::<_, Outer>(&body).expect_err("refused");
        refusal(
            Source::Body {
                type_name: std::any::type_name::<Outer>(),
            },
            err.path(),
            &err.inner().to_string(),
            &body,
        )
    }

    fn field(e: &ApiError) -> &str {
        e.details
            .as_ref()
            .and_then(|d| d["field"].as_str())
            .unwrap_or("-")
    }

    #[test]
    fn a_missing_field_is_named_by_its_full_path() {
        let e = refuse(json!({}));
        assert_eq!((e.code, field(&e)), (ErrorCode::InvalidArgument, "command"));
        assert_eq!(e.message, "command: required");
        let e = refuse(json!({ "command": [], "inner": { "cpu": 1 } }));
        assert_eq!(field(&e), "inner.name", "{}", e.message);
        let e =
            refuse(json!({ "command": [], "items": [{ "cpu": 1, "name": "a" }, { "name": "b" }] }));
        assert_eq!(field(&e), "items[1].cpu", "{}", e.message);
        assert_eq!(e.message, "items[1].cpu: required");
    }

    #[test]
    fn a_whole_number_beyond_its_type_is_a_bound_without_rust_names() {
        for (body, at, bound) in [
            (
                json!({ "command": [], "timeoutSeconds": -1 }),
                "timeoutSeconds",
                "0 and 18446744073709551615",
            ),
            (
                json!({ "command": [], "timeoutSeconds": 1e30 }),
                "timeoutSeconds",
                "0 and ",
            ),
            (
                json!({ "command": [], "priority": 3_000_000_000u64 }),
                "priority",
                "-2147483648 and 2147483647",
            ),
            (
                json!({ "command": [], "inner": { "cpu": -2, "name": "a" } }),
                "inner.cpu",
                "0 and 4294967295",
            ),
        ] {
            let e = refuse(body);
            assert_eq!(
                (e.code, field(&e)),
                (ErrorCode::ValidationFailed, at),
                "{}",
                e.message
            );
            assert!(
                e.message.starts_with(&format!("{at}: must be between ")),
                "{}",
                e.message
            );
            assert!(e.message.contains(bound), "{}", e.message);
            assert!(
                !e.message.contains("u64") && !e.message.contains("u32"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn a_wrong_type_stays_a_400_in_plain_words() {
        let e = refuse(json!({ "command": [], "timeoutSeconds": 1.5 }));
        assert_eq!(
            (e.code, field(&e)),
            (ErrorCode::InvalidArgument, "timeoutSeconds")
        );
        assert!(
            e.message.ends_with("expected a whole number ≥ 0"),
            "{}",
            e.message
        );
        let e = refuse(json!({ "command": [], "priority": "high" }));
        assert!(
            e.message.ends_with("expected a whole number"),
            "{}",
            e.message
        );
        let e = refuse(json!({ "command": [], "ratio": "x" }));
        assert!(e.message.ends_with("expected a number"), "{}", e.message);
        let e = refuse(json!({ "command": [], "bogus": 1 }));
        assert_eq!((e.code, field(&e)), (ErrorCode::InvalidArgument, "bogus"));
    }

    #[test]
    fn a_query_names_parameters() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Q {
            after: Option<String>,
        }
        let q = json!({ "bogus": "1" });
        let err = serde_path_to_error::deserialize::<_, Q>(&q).expect_err("refused");
        let e = refusal(Source::Query, err.path(), &err.inner().to_string(), &q);
        assert_eq!((e.code, field(&e)), (ErrorCode::InvalidArgument, "bogus"));
        assert!(
            e.message.starts_with("bogus: unknown parameter `bogus`"),
            "{}",
            e.message
        );
    }
}
