//! Trace context of the work in progress, carried through the bus: whoever handles a request
//! or a consumed envelope runs inside [`scope`], and every envelope published from there
//! carries the same `traceparent`, so one trace id follows a sandbox across processes. Work
//! nobody asked for (sweeps, repairs) starts its own trace with [`new_root`].

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use differently_bus_schema::TraceContext;
use tracing::Instrument;

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// The trace context of the current task, empty outside any [`scope`].
pub fn current() -> TraceContext {
    CURRENT.try_with(Clone::clone).unwrap_or_default()
}

/// A new root trace context with random ids, for work that no request started (the
/// scheduler's sweeps and repairs): what it publishes then carries a trace id of its own.
pub fn new_root() -> TraceContext {
    TraceContext::from_random(rand::random(), rand::random())
}

/// Runs `fut` with `ctx` as the current trace context, inside a `tracing` span named `name`
/// whose `trace_id` field puts the id on every log line written within.
pub async fn scope<F: Future>(name: &'static str, ctx: TraceContext, fut: F) -> F::Output {
    let trace_id = ctx.trace_id().unwrap_or("").to_owned();
    let span = tracing::info_span!("trace", op = name, trace_id = %trace_id);
    CURRENT.scope(ctx, fut.instrument(span)).await
}

/// Records `differently_bus_consume_lag_seconds` for an envelope published at `published_at`
/// (messages from before the field existed are skipped). `stream` is `admit`, `work` or `evt`.
pub fn record_consume_lag(stream: &'static str, published_at: Option<DateTime<Utc>>) {
    let Some(at) = published_at else { return };
    let lag = (Utc::now() - at).to_std().unwrap_or(Duration::ZERO);
    metrics::histogram!("differently_bus_consume_lag_seconds", "stream" => stream)
        .record(lag.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_new_root_is_valid_fresh_and_current_inside_its_scope() {
        let a = new_root();
        let b = new_root();
        let header = a.traceparent.clone().unwrap_or_default();
        assert_eq!(TraceContext::from_header(&header), Some(a.clone()));
        assert_ne!(a.trace_id(), b.trace_id());
        assert_eq!(current(), TraceContext::default());
        let inside = scope("sweep.test", a.clone(), async { current() }).await;
        assert_eq!(inside, a);
    }
}
