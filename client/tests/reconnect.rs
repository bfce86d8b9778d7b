//! The events stream resumes by itself after a dropped connection, sending the last id it
//! handed out as `Last-Event-ID`. The real API cannot be made to drop a stream on cue (and
//! `differently dev` loses its events on a restart), so a loopback listener plays the server:
//! it answers two events and closes, then checks the resume header and answers the third.

use std::time::Duration;

use differently_client::events::EventFilter;
use differently_client::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn event(id: u64, status: &str) -> String {
    format!(
        "id: {id}\nevent: status\ndata: {{\"sandboxId\":\"sbx_1\",\"orgId\":\"org_1\",\"projectId\":\"prj_1\",\
         \"status\":\"{status}\",\"statusReason\":null,\"pool\":\"p\",\"statusVersion\":{id},\"at\":\"t\"}}\n\n"
    )
}

/// Reads one request's head; its lines, lower-cased.
async fn head(s: &mut tokio::net::TcpStream) -> Vec<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).await.expect("read");
        assert!(n > 0, "the client closed before its request ended");
        buf.extend_from_slice(&b[..n]);
    }
    String::from_utf8_lossy(&buf)
        .lines()
        .map(str::to_lowercase)
        .collect()
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

#[tokio::test]
async fn a_dropped_stream_resumes_after_the_last_event() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("first connection");
        let first = head(&mut s).await;
        assert!(
            first[0].starts_with("get /v1/events?sandboxid=sbx_1 "),
            "{first:?}"
        );
        assert!(first.iter().any(|l| l == "last-event-id: 0"), "{first:?}");
        assert!(
            first
                .iter()
                .any(|l| l.starts_with("authorization: bearer ")),
            "{first:?}"
        );
        let body = format!(
            "{SSE_HEAD}: ping\n\n{}{}",
            event(1, "provisioning"),
            event(2, "running")
        );
        s.write_all(body.as_bytes()).await.expect("write");
        drop(s); // the drop
        let (mut s, _) = listener.accept().await.expect("the reconnect");
        let second = head(&mut s).await;
        assert!(second.iter().any(|l| l == "last-event-id: 2"), "{second:?}");
        let body = format!("{SSE_HEAD}{}", event(3, "terminating"));
        s.write_all(body.as_bytes()).await.expect("write");
        // Held open: the client must not need the end of the body to hand out event 3.
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let c = Client::new(&url, "dly_key_test").expect("client");
    let mut events = c
        .events(EventFilter {
            sandbox_id: Some("sbx_1".into()),
            after: Some(0),
            ..EventFilter::default()
        })
        .await
        .expect("open");
    let mut got = Vec::new();
    for _ in 0..3 {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("event");
        got.push((ev.id, ev.event.status));
    }
    assert_eq!(
        got,
        [
            (1, "provisioning".to_owned()),
            (2, "running".to_owned()),
            (3, "terminating".to_owned())
        ]
    );
    assert_eq!(events.last_event_id(), Some(3));
    server.abort();
}
