//! Usage counters on Postgres (migration `0006_usage_counters`; the trigger as it is now is
//! `0017_usage_trigger_once`).
//!
//! A trigger on `sandboxes` moves the counters of a row's org, project and pool in the same
//! transaction as the row (at its COMMIT, in one statement, and not at all for a change that
//! counts the same), so a quota check reads three small rows instead of aggregating every
//! row of the tenant under its lock. Which status counts toward what is
//! `differently_core::SandboxStatus`'s decision: `sync_status_classes` copies it into the
//! database on every migrate, and `reconcile` recounts from rows, fixes and reports drift.

use std::collections::{BTreeMap, HashMap};

use differently_core::{Sandbox, SandboxStatus};
use sqlx::{PgConnection, Postgres, Row};

use crate::{QuotaScope, StoreError, Usage, UsageDrift};

/// One counter row as read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counter {
    pub queued: i64,
    pub active: i64,
    pub cpu: i64,
    pub memory_mib: i64,
    pub disk_gib: i64,
    pub slots: i64,
}

impl Counter {
    /// The quota view of an org or project counter. Negative values would be drift (the
    /// reconcile reports and fixes them); they read as zero rather than wrapping.
    pub fn usage(&self) -> Usage {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        let c = |v: i64| u32::try_from(v).unwrap_or(if v < 0 { 0 } else { u32::MAX });
        Usage {
            active: c(self.active),
            cpu: n(self.cpu),
            memory_mib: n(self.memory_mib),
            disk_gib: n(self.disk_gib),
            queued: c(self.queued),
        }
    }
}

/// The counter key of a pool (org and project keys are `QuotaScope::key`).
pub(crate) fn pool_key(pool: &str) -> String {
    format!("pool:{pool}")
}

/// The counters the usage trigger moves when a row goes from `old` to `new` (same sandbox):
/// org and project when the status's class changes, the pools involved when the pool or the
/// slot flag changes. A change that counts the same (provisioning → running) moves none, and
/// locking none keeps such changes off the hot counter rows.
pub(crate) fn moved_by(old: &Sandbox, new: &Sandbox) -> Vec<String> {
    let class = |s: SandboxStatus| {
        (
            s == SandboxStatus::Queued,
            s.counts_active(),
            s.reserves_compute(),
            s.counts_disk(),
        )
    };
    let mut keys = Vec::new();
    if class(old.status) != class(new.status) || old.spec.resources != new.spec.resources {
        keys.push(QuotaScope::Org(new.org_id.clone()).key());
        keys.push(QuotaScope::Project(new.project_id.clone()).key());
    }
    if old.pool != new.pool || old.status.holds_pool_slot() != new.status.holds_pool_slot() {
        for pool in [old.pool.as_deref(), new.pool.as_deref()]
            .into_iter()
            .flatten()
        {
            keys.push(pool_key(pool));
        }
    }
    keys
}

/// Locks the counter rows of `keys` in (rank, scope) order: org, project, pool, the order the
/// usage trigger takes them for one row. A transaction that changes rows of several orgs or
/// pools calls this last, so it holds its counters in the one global order; left to the
/// trigger at commit it would take them row by row (org A, pool, org B, …) and deadlock with
/// a one-row commit of org B that holds org B and waits for the pool. Writers that also append
/// audit records take the same locks inside the insert (`pg_audit::append_then_lock_counters`,
/// same clause): keep the two in step.
pub(crate) async fn lock_in_order(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    keys: &[String],
) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT 1 FROM usage_counters WHERE scope = ANY($1)
         ORDER BY rank, scope COLLATE \"C\" FOR UPDATE",
    )
    .bind(keys)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A counter from a row with the counter's columns (`queued`, `active`, … `slots`).
pub(crate) fn counter_of(row: &sqlx::postgres::PgRow) -> Result<Counter, StoreError> {
    Ok(Counter {
        queued: row.try_get("queued")?,
        active: row.try_get("active")?,
        cpu: row.try_get("cpu")?,
        memory_mib: row.try_get("memory_mib")?,
        disk_gib: row.try_get("disk_gib")?,
        slots: row.try_get("slots")?,
    })
}

