//! The Postgres store: the truth. Every trait method is one transaction; sandbox rows keep the
//! full serialized `Sandbox` in `doc` with the columns needed for locking, filtering and
//! ordering promoted next to it (written together, so they never disagree).
//!
//! Lock order is fixed: organization row, then pool row, then sandbox row. Status changes load
//! the row `FOR UPDATE`, apply the shared rules in Rust, and write doc, columns and the audit
//! record in the same transaction.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::ids::InstallationId;
use differently_core::{KeyId, OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use serde_json::json;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions};
use sqlx::types::Json;
use sqlx::{Connection, PgConnection, PgPool, Postgres, Row, Transaction};

use crate::shared::rules::{self, AuditEntry};
use crate::prior_write::{bind, PriorWrite};
use crate::usage_pg;
use crate::{admission_pg, audit_pg, transition_lane_pg};
use crate::{
    Activation, Actor, Admission, Admitted, ApiKeyRecord, AuditRecord, Leadership, Org, OrgStatus,
    PoolSlot, Project, Quota, QuotaScope, SandboxFilter, Store, StoreError, Transition, Usage,
};

/// Embedded migrations, applied in order; a version is never edited once released.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../../migrations/0001_init.sql")),
    (
        "0002_tenancy",
        include_str!("../../migrations/0002_tenancy.sql"),
    ),
    (
        "0003_snapshots",
        include_str!("../../migrations/0003_snapshots.sql"),
    ),
    (
        "0004_audit_chain",
        include_str!("../../migrations/0004_audit_chain.sql"),
    ),
    (
        "0005_placement",
        include_str!("../../migrations/0005_placement.sql"),
    ),
    (
        "0006_usage_counters",
        include_str!("../../migrations/0006_usage_counters.sql"),
    ),
    (
        "0007_audit_heads",
        include_str!("../../migrations/0007_audit_heads.sql"),
    ),
    (
        "0008_idempotency",
        include_str!("../../migrations/0008_idempotency.sql"),
    ),
];

/// Session advisory lock serializing migrations across replicas (`dly_mig`).
const MIGRATION_LOCK: i64 = 0x0064_6c79_5f6d_6967; // "dly_mig"
/// Session advisory lock of the scheduler leader (`dly_ldr`).
const LEADER_LOCK: i64 = 0x0064_6c79_5f6c_6472; // "dly_ldr"
/// Transaction advisory lock serializing organization name checks (`dly_orgn`): names are
/// unique installation-wide, and there is no row to lock before the org exists.
const ORG_NAME_LOCK: i64 = 0x646c_795f_6f72_676e; // "dly_orgn"

const INSTALLATION_KEY: &str = "installation_id";

/// `idle_in_transaction_session_timeout` of every store connection, in milliseconds.
const IDLE_IN_TRANSACTION_TIMEOUT_MS: &str = "5000";

/// Columns selected to rebuild a `Sandbox`.
const DOC: &str = "doc";

/// `Store` on PostgreSQL. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    options: PgConnectOptions,
    /// A dedicated connection kept between failed `try_lead` attempts, so a standby replica
    /// trying every tick does not open a new session each time. It becomes the leader's
    /// connection when an attempt succeeds.
    standby: Arc<tokio::sync::Mutex<Option<PgConnection>>>,
    /// Audit heads this process last wrote, for standalone appends (`audit_standalone_pg`).
    audit_heads: Arc<crate::audit_standalone_pg::HeadCache>,
    /// One-row status changes waiting to be committed together (`transition_lane_pg`).
    transitions: Arc<crate::transition_lane_pg::TransitionLane>,
    /// Admissions waiting to be committed together, per organization (`admission_pg`).
    admissions: Arc<admission_pg::AdmissionLanes>,
}

