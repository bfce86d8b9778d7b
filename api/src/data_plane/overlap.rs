//! How a data-plane call overlaps its audit record's round trips instead of waiting for them:
//! the call is prepared while the record is staged ([`beside`]), and runs while the record
//! commits ([`while_committing`], [`commit_detached`]). Never the command before its record is
//! staged, never an answer before it is durable.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use differently_store::audit::StagedAudit;

use crate::error::ApiResult;

/// Awaits `wanted` (a record being staged, or the events that follow it) while polling
/// `call` beside it, so the call prepares its command meanwhile; returns `wanted`'s output
/// and the call's, if it ended first. The call can only end first by failing (its command
/// cannot go before the go-ahead); that output is kept for whoever awaits the call.
///
/// The call is polled first: its connection is opened before `wanted` sends its statement.
/// Polled second, it often started only once the statement was answered, since on a busy
/// machine the database's process, woken by the statement, can take this thread's core
/// until it has answered: the command's start then waits a database round trip it need not.
pub(crate) async fn beside<W: Future, C: Future>(
    mut wanted: Pin<&mut W>,
    mut call: Pin<&mut C>,
) -> (W::Output, Option<C::Output>) {
    let mut ended = None;
    let out = loop {
        tokio::select! {
            biased;
            end = &mut call, if ended.is_none() => ended = Some(end),
            out = &mut wanted => break out,
        }
    };
    (out, ended)
}

/// Runs `call` while `record` commits, and answers once both are done. A failed commit
/// cancels the call (dropped: an adapter interrupts a command it started) and fails it, so
/// no answer goes out without its durable record.
pub(super) async fn while_committing<T>(
    record: StagedAudit,
    call: impl Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    let commit = commit_detached(record);
    tokio::pin!(commit);
    tokio::pin!(call);
    tokio::select! {
        committed = &mut commit => {
            committed?;
            call.await
        }
        answer = &mut call => {
            commit.await?;
            answer
        }
    }
}

/// Commits `record`, polled by the caller; if the caller is dropped first (a hang-up drops its
/// handler), the commit goes on in a task of its own, so the commit of a call that may already
/// have started is never cancelled. Spawning the commit up front did the same at the cost of
/// a task and a thread wake-up per call.
///
/// `COMMIT` is sent only after the tasks this one has just woken have had their turn: an exec
/// gives its command the go-ahead right before, and the task holding the command's request
/// then writes it first. Sent at once, the command waited behind it (0.15 ms at the median
/// between the record staged and the command written, 0.4 ms or more in one exec of four,
/// measured on a real OpenSandbox: `docs/opensandbox.md`); the commit still overlaps the
/// command.
pub(super) async fn commit_detached(record: StagedAudit) -> ApiResult<()> {
    let mut commit = FinishOnDrop(Some(Box::pin(record.commit())));
    // Dropped while yielding, `commit` goes on in a task of its own as above.
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| commit.poll(cx)).await?;
    Ok(())
}

/// A future finished in a task of its own should it be dropped before it ends.
struct FinishOnDrop<F: Future + Send + 'static>(Option<Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: Future + Send + 'static> FinishOnDrop<F>
where
    F::Output: Send,
{
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(f) = self.0.as_mut() else {
            // Polled again after it ended: never, as `commit_detached` awaits it once.
            return Poll::Pending;
        };
        let out = ready!(f.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for FinishOnDrop<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        if let (Some(f), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use differently_store::audit::{AuditEvent, AuditKey, NewAuditEvent};
    use std::sync::{Arc, Mutex};

    fn record() -> AuditEvent {
        let key = AuditKey::random().expect("audit key");
        let event = NewAuditEvent {
            org_id: None,
            project_id: None,
            actor: "system:test".to_owned(),
            action: "sandbox.exec".to_owned(),
            resource: "sbx_test".to_owned(),
            outcome: "ok".to_owned(),
            detail: serde_json::json!({}),
        };
        AuditEvent::chained(&key, "test".to_owned(), None, event, Utc::now(), None)
    }

    /// The call is polled before the statement is sent, and its output, when it fails first,
    /// is kept.
    #[tokio::test]
    async fn beside_starts_the_call_first_and_keeps_an_early_end() {
        let order = Mutex::new(Vec::new());
        let wanted = async {
            order.lock().unwrap().push("statement sent");
            tokio::task::yield_now().await;
            "staged"
        };
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let call = async {
            order.lock().unwrap().push("connection opened");
            let _ = ready.await;
            "ran"
        };
        tokio::pin!(wanted, call);
        let (staged, ended) = beside(wanted.as_mut(), call.as_mut()).await;
        assert_eq!((staged, ended), ("staged", None));
        assert_eq!(
            *order.lock().unwrap(),
            ["connection opened", "statement sent"]
        );
        go.send(()).expect("the call waits");
        assert_eq!(call.await, "ran");

        let failed = async { "failed at once" };
        let slow = async {
            tokio::task::yield_now().await;
            "staged"
        };
        tokio::pin!(failed, slow);
        let (staged, ended) = beside(slow.as_mut(), failed.as_mut()).await;
        assert_eq!((staged, ended), ("staged", Some("failed at once")));
    }

    /// What an exec does: the go-ahead wakes the task holding the command, then the record
    /// commits. That task writes the command before `COMMIT` is sent.
    #[tokio::test(flavor = "current_thread")]
    async fn a_task_just_woken_runs_before_the_commit_is_sent() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (go, ready) = tokio::sync::oneshot::channel::<()>();
        let command = {
            let order = order.clone();
            tokio::spawn(async move {
                let _ = ready.await;
                order.lock().unwrap().push("command written");
            })
        };
        tokio::task::yield_now().await; // the command's task now waits for its go-ahead
        let staged = {
            let order = order.clone();
            StagedAudit::pending(record(), async move {
                order.lock().unwrap().push("commit sent");
                Ok(())
            })
        };
        go.send(()).expect("the command's task waits");
        commit_detached(staged).await.expect("commit");
        command.await.expect("command task");
        assert_eq!(
            *order.lock().unwrap(),
            ["command written", "commit sent"],
            "the woken task goes first"
        );
    }

    /// A caller dropped before the commit was sent (a hang-up during the yield) still
    /// commits: the command may already have been given its go-ahead.
    #[tokio::test(flavor = "current_thread")]
    async fn a_commit_dropped_before_it_was_sent_still_goes_through() {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let staged = StagedAudit::pending(record(), async move {
            let _ = done_tx.send(());
            Ok(())
        });
        let mut commit = Box::pin(commit_detached(staged));
        // One poll: the commit future is set up and this task yields before sending it.
        let polled = futures::poll!(commit.as_mut());
        assert!(polled.is_pending(), "it yields before the commit");
        drop(commit);
        tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("the commit ran in a task of its own")
            .expect("the commit completed");
    }
}