/// The counters of `keys` (missing scopes are all zero: nothing counted yet).
pub(crate) async fn read<'e, E>(
    ex: E,
    keys: &[String],
) -> Result<HashMap<String, Counter>, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let rows = sqlx::query(
        "SELECT scope, queued, active, cpu, memory_mib, disk_gib, slots
         FROM usage_counters WHERE scope = ANY($1)",
    )
    .bind(keys)
    .fetch_all(ex)
    .await?;
    let mut out = HashMap::with_capacity(keys.len());
    for r in &rows {
        out.insert(r.try_get::<String, _>("scope")?, counter_of(r)?);
    }
    Ok(out)
}

/// The usage of one org or project scope.
pub(crate) async fn scope_usage<'e, E>(ex: E, scope: &QuotaScope) -> Result<Usage, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let key = scope.key();
    let all = read(ex, std::slice::from_ref(&key)).await?;
    Ok(all.get(&key).copied().unwrap_or_default().usage())
}

/// Core's classification of `s` as the columns of `sandbox_status_classes`, in order:
/// queued, active, compute, disk, slot. The one place both the table and `usage_class`
/// take it from.
fn status_class(s: SandboxStatus) -> [i16; 5] {
    [
        s == SandboxStatus::Queued,
        s.counts_active(),
        s.reserves_compute(),
        s.counts_disk(),
        s.holds_pool_slot(),
    ]
    .map(i16::from)
}

/// Writes core's status classification into `sandbox_status_classes`. Returns whether it
/// changed anything (then every counter must be recounted).
pub(crate) async fn sync_status_classes(conn: &mut PgConnection) -> Result<bool, StoreError> {
    let mut changed = false;
    for s in SandboxStatus::ALL {
        let [queued, active, compute, disk, slot] = status_class(s);
        let res = sqlx::query(
            "INSERT INTO sandbox_status_classes AS c (status, queued, active, compute, disk, slot)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (status) DO UPDATE SET queued = EXCLUDED.queued,
                 active = EXCLUDED.active, compute = EXCLUDED.compute, disk = EXCLUDED.disk,
                 slot = EXCLUDED.slot
             WHERE (c.queued, c.active, c.compute, c.disk, c.slot)
                 IS DISTINCT FROM (EXCLUDED.queued, EXCLUDED.active, EXCLUDED.compute,
                                   EXCLUDED.disk, EXCLUDED.slot)",
        )
        .bind(s.as_str())
        .bind(queued)
        .bind(active)
        .bind(compute)
        .bind(disk)
        .bind(slot)
        .execute(&mut *conn)
        .await?;
        changed |= res.rows_affected() > 0;
    }
    Ok(changed)
}

/// The body of `usage_class(text)`: core's classification as a `CASE`, so the usage trigger
/// classifies a row by evaluating an expression instead of querying `sandbox_status_classes`
/// (two SPI queries per row change, 7 per sandbox's life, before). Written at every `migrate`
/// whose database holds another body, like the table beside it.
pub(crate) fn class_function_body() -> String {
    let mut arms = String::new();
    for s in SandboxStatus::ALL {
        let st = s.as_str();
        let [queued, active, compute, disk, slot] = status_class(s);
        arms.push_str(&format!(
            "        WHEN '{st}' THEN RETURN ROW('{st}', {queued}, {active}, {compute}, {disk}, {slot})::sandbox_status_classes;\n",
        ));
    }
    format!(
        "\nBEGIN\n    CASE st\n{arms}        ELSE RAISE EXCEPTION 'sandbox status % has no usage class', st;\n    END CASE;\nEND;\n"
    )
}

