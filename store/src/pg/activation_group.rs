//! `ActivationStore::activate_many` on Postgres: a placement group in one transaction.
//!
//! Locks follow the order every writer uses: the organizations (by id, `FOR NO KEY UPDATE`:
//! activations exclude each other and organization changes, not admissions; see
//! `locks::lock_org_admissions`), the capped pools
//! (by name), the sandbox rows (by id); the audit heads of the group's chains (by chain, in one
//! statement) and one insert for all their records;
//! the usage counters last, in (rank, scope) order, in the audit insert's statement
//! (`pg_audit::append_then_lock_counters`:
//! left to the commit trigger, row by row, a group deadlocks with one-row commits). Each item
//! is decided as `activate_explained` decides one, against usage that
//! already includes the group's earlier activations.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{Sandbox, SandboxId, SandboxStatus};
use sqlx::types::Json;
use sqlx::{Postgres, Row, Transaction};

use crate::pg::locks::lock_pool;
use crate::pg::locks::lock_sandboxes;
use crate::pg::usage_counters;
use crate::pg::writes::update_sandboxes;
use crate::pg::PgStore;
use crate::shared::rules;
use crate::{Activation, ActivationItem, Quota, QuotaScope, StoreError, Usage};

pub(crate) async fn activate_many(
    store: &PgStore,
    items: &[ActivationItem],
    defaults: &Quota,
    now: DateTime<Utc>,
) -> Result<Vec<Activation>, StoreError> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
    let mut tx = store.begin().await?;
    let (capped, mut by_id) = lock_group(&mut tx, items, &ids).await?;
    let GroupLimits {
        scopes,
        quotas,
        mut usage,
        mut slots,
    } = read_group_limits(&mut tx, &by_id, &capped).await?;

    let mut out = Vec::with_capacity(items.len());
    let mut audits = Vec::new();
    // Rows are written after the loop, all at once; `out` holds what each item became.
    let mut placements: Vec<(&SandboxId, &serde_json::Value)> = Vec::new();
    for it in items {
        let Some(s) = by_id.get_mut(&it.id) else {
            return Err(StoreError::NotFound);
        };
        if s.status != SandboxStatus::Queued {
            out.push(Activation::NotQueued(s.clone()));
            continue;
        }
        let org_key = QuotaScope::Org(s.org_id.clone()).key();
        let prj_key = QuotaScope::Project(s.project_id.clone()).key();
        let org_quota = quotas
            .get(&org_key)
            .copied()
            .unwrap_or_default()
            .or(defaults);
        let prj_quota = quotas.get(&prj_key).copied().unwrap_or_default();
        let org_usage = usage.get(&org_key).copied().unwrap_or_default();
        let prj_usage = usage.get(&prj_key).copied().unwrap_or_default();
        let used = if it.pool.max_concurrent.is_some() {
            slots.get(&it.pool.name).copied().unwrap_or(0)
        } else {
            0
        };
        let reason = accounting::waiting_reason(
            (&org_usage, &org_quota),
            (&prj_usage, &prj_quota),
            used,
            s,
            it.pool.cap(),
        );
        if let Some((wall, reason)) = reason {
            accounting::wait(s, reason, now);
            out.push(Activation::Waiting(s.clone(), wall));
            continue;
        }
        let resources = s.spec.resources;
        let entry = rules::activate(s, &it.pool, now);
        audits.push(crate::pg::audit_records::sandbox_event(s, entry));
        if let Some(doc) = &it.explanation {
            placements.push((&it.id, doc));
        }
        // Later items see this one: it left the queue and now holds compute and a slot.
        for key in [&org_key, &prj_key] {
            let u = usage.entry(key.clone()).or_default();
            u.queued = u.queued.saturating_sub(1);
            u.add(SandboxStatus::Provisioning, &resources);
        }
        if let Some(n) = slots.get_mut(&it.pool.name) {
            *n += 1;
        }
        out.push(Activation::Activated(s.clone()));
    }
    let changed = each_row_once(&out);
    // The explanations first: the rows' update rides in the audit head lock's statement.
    crate::pg::placement::write_placements(&mut tx, &placements, now).await?;
    let write = update_sandboxes(&changed)?;
    // One row's trigger takes its counters in the global order already; only several rows
    // can interleave them.
    let mut counters = Vec::new();
    if changed.len() > 1 {
        counters = scopes;
        counters.extend(items.iter().map(|i| usage_counters::pool_key(&i.pool.name)));
    }
    let request_id = crate::audit::current_request_id();
    let audits = audits
        .into_iter()
        .map(|e| (e, request_id.clone()))
        .collect();
    crate::pg::audit::append_then_lock_counters(&mut tx, write, audits, now, &counters).await?;
    tx.commit().await?;
    Ok(out)
}