impl PgStore {
    /// Connects a pool of at most `max_connections` to `url`. Does not migrate.
    pub async fn connect(url: &str, max_connections: u32) -> Result<PgStore, StoreError> {
        // A process that stalls inside a transaction (a VM pause, SIGSTOP, a hung task) would
        // hold its locks, an organization's row among them, for as long as it stalls, and
        // every admission of that organization would wait with it. Postgres ends such a
        // session after this long idle in a transaction; its work rolls back and is retried.
        // No store transaction waits on anything but Postgres between statements.
        let options = PgConnectOptions::from_str(url)?.options([(
            "idle_in_transaction_session_timeout",
            IDLE_IN_TRANSACTION_TIMEOUT_MS,
        )]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            // No ping before handing out a connection: it was one extra round trip in front
            // of every query and transaction (the hot paths make several). A connection
            // that died while idle (a database restart) fails its next query instead, which
            // callers report or retry like any other database error.
            .test_before_acquire(false)
            .connect_with(options.clone())
            .await?;
        Ok(PgStore {
            pool,
            options,
            standby: Arc::default(),
            audit_heads: Arc::default(),
            transitions: Arc::default(),
            admissions: Arc::default(),
        })
    }

    pub(crate) fn transitions(&self) -> &Arc<crate::transition_lane_pg::TransitionLane> {
        &self.transitions
    }

    pub(crate) fn admissions(&self) -> &Arc<admission_pg::AdmissionLanes> {
        &self.admissions
    }

    pub(crate) fn audit_heads(&self) -> &crate::audit_standalone_pg::HeadCache {
        &self.audit_heads
    }

    /// Standalone audit appends (exec, files) whose compare-and-swap found the chain's head
    /// moved since this process last saw it, since start: each cost one more statement.
    pub fn audit_append_misses(&self) -> u64 {
        self.audit_heads.misses()
    }

    /// The connection pool, for callers that need plain queries (health checks).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every pooled connection; in-flight work finishes first.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Applies the embedded migrations not yet recorded in `schema_migrations`, each in its own
    /// transaction, under a session advisory lock on a dedicated connection, so replicas
    /// starting together migrate once.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = PgConnection::connect_with(&self.options).await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await?;
        let mut result = apply_migrations(&mut conn).await;
        if result.is_ok() {
            result = sync_usage_classes(&mut conn).await;
        }
        // Closing the session releases the lock even if the unlock below fails.
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await;
        let _ = conn.close().await;
        result?;
        unlocked?;
        Ok(())
    }

    /// The embedded migrations this database has not applied, in order (all of them on a
    /// database never migrated); changes nothing.
    pub async fn pending_migrations(&self) -> Result<Vec<&'static str>, StoreError> {
        let table: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('schema_migrations')::text")
                .fetch_one(&self.pool)
                .await?;
        let applied: Vec<String> = if table.is_some() {
            sqlx::query_scalar("SELECT version FROM schema_migrations")
                .fetch_all(&self.pool)
                .await?
        } else {
            Vec::new()
        };
        Ok(MIGRATIONS
            .iter()
            .map(|(v, _)| *v)
            .filter(|v| !applied.iter().any(|a| a == v))
            .collect())
    }

    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }
}

async fn apply_migrations(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version text PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&mut *conn)
    .await?;
    for (version, sql) in MIGRATIONS {
        let applied: Option<String> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                .bind(*version)
                .fetch_optional(&mut *conn)
                .await?;
        if applied.is_some() {
            continue;
        }
        let mut tx = conn.begin().await?;
        sqlx::raw_sql(sql)
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::Internal(format!("migration {version}: {e}")))?;
        sqlx::query("INSERT INTO schema_migrations (version) VALUES ($1)")
            .bind(*version)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(version, "applied migration");
    }
    Ok(())
}

/// Copies core's status classification into the database; a changed classification means
/// every counter was counted under the old one, so recount them.
async fn sync_usage_classes(conn: &mut PgConnection) -> Result<(), StoreError> {
    if usage_pg::sync_class_function(conn).await? {
        tracing::info!("usage classification function written from core");
    }
    if usage_pg::sync_status_classes(conn).await? {
        let fixed = usage_pg::reconcile(conn).await?;
        tracing::info!(
            corrected = fixed.len(),
            "status classification changed; usage recounted"
        );
    }
    Ok(())
}

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

fn json_of<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Internal(format!("encode: {e}")))
}

pub(crate) fn sandbox_of(row: &sqlx::postgres::PgRow) -> Result<Sandbox, StoreError> {
    let Json(s): Json<Sandbox> = row.try_get(DOC)?;
    Ok(s)
}