/// Replaces `usage_class(text)` with [`class_function_body`] unless it already is that.
/// Returns whether it wrote it.
pub(crate) async fn sync_class_function(conn: &mut PgConnection) -> Result<bool, StoreError> {
    let body = class_function_body();
    let current: Option<String> = sqlx::query_scalar(
        "SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('usage_class(text)')",
    )
    .fetch_optional(&mut *conn)
    .await?;
    if current.as_deref() == Some(body.as_str()) {
        return Ok(false);
    }
    // The statuses are core's own identifiers (lowercase words), never input.
    sqlx::raw_sql(&format!(
        "CREATE OR REPLACE FUNCTION usage_class(st text) RETURNS sandbox_status_classes
         LANGUAGE plpgsql STABLE AS $usage_class${body}$usage_class$"
    ))
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

/// What the rows say every counter should be, keyed by scope.
const TRUTH: &str = "
    SELECT 'org:' || s.org_id AS scope, 0::smallint AS rank,
           sum(c.queued)::bigint AS queued, sum(c.active)::bigint AS active,
           sum(c.compute * s.cpu)::bigint AS cpu, sum(c.compute * s.memory_mib)::bigint AS memory_mib,
           sum(c.disk * s.disk_gib)::bigint AS disk_gib, 0::bigint AS slots
    FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status GROUP BY s.org_id
    UNION ALL
    SELECT 'project:' || s.project_id, 1::smallint,
           sum(c.queued)::bigint, sum(c.active)::bigint,
           sum(c.compute * s.cpu)::bigint, sum(c.compute * s.memory_mib)::bigint,
           sum(c.disk * s.disk_gib)::bigint, 0::bigint
    FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status GROUP BY s.project_id
    UNION ALL
    SELECT 'pool:' || s.pool, 2::smallint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint,
           sum(c.slot)::bigint
    FROM sandboxes s JOIN sandbox_status_classes c ON c.status = s.status
    WHERE s.pool IS NOT NULL GROUP BY s.pool";

/// Recounts every counter from rows and corrects those that differ, returning them.
///
/// Takes `EXCLUSIVE` on `usage_counters` for the recount: in-flight writers commit first,
/// new ones wait for the few milliseconds of one aggregate, so the comparison is exact.
pub(crate) async fn reconcile(conn: &mut PgConnection) -> Result<Vec<UsageDrift>, StoreError> {
    use sqlx::Connection;
    let mut tx = conn.begin().await?;
    sqlx::query("LOCK TABLE usage_counters IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let truth_rows = sqlx::query(TRUTH).fetch_all(&mut *tx).await?;
    let stored_rows = sqlx::query(
        "SELECT scope, queued, active, cpu, memory_mib, disk_gib, slots FROM usage_counters",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut truth: BTreeMap<String, (i16, Counter)> = BTreeMap::new();
    for r in &truth_rows {
        truth.insert(r.try_get("scope")?, (r.try_get("rank")?, counter_of(r)?));
    }
    let mut stored: BTreeMap<String, Counter> = BTreeMap::new();
    for r in &stored_rows {
        stored.insert(r.try_get("scope")?, counter_of(r)?);
    }
    let mut drift = Vec::new();
    for (scope, (rank, want)) in &truth {
        let have = stored.get(scope).copied().unwrap_or_default();
        if have != *want {
            drift.push(UsageDrift {
                scope: scope.clone(),
                stored: have.usage(),
                stored_slots: have.slots,
                counted: want.usage(),
                counted_slots: want.slots,
            });
            sqlx::query(
                "INSERT INTO usage_counters (scope, rank, queued, active, cpu, memory_mib, disk_gib, slots)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (scope) DO UPDATE SET queued = EXCLUDED.queued,
                     active = EXCLUDED.active, cpu = EXCLUDED.cpu,
                     memory_mib = EXCLUDED.memory_mib, disk_gib = EXCLUDED.disk_gib,
                     slots = EXCLUDED.slots",
            )
            .bind(scope)
            .bind(rank)
            .bind(want.queued)
            .bind(want.active)
            .bind(want.cpu)
            .bind(want.memory_mib)
            .bind(want.disk_gib)
            .bind(want.slots)
            .execute(&mut *tx)
            .await?;
        }
    }
    // Counters of scopes with no rows left must read zero.
    for (scope, have) in &stored {
        if !truth.contains_key(scope) && *have != Counter::default() {
            drift.push(UsageDrift {
                scope: scope.clone(),
                stored: have.usage(),
                stored_slots: have.slots,
                counted: Usage::default(),
                counted_slots: 0,
            });
            sqlx::query(
                "UPDATE usage_counters SET queued = 0, active = 0, cpu = 0, memory_mib = 0,
                     disk_gib = 0, slots = 0 WHERE scope = $1",
            )
            .bind(scope)
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    Ok(drift)
}

#[cfg(test)]
mod class_function_tests {
    use super::*;

    #[test]
    fn every_status_has_exactly_one_arm_and_is_a_plain_word() {
        let body = class_function_body();
        for s in SandboxStatus::ALL {
            let st = s.as_str();
            // Interpolated into DDL: must never need quoting.
            assert!(
                !st.is_empty() && st.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{st}"
            );
            assert_eq!(body.matches(&format!("WHEN '{st}' ")).count(), 1, "{body}");
        }
        assert_eq!(body.matches("WHEN '").count(), SandboxStatus::ALL.len());
        assert!(body.contains("RAISE EXCEPTION"), "{body}");
    }
}