/// Locks what the group touches in the fixed order: its organizations (one statement, which
/// also tells a missing one), its capped pools (by name), its sandbox rows (by id). Answers
/// the capped pools' names and the locked rows; `NotFound` if any item has no row.
async fn lock_group<'a>(
    tx: &mut Transaction<'static, Postgres>,
    items: &'a [ActivationItem],
    ids: &[&str],
) -> Result<(Vec<&'a str>, HashMap<SandboxId, Sandbox>), StoreError> {
    // A row's organization never changes: found unlocked and locked in the fixed order, in
    // one statement; `named` counts the organizations the rows name, to tell a missing one.
    let locked = sqlx::query(
        "SELECT o.id, (SELECT count(DISTINCT org_id) FROM sandboxes WHERE id = ANY($1)) AS named
         FROM organizations o
         WHERE o.id IN (SELECT org_id FROM sandboxes WHERE id = ANY($1))
         ORDER BY o.id FOR NO KEY UPDATE OF o",
    )
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?;
    let named: i64 = match locked.first() {
        Some(r) => r.try_get("named")?,
        None => 0,
    };
    if locked.is_empty() || usize::try_from(named).ok() != Some(locked.len()) {
        return Err(StoreError::NotFound);
    }
    let mut capped: Vec<&str> = items
        .iter()
        .filter(|i| i.pool.max_concurrent.is_some())
        .map(|i| i.pool.name.as_str())
        .collect();
    capped.sort_unstable();
    capped.dedup();
    for pool in &capped {
        lock_pool(tx, pool).await?;
    }
    let by_id = lock_sandboxes(tx, ids).await?;
    if items.iter().any(|i| !by_id.contains_key(&i.id)) {
        return Err(StoreError::NotFound);
    }
    Ok((capped, by_id))
}

/// The stored quotas and usage counters of every org and project of the group, and the
/// capped pools' slots in use, read in one statement under the group's locks.
struct GroupLimits {
    /// The `QuotaScope` keys involved, sorted.
    scopes: Vec<String>,
    quotas: HashMap<String, Quota>,
    usage: HashMap<String, Usage>,
    /// Slots in use per capped pool name.
    slots: HashMap<String, u64>,
}

async fn read_group_limits(
    tx: &mut Transaction<'static, Postgres>,
    by_id: &HashMap<SandboxId, Sandbox>,
    capped: &[&str],
) -> Result<GroupLimits, StoreError> {
    // Quotas and usage of every org and project involved, and the capped pools' slots.
    let mut scopes: Vec<String> = by_id
        .values()
        .flat_map(|s| {
            [
                QuotaScope::Org(s.org_id.clone()).key(),
                QuotaScope::Project(s.project_id.clone()).key(),
            ]
        })
        .collect();
    scopes.sort_unstable();
    scopes.dedup();
    // Quotas and counters in one read (a missing counter is all zero: nothing counted yet).
    let mut counter_keys = scopes.clone();
    counter_keys.extend(capped.iter().map(|p| usage_counters::pool_key(p)));
    let mut quotas: HashMap<String, Quota> = HashMap::new();
    let mut counters: HashMap<String, usage_counters::Counter> = HashMap::new();
    for r in sqlx::query(
        "SELECT k.scope, q.doc, u.queued, u.active, u.cpu, u.memory_mib, u.disk_gib, u.slots
         FROM UNNEST($1::text[]) AS k(scope)
         LEFT JOIN quotas q ON q.scope = k.scope
         LEFT JOIN usage_counters u ON u.scope = k.scope",
    )
    .bind(&counter_keys)
    .fetch_all(&mut **tx)
    .await?
    {
        let scope: String = r.try_get("scope")?;
        if let Some(Json(q)) = r.try_get::<Option<Json<Quota>>, _>("doc")? {
            quotas.insert(scope.clone(), q);
        }
        if r.try_get::<Option<i64>, _>("queued")?.is_some() {
            counters.insert(scope, usage_counters::counter_of(&r)?);
        }
    }
    let usage: HashMap<String, Usage> = scopes
        .iter()
        .map(|k| {
            (
                k.clone(),
                counters.get(k).copied().unwrap_or_default().usage(),
            )
        })
        .collect();
    let slots: HashMap<String, u64> = capped
        .iter()
        .map(|p| {
            let k = usage_counters::pool_key(p);
            let n = counters
                .get(&k)
                .map_or(0, |c| u64::try_from(c.slots).unwrap_or(0));
            ((*p).to_owned(), n)
        })
        .collect();
    Ok(GroupLimits {
        scopes,
        quotas,
        usage,
        slots,
    })
}

/// Each changed row once, as it ended (an id given twice was decided twice against one row),
/// in the order first decided.
fn each_row_once(out: &[Activation]) -> Vec<&Sandbox> {
    let mut seen = std::collections::HashSet::new();
    let mut changed: Vec<&Sandbox> = out
        .iter()
        .rev()
        .filter_map(|a| match a {
            Activation::Activated(s) | Activation::Waiting(s, _) => Some(s),
            Activation::NotQueued(_) => None,
        })
        .filter(|s| seen.insert(s.id.clone()))
        .collect();
    changed.reverse();
    changed
}
