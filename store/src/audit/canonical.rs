//! The canonical form hashed for records and checkpoints (`docs/audit.md`): deterministic
//! JSON and the stored time precision. Any change here changes every hash, so it is pinned
//! by tests.

use chrono::{DateTime, Utc};
use serde_json::Value;

/// `at` as stored: Postgres keeps microseconds, so hashes are computed over that precision.
pub fn stored_time(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at)
}

/// Deterministic JSON: object keys sorted by their bytes, no whitespace, numbers and
/// strings as `serde_json` writes them.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                if let Some(x) = map.get(*k) {
                    write_canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}
