//! Activations: a group's first choices in one transaction, the fallbacks ranked after
//! them, and the announcements of what activated.

use chrono::Utc;
use differently_bus::trace;
use differently_bus_schema::TraceContext;
use differently_core::Sandbox;
use differently_store::{Activation, ActivationItem, PoolSlot, StoreError, Wall};

use super::dispatch::{Pick, Ready};
use super::queue::{lock, Shared};
use super::quota_cache::QuotaCache;
use super::Outcome;
use crate::Scheduler;

/// Phase two for a group: the first choices of every decided candidate in one
/// `activate_many`, in pick order — each sees the activations before it, so whoever the fair
/// order picked first gets a contested slot or quota, exactly as one by one. A candidate
/// whose first pool was full then tries its other ranked pools on its own.
pub(super) async fn activate_group(
    s: &Scheduler,
    group: &[Pick],
    ready: &[Option<&Ready>],
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Vec<(usize, Result<Outcome, StoreError>)> {
    let mut out = Vec::with_capacity(ready.len());
    let mut items: Vec<(usize, ActivationItem)> = Vec::new();
    let mut walled: Vec<(usize, Wall)> = Vec::new();
    {
        let queue = lock(q);
        let decided = ready
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)));
        if queue.generation != generation {
            // Capacity was released while deciding: pick again, in fair order.
            return decided.map(|(i, _)| (i, Ok(Outcome::Stale))).collect();
        }
        for (i, r) in decided {
            match r
                .ranking
                .iter()
                .find(|(pool, _)| !queue.blocked.blocks(&r.row, pool))
            {
                Some((pool, cap)) => items.push((
                    i,
                    ActivationItem {
                        id: r.row.id.clone(),
                        pool: PoolSlot {
                            name: pool.clone(),
                            max_concurrent: *cap,
                        },
                        explanation: Some(r.doc.clone()),
                    },
                )),
                None => walled.push((i, parked_wall(&queue.blocked, &r.row))),
            }
        }
    }
    for (i, wall) in walled {
        if let Some(r) = ready[i] {
            out.push((i, Ok(wait_behind_walls(s, q, r, wall, None).await)));
        }
    }
    if items.is_empty() {
        return out;
    }
    let batch: Vec<ActivationItem> = items.iter().map(|(_, it)| it.clone()).collect();
    let results = match s
        .store
        .activate_many(&batch, &s.config.quota, Utc::now())
        .await
    {
        Ok(results) => results,
        Err(e) => {
            let msg = e.to_string();
            out.extend(
                items
                    .into_iter()
                    .map(|(i, _)| (i, Err(StoreError::Internal(msg.clone())))),
            );
            return out;
        }
    };
    let mut activated: Vec<(usize, Sandbox)> = Vec::new();
    let mut try_others: Vec<usize> = Vec::new();
    for ((i, it), res) in items.into_iter().zip(results) {
        match res {
            Activation::Activated(active) => {
                count_activation(quotas, &it.pool.name);
                activated.push((i, active));
                out.push((i, Ok(Outcome::Activated)));
            }
            Activation::Waiting(waiting, wall) => {
                let reason = waiting.status_reason.clone();
                note_wall(q, generation, waiting, &it.pool.name, wall);
                if wall == Wall::Pool {
                    try_others.push(i);
                } else if let Some(r) = ready[i] {
                    // A tenant quota: no other pool helps.
                    out.push((i, Ok(wait_behind_walls(s, q, r, wall, reason).await)));
                }
            }
            Activation::NotQueued(_) => out.push((i, Ok(Outcome::Gone))),
        }
    }
    // The work and status of every activation at once, each under its caller's trace, while
    // the leader goes on with the next group.
    let announcements: Vec<(TraceContext, Sandbox)> = activated
        .into_iter()
        .map(|(i, active)| {
            let ctx = group.get(i).map(|p| p.trace.clone()).unwrap_or_default();
            (ctx, active)
        })
        .collect();
    announce_in_background(s, q, announcements).await;
    for i in try_others {
        let (Some(r), Some(p)) = (ready[i], group.get(i)) else {
            continue;
        };
        let res = trace::scope(
            "activate",
            p.trace.clone(),
            activate_ranked(s, r, quotas, q, generation),
        )
        .await;
        out.push((i, res));
    }
    out
}

/// Counts an activation on `pool` (metric, and the slot view until the next read).
pub(super) fn count_activation(quotas: &QuotaCache, pool: &str) {
    quotas.take_slot(pool);
    metrics::counter!("differently_activations_total", "pool" => pool.to_owned()).increment(1);
}

/// Publishes the group's activations from a task of its own, once one of the
/// `ANNOUNCING_GROUPS` permits is free.
pub(super) async fn announce_in_background(
    s: &Scheduler,
    q: &Shared,
    activated: Vec<(TraceContext, Sandbox)>,
) {
    if activated.is_empty() {
        return;
    }
    // The semaphore is never closed; if it were, announcing unbounded beats not announcing.
    let permit = q.2.clone().acquire_owned().await.ok();
    let s = s.clone();
    tokio::spawn(async move {
        futures::future::join_all(activated.iter().map(|(ctx, active)| {
            trace::scope("activate", ctx.clone(), announce_activation(&s, active))
        }))
        .await;
        drop(permit);
    });
}

