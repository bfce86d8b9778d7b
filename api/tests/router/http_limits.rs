//! The HTTP layer's own limits docs/api.md states, on the real listener: more than 100 header
//! fields is the 431 envelope.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::api;

/// The answer to `head` on a fresh listener, up to the close.
async fn answer_to(head: &[u8]) -> String {
    let api = api().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(differently_api::server::serve(
        listener,
        api.router,
        Duration::from_secs(30),
        std::future::pending(),
    ));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out))
        .await
        .expect("the server closed the connection within 30 s")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

fn headers(n: usize) -> String {
    let mut head = String::from("GET /healthz HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for i in 0..n {
        head.push_str(&format!("x-h{i}: v\r\n"));
    }
    head.push_str("\r\n");
    head
}

#[tokio::test]
async fn more_than_100_header_fields_get_the_431_envelope() {
    // `host` and `connection` are two of the hundred.
    let ok = answer_to(headers(98).as_bytes()).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok:.300}");
    let answer = answer_to(headers(99).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.300}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:.300}"));
    assert_eq!(v["error"]["code"], "invalid_argument", "{answer:.300}");
}
