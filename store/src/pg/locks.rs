//! Row and advisory locks, in the store's fixed order: organization, then pool, then sandbox.

use std::collections::HashMap;

use differently_core::{OrgId, Sandbox, SandboxId};
use sqlx::{Postgres, Transaction};

use super::rows::sandbox_of;
use crate::StoreError;

/// Locks and loads one sandbox row.
pub(crate) async fn lock_sandbox(
    tx: &mut Transaction<'static, Postgres>,
    id: &SandboxId,
) -> Result<Sandbox, StoreError> {
    let row = sqlx::query("SELECT doc, env_sealed FROM sandboxes WHERE id = $1 FOR UPDATE")
        .bind(id.as_str())
        .fetch_optional(&mut **tx)
        .await?
        .ok_or(StoreError::NotFound)?;
    sandbox_of(&row)
}

/// Locks the sandbox rows `ids` (any order) in id order, the order every group writer uses,
/// and returns them by id; a missing id is simply absent.
pub(crate) async fn lock_sandboxes(
    tx: &mut Transaction<'static, Postgres>,
    ids: &[&str],
) -> Result<HashMap<SandboxId, Sandbox>, StoreError> {
    let rows = sqlx::query(
        "SELECT doc, env_sealed FROM sandboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?;
    let mut by_id = HashMap::with_capacity(rows.len());
    for r in &rows {
        let s = sandbox_of(r)?;
        by_id.insert(s.id.clone(), s);
    }
    Ok(by_id)
}

/// The advisory-lock key space of `lock_org_admissions` (`pg_advisory_xact_lock(space, key)`;
/// the bytes spell "dlya"), so no other advisory lock of this database can collide with it.
pub(crate) const ADMISSION_LOCK_SPACE: i32 = 0x646c_7961;

/// Serializes the admissions of `org` without excluding its activations; `NotFound` if the
/// organization does not exist. One statement.
///
/// Why two locks and not the org row `FOR UPDATE`: an admission checks only queue limits
/// (`queued`), which an activation can only lower, and an activation checks only active
/// usage, which an admission never changes, so neither needs to wait for the other; only
/// admissions must see each other's rows. They serialize on a transaction-scoped advisory
/// lock keyed by the org (two orgs sharing a hash merely queue together), and hold the org
/// row `FOR KEY SHARE`, which organization and quota changes (`lock_org`, `FOR UPDATE`)
/// still conflict with. Activations take the row `FOR NO KEY UPDATE` (`lock_org_capacity`),
/// which `FOR KEY SHARE` does not conflict with.
///
/// With `capacity`, the row is taken `FOR NO KEY UPDATE` instead, as `lock_org_capacity`
/// takes it: admissions that also place (`DirectPlacement`) reserve capacity, so they
/// exclude activations too. The advisory lock comes first in either mode.
pub(crate) async fn lock_org_admissions(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    capacity: bool,
) -> Result<(), StoreError> {
    let sql = if capacity {
        "SELECT o.id FROM (SELECT pg_advisory_xact_lock($2, hashtext($1))) AS admissions,
                          organizations o
         WHERE o.id = $1 FOR NO KEY UPDATE OF o"
    } else {
        "SELECT o.id FROM (SELECT pg_advisory_xact_lock($2, hashtext($1))) AS admissions,
                          organizations o
         WHERE o.id = $1 FOR KEY SHARE OF o"
    };
    sqlx::query(sql)
        .bind(org.as_str())
        .bind(ADMISSION_LOCK_SPACE)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or(StoreError::NotFound)?;
    Ok(())
}

/// Serializes what reserves capacity in `org` (activations, starts): the org row
/// `FOR NO KEY UPDATE`, which conflicts with itself and with organization changes
/// (`lock_org`) but not with admissions (`lock_org_admissions`). `NotFound` if it does not
/// exist.
pub(crate) async fn lock_org_capacity(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
) -> Result<(), StoreError> {
    lock_org_row(
        tx,
        org,
        "SELECT id FROM organizations WHERE id = $1 FOR NO KEY UPDATE",
    )
    .await
}

/// Locks the organization row against every other writer of the org (changes to the org,
/// its projects, keys and quotas); `NotFound` if it does not exist.
pub(crate) async fn lock_org(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
) -> Result<(), StoreError> {
    lock_org_row(
        tx,
        org,
        "SELECT id FROM organizations WHERE id = $1 FOR UPDATE",
    )
    .await
}

/// Runs `lock` (a `SELECT … WHERE id = $1` with a locking clause) for `org`.
pub(crate) async fn lock_org_row(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    lock: &'static str,
) -> Result<(), StoreError> {
    sqlx::query(lock)
        .bind(org.as_str())
        .fetch_optional(&mut **tx)
        .await?
        .ok_or(StoreError::NotFound)?;
    Ok(())
}

/// Locks a capped pool's row, creating it on first use (a pool from config has no row until
/// something takes a slot on it). One round trip when the row exists.
pub(crate) async fn lock_pool(
    tx: &mut Transaction<'static, Postgres>,
    name: &str,
) -> Result<(), StoreError> {
    let locked = sqlx::query("SELECT name FROM pools WHERE name = $1 FOR UPDATE")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?;
    if locked.is_none() {
        sqlx::query("INSERT INTO pools (name) VALUES ($1) ON CONFLICT (name) DO NOTHING")
            .bind(name)
            .execute(&mut **tx)
            .await?;
        sqlx::query("SELECT name FROM pools WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_one(&mut **tx)
            .await?;
    }
    Ok(())
}
