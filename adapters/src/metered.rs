//! Adapter call metrics, shared by workers and the API's data-plane calls:
//! `differently_adapter_calls_total{pool,op,outcome}` and
//! `differently_adapter_call_seconds{pool,op}`.
//!
//! Most calls end when their future does ([`metered`]). A download answers with a body
//! stream, so its call is not over until the body is: [`metered_download`] records when the
//! body ends, fails, or is dropped unfinished (`cancelled`, e.g. the client went away).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::{AdapterError, ByteStream, Download};

/// The `outcome` label of a call's result: `ok` or the error kind.
pub fn outcome_label<T>(r: &Result<T, AdapterError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => error_label(e),
    }
}

fn error_label(e: &AdapterError) -> &'static str {
    match e {
        AdapterError::Transient(_) => "transient",
        AdapterError::Permanent(_) => "permanent",
        AdapterError::NotFound => "not_found",
        AdapterError::PathNotFound(_) => "path_not_found",
        AdapterError::Unsupported(_) => "unsupported",
        AdapterError::Unavailable(_) => "unavailable",
    }
}

/// Records one finished call of `op` on `pool` that took `seconds`.
pub fn record<T>(pool: &str, op: &'static str, seconds: f64, r: &Result<T, AdapterError>) {
    record_outcome(pool, op, seconds, outcome_label(r));
}

fn record_outcome(pool: &str, op: &'static str, seconds: f64, outcome: &'static str) {
    metrics::counter!(
        "differently_adapter_calls_total",
        "pool" => pool.to_owned(),
        "op" => op,
        "outcome" => outcome,
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

/// Awaits a download `call` on `pool` (op `download`). A refused call is recorded at once;
/// an answered one when its body has been read to the end (`ok`), fails (the error kind) or
/// is dropped before the end (`cancelled`), with the latency up to then.
pub async fn metered_download(
    pool: &str,
    call: impl Future<Output = Result<Download, AdapterError>>,
) -> Result<Download, AdapterError> {
    let started = Instant::now();
    match call.await {
        Ok(d) => Ok(Download {
            total_size: d.total_size,
            body: MeteredBody {
                inner: d.body,
                pool: pool.to_owned(),
                started,
                done: false,
            }
            .boxed(),
        }),
        Err(e) => {
            record_outcome(
                pool,
                "download",
                started.elapsed().as_secs_f64(),
                error_label(&e),
            );
            Err(e)
        }
    }
}

/// A download body that records its call once, at its end.
struct MeteredBody {
    inner: ByteStream,
    pool: String,
    started: Instant,
    done: bool,
}

impl MeteredBody {
    fn finish(&mut self, outcome: &'static str) {
        if !self.done {
            self.done = true;
            let seconds = self.started.elapsed().as_secs_f64();
            record_outcome(&self.pool, "download", seconds, outcome);
        }
    }
}

impl Stream for MeteredBody {
    type Item = Result<Bytes, AdapterError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.inner.poll_next_unpin(cx);
        match &item {
            Poll::Ready(None) => self.finish("ok"),
            Poll::Ready(Some(Err(e))) => {
                let label = error_label(e);
                self.finish(label)
            }
            _ => {}
        }
        item
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        self.finish("cancelled");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::Waker;

    use metrics::{
        Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
        SharedString, Unit,
    };

    use super::*;

    /// Counter increments as `name{label=value,…}` lines.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    struct Handle(Key, Seen);

    impl CounterFn for Handle {
        fn increment(&self, _: u64) {
            let labels: Vec<String> = self
                .0
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let line = format!("{}{{{}}}", self.0.name(), labels.join(","));
            self.1 .0.lock().unwrap().push(line);
        }
        fn absolute(&self, _: u64) {}
    }

    impl HistogramFn for Handle {
        fn record(&self, _: f64) {}
    }

    impl Recorder for Seen {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            Counter::from_arc(Arc::new(Handle(key.clone(), self.clone())))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::from_arc(Arc::new(Handle(key.clone(), self.clone())))
        }
    }

    /// Polls a future that is ready without waiting (every one here is).
    fn now<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("not ready"),
        }
    }

    fn download(chunks: Vec<Result<Bytes, AdapterError>>) -> Download {
        Download {
            total_size: None,
            body: futures::stream::iter(chunks).boxed(),
        }
    }

    fn line(outcome: &str) -> String {
        format!("differently_adapter_calls_total{{pool=p,op=download,outcome={outcome}}}")
    }

    #[test]
    fn a_download_is_recorded_once_when_its_body_ends() {
        let seen = Seen::default();
        metrics::with_local_recorder(&seen, || {
            // Read to the end: ok, once, and only then.
            let d = now(metered_download("p", async {
                Ok(download(vec![Ok(Bytes::from_static(b"ab"))]))
            }))
            .unwrap();
            let mut body = d.body;
            assert!(now(body.next()).is_some());
            assert!(seen.0.lock().unwrap().is_empty(), "not over yet");
            assert!(now(body.next()).is_none());
            drop(body);
            // Dropped half-read: cancelled.
            let d = now(metered_download("p", async {
                Ok(download(vec![
                    Ok(Bytes::from_static(b"a")),
                    Ok(Bytes::new()),
                ]))
            }))
            .unwrap();
            let mut body = d.body;
            assert!(now(body.next()).is_some());
            drop(body);
            // Failing mid-body: the error kind.
            let d = now(metered_download("p", async {
                Ok(download(vec![Err(AdapterError::Transient("cut".into()))]))
            }))
            .unwrap();
            let mut body = d.body;
            assert!(now(body.next()).is_some_and(|r| r.is_err()));
            drop(body);
            // Refused outright.
            let r = now(metered_download("p", async { Err(AdapterError::NotFound) }));
            assert!(r.is_err());
        });
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec![
                line("ok"),
                line("cancelled"),
                line("transient"),
                line("not_found")
            ]
        );
    }
}
