//! A client that reuses its connections (as the SDKs' pools do) and sends a body the server
//! refuses before reading it: the real listener either reads the rest of the body and keeps
//! the connection, or says `Connection: close` before closing it. Never a silent close, which
//! the SDKs see as "Server disconnected" on their next request.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::api;

/// A well-formed sandbox id no sandbox has.
const MISSING: &str = "sbx_00000000000000000000000000";

/// Serves a fresh API on the real listener; its address and bootstrap key.
async fn listening() -> (std::net::SocketAddr, String) {
    let api = api().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(differently_api::server::serve(
        listener,
        api.router,
        Duration::from_secs(30),
        std::future::pending(),
    ));
    (addr, api.key)
}

/// One answer read off `stream`: its head (lower-cased) and body. `None` when the server
/// closed or reset the connection first. Fails after 30 s.
async fn read_answer(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().expect("a numeric content-length"))
            .expect("answers here carry a content-length");
        let mut body = buf[head_end..].to_vec();
        while body.len() < length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        Some((head, body))
    })
    .await
    .expect("an answer or a close within 30 s")
}

fn says_close(head: &str) -> bool {
    head.lines()
        .filter_map(|l| l.strip_prefix("connection:"))
        .any(|v| v.split(',').any(|t| t.trim() == "close"))
}

/// Sends `first` (a whole request, whose body the server refuses unread) and expects `status`;
/// then, unless that answer said `Connection: close`, a second request on the same connection
/// must be answered. Returns whether the connection was kept.
async fn refused_then_reused(first: &[u8], status: u16) -> bool {
    let (addr, _) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(first).await.unwrap();
    let (head, body) = read_answer(&mut stream)
        .await
        .expect("the refused request is answered");
    assert!(
        head.starts_with(&format!("http/1.1 {status}")),
        "{head}{}",
        String::from_utf8_lossy(&body)
    );
    if says_close(&head) {
        return false;
    }
    assert_reused(&mut stream, &head).await;
    true
}

/// A second request on `stream`, after an answer (`head`) that did not say it closes, is
/// answered.
async fn assert_reused(stream: &mut TcpStream, head: &str) {
    let sent = stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
        .await;
    let second = match sent {
        Ok(()) => read_answer(stream).await,
        Err(_) => None,
    };
    let (head2, _) = second.unwrap_or_else(|| {
        panic!("the connection was dropped after an answer without `connection: close`: {head}")
    });
    assert!(head2.starts_with("http/1.1 200"), "{head2}");
}

fn post_sandboxes_unauthenticated(body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// A JSON body of about `n` bytes.
fn json_body(n: usize) -> Vec<u8> {
    format!(r#"{{"labels":{{"pad":"{}"}}}}"#, "x".repeat(n)).into_bytes()
}

#[tokio::test]
async fn a_401_to_a_post_with_a_body_keeps_the_connection_usable() {
    // Larger than what hyper has buffered when the body is dropped, smaller than the drain
    // bound: the rest is read and the connection kept.
    let kept =
        refused_then_reused(&post_sandboxes_unauthenticated(&json_body(40 * 1024)), 401).await;
    assert!(kept, "a body under the drain bound keeps the connection");
}

#[tokio::test]
async fn a_401_to_a_chunked_post_keeps_the_connection_usable() {
    let chunk = json_body(20 * 1024);
    let mut req =
        b"POST /v1/sandboxes HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\n\r\n"
            .to_vec();
    for piece in chunk.chunks(4096) {
        req.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
        req.extend_from_slice(piece);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    assert!(refused_then_reused(&req, 401).await);
}

#[tokio::test]
async fn a_404_to_an_upload_keeps_the_connection_usable_or_says_close() {
    let (addr, key) = listening().await;
    let body = vec![b'z'; 30 * 1024];
    let mut req = format!(
        "PUT /v1/sandboxes/{MISSING}/files?path=/tmp/x HTTP/1.1\r\nhost: test\r\n\
         authorization: Bearer {key}\r\ncontent-type: application/octet-stream\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&req).await.unwrap();
    let (head, body) = read_answer(&mut stream).await.expect("answered");
    assert!(
        head.starts_with("http/1.1 404"),
        "{head}{}",
        String::from_utf8_lossy(&body)
    );
    if !says_close(&head) {
        assert_reused(&mut stream, &head).await;
    }
}

#[tokio::test]
async fn a_refused_body_over_the_drain_bound_is_answered_with_connection_close() {
    // Only part of a 1 MiB body is sent: the server must not wait for the rest, and must say
    // it is closing.
    let (addr, _) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut req =
        b"POST /v1/sandboxes HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
                    content-length: 1048576\r\n\r\n"
            .to_vec();
    req.extend_from_slice(&[b' '; 16 * 1024]);
    stream.write_all(&req).await.unwrap();
    let (head, _) = read_answer(&mut stream).await.expect("answered");
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(says_close(&head), "{head}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the server closes the connection it said it would"
    );
}