fn sandboxes_of(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<Sandbox>, StoreError> {
    rows.iter().map(sandbox_of).collect()
}

/// Locks and loads one sandbox row.
async fn lock_sandbox(
    tx: &mut Transaction<'static, Postgres>,
    id: &SandboxId,
) -> Result<Sandbox, StoreError> {
    let row = sqlx::query("SELECT doc FROM sandboxes WHERE id = $1 FOR UPDATE")
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
    let rows = sqlx::query("SELECT doc FROM sandboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE")
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
const ADMISSION_LOCK_SPACE: i32 = 0x646c_7961;

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
async fn lock_org_row(
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

/// Applies `t` to the locked row `s`, writes it and its audit record, and commits.
async fn apply_transition(
    mut tx: Transaction<'static, Postgres>,
    mut s: Sandbox,
    t: &Transition,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let entry = rules::transition(&mut s, t, now)?;
    let next = (t.to == SandboxStatus::Queued).then_some(now);
    write_sandbox(&mut tx, &s, next).await?;
    insert_audit(&mut tx, &s, entry, now).await?;
    tx.commit().await?;
    Ok(s)
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

/// Writes the document and every promoted column of `s`; `next_attempt_at` only when given.
pub(crate) async fn write_sandbox(
    tx: &mut Transaction<'static, Postgres>,
    s: &Sandbox,
    next_attempt_at: Option<DateTime<Utc>>,
) -> Result<(), StoreError> {
    let res = sqlx::query(
        "UPDATE sandboxes SET status = $2, status_version = $3, pool = $4, backend_ref = $5,
             attempts = $6, priority = $7, cpu = $8, memory_mib = $9, disk_gib = $10,
             next_attempt_at = COALESCE($11, next_attempt_at), expires_at = $12,
             updated_at = $13, doc = $14
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
    .bind(Json(s))
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
    for s in rows {
        attempts.push(to_i32(s.attempts)?);
        memory.push(to_i64(s.spec.resources.memory_mib, "memory")?);
        disk.push(to_i64(s.spec.resources.disk_gib, "disk")?);
        docs.push(serde_json::to_value(s).map_err(|e| StoreError::Internal(e.to_string()))?);
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
    Ok(Some(PriorWrite::new(
        "UPDATE sandboxes AS s SET status = u.status, status_version = u.status_version,
             pool = u.pool, backend_ref = u.backend_ref, attempts = u.attempts,
             priority = u.priority, cpu = u.cpu, memory_mib = u.memory_mib,
             disk_gib = u.disk_gib, expires_at = u.expires_at, updated_at = u.updated_at,
             doc = u.doc
         FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::int[],
             $7::int[], $8::bigint[], $9::bigint[], $10::bigint[], $11::timestamptz[],
             $12::timestamptz[], $13::jsonb[])
             AS u(id, status, status_version, pool, backend_ref, attempts, priority, cpu,
                  memory_mib, disk_gib, expires_at, updated_at, doc)
         WHERE s.id = u.id",
        args,
        13,
        rows.len() as u64,
        |_, _| StoreError::NotFound,
    )))
}

/// The audit record of `e` about sandbox `s` (its org's chain, its project).
pub(crate) fn sandbox_event(s: &Sandbox, e: AuditEntry) -> crate::audit::NewAuditEvent {
    crate::shared::audit_entry::event_for(
        Some(&s.org_id),
        Some(&s.project_id),
        s.id.as_str(),
        e.actor,
        e.action,
        e.detail,
    )
}

pub(crate) async fn insert_audit(
    tx: &mut Transaction<'static, Postgres>,
    s: &Sandbox,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    audit_pg::append_chained(tx, sandbox_event(s, e), at).await?;
    Ok(())
}

/// Appends one record about `resource` to `org`'s audit chain (`audit_pg`): hashed, gapless,
/// in this transaction, so the change and its record commit or fail together.
pub(crate) async fn insert_audit_for(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    resource: &str,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let ev = crate::shared::audit_entry::event_for(Some(org), None, resource, e.actor, e.action, e.detail);
    audit_pg::append_chained(tx, ev, at).await?;
    Ok(())
}

/// Appends one record about `resource` to the installation chain (events of no
/// organization: pools, global policy, secrets).
pub(crate) async fn insert_audit_installation(
    tx: &mut Transaction<'static, Postgres>,
    resource: &str,
    e: AuditEntry,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    let ev = crate::shared::audit_entry::event_for(None, None, resource, e.actor, e.action, e.detail);
    audit_pg::append_chained(tx, ev, at).await?;
    Ok(())
}

/// What a quota check needs, read in one round trip after the org lock: the project's org,
/// both stored quotas and both usage counters.
pub(crate) struct Limits {
    pub(crate) project_org: Option<String>,
    pub(crate) org_quota: Option<Quota>,
    pub(crate) prj_quota: Option<Quota>,
    pub(crate) org_usage: Usage,
    pub(crate) prj_usage: Usage,
}

pub(crate) async fn read_limits(
    tx: &mut Transaction<'static, Postgres>,
    project: &ProjectId,
    org_scope: &QuotaScope,
    prj_scope: &QuotaScope,
) -> Result<Limits, StoreError> {
    let row = sqlx::query(
        "SELECT p.org_id AS project_org, oq.doc AS org_quota, pq.doc AS prj_quota,
                ou.queued AS o_queued, ou.active AS o_active, ou.cpu AS o_cpu,
                ou.memory_mib AS o_memory_mib, ou.disk_gib AS o_disk_gib,
                pu.queued AS p_queued, pu.active AS p_active, pu.cpu AS p_cpu,
                pu.memory_mib AS p_memory_mib, pu.disk_gib AS p_disk_gib
         FROM (SELECT 1) one
         LEFT JOIN projects p ON p.id = $1
         LEFT JOIN quotas oq ON oq.scope = $2
         LEFT JOIN quotas pq ON pq.scope = $3
         LEFT JOIN usage_counters ou ON ou.scope = $2
         LEFT JOIN usage_counters pu ON pu.scope = $3",
    )
    .bind(project.as_str())
    .bind(org_scope.key())
    .bind(prj_scope.key())
    .fetch_one(&mut **tx)
    .await?;
    let counter = |p: &str| -> Result<usage_pg::Counter, StoreError> {
        let get = |c: &str| -> Result<i64, StoreError> {
            Ok(row
                .try_get::<Option<i64>, _>(format!("{p}_{c}").as_str())?
                .unwrap_or(0))
        };
        Ok(usage_pg::Counter {
            queued: get("queued")?,
            active: get("active")?,
            cpu: get("cpu")?,
            memory_mib: get("memory_mib")?,
            disk_gib: get("disk_gib")?,
            slots: 0,
        })
    };
    let quota = |c: &str| -> Result<Option<Quota>, StoreError> {
        Ok(row.try_get::<Option<Json<Quota>>, _>(c)?.map(|Json(q)| q))
    };
    Ok(Limits {
        project_org: row.try_get("project_org")?,
        org_quota: quota("org_quota")?,
        prj_quota: quota("prj_quota")?,
        org_usage: counter("o")?.usage(),
        prj_usage: counter("p")?.usage(),
    })
}

/// The stored quota of `scope`, if any.
async fn stored_quota<'e, E>(ex: E, scope: &QuotaScope) -> Result<Option<Quota>, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let doc: Option<Json<Quota>> = sqlx::query_scalar("SELECT doc FROM quotas WHERE scope = $1")
        .bind(scope.key())
        .fetch_optional(ex)
        .await?;
    Ok(doc.map(|Json(q)| q))
}

/// The wire form of an organization status (the promoted `status` column).
fn org_status_str(s: OrgStatus) -> &'static str {
    match s {
        OrgStatus::Active => "active",
        OrgStatus::Suspended => "suspended",
    }
}

fn org_of(row: &sqlx::postgres::PgRow) -> Result<Org, StoreError> {
    let Json(o): Json<Org> = row.try_get(DOC)?;
    Ok(o)
}

fn project_of(row: &sqlx::postgres::PgRow) -> Result<Project, StoreError> {
    let Json(p): Json<Project> = row.try_get(DOC)?;
    Ok(p)
}

/// Rebuilds a key record: the doc never holds the hash, its own column does.
fn key_of(row: &sqlx::postgres::PgRow) -> Result<ApiKeyRecord, StoreError> {
    let Json(mut k): Json<ApiKeyRecord> = row.try_get(DOC)?;
    k.hash = row.try_get("hash")?;
    Ok(k)
}

fn limit_of(limit: u32) -> Option<i64> {
    (limit != 0).then_some(i64::from(limit))
}

/// Takes the organization-name lock and fails with `AlreadyExists` if an organization other
/// than `except` has `name`.
async fn check_org_name(
    tx: &mut Transaction<'static, Postgres>,
    name: &str,
    except: &OrgId,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ORG_NAME_LOCK)
        .execute(&mut **tx)
        .await?;
    let taken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM organizations WHERE name = $1 AND id <> $2)",
    )
    .bind(name)
    .bind(except.as_str())
    .fetch_one(&mut **tx)
    .await?;
    if taken {
        return Err(rules::name_taken("organization", name));
    }
    Ok(())
}

