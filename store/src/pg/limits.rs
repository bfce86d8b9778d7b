//! Stored quotas and usage counters, read for a quota check.

use std::sync::LazyLock;

use differently_core::ProjectId;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Postgres, Row, Transaction};

use super::usage_counters;
use crate::{Quota, QuotaScope, StoreError, Usage};

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
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {LIMITS_COLUMNS} FROM (SELECT 1) one {LIMITS_JOINS}"));
    let row = sqlx::query(SQL.as_str())
        .bind(project.as_str())
        .bind(org_scope.key())
        .bind(prj_scope.key())
        .fetch_one(&mut **tx)
        .await?;
    Ok(limits_of(&row)?.0)
}

/// The columns [`limits_of`] reads, from [`LIMITS_JOINS`].
pub(crate) const LIMITS_COLUMNS: &str =
    "p.org_id AS project_org, oq.doc AS org_quota, pq.doc AS prj_quota,
     oq.xmin::text AS org_quota_xmin, pq.xmin::text AS prj_quota_xmin,
     ou.queued AS o_queued, ou.active AS o_active, ou.cpu AS o_cpu,
     ou.memory_mib AS o_memory_mib, ou.disk_gib AS o_disk_gib,
     pu.queued AS p_queued, pu.active AS p_active, pu.cpu AS p_cpu,
     pu.memory_mib AS p_memory_mib, pu.disk_gib AS p_disk_gib";

/// The joins behind [`LIMITS_COLUMNS`], onto a one-row `FROM`: `$1` the project, `$2` the
/// org's scope key, `$3` the project's.
pub(crate) const LIMITS_JOINS: &str = "LEFT JOIN projects p ON p.id = $1
     LEFT JOIN quotas oq ON oq.scope = $2
     LEFT JOIN quotas pq ON pq.scope = $3
     LEFT JOIN usage_counters ou ON ou.scope = $2
     LEFT JOIN usage_counters pu ON pu.scope = $3";

/// What a lone admission's guards compare after taking the lane's locks
/// (`admission_swap`): the quota rows' versions and the counters as read.
pub(crate) struct LimitsSeen {
    pub(crate) org_quota_xmin: Option<String>,
    pub(crate) prj_quota_xmin: Option<String>,
    pub(crate) org_counter: usage_counters::Counter,
    pub(crate) prj_counter: usage_counters::Counter,
}

/// The limits in a row with [`LIMITS_COLUMNS`], and what was read to decide on them.
pub(crate) fn limits_of(row: &PgRow) -> Result<(Limits, LimitsSeen), StoreError> {
    let counter = |p: &str| -> Result<usage_counters::Counter, StoreError> {
        let get = |c: &str| -> Result<i64, StoreError> {
            Ok(row
                .try_get::<Option<i64>, _>(format!("{p}_{c}").as_str())?
                .unwrap_or(0))
        };
        Ok(usage_counters::Counter {
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
    let seen = LimitsSeen {
        org_quota_xmin: row.try_get("org_quota_xmin")?,
        prj_quota_xmin: row.try_get("prj_quota_xmin")?,
        org_counter: counter("o")?,
        prj_counter: counter("p")?,
    };
    let limits = Limits {
        project_org: row.try_get("project_org")?,
        org_quota: quota("org_quota")?,
        prj_quota: quota("prj_quota")?,
        org_usage: seen.org_counter.usage(),
        prj_usage: seen.prj_counter.usage(),
    };
    Ok((limits, seen))
}

/// The stored quota of `scope`, if any.
pub(crate) async fn stored_quota<'e, E>(
    ex: E,
    scope: &QuotaScope,
) -> Result<Option<Quota>, StoreError>
where
    E: sqlx::Executor<'e, Database = Postgres>,
{
    let doc: Option<Json<Quota>> = sqlx::query_scalar("SELECT doc FROM quotas WHERE scope = $1")
        .bind(scope.key())
        .fetch_optional(ex)
        .await?;
    Ok(doc.map(|Json(q)| q))
}
