//! Group commit of one-row status changes (`mark_running`, `transition`) on Postgres.
//!
//! Workers mark sandboxes running and terminated, and the API moves them to terminating, one
//! row per call and up to 64 calls at a time per worker. Each was a transaction of its own:
//! BEGIN, lock the row, write it, lock the audit head, insert the record, COMMIT, and a WAL
//! flush. Postgres CPU per sandbox was the limit of the whole system (`docs/performance.md`),
//! so changes that arrive while the previous group commits now share one transaction: rows
//! locked in id order with one statement, each change decided in Rust exactly as alone (in
//! arrival order; an id given twice sees the first change), rows written with one statement,
//! audit records of all their chains with two, usage counters locked in their global order,
//! one commit. A change its rules refuse fails alone; a group whose transaction fails is
//! retried change by change. The batching itself is `group_commit` (one lane per process).
//!
//! A batch of one has nothing to share a transaction with: it is decided in one statement
//! instead when it can be (`transition_swap`), and here only when that declines.
//!
//! Changes to `queued` keep their own transaction (they also move `next_attempt_at`).

use chrono::{DateTime, Utc};
use differently_core::{Sandbox, SandboxId};
use tokio::sync::oneshot;

use crate::pg::audit as pg_audit;
use crate::pg::audit_records::sandbox_event;
use crate::pg::group_commit::Lanes;
use crate::pg::locks::lock_sandboxes;
use crate::pg::transition_swap;
use crate::pg::usage_counters;
use crate::pg::writes::update_sandboxes;
use crate::pg::PgStore;
use crate::shared::rules;
use crate::{audit, SeenRow, StoreError, Transition};

/// Most changes decided in one transaction.
const MAX_GROUP: usize = 64;

/// One requested change.
#[derive(Debug)]
pub(crate) enum Change {
    /// `mark_running` with the backend's instance reference.
    Running { backend_ref: String },
    /// `transition` (never to `queued`).
    To(Transition),
}

impl Change {
    /// Applies this change to `s` by the status rules; the lane and the one-statement path
    /// (`transition_swap`) decide the same way.
    pub(crate) fn apply(
        &self,
        s: &mut Sandbox,
        now: DateTime<Utc>,
    ) -> Result<rules::AuditEntry, StoreError> {
        match self {
            Change::Running { backend_ref } => rules::mark_running(s, backend_ref, now),
            Change::To(t) => rules::transition(s, t, now),
        }
    }
}

pub(crate) struct Pending {
    id: SandboxId,
    change: Change,
    now: DateTime<Utc>,
    request_id: Option<String>,
    /// The row as the caller saw it (`TransitionStore::transition_seen`), for a lone change.
    seen: Option<SeenRow>,
    reply: oneshot::Sender<Result<Sandbox, StoreError>>,
}

/// The one lane of a process's status changes (`group_commit`).
pub(crate) type TransitionLane = Lanes<(), Pending>;

/// Applies `change` to row `id` with whatever else this process is changing right now.
pub(crate) async fn submit(
    store: &PgStore,
    id: &SandboxId,
    change: Change,
    seen: Option<SeenRow>,
    now: DateTime<Utc>,
) -> Result<Sandbox, StoreError> {
    let (reply, rx) = oneshot::channel();
    let job = Pending {
        id: id.clone(),
        change,
        now,
        request_id: audit::current_request_id(),
        seen,
        reply,
    };
    let batch_store = store.clone();
    store.transitions().push((), job, MAX_GROUP, move |group| {
        let store = batch_store.clone();
        async move { run(&store, group).await }
    });
    rx.await
        .unwrap_or_else(|_| Err(StoreError::Internal("the change's group stopped".into())))
}

