//! `AdmissionStore::admit` and `admit_many` on Postgres: the admissions of one organization
//! that arrive together, in one transaction.
//!
//! Every admission of an org serializes with the org's other admissions (the queue-limit
//! check must see the previous admission's row), not with its activations
//! (`locks::lock_org_admissions` says why that is safe). So `admit` joins its org's lane (`group_commit`): the creates
//! of an org that arrive while that org's previous group commits are served with one org
//! lock, one limits read per project, one insert, one audit append and one commit. A create
//! that arrives alone is a group of one. The caller only waits for its outcome; if it goes
//! away, the admission still commits with its group (the scheduler's repair pass publishes
//! it, like any admission whose publish was lost).
//!
//! Each item is decided as a lone admission would be, in the order given, against usage that
//! includes the group's earlier admissions; a refused item refuses only itself. If the group's
//! transaction fails as a whole, each item is retried alone, so one bad item cannot fail the
//! others. Two items of one group with the same `Idempotency-Key` are not decided together:
//! the later one runs after the group commits, and so replays (or conflicts with) the first.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use differently_core::accounting;
use differently_core::{OrgId, ProjectId, Sandbox, SandboxStatus};
use sqlx::postgres::PgArguments;
use sqlx::{Postgres, Row, Transaction};
use tokio::sync::oneshot;

use crate::pg::admission_swap;
use crate::pg::group_commit::Lanes;

use crate::pg::audit as pg_audit;
use crate::pg::audit_records::sandbox_event;
use crate::pg::env_at_rest;
use crate::pg::limits::read_limits;
use crate::pg::locks::lock_org_admissions;
use crate::pg::prior_write::{bind, PriorWrite};
use crate::pg::rows::sandbox_of;
use crate::pg::rows::to_i32;
use crate::pg::rows::to_i64;
use crate::pg::usage_counters;
use crate::pg::PgStore;
use crate::shared::rules::{self, AuditEntry};
use crate::{audit, Admission, Admitted, DirectPlacement, QuotaScope, StoreError, Usage};

/// One item's outcome.
type Outcome = Result<Admitted, StoreError>;

/// The per-organization lanes of a process's admissions (`group_commit`).
pub(crate) type AdmissionLanes = Lanes<OrgId, (Admission, oneshot::Sender<Outcome>)>;

/// Most admissions decided in one transaction.
const MAX_GROUP: usize = 64;

/// Admits `a` with whatever else its organization has waiting in this process.
pub(crate) async fn admit(store: &PgStore, mut a: Admission) -> Outcome {
    // The group is decided on another task: the record keeps this request's id.
    if a.request_id.is_none() {
        a.request_id = audit::current_request_id();
    }
    let (reply, rx) = oneshot::channel();
    let org = a.sandbox.org_id.clone();
    let batch_store = store.clone();
    store
        .admissions()
        .push(org, (a, reply), MAX_GROUP, move |jobs: Vec<_>| {
            let store = batch_store.clone();
            async move {
                metrics::histogram!("differently_admission_group_size").record(jobs.len() as f64);
                let (group, replies): (Vec<Admission>, Vec<_>) = jobs.into_iter().unzip();
                // Alone: decided in one statement when it can be (`admission_swap`).
                let lone = match group.as_slice() {
                    [a] => admission_swap::admit(&store, a).await,
                    _ => None,
                };
                let outcomes = match lone {
                    Some(outcome) => vec![outcome],
                    None => admit_many(&store, group).await,
                };
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    // A requester that went away does not undo a committed admission.
                    let _ = reply.send(outcome);
                }
            }
        });
    rx.await
        .unwrap_or_else(|_| Err(StoreError::Internal("the admission's group stopped".into())))
}