/// `AlreadyExists` if a project of `org` other than `except` has `name`. The caller holds
/// the organization row lock, which serializes project names within it.
async fn check_project_name(
    tx: &mut Transaction<'static, Postgres>,
    org: &OrgId,
    name: &str,
    except: &ProjectId,
) -> Result<(), StoreError> {
    let taken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM projects WHERE org_id = $1 AND name = $2 AND id <> $3)",
    )
    .bind(org.as_str())
    .bind(name)
    .bind(except.as_str())
    .fetch_one(&mut **tx)
    .await?;
    if taken {
        return Err(rules::name_taken("project", name));
    }
    Ok(())
}

/// The organization of a project (it never changes, so an unlocked read is safe).
async fn project_org<'e, E>(ex: E, id: &ProjectId) -> Result<OrgId, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let org: String = sqlx::query_scalar("SELECT org_id FROM projects WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(ex)
        .await?
        .ok_or(StoreError::NotFound)?;
    OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))
}

fn count_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A held `dly_ldr` session lock on its own connection; dropping it closes the session,
/// which releases the lock.
struct PgLeadership {
    conn: PgConnection,
}

#[async_trait]
impl Leadership for PgLeadership {
    async fn still_held(&mut self) -> bool {
        sqlx::query("SELECT 1")
            .execute(&mut self.conn)
            .await
            .is_ok()
    }
}

