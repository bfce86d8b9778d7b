//! Leadership: try the lock, lead while it is held, step down at once when a ping fails.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{audit_checkpoints, placement, sweeps, usage_reconcile, warm, Scheduler};

/// Longest one publish may hold up a leader task. The leader's loops publish what Postgres
/// already holds (re-sends, status, activations) and repeat every pass, so a publish to a
/// hung node or a stream without a leader is better given up and retried than waited on for
/// the client's full timeout (5 s), row after row: one hung node stalled a whole pass for a
/// minute before this bound.
pub(crate) const LEADER_PUBLISH_BOUND: Duration = Duration::from_secs(1);

/// What this scheduler is as far as leadership goes: the log says when that changes, once,
/// and a scheduler that stands by polling the lock every `standby_poll` stays quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Starting,
    StandingBy,
    Leading,
}

impl Role {
    /// The role after one try of the lock (`leads`: it was won), logged at info when it
    /// changed: an operator reading a second scheduler's log sees that it stands by, and
    /// when it takes over.
    fn after_try(self, leads: bool) -> Role {
        match (self, leads) {
            (Role::Starting, true) => tracing::info!("scheduler: leading"),
            (Role::StandingBy, true) => {
                tracing::info!("scheduler: leading; taking over, the lock was free")
            }
            (Role::Starting, false) => tracing::info!(
                "scheduler: standing by; another scheduler leads (trying the lock again every poll)"
            ),
            (Role::Leading, false) => {
                tracing::info!("scheduler: standing by; another scheduler leads now")
            }
            (Role::Leading, true) | (Role::StandingBy, false) => {}
        }
        if leads {
            Role::Leading
        } else {
            Role::StandingBy
        }
    }
}

pub(crate) async fn run(s: Scheduler, mut shutdown: watch::Receiver<bool>) {
    let mut role = Role::Starting;
    loop {
        if *shutdown.borrow() {
            return;
        }
        match s.store.try_lead().await {
            Ok(Some(mut lease)) => {
                // Logs the change; the role is set again once this scheduler steps down.
                role.after_try(true);
                let s = Scheduler {
                    announcer: s.announcer.clone().bounded(LEADER_PUBLISH_BOUND),
                    ..s.clone()
                };
                let (stop_tx, stop_rx) = watch::channel(false);
                let mut tasks = JoinSet::new();
                tasks.spawn(placement::run(s.clone(), stop_rx.clone()));
                tasks.spawn(sweeps::run(s.clone(), stop_rx.clone()));
                tasks.spawn(audit_checkpoints::run(s.clone(), stop_rx.clone()));
                tasks.spawn(usage_reconcile::run(s.clone(), stop_rx.clone()));
                tasks.spawn(warm::run(s.clone(), stop_rx.clone()));
                loop {
                    tokio::select! {
                        _ = shutdown.changed() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {
                            if !lease.still_held().await {
                                tracing::warn!("scheduler: lost leadership");
                                break;
                            }
                        }
                        Some(res) = tasks.join_next() => {
                            tracing::error!(?res, "scheduler: a leader task ended; stepping down");
                            break;
                        }
                    }
                }
                let _ = stop_tx.send(true);
                tasks.shutdown().await;
                drop(lease);
                tracing::info!("scheduler: stepped down");
                // Whatever the next try brings (leading again, or standing by) is news.
                role = Role::Starting;
            }
            Ok(None) => role = role.after_try(false),
            Err(e) => tracing::warn!(error = %e, "scheduler: cannot try leadership"),
        }
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = tokio::time::sleep(s.config.standby_poll) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Level, Metadata, Subscriber};

    use super::Role;

    /// Keeps the message of every info-or-above event.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    struct Message<'a>(&'a mut String);

    impl Visit for Message<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                *self.0 = format!("{value:?}");
            }
        }
    }

    impl Subscriber for Lines {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            *m.level() <= Level::INFO
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, e: &Event<'_>) {
            let mut text = String::new();
            e.record(&mut Message(&mut text));
            self.0.lock().expect("lines").push(text);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Runs `tries` (each: whether the lock was won) from a starting scheduler and returns the
    /// role it ends in and the lines it logged.
    fn drive(tries: &[bool]) -> (Role, Vec<String>) {
        let lines = Lines::default();
        let role = tracing::subscriber::with_default(lines.clone(), || {
            tries
                .iter()
                .fold(Role::Starting, |r, &leads| r.after_try(leads))
        });
        let out = lines.0.lock().expect("lines").clone();
        (role, out)
    }

    #[test]
    fn a_second_scheduler_says_once_that_it_stands_by_then_that_it_takes_over() {
        let (role, lines) = drive(&[false, false, false, true, true]);
        assert_eq!(role, Role::Leading);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("standing by"), "{lines:?}");
        assert!(lines[1].contains("taking over"), "{lines:?}");
        // Operators and tests look for one line whoever leads.
        assert!(lines[1].contains("scheduler: leading"), "{lines:?}");
    }

    #[test]
    fn a_first_scheduler_says_it_leads_once_and_when_it_stands_by_after_losing_the_lock() {
        let (role, lines) = drive(&[true, true, false, false]);
        assert_eq!(role, Role::StandingBy);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("leading"), "{lines:?}");
        assert!(lines[1].contains("standing by"), "{lines:?}");
    }

    #[test]
    fn standing_by_polls_log_nothing_after_the_first() {
        let (_, lines) = drive(&[false; 50]);
        assert_eq!(lines.len(), 1, "{lines:?}");
    }
}
