//! Publishing what a request committed, without making the caller wait on the bus.
//!
//! The row is the truth once committed, and every message a request publishes (admission,
//! work, operation, status) is re-sent by the scheduler's repair path if it is lost. So the
//! request waits for the publish acknowledgement only a short while: a healthy bus answers in
//! well under it, and a hung or electing NATS node (whose acknowledgement can take the full
//! publish timeout, seconds) costs the client at most this bound. The publish itself is not
//! cancelled: it goes on in the background and, if it still fails, repair covers it.

use std::future::Future;
use std::time::Duration;

use differently_bus::{BusError, Published};

/// Longest a request waits for one batch of publish acknowledgements.
pub const PUBLISH_BOUND: Duration = Duration::from_millis(250);

/// Publishes `publishes` concurrently, waiting for them at most [`PUBLISH_BOUND`] in all.
/// `what` names each for the logs (with the sandbox); failures and overruns are logged and
/// counted in `differently_request_publishes_total{what,outcome}` (`stored`, `duplicate`,
/// `failed`, `detached`), never returned: the caller's answer is its commit's.
pub async fn publish_bounded<F>(sandbox: &str, publishes: Vec<(&'static str, F)>)
where
    F: Future<Output = Result<Published, BusError>> + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + PUBLISH_BOUND;
    let tasks: Vec<_> = publishes
        .into_iter()
        // With the request's trace context (a task-local), so the message carries it.
        .map(|(what, f)| {
            let ctx = differently_bus::trace::current();
            (
                what,
                tokio::spawn(differently_bus::trace::scope("publish", ctx, f)),
            )
        })
        .collect();
    for (what, task) in tasks {
        let outcome = match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Ok(Published::Stored))) => "stored",
            Ok(Ok(Ok(Published::Duplicate))) => "duplicate",
            Ok(Ok(Err(e))) => {
                tracing::warn!(sandbox, what, error = %e, "publish failed; repair will re-send it");
                "failed"
            }
            Ok(Err(e)) => {
                tracing::warn!(sandbox, what, error = %e, "publish task failed; repair will re-send it");
                "failed"
            }
            // Dropping the handle detaches the task: the publish goes on in the background.
            Err(_) => {
                tracing::info!(
                    sandbox,
                    what,
                    bound_ms = PUBLISH_BOUND.as_millis() as u64,
                    "publish not acknowledged within the request's bound; it continues in the \
                     background and repair covers it"
                );
                "detached"
            }
        };
        metrics::counter!("differently_request_publishes_total", "what" => what, "outcome" => outcome)
            .increment(1);
    }
}

/// A publish future, boxed so publishes of different kinds fit one batch.
pub type BoxedPublish =
    std::pin::Pin<Box<dyn Future<Output = Result<Published, BusError>> + Send + 'static>>;

/// Boxes `f` as a [`BoxedPublish`].
pub fn boxed(
    f: impl Future<Output = Result<Published, BusError>> + Send + 'static,
) -> BoxedPublish {
    Box::pin(f)
}
