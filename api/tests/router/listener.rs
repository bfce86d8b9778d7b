//! The real listener (`differently_api::server::serve`) against raw, slow TCP clients: a
//! client that stalls in its headers or its body does not hold its connection past the
//! configured timeouts. Timeouts of 1 s keep these tests short.

use std::time::{Duration, Instant};

use differently_api::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::api_with;

const TIMEOUT: Duration = Duration::from_secs(1);

/// Serves a fresh API with 1 s header and body timeouts; its address and bootstrap key.
async fn listening() -> (std::net::SocketAddr, String) {
    let api = api_with(Limits {
        direct_placement: false,
        header_read_timeout: TIMEOUT,
        body_read_timeout: TIMEOUT,
        ..Limits::default()
    })
    .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(differently_api::server::serve(
        listener,
        api.router,
        TIMEOUT,
        std::future::pending(),
    ));
    (addr, api.key)
}

/// Everything the server sends until it closes the connection; fails after 5 s.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
        .await
        .expect("the server closed the connection within 5 s")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_client_stalling_in_its_request_line_is_disconnected() {
    let (addr, _) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    stream.write_all(b"GET /v1/sandb").await.unwrap();
    read_to_close(&mut stream).await;
    let held = start.elapsed();
    assert!(
        held >= TIMEOUT - Duration::from_millis(100) && held < TIMEOUT * 3,
        "held for {held:?}"
    );
}

#[tokio::test]
async fn a_client_stalling_in_its_body_gets_408_and_is_disconnected() {
    let (addr, key) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    let head = format!(
        "POST /v1/sandboxes HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"ttl"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut stream).await;
    let held = start.elapsed();
    assert!(held < TIMEOUT * 3, "held for {held:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(answer.contains(r#""requestId""#), "{answer}");
}

/// Under `/opensandbox` the 408 is the facade's `{code, message}`: its SDKs read no other.
#[tokio::test]
async fn a_client_stalling_in_its_body_under_the_opensandbox_facade_gets_its_408() {
    let (addr, key) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /opensandbox/v1/sandboxes HTTP/1.1\r\nhost: test\r\nopen-sandbox-api-key: {key}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"ima"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(v["code"], "DIFFERENTLY::REQUEST_TIMEOUT", "{answer}");
    assert!(v["message"].is_string(), "{answer}");
    assert!(v.get("error").is_none(), "the /v1 envelope: {answer}");
}

#[tokio::test]
async fn a_prompt_client_is_served() {
    let (addr, _) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Sends `head` (a whole request head) and returns the answer up to the close.
async fn answer_to(head: &[u8]) -> String {
    let (addr, _) = listening().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    read_to_close(&mut stream).await
}

#[tokio::test]
async fn a_request_target_over_the_http_layers_64_kib_gets_the_414_envelope() {
    // hyper refuses such a target while parsing, before any route or middleware is asked;
    // the listener still answers with the envelope and its stable code.
    let path = format!("/v1/sandboxes?label={}", "a".repeat(70 * 1024));
    let answer = answer_to(format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 414"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer}"
    );
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(v["error"]["code"], "uri_too_long", "{answer}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("65534"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_request_line_hyper_cannot_parse_gets_the_400_envelope() {
    let answer = answer_to(b"GET /v1/\x01bad HTTP/1.1\r\nhost: test\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(v["error"]["code"], "invalid_argument", "{answer}");
}

#[tokio::test]
async fn a_head_over_the_http_layers_buffer_gets_the_431_envelope() {
    let head = format!(
        "GET /healthz HTTP/1.1\r\nhost: test\r\nx-big: {}\r\n\r\n",
        "b".repeat(512 * 1024)
    );
    let answer = answer_to(head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:.200}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:.200}"));
    assert_eq!(v["error"]["code"], "invalid_argument", "{answer:.200}");
}
