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
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use differently_core::exec::{ExecRequest, ExecResult};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;

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

/// Awaits a download `call` on `pool` (op `download`). A refused call is recorded at once;
/// an answered one when its body has been read to the end (`ok`), fails (the error kind) or
/// is dropped before the end (`cancelled`), with the latency up to then.
pub(crate) async fn metered_download(
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

#[async_trait]
impl<A: Adapter + ?Sized> Adapter for Metered<A> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn capabilities(&self) -> Vec<crate::Capability> {
        self.inner.capabilities()
    }

    fn exec_fidelity(&self) -> crate::ExecFidelity {
        self.inner.exec_fidelity()
    }

    fn snapshot_timeout(&self) -> std::time::Duration {
        self.inner.snapshot_timeout()
    }

    fn backend_version(&self) -> Option<String> {
        self.inner.backend_version()
    }

    fn verification(&self) -> crate::Verification {
        self.inner.verification()
    }

    async fn create(&self, req: &CreateInstance) -> Result<Instance, AdapterError> {
        metered(&self.pool, "create", self.inner.create(req)).await
    }

    async fn delete(&self, sandbox_id: &SandboxId) -> Result<(), AdapterError> {
        metered(&self.pool, "delete", self.inner.delete(sandbox_id)).await
    }

    async fn find(&self, sandbox_id: &SandboxId) -> Result<Option<Instance>, AdapterError> {
        metered(&self.pool, "find", self.inner.find(sandbox_id)).await
    }

    async fn list(&self, installation: &InstallationId) -> Result<Vec<Instance>, AdapterError> {
        metered(&self.pool, "list", self.inner.list(installation)).await
    }

    async fn exec(&self, at: &InstanceRef, req: &ExecRequest) -> Result<ExecResult, AdapterError> {
        metered(&self.pool, "exec", self.inner.exec(at, req)).await
    }

    async fn health(&self) -> Result<(), AdapterError> {
        metered(&self.pool, "health", self.inner.health()).await
    }

    async fn exec_stream(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
    ) -> Result<ExecExit, AdapterError> {
        metered(
            &self.pool,
            "exec_stream",
            self.inner.exec_stream(at, req, out),
        )
        .await
    }

    async fn exec_stream_after(
        &self,
        at: &InstanceRef,
        req: &ExecRequest,
        out: mpsc::Sender<ExecEvent>,
        go: crate::go_ahead::GoAhead,
    ) -> Result<ExecExit, AdapterError> {
        metered(
            &self.pool,
            "exec_stream",
            self.inner.exec_stream_after(at, req, out, go),
        )
        .await
    }

    async fn pty(
        &self,
        at: &InstanceRef,
        req: &PtyRequest,
        input: mpsc::Receiver<PtyInput>,
        out: mpsc::Sender<Bytes>,
    ) -> Result<ExecExit, AdapterError> {
        metered(&self.pool, "pty", self.inner.pty(at, req, input, out)).await
    }

    async fn upload(
        &self,
        at: &InstanceRef,
        path: &str,
        mode: Option<u32>,
        body: ByteStream,
    ) -> Result<(), AdapterError> {
        metered(
            &self.pool,
            "upload",
            self.inner.upload(at, path, mode, body),
        )
        .await
    }

    async fn download(
        &self,
        at: &InstanceRef,
        path: &str,
        range: Option<ByteRange>,
    ) -> Result<Download, AdapterError> {
        metered_download(&self.pool, self.inner.download(at, path, range)).await
    }

    async fn list_files(
        &self,
        at: &InstanceRef,
        path: &str,
        depth: u32,
    ) -> Result<Vec<FileEntry>, AdapterError> {
        metered(
            &self.pool,
            "list_files",
            self.inner.list_files(at, path, depth),
        )
        .await
    }

    async fn delete_file(&self, at: &InstanceRef, path: &str) -> Result<(), AdapterError> {
        metered(&self.pool, "delete_file", self.inner.delete_file(at, path)).await
    }

    async fn pause(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        metered(&self.pool, "pause", self.inner.pause(at)).await
    }

    async fn resume(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        metered(&self.pool, "resume", self.inner.resume(at)).await
    }

    async fn stop(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        metered(&self.pool, "stop", self.inner.stop(at)).await
    }

    async fn start(&self, at: &InstanceRef) -> Result<(), AdapterError> {
        metered(&self.pool, "start", self.inner.start(at)).await
    }

    async fn snapshot(
        &self,
        at: &InstanceRef,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, AdapterError> {
        metered(&self.pool, "snapshot", self.inner.snapshot(at, snapshot_id)).await
    }

    async fn delete_snapshot(&self, backend_ref: &str) -> Result<(), AdapterError> {
        metered(
            &self.pool,
            "delete_snapshot",
            self.inner.delete_snapshot(backend_ref),
        )
        .await
    }

    async fn expose_port(
        &self,
        at: &InstanceRef,
        port: u16,
        expires: Option<std::time::Duration>,
    ) -> Result<Endpoint, AdapterError> {
        metered(
            &self.pool,
            "expose_port",
            self.inner.expose_port(at, port, expires),
        )
        .await
    }

    async fn renew(&self, at: &InstanceRef, ttl: std::time::Duration) -> Result<(), AdapterError> {
        metered(&self.pool, "renew", self.inner.renew(at, ttl)).await
    }

    fn claim_call(&self) -> bool {
        self.inner.claim_call()
    }

    async fn claim(&self, at: &InstanceRef, ttl_seconds: u64) -> Result<(), AdapterError> {
        metered(&self.pool, "claim", self.inner.claim(at, ttl_seconds)).await
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
                Ok(download(vec![Err(AdapterError::transient("cut"))]))
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