/// Admits `group` (any organizations; each org's items in one transaction), one outcome per
/// item in the order given.
pub(crate) async fn admit_many(store: &PgStore, group: Vec<Admission>) -> Vec<Outcome> {
    let mut out: Vec<Option<Outcome>> = (0..group.len()).map(|_| None).collect();
    let mut by_org: BTreeMap<&OrgId, Vec<usize>> = BTreeMap::new();
    let mut seen_keys: HashSet<(&ProjectId, &str)> = HashSet::new();
    let mut later: Vec<usize> = Vec::new();
    for (i, a) in group.iter().enumerate() {
        let s = &a.sandbox;
        if let Err(e) = accounting::check_admissible(s) {
            out[i] = Some(Err(e.into()));
            continue;
        }
        if let Some(key) = s.idempotency_key.as_deref() {
            if !seen_keys.insert((&s.project_id, key)) {
                later.push(i);
                continue;
            }
        }
        by_org.entry(&s.org_id).or_default().push(i);
    }
    for items in by_org.into_values() {
        if items.len() > 1 {
            match decide_in_one_tx(store, &group, &items).await {
                Ok(decided) => {
                    for (i, o) in decided {
                        out[i] = Some(o);
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, size = items.len(),
                        "admission group failed as a whole; admitting its items one by one");
                }
            }
        }
        for i in items {
            out[i] = Some(alone(store, &group, i).await);
        }
    }
    for i in later {
        out[i] = Some(alone(store, &group, i).await);
    }
    out.into_iter()
        .map(|o| o.unwrap_or_else(|| Err(StoreError::Internal("admission not decided".into()))))
        .collect()
}

/// Item `i` in a transaction of its own.
async fn alone(store: &PgStore, group: &[Admission], i: usize) -> Outcome {
    let mut decided = decide_in_one_tx(store, group, &[i]).await?;
    match decided.pop() {
        Some((_, outcome)) => outcome,
        None => Err(StoreError::Internal("admission not decided".into())),
    }
}

/// What one project's items are checked against.
struct ProjectLimits {
    org: Option<String>,
    quota: crate::Quota,
    usage: Usage,
}

