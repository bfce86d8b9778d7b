//! NUL characters are refused at the boundary, in every request string: Postgres cannot
//! store them (a 500 there) while the memory store would keep them, so without this one
//! store accepted what the other failed on. A NUL in a JSON body is a
//! 422 `validation_failed` naming the field (as for exec arguments); in a query parameter a
//! 400 `invalid_argument` naming the parameter (as for other malformed parameters).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use differently_core::ErrorCode;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::requests::middleware::Refusal;

/// The message every NUL refusal carries.
pub const MESSAGE: &str = "may not contain the NUL character";

/// The JSON path (as `serde_path_to_error` writes it: `labels.k`, `command[1]`) of the first
/// string in `body` holding a NUL, in a value or an object key (then the path of the
/// object); fields named in `allow` at the top level are data and may hold one.
pub fn find_in_body(body: &[u8], allow: &[&str]) -> Option<String> {
    // The only way a valid JSON text carries a NUL is the escape `\u0000`: skip the walk
    // for the bodies (nearly all) that have no such escape.
    let cheap = body
        .windows(5)
        .any(|w| w[0] == b'u' && w[1..].iter().all(|b| *b == b'0'));
    if !cheap {
        return None;
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    match &value {
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !allow.contains(&k.as_str()))
            .find_map(|(k, v)| {
                if k.contains('\0') {
                    return Some(String::new());
                }
                find_in_value(v, k.clone())
            }),
        other => find_in_value(other, String::new()),
    }
}

fn find_in_value(v: &Value, path: String) -> Option<String> {
    match v {
        Value::String(s) if s.contains('\0') => Some(path),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| find_in_value(item, format!("{path}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            if k.contains('\0') {
                return Some(path.clone());
            }
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            find_in_value(item, at)
        }),
        _ => None,
    }
}

/// The 422 for a NUL at `field` of a body.
pub fn body_error(field: String) -> ApiError {
    refusal(ErrorCode::ValidationFailed, field, "body")
}

/// `code` for a NUL at `field` (`details.field`), its message naming the field once (`whole`
/// when the field is the whole body or query).
fn refusal(code: ErrorCode, field: String, whole: &str) -> ApiError {
    let shown = if field.is_empty() { whole } else { &field };
    ApiError::new(code, format!("{shown}: {MESSAGE}")).with_details(json!({ "field": field }))
}

/// The name of the first query parameter whose name or value decodes to a NUL (`%00`).
pub fn find_in_query(query: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        has_nul_escape(pair).then(|| {
            if has_nul_escape(name) {
                String::new()
            } else {
                name.to_owned()
            }
        })
    })
}

/// Whether percent-decoding `s` yields a NUL: a `%00` that starts an escape.
fn has_nul_escape(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if b.get(i + 1..i + 3) == Some(b"00") {
                return true;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    false
}

/// Middleware: a query parameter holding a NUL is a 400 naming it, before any route runs,
/// in the error shape of the path asked for (a facade's own under its prefix).
pub async fn refuse_in_query(req: Request, next: Next) -> Response {
    if let Some(name) = req.uri().query().and_then(find_in_query) {
        let error = refusal(ErrorCode::InvalidArgument, name, "query");
        return Refusal::of(error).render(req.method(), req.uri().path());
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_path_of_a_nul_in_a_body() {
        let f = |s: &str| find_in_body(s.as_bytes(), &["stdin"]);
        assert_eq!(f(r#"{"template":"a\u0000b"}"#).as_deref(), Some("template"));
        assert_eq!(
            f(r#"{"labels":{"k":"\u0000"}}"#).as_deref(),
            Some("labels.k")
        );
        assert_eq!(
            f(r#"{"labels":{"k\u0000":"v"}}"#).as_deref(),
            Some("labels")
        );
        assert_eq!(
            f(r#"{"command":["a","\u0000"]}"#).as_deref(),
            Some("command[1]")
        );
        assert_eq!(f(r#"{"stdin":"\u0000"}"#), None, "allowed: data");
        assert_eq!(
            f(r#"{"template":"u0000 \\u0000"}"#),
            None,
            "no NUL, only text"
        );
        assert_eq!(f(r#"{"template":"plain"}"#), None);
    }

    #[test]
    fn a_refusal_names_the_field_once() {
        let e = body_error("command[0]".to_owned());
        assert_eq!(e.message, format!("command[0]: {MESSAGE}"));
        assert_eq!(e.details, Some(json!({ "field": "command[0]" })));
        let e = body_error(String::new());
        assert_eq!(e.message, format!("body: {MESSAGE}"));
        assert_eq!(e.details, Some(json!({ "field": "" })));
    }

    #[test]
    fn finds_the_parameter_of_a_nul_in_a_query() {
        assert_eq!(find_in_query("label=a%00b").as_deref(), Some("label"));
        assert_eq!(find_in_query("limit=2&actor=%00").as_deref(), Some("actor"));
        assert_eq!(find_in_query("a%00=1").as_deref(), Some(""));
        assert_eq!(
            find_in_query("label=a%2500b"),
            None,
            "an escaped %, not a NUL"
        );
        assert_eq!(find_in_query("label=a"), None);
    }
}
