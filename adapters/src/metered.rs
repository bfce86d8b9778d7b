//! Adapter call metrics, shared by workers and the API's data-plane calls:
//! `differently_adapter_calls_total{pool,op,outcome}` and
//! `differently_adapter_call_seconds{pool,op}`.

use std::future::Future;
use std::time::Instant;

use crate::AdapterError;

/// The `outcome` label of a call's result: `ok` or the error kind.
pub fn outcome_label<T>(r: &Result<T, AdapterError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(AdapterError::Transient(_)) => "transient",
        Err(AdapterError::Permanent(_)) => "permanent",
        Err(AdapterError::NotFound) => "not_found",
        Err(AdapterError::PathNotFound(_)) => "path_not_found",
        Err(AdapterError::Unsupported(_)) => "unsupported",
        Err(AdapterError::Unavailable(_)) => "unavailable",
    }
}

/// Records one finished call of `op` on `pool` that took `seconds`.
pub fn record<T>(pool: &str, op: &'static str, seconds: f64, r: &Result<T, AdapterError>) {
    metrics::counter!(
        "differently_adapter_calls_total",
        "pool" => pool.to_owned(),
        "op" => op,
        "outcome" => outcome_label(r),
    )
    .increment(1);
    metrics::histogram!("differently_adapter_call_seconds", "pool" => pool.to_owned(), "op" => op)
        .record(seconds);
}

/// Awaits `call` (an adapter call of `op` on `pool`) and records its outcome and latency.
pub async fn metered<T>(
    pool: &str,
    op: &'static str,
    call: impl Future<Output = Result<T, AdapterError>>,
) -> Result<T, AdapterError> {
    let started = Instant::now();
    let out = call.await;
    record(pool, op, started.elapsed().as_secs_f64(), &out);
    out
}