/// Decides `items` (indexes into `group`, all of one org) in one transaction and commits the
/// admitted ones. `Err` means nothing was committed.
async fn decide_in_one_tx(
    store: &PgStore,
    group: &[Admission],
    items: &[usize],
) -> Result<Vec<(usize, Outcome)>, StoreError> {
    let Some(&first) = items.first() else {
        return Ok(Vec::new());
    };
    let org = &group[first].sandbox.org_id;
    // A direct placement reserves capacity, so it also excludes the org's activations.
    let places = items.iter().any(|&i| direct_of(&group[i]).is_some());
    let mut tx = store.begin().await?;
    lock_org_admissions(&mut tx, org, places).await?;
    // Capped pools the group may claim on (claim only), locked after the org.
    let capped_names: Vec<&str> = items
        .iter()
        .filter_map(|&i| direct_of(&group[i]).filter(|d| d.claim_only()))
        .map(|d| d.pool.name.as_str())
        .collect();
    let mut capped = crate::pg::warm::capped_pools(&mut tx, &capped_names).await?;
    let org_scope = QuotaScope::Org(org.clone());
    let mut org_limits: Option<(Usage, crate::Quota)> = None;
    let mut projects: HashMap<&ProjectId, ProjectLimits> = HashMap::new();
    for &i in items {
        let p = &group[i].sandbox.project_id;
        if projects.contains_key(p) {
            continue;
        }
        let l = read_limits(&mut tx, p, &org_scope, &QuotaScope::Project(p.clone())).await?;
        org_limits.get_or_insert((l.org_usage, l.org_quota.unwrap_or_default()));
        projects.insert(
            p,
            ProjectLimits {
                org: l.project_org,
                quota: l.prj_quota.unwrap_or_default(),
                usage: l.prj_usage,
            },
        );
    }
    let (mut org_usage, org_quota) = org_limits.unwrap_or_default();
    let replays = earlier_admissions(&mut tx, group, items).await?;

    let mut decided: Vec<(usize, Outcome)> = Vec::with_capacity(items.len());
    // Each admitted item's row as it is inserted, and its activation's record if placed.
    let mut admitted: Vec<(usize, Sandbox, Option<AuditEntry>)> = Vec::new();
    for &i in items {
        let a = &group[i];
        let s = &a.sandbox;
        let Some(prj) = projects.get_mut(&s.project_id) else {
            decided.push((i, Err(StoreError::NotFound)));
            continue;
        };
        if prj.org.as_deref() != Some(org.as_str()) {
            decided.push((i, Err(StoreError::NotFound)));
            continue;
        }
        if let Some(key) = s.idempotency_key.as_deref() {
            if let Some((earlier, hash)) = replays.get(&(s.project_id.as_str(), key)) {
                let outcome = if *hash == a.request_hash {
                    Ok(Admitted::Replayed(earlier.clone()))
                } else {
                    Err(StoreError::IdempotencyMismatch)
                };
                decided.push((i, outcome));
                continue;
            }
        }
        let quota = org_quota.clone().or(&a.defaults);
        let pool =
            direct_of(a).and_then(|d| capped.get_mut(&d.pool.name).filter(|_| d.claim_only()));
        let (mut row, next) = match decide_item(
            a,
            (&mut org_usage, &quota),
            (&mut prj.usage, &prj.quota),
            pool.as_deref(),
        ) {
            Ok(decided) => decided,
            Err(e) => {
                decided.push((i, Err(e)));
                continue;
            }
        };
        let placed = match next {
            Next::Stay => None,
            Next::Place(d) => match crate::pg::warm::claim(&mut tx, d).await? {
                // Claim only and nothing ready: queued, never placed cold.
                None if d.claim_only() => None,
                claimed => {
                    for u in [&mut org_usage, &mut prj.usage] {
                        u.queued = u.queued.saturating_sub(1);
                        u.add(SandboxStatus::Provisioning, &s.spec.resources);
                    }
                    if let Some(p) = pool {
                        p.used += 1;
                    }
                    // A claimed warm instance counts as provisioning does (running too).
                    Some(match claimed {
                        Some((id, backend_ref)) => {
                            rules::claim_warm(&mut row, d, id, &backend_ref, s.created_at)?
                        }
                        None => rules::activate_direct(&mut row, &d.pool, s.created_at),
                    })
                }
            },
        };
        admitted.push((i, row, placed));
    }
    if !admitted.is_empty() {
        let write = insert_rows(group, &admitted)?;
        let at = admitted
            .iter()
            .map(|(i, _, _)| group[*i].sandbox.created_at)
            .max()
            .unwrap_or_else(Utc::now);
        let mut events = Vec::with_capacity(admitted.len());
        for (i, row, placed) in &admitted {
            let a = &group[*i];
            let request_id = a.request_id.clone().or_else(audit::current_request_id);
            // Under the row's id: a warm claim gave it the instance's.
            events.push((
                sandbox_event(row, rules::admit_entry(row, &a.actor)),
                request_id.clone(),
            ));
            if let Some(entry) = placed {
                events.push((sandbox_event(row, entry.clone()), request_id));
            }
        }
        let counters = counters_to_lock(&org_scope, &admitted);
        pg_audit::append_then_lock_counters(&mut tx, Some(write), events, at, &counters).await?;
        let placements: Vec<(&differently_core::SandboxId, &serde_json::Value)> = admitted
            .iter()
            .filter(|(_, _, placed)| placed.is_some())
            .filter_map(|(i, row, _)| direct_of(&group[*i]).map(|d| (&row.id, &d.explanation)))
            .collect();
        // After the rows' insert (the explanation references its row).
        crate::pg::placement::write_placements(&mut tx, &placements, at).await?;
    }
    tx.commit().await?;
    decided.extend(
        admitted
            .into_iter()
            .map(|(i, row, _)| (i, Ok(Admitted::New(row)))),
    );
    Ok(decided)
}

/// The item's direct placement if it can apply (`DirectPlacement::applies`).
pub(crate) fn direct_of(a: &Admission) -> Option<&DirectPlacement> {
    a.direct.as_ref().filter(|d| d.applies())
}

/// What comes after an admitted item's row is decided.
pub(crate) enum Next<'a> {
    /// Stays queued, for the leader (waiting, saying why, or behind others).
    Stay,
    /// Placed now by this placement: a warm claim if it names a class, else cold (a capped
    /// pool's placement only claims).
    Place(&'a DirectPlacement),
}