#[async_trait]
impl Store for PgStore {
    async fn installation_id(&self) -> Result<InstallationId, StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING")
            .bind(INSTALLATION_KEY)
            .bind(InstallationId::new().as_str())
            .execute(&mut *tx)
            .await?;
        let value: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = $1")
            .bind(INSTALLATION_KEY)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        InstallationId::parse(&value)
            .map_err(|e| StoreError::Internal(format!("stored installation id {value:?}: {e}")))
    }

    async fn ensure_tenant(&self, org: &Org, project: &Project) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO organizations (id, name, status, doc, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(org.id.as_str())
        .bind(&org.name)
        .bind(org_status_str(org.status))
        .bind(json_of(org)?)
        .bind(org.created_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO projects (id, org_id, name, doc, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(project.id.as_str())
        .bind(project.org_id.as_str())
        .bind(&project.name)
        .bind(json_of(project)?)
        .bind(project.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_project(&self, id: &ProjectId) -> Result<Option<Project>, StoreError> {
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        match row {
            None => Ok(None),
            Some(r) => {
                let Json(p): Json<Project> = r.try_get(DOC)?;
                Ok(Some(p))
            }
        }
    }

    async fn create_org(&self, org: &Org, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        check_org_name(&mut tx, &org.name, &org.id).await?;
        let inserted = sqlx::query(
            "INSERT INTO organizations (id, name, status, doc, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(org.id.as_str())
        .bind(&org.name)
        .bind(org_status_str(org.status))
        .bind(json_of(org)?)
        .bind(org.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!(
                "organization {}",
                org.id
            )));
        }
        let e = rules::tenancy_entry(
            actor,
            "org.create",
            json!({ "name": org.name, "status": org.status }),
        );
        insert_audit_for(&mut tx, &org.id, org.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_org(&self, id: &OrgId) -> Result<Option<Org>, StoreError> {
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(org_of).transpose()
    }

    async fn list_orgs(&self, after: Option<&OrgId>, limit: u32) -> Result<Vec<Org>, StoreError> {
        let rows = sqlx::query(
            r#"SELECT doc FROM organizations
               WHERE ($1::text IS NULL OR id COLLATE "C" > $1)
               ORDER BY id COLLATE "C" LIMIT $2"#,
        )
        .bind(after.map(OrgId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(org_of).collect()
    }

    async fn update_org(
        &self,
        id: &OrgId,
        name: Option<&str>,
        status: Option<OrgStatus>,
        actor: &Actor,
    ) -> Result<Org, StoreError> {
        let mut tx = self.begin().await?;
        if let Some(n) = name {
            // The name lock comes before the row lock, as in `create_org`.
            check_org_name(&mut tx, n, id).await?;
        }
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut org = org_of(&row)?;
        let detail = rules::update_org(&mut org, name, status);
        sqlx::query("UPDATE organizations SET name = $2, status = $3, doc = $4 WHERE id = $1")
            .bind(id.as_str())
            .bind(&org.name)
            .bind(org_status_str(org.status))
            .bind(json_of(&org)?)
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(actor, "org.update", detail);
        insert_audit_for(&mut tx, id, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(org)
    }

    async fn delete_org(&self, id: &OrgId, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT doc FROM organizations WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let org = org_of(&row)?;
        let projects: i64 = sqlx::query_scalar("SELECT count(*) FROM projects WHERE org_id = $1")
            .bind(id.as_str())
            .fetch_one(&mut *tx)
            .await?;
        if projects > 0 {
            return Err(rules::org_has_projects(count_u64(projects)));
        }
        sqlx::query("DELETE FROM api_keys WHERE org_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM quotas WHERE scope = $1")
            .bind(QuotaScope::Org(id.clone()).key())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM organizations WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(actor, "org.delete", json!({ "name": org.name }));
        insert_audit_for(&mut tx, id, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_project(&self, project: &Project, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        lock_org(&mut tx, &project.org_id).await?;
        check_project_name(&mut tx, &project.org_id, &project.name, &project.id).await?;
        let inserted = sqlx::query(
            "INSERT INTO projects (id, org_id, name, doc, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(project.id.as_str())
        .bind(project.org_id.as_str())
        .bind(&project.name)
        .bind(json_of(project)?)
        .bind(project.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!("project {}", project.id)));
        }
        let e = rules::tenancy_entry(actor, "project.create", json!({ "name": project.name }));
        insert_audit_for(&mut tx, &project.org_id, project.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_projects(
        &self,
        org: &OrgId,
        after: Option<&ProjectId>,
        limit: u32,
    ) -> Result<Vec<Project>, StoreError> {
        let rows = sqlx::query(
            r#"SELECT doc FROM projects
               WHERE org_id = $1 AND ($2::text IS NULL OR id COLLATE "C" > $2)
               ORDER BY id COLLATE "C" LIMIT $3"#,
        )
        .bind(org.as_str())
        .bind(after.map(ProjectId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(project_of).collect()
    }

    async fn rename_project(
        &self,
        id: &ProjectId,
        name: &str,
        actor: &Actor,
    ) -> Result<Project, StoreError> {
        let mut tx = self.begin().await?;
        let org = project_org(&mut *tx, id).await?;
        lock_org(&mut tx, &org).await?;
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut p = project_of(&row)?;
        check_project_name(&mut tx, &org, name, id).await?;
        let old = std::mem::replace(&mut p.name, name.to_owned());
        sqlx::query("UPDATE projects SET name = $2, doc = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(&p.name)
            .bind(json_of(&p)?)
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(
            actor,
            "project.rename",
            json!({ "old": old, "new": p.name }),
        );
        insert_audit_for(&mut tx, &org, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(p)
    }

    async fn delete_project(&self, id: &ProjectId, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let org = project_org(&mut *tx, id).await?;
        // Lock order: organization first, so admission (which holds it) cannot insert a new
        // sandbox into the project while it is being deleted.
        lock_org(&mut tx, &org).await?;
        let row = sqlx::query("SELECT doc FROM projects WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let p = project_of(&row)?;
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE project_id = $1 AND NOT (status = ANY($2))",
        )
        .bind(id.as_str())
        .bind(statuses_where(SandboxStatus::is_final))
        .fetch_one(&mut *tx)
        .await?;
        if live > 0 {
            return Err(rules::project_has_live_sandboxes(count_u64(live)));
        }
        let removed = sqlx::query("DELETE FROM sandboxes WHERE project_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM api_keys WHERE project_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM quotas WHERE scope = $1")
            .bind(QuotaScope::Project(id.clone()).key())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM projects WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(
            actor,
            "project.delete",
            json!({ "name": p.name, "deletedSandboxes": removed }),
        );
        insert_audit_for(&mut tx, &org, id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn create_key(&self, key: &ApiKeyRecord, actor: &Actor) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        lock_org(&mut tx, &key.org_id).await?;
        if let Some(p) = &key.project_id {
            let org = project_org(&mut *tx, p).await?;
            if org != key.org_id {
                return Err(StoreError::NotFound);
            }
        }
        let inserted = sqlx::query(
            "INSERT INTO api_keys (id, org_id, project_id, doc, hash, revoked_at, expires_at,
                 created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(key.id.as_str())
        .bind(key.org_id.as_str())
        .bind(key.project_id.as_ref().map(ProjectId::as_str))
        .bind(json_of(key)?)
        .bind(&key.hash)
        .bind(key.revoked_at)
        .bind(key.expires_at)
        .bind(key.created_at)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(StoreError::AlreadyExists(format!("key {}", key.id)));
        }
        let e = rules::tenancy_entry(actor, "key.create", rules::key_detail(key));
        insert_audit_for(&mut tx, &key.org_id, key.id.as_str(), e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row = sqlx::query("SELECT doc, hash FROM api_keys WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(key_of).transpose()
    }

    async fn list_keys(
        &self,
        org: &OrgId,
        after: Option<&KeyId>,
        limit: u32,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc, hash FROM api_keys
             WHERE org_id = $1 AND ($2::text IS NULL OR id > $2)
             ORDER BY id LIMIT $3",
        )
        .bind(org.as_str())
        .bind(after.map(KeyId::as_str))
        .bind(limit_of(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_of).collect()
    }

    async fn revoke_key(
        &self,
        id: &KeyId,
        at: DateTime<Utc>,
        actor: &Actor,
    ) -> Result<ApiKeyRecord, StoreError> {
        let mut tx = self.begin().await?;
        let row = sqlx::query("SELECT doc, hash FROM api_keys WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let mut key = key_of(&row)?;
        if key.revoked_at.is_some() {
            return Ok(key);
        }
        key.revoked_at = Some(at);
        sqlx::query("UPDATE api_keys SET revoked_at = $2, doc = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(at)
            .bind(json_of(&key)?)
            .execute(&mut *tx)
            .await?;
        let e = rules::tenancy_entry(actor, "key.revoke", json!({ "revokedAt": at }));
        insert_audit_for(&mut tx, &key.org_id, id.as_str(), e, at).await?;
        tx.commit().await?;
        Ok(key)
    }

    async fn touch_key(&self, id: &KeyId, at: DateTime<Utc>) -> Result<(), StoreError> {
        // The doc is the serialized record: set the field as serde writes it.
        let res = sqlx::query(
            "UPDATE api_keys SET doc = jsonb_set(doc, '{lastUsedAt}', $2) WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(json_of(&at)?)
        .execute(&self.pool)
        .await?;
        if res.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    async fn get_quota(&self, scope: &QuotaScope) -> Result<Option<Quota>, StoreError> {
        stored_quota(&self.pool, scope).await
    }

    async fn put_quota(
        &self,
        scope: &QuotaScope,
        quota: &Quota,
        actor: &Actor,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        let org = match scope {
            QuotaScope::Org(o) => o.clone(),
            QuotaScope::Project(p) => project_org(&mut *tx, p).await?,
        };
        lock_org(&mut tx, &org).await?;
        let key = scope.key();
        let old = stored_quota(&mut *tx, scope).await?;
        sqlx::query(
            "INSERT INTO quotas (scope, doc) VALUES ($1, $2)
             ON CONFLICT (scope) DO UPDATE SET doc = EXCLUDED.doc",
        )
        .bind(&key)
        .bind(json_of(quota)?)
        .execute(&mut *tx)
        .await?;
        let e = rules::tenancy_entry(actor, "quota.put", json!({ "old": old, "new": quota }));
        insert_audit_for(&mut tx, &org, &key, e, Utc::now()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn usage(&self, scope: &QuotaScope) -> Result<Usage, StoreError> {
        let mut conn = self.pool.acquire().await?;
        match scope {
            QuotaScope::Org(o) => {
                sqlx::query_scalar::<_, String>("SELECT id FROM organizations WHERE id = $1")
                    .bind(o.as_str())
                    .fetch_optional(&mut *conn)
                    .await?
                    .ok_or(StoreError::NotFound)?;
            }
            QuotaScope::Project(p) => {
                project_org(&mut *conn, p).await?;
            }
        }
        usage_pg::scope_usage(&mut *conn, scope).await
    }

    async fn admit(&self, admission: Admission) -> Result<Admitted, StoreError> {
        admission_pg::admit(self, admission).await
    }

    async fn admit_many(&self, group: Vec<Admission>) -> Vec<Result<Admitted, StoreError>> {
        admission_pg::admit_many(self, group).await
    }

    async fn get_sandbox(&self, id: &SandboxId) -> Result<Option<Sandbox>, StoreError> {
        let row = sqlx::query("SELECT doc FROM sandboxes WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(sandbox_of).transpose()
    }

    async fn sandbox_briefs(
        &self,
        ids: &[SandboxId],
    ) -> Result<HashMap<SandboxId, crate::SandboxBrief>, StoreError> {
        let ids: Vec<&str> = ids.iter().map(SandboxId::as_str).collect();
        let rows =
            sqlx::query("SELECT id, org_id, project_id, status FROM sandboxes WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.pool)
                .await?;
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Internal(format!("sandboxes.{what}: {e}"))
        };
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let id: String = r.try_get("id")?;
            let org: String = r.try_get("org_id")?;
            let prj: String = r.try_get("project_id")?;
            let status: String = r.try_get("status")?;
            out.insert(
                SandboxId::parse(&id).map_err(|e| bad("id", &e))?,
                crate::SandboxBrief {
                    org_id: OrgId::parse(&org).map_err(|e| bad("org_id", &e))?,
                    project_id: ProjectId::parse(&prj).map_err(|e| bad("project_id", &e))?,
                    status: SandboxStatus::from_str(&status).map_err(|e| bad("status", &e))?,
                },
            );
        }
        Ok(out)
    }

    async fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<Sandbox>, StoreError> {
        let limit = if filter.limit == 0 {
            None
        } else {
            Some(i64::from(filter.limit))
        };
        let label = filter
            .label
            .as_ref()
            .map(|(k, v)| serde_json::json!({ k.as_str(): v }));
        let rows = sqlx::query(
            "SELECT doc FROM sandboxes
             WHERE ($1::text IS NULL OR org_id = $1)
               AND ($2::text IS NULL OR project_id = $2)
               AND ($3::text IS NULL OR status = $3)
               AND ($4::jsonb IS NULL OR doc -> 'spec' -> 'labels' @> $4)
               AND ($5::text IS NULL OR id > $5)
             ORDER BY id
             LIMIT $6",
        )
        .bind(filter.org_id.as_ref().map(OrgId::as_str))
        .bind(filter.project_id.as_ref().map(ProjectId::as_str))
        .bind(filter.status.map(SandboxStatus::as_str))
        .bind(label)
        .bind(filter.after.as_ref().map(SandboxId::as_str))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn activate_explained(
        &self,
        id: &SandboxId,
        pool: &PoolSlot,
        quota: &Quota,
        explanation: Option<&serde_json::Value>,
        now: DateTime<Utc>,
    ) -> Result<Activation, StoreError> {
        // One activation is a group of one: a single implementation of the rules and locks.
        let item = crate::ActivationItem {
            id: id.clone(),
            pool: pool.clone(),
            explanation: explanation.cloned(),
        };
        crate::activation_pg::activate_many(self, std::slice::from_ref(&item), quota, now)
            .await?
            .pop()
            .ok_or_else(|| StoreError::Internal("activation of one returned nothing".into()))
    }

    async fn activate_many(
        &self,
        items: &[crate::ActivationItem],
        quota: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Vec<Activation>, StoreError> {
        crate::activation_pg::activate_many(self, items, quota, now).await
    }

    async fn mark_running(
        &self,
        id: &SandboxId,
        backend_ref: &str,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let change = transition_lane_pg::Change::Running {
            backend_ref: backend_ref.to_owned(),
        };
        transition_lane_pg::submit(self, id, change, now).await
    }

    async fn requeue(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let now = Utc::now();
        let mut tx = self.begin().await?;
        let mut s = lock_sandbox(&mut tx, id).await?;
        let entry = rules::requeue(&mut s, reason, not_before, now)?;
        write_sandbox(&mut tx, &s, Some(not_before)).await?;
        insert_audit(&mut tx, &s, entry, now).await?;
        tx.commit().await?;
        Ok(s)
    }

    async fn transition(&self, t: Transition, now: DateTime<Utc>) -> Result<Sandbox, StoreError> {
        if t.to == SandboxStatus::Queued {
            let mut tx = self.begin().await?;
            let s = lock_sandbox(&mut tx, &t.id).await?;
            return apply_transition(tx, s, &t, now).await;
        }
        let id = t.id.clone();
        transition_lane_pg::submit(self, &id, transition_lane_pg::Change::To(t), now).await
    }

    async fn transition_within_quota(
        &self,
        t: Transition,
        defaults: &Quota,
        now: DateTime<Utc>,
    ) -> Result<Sandbox, StoreError> {
        let mut tx = self.begin().await?;
        // As in `activate`: the org never changes, so read it unlocked and lock in order.
        let org: String = sqlx::query_scalar("SELECT org_id FROM sandboxes WHERE id = $1")
            .bind(t.id.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let org = OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))?;
        lock_org_capacity(&mut tx, &org).await?;
        let s = lock_sandbox(&mut tx, &t.id).await?;
        if t.from.contains(&s.status) {
            let org_scope = QuotaScope::Org(org.clone());
            let prj_scope = QuotaScope::Project(s.project_id.clone());
            let limits = read_limits(&mut tx, &s.project_id, &org_scope, &prj_scope).await?;
            accounting::check_change_limits(
                &s,
                t.to,
                (
                    &limits.org_usage,
                    &limits.org_quota.unwrap_or_default().or(defaults),
                ),
                (&limits.prj_usage, &limits.prj_quota.unwrap_or_default()),
            )?;
        }
        apply_transition(tx, s, &t, now).await
    }

    async fn set_queued_reason(
        &self,
        id: &SandboxId,
        reason: &str,
        not_before: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let now = Utc::now();
        let mut tx = self.begin().await?;
        let mut s = lock_sandbox(&mut tx, id).await?;
        if s.status == SandboxStatus::Queued {
            accounting::wait(&mut s, reason.to_owned(), now);
            write_sandbox(&mut tx, &s, Some(not_before)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn runnable_queued(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc FROM sandboxes WHERE status = $1 AND next_attempt_at <= $2
             ORDER BY id LIMIT $3",
        )
        .bind(SandboxStatus::Queued.as_str())
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn stale(
        &self,
        status: SandboxStatus,
        before: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<Sandbox>, StoreError> {
        let rows = sqlx::query(
            "SELECT doc FROM sandboxes WHERE status = $1 AND updated_at < $2
             ORDER BY updated_at, id LIMIT $3",
        )
        .bind(status.as_str())
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn expired(&self, now: DateTime<Utc>, limit: u32) -> Result<Vec<Sandbox>, StoreError> {
        let expirable: Vec<&str> = accounting::EXPIRABLE.iter().map(|s| s.as_str()).collect();
        let rows = sqlx::query(
            "SELECT doc FROM sandboxes WHERE status = ANY($1) AND expires_at < $2
             ORDER BY expires_at, id LIMIT $3",
        )
        .bind(expirable)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        sandboxes_of(&rows)
    }

    async fn active_cpu_by_org(&self) -> Result<HashMap<OrgId, u64>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT substr(scope, 5), cpu FROM usage_counters WHERE rank = 0 AND cpu > 0",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for (org, cpu) in rows {
            let org = OrgId::parse(&org).map_err(|e| StoreError::Internal(e.to_string()))?;
            out.insert(org, u64::try_from(cpu).unwrap_or(0));
        }
        Ok(out)
    }

    async fn reconcile_usage(&self) -> Result<Vec<crate::UsageDrift>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        usage_pg::reconcile(&mut conn).await
    }

    async fn audit_tail(&self, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM (
                 SELECT seq, org_id, actor, action, resource, at, detail FROM audit_events
                 ORDER BY seq DESC LIMIT $1
             ) t ORDER BY seq",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let org: Option<String> = r.try_get("org_id")?;
                let org_id = org
                    .map(|o| OrgId::parse(&o))
                    .transpose()
                    .map_err(|e| StoreError::Internal(e.to_string()))?;
                Ok(AuditRecord {
                    seq: r.try_get("seq")?,
                    org_id,
                    actor: r.try_get("actor")?,
                    action: r.try_get("action")?,
                    resource: r.try_get("resource")?,
                    at: r.try_get("at")?,
                    detail: r.try_get("detail")?,
                })
            })
            .collect()
    }

    async fn try_lead(&self) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        let mut standby = self.standby.lock().await;
        let mut conn = match standby.take() {
            Some(c) => c,
            None => PgConnection::connect_with(&self.options).await?,
        };
        // On error the connection is dropped (closing its session) and the next attempt
        // opens a fresh one.
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(LEADER_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if got {
            Ok(Some(Box::new(PgLeadership { conn })))
        } else {
            *standby = Some(conn);
            Ok(None)
        }
    }
}
