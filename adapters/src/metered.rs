//! Adapter call metrics: `differently_adapter_calls_total{pool,op,outcome}` and
//! `differently_adapter_call_seconds{pool,op}`, `op` being the contract method's name.
//!
//! [`Metered`] wraps a pool's adapter (the registry applies it to every pool it builds), so
//! every call is counted once whoever makes it: workers, the API's data plane, the
//! scheduler's sweeps and reconciler. Most calls end when their future does ([`metered`]). A
//! download answers with a body stream, so its call is not over until the body is:
//! [`metered_download`] records when the body ends, fails, or is dropped unfinished
//! (`cancelled`, e.g. the client went away).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

use crate::go_ahead::GoAhead;
use crate::{
    Adapter, AdapterError, ByteRange, ByteStream, CreateInstance, Download, Endpoint, ExecEvent,
    ExecExit, FileEntry, Instance, InstanceRef, PtyInput, PtyRequest, SnapshotInfo,
};

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
        AdapterError::Capacity(_) => "capacity",
        AdapterError::BadPath(_) => "bad_path",
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
pub(crate) async fn metered<T>(
    pool: &str,
    op: &'static str,
    call: impl Future<Output = Result<T, AdapterError>>,
) -> Result<T, AdapterError> {
    let started = Instant::now();
    let out = call.await;
    record(pool, op, started.elapsed().as_secs_f64(), &out);
    out
}

/// Awaits a download `call` of `op` on `pool`. A refused call is recorded at once;
/// an answered one when its body has been read to the end (`ok`), fails (the error kind) or
/// is dropped before the end (`cancelled`), with the latency up to then.
pub(crate) async fn metered_download(
    pool: &str,
    op: &'static str,
    call: impl Future<Output = Result<Download, AdapterError>>,
) -> Result<Download, AdapterError> {
    let started = Instant::now();
    match call.await {
        Ok(d) => Ok(Download {
            total_size: d.total_size,
            body: MeteredBody {
                inner: d.body,
                pool: pool.to_owned(),
                op,
                started,
                done: false,
            }
            .boxed(),
        }),
        Err(e) => {
            record_outcome(pool, op, started.elapsed().as_secs_f64(), error_label(&e));
            Err(e)
        }
    }
}

/// A download body that records its call once, at its end.
struct MeteredBody {
    inner: ByteStream,
    pool: String,
    op: &'static str,
    started: Instant,
    done: bool,
}