/// Decides admission item `a` on the usage seen so far (`org` merged over the defaults,
/// `pool`: its capped pool, when it may only claim on one): refused, or its row and what
/// comes next. An admitted item is counted as queued in both usages. The lane and the
/// one-statement path (`admission_swap`) decide the same way.
pub(crate) fn decide_item<'a>(
    a: &'a Admission,
    org: (&mut Usage, &crate::Quota),
    prj: (&mut Usage, &crate::Quota),
    pool: Option<&crate::pg::warm::CappedPool>,
) -> Result<(Sandbox, Next<'a>), StoreError> {
    let s = &a.sandbox;
    let (org_usage, quota) = org;
    let (prj_usage, prj_quota) = prj;
    accounting::check_admission_limits(s, (org_usage, quota), (prj_usage, prj_quota))?;
    // Nothing of the org waits (a group's earlier items included), so placing this one now
    // overtakes nobody; it still must fit the org's and project's quotas.
    let nothing_waits = org_usage.queued == 0;
    org_usage.add(SandboxStatus::Queued, &s.spec.resources);
    prj_usage.add(SandboxStatus::Queued, &s.spec.resources);
    let mut row = s.clone();
    let next = match direct_of(a) {
        Some(d) if nothing_waits => {
            let used = pool.map_or(0, |p| p.used);
            match accounting::waiting_reason(
                (org_usage, quota),
                (prj_usage, prj_quota),
                used,
                &row,
                d.pool.cap(),
            ) {
                // It waits like any queued sandbox, saying why (as the leader would).
                Some((_, reason)) => {
                    accounting::wait(&mut row, reason, s.created_at);
                    Next::Stay
                }
                // Claim only, and another org's sandbox may be waiting for the pool: queued
                // for the leader, which orders them.
                None if d.claim_only() && pool.is_none_or(|p| p.waited) => Next::Stay,
                None => Next::Place(d),
            }
        }
        _ => Next::Stay,
    };
    Ok((row, next))
}

/// The counters to lock before commit, in the global order, when the rows' commit triggers
/// would otherwise take them in row order: the org's, every project's and every pool's once
/// the rows name more than one project or pool. Rows of one project and at most one pool
/// take them in the global order already (org, project, pool), so no lock.
fn counters_to_lock(
    org_scope: &QuotaScope,
    admitted: &[(usize, Sandbox, Option<AuditEntry>)],
) -> Vec<String> {
    let mut projects: Vec<String> = admitted
        .iter()
        .map(|(_, row, _)| QuotaScope::Project(row.project_id.clone()).key())
        .collect();
    projects.sort_unstable();
    projects.dedup();
    let mut pools: Vec<String> = admitted
        .iter()
        .filter_map(|(_, row, _)| row.pool.as_deref().map(usage_counters::pool_key))
        .collect();
    pools.sort_unstable();
    pools.dedup();
    if projects.len() <= 1 && pools.len() <= 1 {
        return Vec::new();
    }
    let mut counters = vec![org_scope.key()];
    counters.extend(projects);
    counters.extend(pools);
    counters
}

/// Rows already stored under the `Idempotency-Key`s of `items`, keyed by (project, key),
/// with their request hashes.
async fn earlier_admissions<'g>(
    tx: &mut Transaction<'static, Postgres>,
    group: &'g [Admission],
    items: &[usize],
) -> Result<HashMap<(&'g str, &'g str), (Sandbox, String)>, StoreError> {
    let keyed: Vec<(&'g str, &'g str)> = items
        .iter()
        .filter_map(|&i| {
            let s = &group[i].sandbox;
            s.idempotency_key
                .as_deref()
                .map(|k| (s.project_id.as_str(), k))
        })
        .collect();
    let mut found = HashMap::new();
    if keyed.is_empty() {
        return Ok(found);
    }
    let rows = sqlx::query(
        "SELECT s.project_id, s.idempotency_key, s.doc, s.env_sealed, s.request_hash
         FROM UNNEST($1::text[], $2::text[]) AS k(project_id, idempotency_key)
         JOIN sandboxes s ON s.project_id = k.project_id
                         AND s.idempotency_key = k.idempotency_key",
    )
    .bind(keyed.iter().map(|k| k.0).collect::<Vec<_>>())
    .bind(keyed.iter().map(|k| k.1).collect::<Vec<_>>())
    .fetch_all(&mut **tx)
    .await?;
    for row in rows {
        let project: String = row.try_get("project_id")?;
        let key: String = row.try_get("idempotency_key")?;
        let Some(&k) = keyed.iter().find(|k| k.0 == project && k.1 == key) else {
            continue;
        };
        found.insert(k, (sandbox_of(&row)?, row.try_get("request_hash")?));
    }
    Ok(found)
}