/// Decides a batch and answers each caller; a batch whose transaction fails is retried
/// change by change.
async fn run(store: &PgStore, group: Vec<Pending>) {
    metrics::histogram!("differently_transition_group_size").record(group.len() as f64);
    if let [p] = group.as_slice() {
        let swapped = transition_swap::change(
            store,
            &p.id,
            &p.change,
            p.seen.as_ref(),
            p.now,
            p.request_id.as_deref(),
        )
        .await;
        if let Some(outcome) = swapped {
            if let Some(p) = group.into_iter().next() {
                let _ = p.reply.send(outcome);
            }
            return;
        }
    }
    let outcomes = match decide(store, &group).await {
        Ok(outcomes) => outcomes,
        Err(e) if group.len() == 1 => vec![Err(e)],
        Err(e) => {
            tracing::warn!(error = %e, size = group.len(),
                "status change group failed as a whole; applying its changes one by one");
            let mut each = Vec::with_capacity(group.len());
            for p in &group {
                each.push(match decide(store, std::slice::from_ref(p)).await {
                    Ok(mut one) => one
                        .pop()
                        .unwrap_or_else(|| Err(StoreError::Internal("change not decided".into()))),
                    Err(e) => Err(e),
                });
            }
            each
        }
    };
    for (p, outcome) in group.into_iter().zip(outcomes) {
        let _ = p.reply.send(outcome);
    }
}

/// Decides `group` in one transaction; one outcome per change. `Err`: nothing committed.
async fn decide(
    store: &PgStore,
    group: &[Pending],
) -> Result<Vec<Result<Sandbox, StoreError>>, StoreError> {
    let mut ids: Vec<&str> = group.iter().map(|p| p.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut tx = store.begin().await?;
    let mut by_id = lock_sandboxes(&mut tx, &ids).await?;
    let before = by_id.clone();
    let mut outcomes = Vec::with_capacity(group.len());
    let mut events = Vec::new();
    let mut changed: Vec<SandboxId> = Vec::new();
    let mut written = Vec::new();
    for p in group {
        let Some(s) = by_id.get_mut(&p.id) else {
            outcomes.push(Err(StoreError::NotFound));
            continue;
        };
        let mut next = s.clone();
        match p.change.apply(&mut next, p.now) {
            Ok(entry) => {
                events.push((sandbox_event(&next, entry), p.request_id.clone()));
                *s = next.clone();
                if !changed.contains(&p.id) {
                    changed.push(p.id.clone());
                }
                outcomes.push(Ok(next));
            }
            Err(e) => outcomes.push(Err(e)),
        }
    }
    if !changed.is_empty() {
        let rows: Vec<&Sandbox> = changed.iter().filter_map(|id| by_id.get(id)).collect();
        let write = update_sandboxes(&rows)?;
        let at = group.iter().map(|p| p.now).max().unwrap_or_else(Utc::now);
        let mut counters: Vec<String> = rows
            .iter()
            .filter_map(|s| {
                before
                    .get(&s.id)
                    .map(|old| usage_counters::moved_by(old, s))
            })
            .flatten()
            .collect();
        counters.sort_unstable();
        counters.dedup();
        // One row's trigger takes its counters in the global order already (org, project,
        // pool); only several rows can interleave them.
        if rows.len() < 2 {
            counters.clear();
        }
        written =
            pg_audit::append_then_lock_counters(&mut tx, write, events, at, &counters).await?;
    }
    tx.commit().await?;
    remember_heads(store, &written);
    Ok(outcomes)
}

/// Tells the process's head cache where each written record's chain now ends, per sandbox,
/// for the changes' status events (`AuditStore::audit_head_after`).
fn remember_heads(store: &PgStore, written: &[crate::audit::AuditEvent]) {
    let mut last: std::collections::HashMap<&str, &crate::audit::AuditEvent> =
        std::collections::HashMap::new();
    for r in written {
        let newer = last
            .get(r.chain.as_str())
            .is_none_or(|l| l.chain_seq < r.chain_seq);
        if newer {
            last.insert(r.chain.as_str(), r);
        }
    }
    for r in written {
        if let Some(head) = last.get(r.chain.as_str()) {
            store
                .audit_heads()
                .after_change(&r.resource, &head.chain, head.chain_seq, &head.hash);
        }
    }
}