impl MeteredBody {
    fn finish(&mut self, outcome: &'static str) {
        if !self.done {
            self.done = true;
            let seconds = self.started.elapsed().as_secs_f64();
            record_outcome(&self.pool, self.op, seconds, outcome);
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

/// An adapter whose every call is metered under its pool's name. Calls pass through
/// unchanged; only `kind` and `capabilities` (no backend call) are not counted.
pub struct Metered<A: ?Sized = dyn Adapter> {
    pool: String,
    inner: Arc<A>,
}

impl<A: ?Sized> Metered<A> {
    /// Meters `inner`'s calls as calls on `pool`.
    pub fn new(pool: impl Into<String>, inner: Arc<A>) -> Self {
        Metered {
            pool: pool.into(),
            inner,
        }
    }
}

/// Writes `Metered`'s `Adapter` impl: the calls that reach no backend pass through, and
/// every other is `wrap(pool, op, inner.call(args))`, one line each, so a new contract
/// method is metered by adding its line (the compiler refuses the impl until it is).
macro_rules! metered_adapter {
    (
        pass { $(fn $pass:ident() -> $pass_ret:ty;)* }
        metered { $($wrap:ident $op:literal => fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)* }
    ) => {
        #[async_trait]
        impl<A: Adapter + ?Sized> Adapter for Metered<A> {
            $(
                fn $pass(&self) -> $pass_ret {
                    self.inner.$pass()
                }
            )*
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret, AdapterError> {
                    $wrap(&self.pool, $op, self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
}

metered_adapter! {
    pass {
        fn kind() -> &'static str;
        fn capabilities() -> Vec<crate::Capability>;
        fn exec_fidelity() -> crate::ExecFidelity;
        fn snapshot_timeout() -> Duration;
        fn backend_version() -> Option<String>;
        fn verification() -> crate::Verification;
        fn claim_call() -> bool;
    }
    metered {
        metered "create" => fn create(req: &CreateInstance) -> Instance;
        metered "delete" => fn delete(sandbox_id: &SandboxId) -> ();
        metered "find" => fn find(sandbox_id: &SandboxId) -> Option<Instance>;
        metered "list" => fn list(installation: &InstallationId) -> Vec<Instance>;
        metered "exec" => fn exec(at: &InstanceRef, req: &ExecRequest) -> ExecResult;
        metered "health" => fn health() -> ();
        metered "exec_stream" => fn exec_stream(
            at: &InstanceRef, req: &ExecRequest, out: mpsc::Sender<ExecEvent>
        ) -> ExecExit;
        metered "exec_stream" => fn exec_stream_after(
            at: &InstanceRef, req: &ExecRequest, out: mpsc::Sender<ExecEvent>, go: GoAhead
        ) -> ExecExit;
        metered "pty" => fn pty(
            at: &InstanceRef, req: &PtyRequest, input: mpsc::Receiver<PtyInput>, out: mpsc::Sender<Bytes>
        ) -> ExecExit;
        metered "process" => fn process(
            at: &InstanceRef, spec: &crate::process::ProcessSpec,
            input: mpsc::Receiver<crate::process::ProcessInput>, out: mpsc::Sender<ExecEvent>,
            go: GoAhead
        ) -> ExecExit;
        metered "upload" => fn upload(
            at: &InstanceRef, path: &str, mode: Option<u32>, body: ByteStream
        ) -> ();
        metered_download "download" => fn download(
            at: &InstanceRef, path: &str, range: Option<ByteRange>
        ) -> Download;
        metered "list_files" => fn list_files(at: &InstanceRef, path: &str, depth: u32) -> Vec<FileEntry>;
        metered "delete_file" => fn delete_file(at: &InstanceRef, path: &str) -> ();
        metered "make_dir" => fn make_dir(at: &InstanceRef, path: &str, mode: Option<u32>) -> bool;
        metered "pause" => fn pause(at: &InstanceRef) -> ();
        metered "resume" => fn resume(at: &InstanceRef) -> ();
        metered "stop" => fn stop(at: &InstanceRef) -> ();
        metered "start" => fn start(at: &InstanceRef) -> ();
        metered "snapshot" => fn snapshot(at: &InstanceRef, snapshot_id: &str) -> SnapshotInfo;
        metered "delete_snapshot" => fn delete_snapshot(backend_ref: &str) -> ();
        metered "expose_port" => fn expose_port(
            at: &InstanceRef, port: u16, expires: Option<Duration>
        ) -> Endpoint;
        metered "renew" => fn renew(at: &InstanceRef, ttl: Duration) -> ();
        metered "claim" => fn claim(at: &InstanceRef, ttl_seconds: u64) -> ();
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
            let d = now(metered_download("p", "download", async {
                Ok(download(vec![Ok(Bytes::from_static(b"ab"))]))
            }))
            .unwrap();
            let mut body = d.body;
            assert!(now(body.next()).is_some());
            assert!(seen.0.lock().unwrap().is_empty(), "not over yet");
            assert!(now(body.next()).is_none());
            drop(body);
            // Dropped half-read: cancelled.
            let d = now(metered_download("p", "download", async {
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
            let d = now(metered_download("p", "download", async {
                Ok(download(vec![Err(AdapterError::transient("cut"))]))
            }))
            .unwrap();
            let mut body = d.body;
            assert!(now(body.next()).is_some_and(|r| r.is_err()));
            drop(body);
            // Refused outright.
            let r = now(metered_download("p", "download", async {
                Err(AdapterError::NotFound)
            }));
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

    /// An adapter whose required calls answer at once: `find` finds nothing, `list` fails.
    struct Stub;

    #[async_trait]
    impl Adapter for Stub {
        fn kind(&self) -> &'static str {
            "stub"
        }
        fn capabilities(&self) -> Vec<crate::Capability> {
            Vec::new()
        }
        async fn create(&self, _: &CreateInstance) -> Result<Instance, AdapterError> {
            Err(AdapterError::permanent("no"))
        }
        async fn delete(&self, _: &SandboxId) -> Result<(), AdapterError> {
            Ok(())
        }
        async fn find(&self, _: &SandboxId) -> Result<Option<Instance>, AdapterError> {
            Ok(None)
        }
        async fn list(&self, _: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
            Err(AdapterError::unavailable("down"))
        }
        async fn exec(&self, _: &InstanceRef, _: &ExecRequest) -> Result<ExecResult, AdapterError> {
            Err(AdapterError::NotFound)
        }
        async fn health(&self) -> Result<(), AdapterError> {
            Ok(())
        }
    }

    #[test]
    fn the_wrapper_meters_every_call_under_its_pool() {
        let seen = Seen::default();
        let a = Metered::new("p", Arc::new(Stub) as Arc<dyn Adapter>);
        let id = SandboxId::new();
        let at = InstanceRef {
            sandbox_id: id.clone(),
            backend_ref: "b".into(),
        };
        metrics::with_local_recorder(&seen, || {
            assert_eq!(a.kind(), "stub");
            assert!(now(a.find(&id)).is_ok());
            assert!(now(a.list(&InstallationId::new())).is_err());
            assert!(now(a.delete(&id)).is_ok());
            assert!(
                now(a.pause(&at)).is_err(),
                "the default answers unsupported"
            );
            assert!(now(a.download(&at, "/f", None)).is_err());
        });
        let call = |op: &str, outcome: &str| {
            format!("differently_adapter_calls_total{{pool=p,op={op},outcome={outcome}}}")
        };
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec![
                call("find", "ok"),
                call("list", "unavailable"),
                call("delete", "ok"),
                call("pause", "unsupported"),
                call("download", "unsupported"),
            ]
        );
    }
}