/// One row to insert and the request hash stored with it.
struct Insert<'a> {
    sandbox: &'a Sandbox,
    request_hash: &'a str,
}

/// Inserts the rows of `admitted` (as decided: queued, or placed) with one statement.
pub(crate) fn insert_rows<'g>(
    group: &'g [Admission],
    admitted: &'g [(usize, Sandbox, Option<AuditEntry>)],
) -> Result<PriorWrite, StoreError> {
    let rows: Vec<Insert<'g>> = admitted
        .iter()
        .map(|(i, row, _)| Insert {
            sandbox: row,
            request_hash: &group[*i].request_hash,
        })
        .collect();
    let text = |f: fn(&Insert<'g>) -> Option<&'g str>| -> Vec<Option<&'g str>> {
        rows.iter().map(f).collect()
    };
    let time = |f: fn(&Sandbox) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
        rows.iter().map(|a| f(a.sandbox)).collect()
    };
    let mut attempts = Vec::with_capacity(rows.len());
    let mut cpu = Vec::with_capacity(rows.len());
    let mut memory = Vec::with_capacity(rows.len());
    let mut disk = Vec::with_capacity(rows.len());
    let mut docs = Vec::with_capacity(rows.len());
    let mut envs = Vec::with_capacity(rows.len());
    for a in &rows {
        let s = &a.sandbox;
        attempts.push(to_i32(s.attempts)?);
        cpu.push(i64::from(s.spec.resources.cpu));
        memory.push(to_i64(s.spec.resources.memory_mib, "memory")?);
        disk.push(to_i64(s.spec.resources.disk_gib, "disk")?);
        let (doc, env) = env_at_rest::stored(s)?;
        docs.push(doc);
        envs.push(env);
    }
    let mut args = PgArguments::default();
    bind(&mut args, text(|a| Some(a.sandbox.id.as_str())))?;
    bind(&mut args, text(|a| Some(a.sandbox.org_id.as_str())))?;
    bind(&mut args, text(|a| Some(a.sandbox.project_id.as_str())))?;
    bind(&mut args, text(|a| Some(a.sandbox.status.as_str())))?;
    bind(
        &mut args,
        rows.iter()
            .map(|a| a.sandbox.status_version)
            .collect::<Vec<i64>>(),
    )?;
    bind(&mut args, text(|a| a.sandbox.pool.as_deref()))?;
    bind(&mut args, text(|a| a.sandbox.backend_ref.as_deref()))?;
    bind(&mut args, text(|a| a.sandbox.idempotency_key.as_deref()))?;
    bind(&mut args, text(|a| Some(a.request_hash)))?;
    bind(&mut args, attempts)?;
    bind(
        &mut args,
        rows.iter()
            .map(|a| a.sandbox.spec.priority)
            .collect::<Vec<i32>>(),
    )?;
    bind(&mut args, cpu)?;
    bind(&mut args, memory)?;
    bind(&mut args, disk)?;
    bind(&mut args, time(|s| Some(s.created_at)))?;
    bind(&mut args, time(|s| s.expires_at))?;
    bind(&mut args, time(|s| Some(s.created_at)))?;
    bind(&mut args, time(|s| Some(s.updated_at)))?;
    bind(&mut args, docs)?;
    bind(&mut args, envs)?;
    Ok(PriorWrite::new(
        "INSERT INTO sandboxes (id, org_id, project_id, status, status_version, pool,
             backend_ref, idempotency_key, request_hash, attempts, priority, cpu, memory_mib,
             disk_gib, next_attempt_at, expires_at, created_at, updated_at, doc, env_sealed)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
             $6::text[], $7::text[], $8::text[], $9::text[], $10::int[], $11::int[],
             $12::bigint[], $13::bigint[], $14::bigint[], $15::timestamptz[],
             $16::timestamptz[], $17::timestamptz[], $18::timestamptz[], $19::jsonb[],
             $20::bytea[])",
        args,
        20,
        rows.len() as u64,
        |written, expected| {
            StoreError::Internal(format!(
                "admission insert wrote {written} of {expected} rows"
            ))
        },
    ))
}
