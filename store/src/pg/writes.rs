//! Writing sandbox rows: the document and every promoted column together.

use chrono::{DateTime, Utc};
use differently_core::Sandbox;
use sqlx::postgres::PgArguments;
use sqlx::{Postgres, Transaction};

use super::env_at_rest;
use super::prior_write::{bind, PriorWrite};
use super::rows::{to_i32, to_i64};
use crate::StoreError;

/// Writes the document and every promoted column of `s`; `next_attempt_at` only when given.
pub(crate) async fn write_sandbox(
    tx: &mut Transaction<'static, Postgres>,
    s: &Sandbox,
    next_attempt_at: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    let (doc, env_sealed) = env_at_rest::stored(s)?;
    let res = sqlx::query(
        "UPDATE sandboxes SET status = $2, status_version = $3, pool = $4, backend_ref = $5,
             attempts = $6, priority = $7, cpu = $8, memory_mib = $9, disk_gib = $10,
             next_attempt_at = COALESCE($11, next_attempt_at), expires_at = $12,
             updated_at = $13, doc = $14, env_sealed = $15
         WHERE id = $1",
    )
    .bind(s.id.as_str())
    .bind(s.status.as_str())
    .bind(s.status_version)
    .bind(s.pool.as_deref())
    .bind(s.backend_ref.as_deref())
    .bind(to_i32(s.attempts)?)
    .bind(s.spec.priority)
    .bind(i64::from(s.spec.resources.cpu))
    .bind(to_i64(s.spec.resources.memory_mib, "memory")?)
    .bind(to_i64(s.spec.resources.disk_gib, "disk")?)
    .bind(next_attempt_at)
    .bind(s.expires_at)
    .bind(s.updated_at)
    .bind(doc)
    .bind(env_sealed)
    .execute(&mut **tx)
    .await?;
    if res.rows_affected() == 0 {
        return Err(StoreError::NotFound);
    }
    Ok(())
}

/// The `UPDATE` that writes `rows` as they are, `next_attempt_at` untouched (`None` for no
/// rows); every row must exist. A group's rows are already locked, so one statement for all,
/// sent with the audit head lock that follows it (`PriorWrite`).
pub(crate) fn update_sandboxes(rows: &[&Sandbox]) -> Result<Option<PriorWrite>, StoreError> {
    if rows.is_empty() {
        return Ok(None);
    }
    let text = |f: fn(&Sandbox) -> Option<&str>| -> Vec<Option<&str>> {
        rows.iter().map(|s| f(s)).collect()
    };
    let mut attempts = Vec::with_capacity(rows.len());
    let mut memory = Vec::with_capacity(rows.len());
    let mut disk = Vec::with_capacity(rows.len());
    let mut docs = Vec::with_capacity(rows.len());
    let mut envs = Vec::with_capacity(rows.len());
    for s in rows {
        attempts.push(to_i32(s.attempts)?);
        memory.push(to_i64(s.spec.resources.memory_mib, "memory")?);
        disk.push(to_i64(s.spec.resources.disk_gib, "disk")?);
        let (doc, env) = env_at_rest::stored(s)?;
        docs.push(doc);
        envs.push(env);
    }
    let mut args = PgArguments::default();
    bind(&mut args, text(|s| Some(s.id.as_str())))?;
    bind(&mut args, text(|s| Some(s.status.as_str())))?;
    bind(
        &mut args,
        rows.iter().map(|s| s.status_version).collect::<Vec<i64>>(),
    )?;
    bind(&mut args, text(|s| s.pool.as_deref()))?;
    bind(&mut args, text(|s| s.backend_ref.as_deref()))?;
    bind(&mut args, attempts)?;
    bind(
        &mut args,
        rows.iter().map(|s| s.spec.priority).collect::<Vec<i32>>(),
    )?;
    bind(
        &mut args,
        rows.iter()
            .map(|s| i64::from(s.spec.resources.cpu))
            .collect::<Vec<i64>>(),
    )?;
    bind(&mut args, memory)?;
    bind(&mut args, disk)?;
    bind(
        &mut args,
        rows.iter().map(|s| s.expires_at).collect::<Vec<_>>(),
    )?;
    bind(
        &mut args,
        rows.iter().map(|s| s.updated_at).collect::<Vec<_>>(),
    )?;
    bind(&mut args, docs)?;
    bind(&mut args, envs)?;
    Ok(Some(PriorWrite::new(
        "UPDATE sandboxes AS s SET status = u.status, status_version = u.status_version,
             pool = u.pool, backend_ref = u.backend_ref, attempts = u.attempts,
             priority = u.priority, cpu = u.cpu, memory_mib = u.memory_mib,
             disk_gib = u.disk_gib, expires_at = u.expires_at, updated_at = u.updated_at,
             doc = u.doc, env_sealed = u.env_sealed
         FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::int[],
             $7::int[], $8::bigint[], $9::bigint[], $10::bigint[], $11::timestamptz[],
             $12::timestamptz[], $13::jsonb[], $14::bytea[])
             AS u(id, status, status_version, pool, backend_ref, attempts, priority, cpu,
                  memory_mib, disk_gib, expires_at, updated_at, doc, env_sealed)
         WHERE s.id = u.id",
        args,
        14,
        rows.len() as u64,
        |_, _| StoreError::NotFound,
    )))
}
