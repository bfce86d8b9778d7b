//! Row decoding and value conversions of the Postgres store.

use differently_core::{Sandbox, SandboxStatus};
use sqlx::types::Json;
use sqlx::Row;

use crate::{ApiKeyRecord, Org, OrgStatus, Project, StoreError};

/// Columns selected to rebuild a `Sandbox`.
pub(crate) const DOC: &str = "doc";

/// Statuses for which `pred` holds, in wire form: the single source for SQL `= ANY($n)`.
pub(crate) fn statuses_where(pred: fn(SandboxStatus) -> bool) -> Vec<String> {
    SandboxStatus::ALL
        .into_iter()
        .filter(|s| pred(*s))
        .map(|s| s.as_str().to_owned())
        .collect()
}

pub(crate) fn to_i64<T: TryInto<i64>>(v: T, what: &str) -> Result<i64, StoreError> {
    v.try_into()
        .map_err(|_| StoreError::Internal(format!("{what} out of range")))
}

pub(crate) fn to_i32(v: u32) -> Result<i32, StoreError> {
    i32::try_from(v).map_err(|_| StoreError::Internal("attempts out of range".to_owned()))
}

pub(crate) fn json_of<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Internal(format!("encode: {e}")))
}

/// Rebuilds a sandbox from a row selecting `doc` and `env_sealed` (`env_at_rest`).
pub(crate) fn sandbox_of(row: &sqlx::postgres::PgRow) -> Result<Sandbox, StoreError> {
    super::env_at_rest::sandbox_of(row)
}

/// The rows a sweep iterates (their query selects `id`, `doc` and `env_sealed`): one whose document does
/// not decode (damaged, or written by another version) is skipped and reported
/// (`action=row_skipped`), so one bad row never fails the pass for every other row.
pub(crate) fn sweep_rows_of(rows: &[sqlx::postgres::PgRow]) -> Vec<Sandbox> {
    rows.iter()
        .filter_map(|row| match sandbox_of(row) {
            Ok(s) => Some(s),
            Err(e) => {
                let id: String = row.try_get("id").unwrap_or_default();
                tracing::warn!(sandbox = %id, error = %e, action = "row_skipped", "store: a sandbox row does not decode; a sweep skips it");
                metrics::counter!("differently_reconcile_actions_total", "pool" => "none", "action" => "row_skipped").increment(1);
                None
            }
        })
        .collect()
}

pub(crate) fn sandboxes_of(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<Sandbox>, StoreError> {
    rows.iter().map(sandbox_of).collect()
}

/// The wire form of an organization status (the promoted `status` column).
pub(crate) fn org_status_str(s: OrgStatus) -> &'static str {
    match s {
        OrgStatus::Active => "active",
        OrgStatus::Suspended => "suspended",
    }
}

pub(crate) fn org_of(row: &sqlx::postgres::PgRow) -> Result<Org, StoreError> {
    let Json(o): Json<Org> = row.try_get(DOC)?;
    Ok(o)
}

pub(crate) fn project_of(row: &sqlx::postgres::PgRow) -> Result<Project, StoreError> {
    let Json(p): Json<Project> = row.try_get(DOC)?;
    Ok(p)
}

/// Rebuilds a key record: the doc never holds the hash, its own column does.
pub(crate) fn key_of(row: &sqlx::postgres::PgRow) -> Result<ApiKeyRecord, StoreError> {
    let Json(mut k): Json<ApiKeyRecord> = row.try_get(DOC)?;
    k.hash = row.try_get("hash")?;
    Ok(k)
}

pub(crate) fn limit_of(limit: u32) -> Option<i64> {
    (limit != 0).then_some(i64::from(limit))
}

pub(crate) fn count_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
