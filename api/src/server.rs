//! The API's listener: HTTP/1 connections served by hyper with a header read timeout.
//! `axum::serve` gives hyper no timer, so a client that opens a connection and sends half a
//! request line holds it for ever; here every connection must deliver its request headers
//! within `header_read_timeout` or is closed. (The body's deadline is `middleware::guard`'s.)
//! What hyper answers itself to a head it cannot parse is made the envelope by
//! `requests::bare_errors`. A request whose body was refused unread is drained (a little) or answered
//! with `Connection: close` (`unread_body`), so a client that reuses connections is never
//! cut off without being told.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::requests::bare_errors::EnvelopeBareErrors;

/// Turns Nagle's algorithm off for an accepted connection. A streamed body (exec's SSE or
/// frames, the event stream, the facade's execd stream) is many small writes, and with Nagle
/// on each one after the first waited for the client's delayed ACK: a streamed `echo hi`
/// through Differently took 45 ms p50 against 6.5 ms collected (`opensandbox_bench` on the
/// fake server), the 40 ms of Linux's delayed ACK. A failure is logged and the connection
/// served anyway: it is slower, not wrong.
fn no_delay(stream: &tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then lets the open requests finish.
/// Each request carries its peer's `ConnectInfo<SocketAddr>`, as
/// `into_make_service_with_connect_info` would give it.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    // hyper-util's `GracefulShutdown` does not take upgradeable connections (the PTY route's
    // WebSocket), so the same is done here: a stop signal each connection watches, and a
    // channel whose last sender drops when the last connection has finished.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (alive_tx, mut alive_rx) = tokio::sync::mpsc::channel::<()>(1);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        no_delay(&stream);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let app = app.clone();
            async move {
                let (parts, incoming) = req.into_parts();
                let unread = Unread::of(&parts.headers);
                let (body, watch) = WatchedBody::new(incoming);
                let resp = app
                    .oneshot(hyper::Request::from_parts(parts, Body::new(body)))
                    .await?;
                Ok::<_, std::convert::Infallible>(unread.settle(&watch, resp).await)
            }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .serve_connection(TokioIo::new(EnvelopeBareErrors::new(stream)), service)
            // The PTY route is a WebSocket: the connection must let axum take it over.
            .with_upgrades();
        let (mut stop, alive) = (stop_rx.clone(), alive_tx.clone());
        tokio::spawn(async move {
            let _alive = alive;
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    // Every connection task holds a sender: `None` once the last one has finished.
    let _ = alive_rx.recv().await;
    Ok(())
}

/// Most of a refused request's unread body that is read and thrown away to keep its
/// connection open; a longer one is not waited for, the connection is closed instead.
pub const MAX_DRAINED_BODY_BYTES: usize = 64 * 1024;

/// How long the rest of a refused request's body is waited for. Closing is always correct and
/// costs the client one new connection; waiting only holds back the answer.
const DRAIN_WINDOW: Duration = Duration::from_secs(1);

/// What the request head says about the body, for settling an unread one (`unread_body`).
struct Unread {
    /// `Content-Length`, when given.
    length: Option<u64>,
    /// `Expect: 100-continue`: the client has not sent its body and waits to be asked.
    expects_continue: bool,
}

impl Unread {
    fn of(headers: &axum::http::HeaderMap) -> Unread {
        let length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let expects_continue = headers
            .get(header::EXPECT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
        Unread {
            length,
            expects_continue,
        }
    }

    /// `resp`, once the request body it was given is settled. hyper keeps a connection whose
    /// request body was dropped unread only if the rest of it is already buffered; otherwise
    /// it closes the connection after the answer, whose head has already gone out without
    /// `Connection: close` (the handler dropped the body while answering). A client that
    /// reuses connections then fails its next request. So an unread body is read here (at
    /// most `MAX_DRAINED_BODY_BYTES`, within `DRAIN_WINDOW`), and when that is not possible
    /// the answer says `Connection: close`.
    async fn settle(self, watch: &Watch, mut resp: Response) -> Response {
        let Some(rest) = watch.take_unread() else {
            return resp;
        };
        let closing = resp
            .headers()
            .get(header::CONNECTION)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        if closing {
            // A body that timed out, say: nothing more to wait for.
            return resp;
        }
        let small = self
            .length
            .is_some_and(|n| n <= MAX_DRAINED_BODY_BYTES as u64);
        let drained = !self.expects_continue
            && (small || self.length.is_none())
            && matches!(
                tokio::time::timeout(
                    DRAIN_WINDOW,
                    axum::body::to_bytes(Body::new(rest), MAX_DRAINED_BODY_BYTES),
                )
                .await,
                Ok(Ok(_))
            );
        if !drained {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// What became of a request body handed to the router: the body itself when it was dropped
/// before its end.
#[derive(Default)]
struct Watch {
    unread: Mutex<Option<Incoming>>,
}

impl Watch {
    fn take_unread(&self) -> Option<Incoming> {
        self.unread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// The connection's request body as the router sees it. Dropped before its end, it hands the
/// rest back through its `Watch` instead of dropping it (which would make hyper close the
/// connection unannounced).
struct WatchedBody {
    inner: Option<Incoming>,
    watch: Arc<Watch>,
}

impl WatchedBody {
    fn new(inner: Incoming) -> (WatchedBody, Arc<Watch>) {
        let watch = Arc::new(Watch::default());
        let body = WatchedBody {
            inner: Some(inner),
            watch: watch.clone(),
        };
        (body, watch)
    }
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        // Read to its end (a chunked body says so only here) or failed: nothing to settle.
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), http_body::Body::size_hint)
    }
}

impl Drop for WatchedBody {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            if !http_body::Body::is_end_stream(&inner) {
                *self
                    .watch
                    .unread
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_accepted_connection_has_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let client = tokio::net::TcpStream::connect(addr);
        let (accepted, client) = tokio::join!(listener.accept(), client);
        let (stream, _) = accepted.expect("accept");
        let _client = client.expect("connect");
        assert!(
            !stream.nodelay().expect("read TCP_NODELAY"),
            "off by default"
        );
        no_delay(&stream);
        assert!(stream.nodelay().expect("read TCP_NODELAY"));
    }
}
