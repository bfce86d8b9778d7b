//! The three feeds of the queue: admission messages (the fast path), a periodic rebuild
//! from queued rows (repair), and capacity-release events that wake parked candidates.

use std::time::Duration;

use chrono::Utc;
use differently_bus::{trace, BusExt, Typed, TypedEvent};
use differently_bus_schema::{Admitted, StatusOnly};
use differently_core::SandboxStatus;
use futures::StreamExt;

use super::queue::{lock, Shared};
use crate::Scheduler;

pub(super) async fn consume_admissions(s: Scheduler, q: Shared) {
    let def = s.announcer.naming().placement_consumer(s.config.ack_wait);
    loop {
        let mut pull = match s.announcer.bus().pull_typed::<Admitted>(&def).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "placement: cannot bind consumer; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            // Undecodable messages are settled by the typed pull itself.
            let Typed { env, delivery } = match pull.next(Duration::from_secs(5)).await {
                Ok(Some(t)) => t,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "placement: pull failed");
                    break;
                }
            };
            trace::record_consume_lag("admit", env.published_at);
            let row = match env.body.sandbox {
                Some(row) if row.id == env.sandbox_id => Ok(Some(row.into_placement_row())),
                _ => s.store.get_sandbox(&env.sandbox_id).await,
            };
            match row {
                Ok(Some(row)) if row.status == SandboxStatus::Queued => {
                    let mut queue = lock(&q);
                    if env.trace.traceparent.is_some() {
                        queue.traces.insert(row.id.clone(), env.trace.clone());
                    }
                    queue.offer(&row);
                    drop(queue);
                    q.1.notify_one();
                }
                Ok(_) => {}
                Err(e) => {
                    // Not acked: redelivered later; the rebuild pass also covers it.
                    tracing::warn!(error = %e, "placement: cannot read admitted row");
                    let _ = delivery.acker.nak(Duration::from_secs(1)).await;
                    continue;
                }
            }
            // The row in Postgres is the truth from here on; a new leader rebuilds from it.
            if let Err(e) = delivery.acker.ack().await {
                tracing::warn!(error = %e, "placement: ack failed");
            }
        }
    }
}

/// Rows admitted while this instance leads reach it as admission messages, which carry the
/// caller's trace; the rebuild is for the rest (rows queued before it led, a lost message, a
/// retry's back-off ending), so it leaves a row admitted since it led one repair interval for
/// its message to come first. Taking such a row in the few milliseconds between its commit
/// and its message placed it under a trace of its own, and the create's trace stopped at the
/// API (seen in `observability::metrics_move_and_one_trace_id_spans_api_to_worker`). A lost
/// message costs at most one interval more, as the sweep re-publishes it after one anyway.
pub(super) async fn rebuild_from_store(s: Scheduler, q: Shared) {
    let leading_since = Utc::now();
    let in_flight = chrono::Duration::from_std(s.config.repair_interval)
        .unwrap_or_else(|_| chrono::Duration::seconds(2));
    loop {
        let now = Utc::now();
        match s.store.runnable_queued(now, 10_000).await {
            Ok(rows) => {
                let mut queue = lock(&q);
                let before = queue.fair.len();
                let settled = |r: &&differently_core::Sandbox| {
                    r.created_at <= leading_since || r.created_at <= now - in_flight
                };
                for row in rows.iter().filter(settled) {
                    queue.offer(row);
                }
                let added = queue.fair.len() - before;
                drop(queue);
                if added > 0 {
                    tracing::debug!(added, "placement: queue rebuilt from store");
                    q.1.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "placement: cannot read queued rows"),
        }
        tokio::time::sleep(s.config.repair_interval).await;
    }
}

/// Wakes placement whenever a sandbox ends, freeing room. Only final changes are read
/// (`Naming::final_event_filter`): the other three of a sandbox's four are not sent here. An
/// end announced by an earlier version, without the subject's phase, is not seen; placement
/// still tries its queue again every tick (`SchedulerConfig::tick`).
pub(super) async fn follow_releases(s: Scheduler, q: Shared) {
    let naming = s.announcer.naming().clone();
    let stream = naming.events_stream().name;
    let filter = naming.final_event_filter();
    loop {
        match s
            .announcer
            .bus()
            .events_typed::<StatusOnly>(&stream, &filter, None)
            .await
        {
            Ok(mut events) => {
                while let Some(Ok(TypedEvent { env, .. })) = events.next().await {
                    if env.body.status.is_final() {
                        lock(&q).wake_all();
                        q.1.notify_one();
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "placement: cannot follow events"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
