//! The API's listener: HTTP/1 connections served by hyper with a header read timeout.
//! `axum::serve` gives hyper no timer, so a client that opens a connection and sends half a
//! request line holds it for ever; here every connection must deliver its request headers
//! within `header_read_timeout` or is closed. (The body's deadline is `middleware::guard`'s.)
//! What hyper answers itself to a head it cannot parse is made the envelope by
//! `bare_errors`.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::bare_errors::EnvelopeBareErrors;

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
            app.clone().oneshot(req.map(Body::new))
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
