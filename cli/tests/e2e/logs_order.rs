//! `differently sandbox logs -f` against a stand-in `/v1/events` that sends one sandbox's
//! changes out of order across a resume, as the real stream can (docs/events.md "Order"):
//! a change older than one already printed, or the same one again, is not printed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{binary, Proc};

/// One `event: status` of sandbox `sbx_a` at stream sequence `seq`.
fn status(seq: u64, version: u64, status: &str) -> String {
    let data = json!({ "sandboxId": "sbx_a", "orgId": "org_a", "projectId": "prj_a",
        "status": status, "statusReason": null, "pool": "fake", "statusVersion": version,
        "at": "2026-01-01T00:00:00Z" });
    format!("id: {seq}\nevent: status\ndata: {data}\n\n")
}

/// Reads a request's head; its `last-event-id`, if any.
fn request(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).expect("request") == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("last-event-id")
            .then(|| value.trim().to_owned())
    })
}

fn answer(conn: &mut TcpStream, events: &[String]) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    conn.write_all(head.as_bytes()).expect("answer");
    for e in events {
        conn.write_all(e.as_bytes()).expect("event");
        conn.flush().expect("flush");
    }
}

#[test]
fn a_followed_log_never_goes_back_to_an_older_status() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let server = std::thread::spawn(move || {
        // The first connection: `running` (version 3) before the `provisioning` (2) it
        // followed, then the connection drops.
        let (mut first, _) = listener.accept().expect("first connection");
        let resumed_at = request(&mut first);
        answer(
            &mut first,
            &[
                status(1, 1, "queued"),
                status(2, 3, "running"),
                status(3, 2, "provisioning"),
            ],
        );
        drop(first);
        // The resume: the same change again, then a newer one; held open (the follower
        // goes on following).
        let (mut second, _) = listener.accept().expect("the resume");
        let resumed = request(&mut second);
        answer(
            &mut second,
            &[status(4, 3, "running"), status(5, 4, "terminating")],
        );
        second
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let _ = second.read(&mut [0u8; 1]); // until the follower is gone
        (resumed_at, resumed)
    });
    let mut cmd = Command::new(binary());
    cmd.args(["sandbox", "logs", "sbx_a", "-f", "-o", "json"])
        .env("DIFFERENTLY_URL", &url)
        .env("DIFFERENTLY_API_KEY", "dly_key_test")
        .env("DIFFERENTLY_CLIENT_CONFIG", "/nonexistent")
        .env_remove("DIFFERENTLY_PROFILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Proc {
        child: cmd.spawn().expect("run differently"),
    };
    let out = child.child.stdout.take().expect("stdout");
    let shown: Vec<(u64, u64, String)> = BufReader::new(out)
        .lines()
        .take(3)
        .map(|l| {
            let e: Value = serde_json::from_str(&l.expect("a line")).expect("JSON");
            let status = e["status"].as_str().unwrap_or_default().to_owned();
            (
                e["id"].as_u64().unwrap(),
                e["statusVersion"].as_u64().unwrap(),
                status,
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (1, 1, "queued".to_owned()),
            (2, 3, "running".to_owned()),
            (5, 4, "terminating".to_owned())
        ],
        "the late provisioning (3) and the repeated running (4) are not printed"
    );
    drop(child);
    let (first, resumed) = server.join().expect("the stand-in server");
    assert_eq!(
        first.as_deref(),
        Some("0"),
        "logs start at the stream's start"
    );
    assert_eq!(
        resumed.as_deref(),
        Some("3"),
        "the resume is after the last event read, printed or not"
    );
}
