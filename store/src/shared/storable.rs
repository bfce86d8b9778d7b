//! Values no store can keep: a NUL character, which Postgres refuses in `text` and `jsonb`
//! (a database error there) while the memory store would keep it. The API refuses NUL at the
//! boundary; both stores refuse it here too, alike, naming the field, so a caller that is not
//! the API (the config file's pools, an admin tool, a future route) gets the same answer
//! from either store.

use differently_core::pool::PoolRecord;
use differently_core::tenancy::{Org, Project};
use differently_core::FieldError;
use serde_json::Value;

use crate::lifecycle::SnapshotRecord;
use crate::StoreError;

fn refused(field: impl Into<String>) -> StoreError {
    StoreError::InvalidValue(FieldError::new(field, "may not contain the NUL character"))
}

/// `value` of `field`, if it holds no NUL.
pub(crate) fn text(field: &str, value: &str) -> Result<(), StoreError> {
    if value.contains('\0') {
        Err(refused(field))
    } else {
        Ok(())
    }
}

/// The path (under `at`) of the first string or key in `v` holding a NUL.
fn json_nul(v: &Value, at: &str) -> Option<String> {
    match v {
        Value::String(s) if s.contains('\0') => Some(at.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, x)| json_nul(x, &format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().find_map(|(k, x)| {
            if k.contains('\0') {
                Some(at.to_owned())
            } else {
                json_nul(x, &format!("{at}.{k}"))
            }
        }),
        _ => None,
    }
}

/// An organization's name.
pub(crate) fn org(o: &Org) -> Result<(), StoreError> {
    text("name", &o.name)
}

/// A project's name.
pub(crate) fn project(p: &Project) -> Result<(), StoreError> {
    text("name", &p.name)
}

/// A pool record: its names, region and every string of its settings.
pub(crate) fn pool(p: &PoolRecord) -> Result<(), StoreError> {
    text("name", &p.name)?;
    text("kind", &p.kind)?;
    if let Some(r) = &p.region {
        text("region", r)?;
    }
    match json_nul(&p.settings, "settings") {
        Some(field) => Err(refused(field)),
        None => Ok(()),
    }
}

/// A snapshot record: its name, pool, reason and backend reference.
pub(crate) fn snapshot(s: &SnapshotRecord) -> Result<(), StoreError> {
    text("pool", &s.pool)?;
    for (field, v) in [
        ("name", &s.name),
        ("statusReason", &s.status_reason),
        ("backendRef", &s.backend_ref),
    ] {
        if let Some(v) = v {
            text(field, v)?;
        }
    }
    Ok(())
}