/// Publishes an activated sandbox's create work and its status, both at once: the work
/// matters only to the worker, the status only to watchers.
pub(super) async fn announce_activation(s: &Scheduler, active: &Sandbox) {
    tracing::info!(sandbox = %active.id, pool = active.pool.as_deref().unwrap_or(""), "placement: activated");
    if let Err(e) = s.announcer.activated(active).await {
        tracing::warn!(sandbox = %active.id, error = %e, "create publish failed; the provisioning sweep will retry");
    }
}

/// Records the wall an activation found (others behind it are parked without a
/// transaction) and the row as it now reads (its waiting reason). A wall found before a
/// wake-up (`generation` is stale) may have fallen since: it is not kept.
pub(super) fn note_wall(q: &Shared, generation: u64, waiting: Sandbox, pool: &str, wall: Wall) {
    let mut queue = lock(q);
    if queue.generation == generation {
        queue.blocked.note(&waiting, pool, wall);
    }
    queue.rows.insert(waiting.id.clone(), waiting);
}

/// Which known wall parks `row` without a transaction (the org's, then the project's, then
/// its pools').
fn parked_wall(blocked: &super::queue::Blocked, row: &Sandbox) -> Wall {
    if blocked.orgs.contains(&row.org_id) {
        Wall::Org
    } else if blocked.projects.contains(&row.project_id) {
        Wall::Project
    } else {
        Wall::Pool
    }
}

/// The explanation of a candidate the policy placed but a wall keeps waiting: the policy's
/// `doc` with `decision: waiting`, the `reason` and the `wall`, so it agrees with the row's
/// `queued` status (it never says `placed` on a pool the sandbox is not on).
pub(super) fn waiting_doc(doc: &serde_json::Value, reason: &str, wall: Wall) -> serde_json::Value {
    let mut doc = doc.clone();
    if let Some(o) = doc.as_object_mut() {
        o.insert("decision".into(), "waiting".into());
        o.remove("pool");
        o.insert("reason".into(), reason.into());
        o.insert("wall".into(), wall.as_str().into());
    }
    doc
}

/// Every pool this candidate could use is behind a wall: it waits. Its explanation says so
/// (`waiting_doc`) and is stored whenever its reason changes (and once per leader), so
/// `GET …/placement` says why. `reason` is the row's after a refused activation; `None` when
/// it was parked behind a wall another candidate found. The row's `statusReason` and the
/// explanation's `reason` are the same text: a parked row without a reason of its own gets
/// the wall's (`waiting: org limit reached`) stored on it too, once.
pub(super) async fn wait_behind_walls(
    s: &Scheduler,
    q: &Shared,
    r: &Ready,
    wall: Wall,
    reason: Option<String>,
) -> Outcome {
    let on_row = reason.is_some() || r.row.status_reason.is_some();
    let reason = reason
        .or_else(|| r.row.status_reason.clone())
        .unwrap_or_else(|| format!("waiting: {} limit reached", wall.as_str()));
    if !on_row {
        let next =
            Utc::now() + chrono::Duration::from_std(s.config.waiting_backoff).unwrap_or_default();
        match s.store.set_queued_reason(&r.row.id, &reason, next).await {
            Ok(()) => {
                if let Some(cached) = lock(q).rows.get_mut(&r.row.id) {
                    cached.status_reason = Some(reason.clone());
                }
            }
            Err(e) => {
                tracing::warn!(sandbox = %r.row.id, error = %e, "placement: cannot record why it waits");
            }
        }
    }
    if lock(q).needs_explaining(&r.row.id, &reason) {
        let doc = waiting_doc(&r.doc, &reason, wall);
        match s.store.save_placement(&r.row.id, &doc).await {
            Ok(()) => {
                lock(q).explained.insert(r.row.id.clone(), reason);
            }
            Err(e) => {
                tracing::warn!(sandbox = %r.row.id, error = %e, "placement: cannot record why it waits");
            }
        }
    }
    Outcome::Wait
}

/// A candidate whose first pool was full tries its other ranked pools, one at a time (any
/// may have filled since the view).
pub(super) async fn activate_ranked(
    s: &Scheduler,
    ready: &Ready,
    quotas: &QuotaCache,
    q: &Shared,
    generation: u64,
) -> Result<Outcome, StoreError> {
    let Ready {
        row,
        doc,
        ranking,
        now,
    } = ready;
    let mut behind: Option<(Wall, Option<String>)> = None;
    for (pool, cap) in ranking {
        {
            let queue = lock(q);
            if queue.generation != generation {
                return Ok(Outcome::Stale);
            }
            if queue.blocked.blocks(row, pool) {
                if behind.is_none() {
                    behind = Some((parked_wall(&queue.blocked, row), None));
                }
                continue;
            }
        }
        let slot = PoolSlot {
            name: pool.clone(),
            max_concurrent: *cap,
        };
        let activation = s
            .store
            .activate_explained(&row.id, &slot, &s.config.quota, Some(doc), *now)
            .await?;
        match activation {
            Activation::Activated(active) => {
                count_activation(quotas, pool);
                announce_activation(s, &active).await;
                return Ok(Outcome::Activated);
            }
            Activation::Waiting(waiting, wall) => {
                behind = Some((wall, waiting.status_reason.clone()));
                note_wall(q, generation, waiting, pool, wall);
                if wall != Wall::Pool {
                    // A tenant quota: no other pool helps.
                    break;
                }
            }
            Activation::NotQueued(_) => return Ok(Outcome::Gone),
        }
    }
    let (wall, reason) = behind.unwrap_or((Wall::Pool, None));
    Ok(wait_behind_walls(s, q, ready, wall, reason).await)
}
