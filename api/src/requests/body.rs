//! Strict JSON request bodies: malformed JSON, wrong types, unknown and missing fields are a
//! 400 that names the field, before anything is written; a well-formed value that is not
//! acceptable (a number beyond its bound included) is a 422 that names it too. What serde
//! refuses is stated by [`crate::requests::decode`], the one mapping bodies and queries share.

use std::cell::Cell;
use std::fmt;

use axum::body::Bytes;
use differently_core::{ErrorCode, FieldError};
use serde::de::{self, DeserializeOwned, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{json, Map, Number, Value};

use crate::error::ApiError;
use crate::requests::decode::{duplicate_key, refusal, Source};

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
    let mut value = read_value(text).map_err(|e| match e {
        JsonError::DuplicateKey { path } => duplicate_key(path),
        JsonError::Syntax(e) => whole_body(format!("invalid JSON body: {e}")),
        JsonError::Trailing(e) => whole_body(format!(
            "invalid JSON body: data after the JSON value ({e})"
        )),
        JsonError::Shape(e) => whole_body(format!("invalid JSON body: {e}")),
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

/// Why bytes are not one JSON value the API reads.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// An object names a key twice (`path` is the key's JSON path, as `details.field` writes
    /// it). serde_json keeps the last value, while a proxy or policy layer in front may read
    /// the first, so the two would see different requests: such a text is refused.
    #[error("{path}: duplicate key")]
    DuplicateKey { path: String },
    /// Not JSON.
    #[error("{0}")]
    Syntax(#[source] serde_json::Error),
    /// A JSON value followed by more than whitespace.
    #[error("data after the JSON value ({0})")]
    Trailing(#[source] serde_json::Error),
    /// Well-formed JSON that is not the type asked for ([`read`] only).
    #[error("{0}")]
    Shape(#[source] serde_json::Error),
}

/// Reads `bytes` as one `T` through [`read_value`], so a key named twice is refused as it is
/// in `/v1` bodies. For parsers that keep their own error shape (the facades', the PTY
/// socket's frames): each maps [`JsonError::DuplicateKey`] to its malformed-JSON refusal,
/// naming the key.
pub fn read<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    let value = read_value(bytes)?;
    serde_json::from_value(value).map_err(JsonError::Shape)
}

/// Reads `bytes` as exactly one JSON value, refusing an object that names a key twice. The
/// check is part of building the value (one lookup per key, as inserting it costs anyway),
/// not a second pass: bodies are read on every request, exec's included.
pub fn read_value(bytes: &[u8]) -> Result<Value, JsonError> {
    let duplicate = Cell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let seed = Strict {
        at: At::Root,
        duplicate: &duplicate,
    };
    let value = seed
        .deserialize(&mut de)
        .map_err(|e| match duplicate.take() {
            Some(path) => JsonError::DuplicateKey { path },
            None => JsonError::Syntax(e),
        })?;
    // One JSON value and nothing after it but whitespace: `{"ttlSeconds":60} junk` is not a
    // body this API understands, however well-formed its first value is.
    de.end().map_err(JsonError::Trailing)?;
    Ok(value)
}

/// Where a value sits: its parent and its key or index. A list on the stack, written out as
/// a path only when a duplicate is found.
#[derive(Clone, Copy)]
enum At<'a> {
    Root,
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    /// The path as `serde_path_to_error` writes it (`resources.cpu`, `items[1].name`), the
    /// form every other `details.field` takes.
    fn path(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            At::Root => {}
            At::Key(parent, key) => {
                parent.write(out);
                if !matches!(parent, At::Root) {
                    out.push('.');
                }
                out.push_str(key);
            }
            At::Index(parent, i) => {
                parent.write(out);
                out.push('[');
                out.push_str(&i.to_string());
                out.push(']');
            }
        }
    }
}

/// Builds a [`Value`] as serde_json's own deserializer does, but fails on a repeated key,
/// leaving its path in `duplicate` (serde's error carries only a message).
struct Strict<'a> {
    at: At<'a>,
    duplicate: &'a Cell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let at = At::Index(&self.at, items.len());
            let item = seq.next_element_seed(Strict {
                at,
                duplicate: self.duplicate,
            })?;
            match item {
                Some(v) => items.push(v),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match out.entry(key) {
                Entry::Occupied(e) => {
                    self.duplicate.set(Some(At::Key(&self.at, e.key()).path()));
                    return Err(de::Error::custom("duplicate key"));
                }
                Entry::Vacant(e) => {
                    let value = map.next_value_seed(Strict {
                        at: At::Key(&self.at, e.key()),
                        duplicate: self.duplicate,
                    })?;
                    e.insert(value);
                }
            }
        }
        Ok(Value::Object(out))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn duplicate(text: &str) -> Option<String> {
        match read_value(text.as_bytes()) {
            Err(JsonError::DuplicateKey { path }) => Some(path),
            _ => None,
        }
    }

    #[test]
    fn the_value_is_serde_jsons_own() {
        for text in [
            r#"{"a":1,"b":-2,"c":1.5,"d":18446744073709551615,"e":18446744073709551616}"#,
            r#"{"s":"\u00e9\n\"x\"","u":"\ud83d\ude00","n":null,"t":true,"f":false}"#,
            r#"[1,[2,[3,{"k":[]}]],{},"",-0,0.0,1e300,-9223372036854775808]"#,
            r#"{"nested":{"a":{"b":{"c":[{"x":1},{"x":2}]}}},"x":{"x":{"x":1}}}"#,
            "  \"just a string\" \n",
            "12",
        ] {
            let ours = read_value(text.as_bytes()).expect(text);
            let theirs: Value = serde_json::from_str(text).expect(text);
            assert_eq!(ours, theirs, "{text}");
            assert_eq!(ours.to_string(), theirs.to_string(), "{text}");
        }
    }

    #[test]
    fn a_key_named_twice_is_refused_by_its_path() {
        assert_eq!(
            duplicate(r#"{"command":["echo","1"],"command":["echo","2"]}"#).as_deref(),
            Some("command")
        );
        assert_eq!(
            duplicate(r#"{"resources":{"cpu":1,"memoryMiB":128,"cpu":2}}"#).as_deref(),
            Some("resources.cpu")
        );
        assert_eq!(
            duplicate(r#"{"items":[{"n":1},{"n":2,"n":3}]}"#).as_deref(),
            Some("items[1].n")
        );
        assert_eq!(duplicate(r#"[{"a":1,"a":1}]"#).as_deref(), Some("[0].a"));
        // The same name in different objects, or as a value, is no repeat.
        assert_eq!(
            duplicate(r#"{"a":{"a":"a"},"b":{"a":1},"c":["a","a"]}"#),
            None
        );
        // Keys are compared decoded: an escape spells the same key.
        assert_eq!(duplicate(r#"{"ab":1,"a\u0062":2}"#).as_deref(), Some("ab"));
    }

    #[test]
    fn syntax_and_trailing_data_stay_what_they_were() {
        assert!(matches!(read_value(b"{\"a\":"), Err(JsonError::Syntax(_))));
        assert!(matches!(
            read_value(br#"{"a":1} x"#),
            Err(JsonError::Trailing(_))
        ));
        // A syntax error after a repeat: the repeat comes first, as the reader meets it.
        assert!(matches!(
            read_value(br#"{"a":1,"a":2,"#),
            Err(JsonError::DuplicateKey { .. })
        ));
    }

    #[test]
    fn a_body_with_a_key_twice_is_a_400_naming_it() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Org {
            name: String,
        }
        let e = parse_json::<Org>(&Bytes::from_static(br#"{"name":"a","name":"b"}"#))
            .expect_err("refused");
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(e.message, "name: duplicate key");
        assert_eq!(e.details, Some(json!({ "field": "name" })));
    }
}
