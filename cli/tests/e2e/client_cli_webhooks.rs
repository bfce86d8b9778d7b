//! `differently webhooks …` and `differently events schemas|credentials|watch --public`, run
//! as a user runs them against a real `differently dev`: a webhook's whole life through the
//! CLI, the API's refusals as exit codes with their stable codes, the secret shown once and
//! never logged, and — with dev allowed to reach loopback over http — a real signed delivery
//! to a receiver in this test, before and after a rotation.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use differently_webhooks::signing::{self, Secret};
use serde_json::Value;

use crate::client_cli_dev::{json, Dev};

/// `text` with every webhook secret replaced, for failure messages: secrets never reach
/// test output.
fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("whsec_") {
        out.push_str(&rest[..at]);
        out.push_str("whsec_<redacted>");
        let tail = &rest[at + "whsec_".len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "+/=".contains(c)))
            .unwrap_or(tail.len());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn redaction_hides_every_secret() {
    assert_eq!(
        redact("a whsec_ab+/c= b\nwhsec_Zz9=\""),
        "a whsec_<redacted> b\nwhsec_<redacted>\""
    );
}

/// A webhook id that is well formed and belongs to nobody.
const NO_SUCH_WEBHOOK: &str = "whk_00000000000000000000000000";

#[test]
fn a_webhook_from_create_to_delete_through_the_cli() {
    let dev = Dev::start();

    // Create: the table shows the webhook, then the secret once, said to be shown once.
    let (code, out, err) = dev.run(&[
        "webhooks",
        "create",
        "https://hooks.example.com/differently",
        "--types",
        "sandbox.status.changed,sandbox.exec.*",
        "--description",
        "ci",
        "-o",
        "table",
    ]);
    assert_eq!((code, err.as_str()), (0, ""), "{}", redact(&out));
    let secret = out
        .lines()
        .find(|l| l.starts_with("whsec_"))
        .unwrap_or_else(|| panic!("no secret line in {}", redact(&out)))
        .to_owned();
    assert_eq!(
        out.matches(&secret).count(),
        1,
        "the secret once: {}",
        redact(&out)
    );
    assert!(out.contains("shown only this once"), "{}", redact(&out));
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("id ").map(str::trim))
        .unwrap_or_else(|| panic!("no id row in {}", redact(&out)))
        .to_owned();
    assert!(id.starts_with("whk_"), "{}", redact(&out));

    // `-o json` is the API's whole answer, secret included.
    let created = dev.json(&["webhooks", "create", "https://hooks.example.com/second"]);
    let second = created["id"].as_str().expect("an id").to_owned();
    assert!(
        created["secret"]
            .as_str()
            .is_some_and(|s| s.starts_with("whsec_")),
        "{}",
        redact(&created.to_string())
    );
    assert_eq!(created["eventTypes"], serde_json::json!([]), "every type");

    // A retry with the same Idempotency-Key creates nothing: 409 naming the first, and its
    // secret is not shown again.
    let args = [
        "webhooks",
        "create",
        "https://hooks.example.com/retried",
        "--idempotency-key",
        "hook-1",
    ];
    let first = dev.json(&args);
    let (code, out, err) = dev.run(&args);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("409 conflict") && err.contains(first["id"].as_str().expect("id")),
        "{err}"
    );
    assert!(!err.contains("whsec_"), "{err}");
    dev.ok(&["webhooks", "delete", first["id"].as_str().expect("id")]);

    // List and get: both webhooks, never a secret.
    let list = dev.json(&["webhooks", "list"]);
    let mut listed: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|w| w["id"].as_str().expect("id"))
        .collect();
    listed.sort_unstable();
    let mut want = vec![id.as_str(), second.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want);
    assert!(
        !list.to_string().contains("whsec_"),
        "{}",
        redact(&list.to_string())
    );
    let ids = dev.ok(&["webhooks", "list", "-o", "id"]);
    assert_eq!(ids.lines().count(), 2, "{ids}");
    let got = dev.json(&["webhooks", "get", &id]);
    assert_eq!(
        (
            got["url"].as_str(),
            got["description"].as_str(),
            got["enabled"].as_bool()
        ),
        (
            Some("https://hooks.example.com/differently"),
            Some("ci"),
            Some(true)
        ),
        "{}",
        redact(&got.to_string())
    );
    assert_eq!(
        got["eventTypes"],
        serde_json::json!(["sandbox.status.changed", "sandbox.exec.*"])
    );
    assert!(got.get("secret").is_none(), "{}", redact(&got.to_string()));

    // Update: URL, filter, description cleared, disabled; nothing to change is a usage error.
    let changed = dev.json(&[
        "webhooks",
        "update",
        &id,
        "--webhook-url",
        "https://hooks.example.com/moved",
        "--types",
        "sandbox.*",
        "--no-description",
        "--disable",
    ]);
    assert_eq!(
        (
            changed["url"].as_str(),
            changed["description"].is_null(),
            changed["enabled"].as_bool()
        ),
        (Some("https://hooks.example.com/moved"), true, Some(false)),
        "{changed}"
    );
    assert_eq!(changed["eventTypes"], serde_json::json!(["sandbox.*"]));
    let again = dev.json(&["webhooks", "update", &id, "--enable", "--all-types"]);
    assert_eq!(
        (again["enabled"].as_bool(), &again["eventTypes"]),
        (Some(true), &serde_json::json!([])),
        "{again}"
    );
    let (code, _, err) = dev.run(&["webhooks", "update", &id]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("nothing to change"), "{err}");

    // Rotate: a new secret, and the old one's overlap.
    let rotated = dev.json(&["webhooks", "rotate-secret", &id]);
    let new_secret = rotated["secret"].as_str().expect("a new secret");
    assert!(new_secret.starts_with("whsec_"), "not a secret");
    assert!(new_secret != secret, "the secret did not change");
    assert!(
        rotated["previousSecretExpiresAt"].is_string(),
        "the old secret overlaps: {}",
        redact(&rotated.to_string())
    );
    // `-o id`: the id on stdout; the secret nowhere, and stderr says so.
    let (code, out, err) = dev.run(&["webhooks", "rotate-secret", &id, "-o", "id"]);
    assert_eq!((code, out.trim()), (0, id.as_str()), "{err}");
    assert!(
        err.contains("not printed") && !err.contains("whsec_"),
        "{err}"
    );

    // Deliveries: none yet (no event happened since); a delivery of nobody's is 404.
    let deliveries = dev.json(&["webhooks", "deliveries", &id]);
    assert_eq!(deliveries["items"], serde_json::json!([]), "{deliveries}");
    let (code, _, err) = dev.run(&[
        "webhooks",
        "redeliver",
        &id,
        "whd_00000000000000000000000000",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404 not_found"), "{err}");

    // Refusals: the URL rules (422 naming the field), and a webhook of nobody's (404).
    // (`dev` allows loopback receivers; private ranges stay refused.)
    let (code, out, err) = dev.run(&["webhooks", "create", "https://10.1.2.3/hook"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("422 validation_failed") && err.contains("(field url)"),
        "{err}"
    );
    assert!(err.contains("private"), "{err}");
    let (code, _, err) = dev.run(&["webhooks", "create", "http://hooks.example.com/plain"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("(field url)"), "http is off by default: {err}");
    let (code, _, err) = dev.run(&[
        "webhooks",
        "create",
        "https://hooks.example.com/x",
        "--types",
        "sandbox.nope",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("(field eventTypes)"), "{err}");
    for args in [
        &["webhooks", "get", NO_SUCH_WEBHOOK][..],
        &["webhooks", "delete", NO_SUCH_WEBHOOK],
        &["webhooks", "rotate-secret", NO_SUCH_WEBHOOK],
        &["webhooks", "deliveries", NO_SUCH_WEBHOOK],
        &["webhooks", "update", NO_SUCH_WEBHOOK, "--disable"],
    ] {
        let (code, out, err) = dev.run(args);
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}: {err}");
        assert!(err.contains("404 not_found"), "{args:?}: {err}");
    }

    // Delete: gone, and a second delete is 404.
    dev.ok(&["webhooks", "delete", &id]);
    let (code, _, err) = dev.run(&["webhooks", "get", &id]);
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");
    let (code, _, _) = dev.run(&["webhooks", "delete", &id]);
    assert_eq!(code, 1);
    dev.ok(&["webhooks", "delete", &second]);
    assert_eq!(
        dev.json(&["webhooks", "list"])["items"],
        serde_json::json!([])
    );

    // No secret reached the server's log.
    let log = std::fs::read_to_string(dev.dir.path().join("dev.log")).expect("dev.log");
    assert!(
        !log.contains(&secret) && !log.contains(new_secret),
        "a webhook secret is in dev.log"
    );
}

#[test]
fn event_schemas_credentials_and_public_events_through_the_cli() {
    let dev = Dev::start();
    // Schemas: a table of every type, the API's document with -o json, one type's schema.
    let table = dev.ok(&["events", "schemas", "-o", "table"]);
    let first = table.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("TYPE") && first.contains("DATA FIELDS"),
        "{table}"
    );
    assert!(
        table.contains("sandbox.status.changed") && table.contains("webhook.disabled"),
        "{table}"
    );
    let all = dev.json(&["events", "schemas"]);
    assert_eq!(all["version"], 1, "{all}");
    assert!(all["envelope"].is_object(), "{all}");
    let types = dev.ok(&["events", "schemas", "-o", "id"]);
    assert_eq!(
        types.lines().count(),
        all["items"].as_array().map_or(0, Vec::len),
        "{types}"
    );
    let one = json(&dev.ok(&["events", "schemas", "sandbox.status.changed"]));
    assert_eq!(one["title"], "sandbox.status.changed", "{one}");
    let (code, _, err) = dev.run(&["events", "schemas", "sandbox.nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");

    // Credentials: dev has no NATS auth callout, so the API's 501 and its code, exit 1.
    for args in [
        &["events", "credentials", "create", "--ttl-seconds", "600"][..],
        &[
            "events",
            "credentials",
            "revoke",
            "evc_01234567890123456789012345",
        ],
    ] {
        let (code, out, err) = dev.run(args);
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}: {err}");
        assert!(
            err.contains("501 unsupported_operation") && err.contains("auth callout"),
            "{args:?}: {err}"
        );
    }

    // Public events: the contract's envelope, narrowed by --types, with each one's seq.
    let sandbox = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let out = dev.ok(&[
        "events",
        "watch",
        "--public",
        "--types",
        "sandbox.status.changed",
        "--sandbox",
        &sandbox,
        "-o",
        "json",
    ]);
    let events: Vec<Value> = out.lines().map(json).collect();
    let statuses: Vec<&str> = events
        .iter()
        .map(|e| e["data"]["status"].as_str().unwrap_or("?"))
        .collect();
    assert!(statuses.contains(&"running"), "{out}");
    for e in &events {
        assert_eq!(
            (
                e["version"].as_u64(),
                e["type"].as_str(),
                e["sandboxId"].as_str()
            ),
            (
                Some(1),
                Some("sandbox.status.changed"),
                Some(sandbox.as_str())
            ),
            "{e}"
        );
        assert!(e["seq"].as_u64().is_some() && e["id"].is_string(), "{e}");
    }
    // The same through `differently events --public` (no subcommand), as a table.
    let table = dev.ok(&["events", "--public", "--sandbox", &sandbox, "-o", "table"]);
    assert!(
        table.starts_with("SEQ") && table.contains("sandbox.status.changed"),
        "{table}"
    );
    // A filter that matches no type is the API's 400 naming `types`; --types needs --public.
    let (code, _, err) = dev.run(&["events", "--public", "--types", "sandbox.nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("400 invalid_argument") && err.contains("(field types)"),
        "{err}"
    );
    let (code, _, err) = dev.run(&["events", "--types", "sandbox.status.changed"]);
    assert_eq!(code, 2, "{err}");
    // Watch flags before another subcommand are refused, not ignored.
    let (code, _, err) = dev.run(&["events", "--after", "3", "schemas"]);
    assert_eq!(code, 2, "{err}");
}

/// One request a receiver got.
pub(crate) struct Received {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// A webhook receiver on 127.0.0.1 answering 200 to every request and handing each one to
/// the test; its URL.
pub(crate) fn receiver() -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone the connection"));
            let mut headers = BTreeMap::new();
            let mut line = String::new();
            // The request line, then headers up to the blank line.
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    headers.insert(k.trim().to_lowercase(), v.trim().to_owned());
                }
            }
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; len];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            if tx.send(Received { headers, body }).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

/// The next request within `within` whose body is an event of `sandbox`.
#[track_caller]
pub(crate) fn next_for(rx: &mpsc::Receiver<Received>, sandbox: &str, within: Duration) -> Received {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no delivery for {sandbox} within {within:?}"));
        let event: Value = serde_json::from_slice(&r.body).expect("a JSON body");
        if event["sandboxId"] == sandbox {
            return r;
        }
    }
}

/// Whether `r`'s signature header verifies with `secret` (as a Standard Webhooks receiver
/// checks it: id, timestamp within five minutes, any `v1` signature).
pub(crate) fn verifies(r: &Received, secret: &str) -> bool {
    let header = |h: &str| r.headers.get(h).map(String::as_str).unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    signing::verify(
        &Secret::parse(secret).expect("a whsec_ secret"),
        header(signing::HEADER_ID),
        header(signing::HEADER_TIMESTAMP),
        header(signing::HEADER_SIGNATURE),
        &r.body,
        now,
    )
    .is_ok()
}

#[test]
fn a_webhook_made_with_the_cli_receives_signed_deliveries() {
    // Loopback over plain http is what the operator switches allow (docs/webhooks.md).
    let dev = Dev::start_with(&[
        ("DIFFERENTLY_WEBHOOKS_ALLOW_PRIVATE", "true"),
        ("DIFFERENTLY_WEBHOOKS_ALLOW_HTTP", "true"),
    ]);
    let (url, rx) = receiver();
    let created = dev.json(&[
        "webhooks",
        "create",
        &url,
        "--types",
        "sandbox.status.changed",
    ]);
    let id = created["id"].as_str().expect("id").to_owned();
    let secret = created["secret"].as_str().expect("secret").to_owned();

    let sandbox = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let first = next_for(&rx, &sandbox, Duration::from_secs(30));
    let event: Value = serde_json::from_slice(&first.body).expect("JSON");
    assert_eq!(event["type"], "sandbox.status.changed", "{event}");
    assert_eq!(
        first.headers.get("webhook-id").map(String::as_str),
        event["id"].as_str(),
        "webhook-id is the event's id"
    );
    assert!(verifies(&first, &secret), "signed with the secret shown");
    assert!(
        !verifies(&first, "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        "not any secret"
    );

    // The log says it succeeded with our 200.
    let deadline = Instant::now() + Duration::from_secs(15);
    let delivered = loop {
        let log = dev.json(&["webhooks", "deliveries", &id]);
        let done = log["items"].as_array().and_then(|items| {
            items
                .iter()
                .find(|d| d["eventId"] == event["id"] && d["status"] == "succeeded")
                .cloned()
        });
        if let Some(d) = done {
            break d;
        }
        assert!(Instant::now() < deadline, "never succeeded: {log}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(delivered["responseCode"], 200, "{delivered}");

    // Redeliver: the same webhook-id arrives again.
    let d = delivered["id"].as_str().expect("delivery id");
    let again = dev.json(&["webhooks", "redeliver", &id, d]);
    assert_eq!(again["status"], "pending", "{again}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = next_for(
            &rx,
            &sandbox,
            deadline.saturating_duration_since(Instant::now()),
        );
        if r.headers.get("webhook-id") == first.headers.get("webhook-id") {
            assert!(verifies(&r, &secret));
            break;
        }
    }

    // After a rotation, deliveries are signed by the new secret and, during the overlap,
    // the old one.
    let rotated = dev.json(&["webhooks", "rotate-secret", &id]);
    let new_secret = rotated["secret"].as_str().expect("secret").to_owned();
    dev.ok(&["sandbox", "delete", &sandbox]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let r = next_for(
            &rx,
            &sandbox,
            deadline.saturating_duration_since(Instant::now()),
        );
        let ev: Value = serde_json::from_slice(&r.body).expect("JSON");
        if ev["data"]["status"] == "terminating" || ev["data"]["status"] == "terminated" {
            break r;
        }
    };
    assert!(verifies(&after, &new_secret), "signed with the new secret");
    assert!(
        verifies(&after, &secret),
        "and, in the overlap, the old one"
    );
    let sigs = after
        .headers
        .get("webhook-signature")
        .map(|s| s.split(' ').count());
    assert_eq!(sigs, Some(2), "two signatures during the overlap");

    let log = std::fs::read_to_string(dev.dir.path().join("dev.log")).expect("dev.log");
    assert!(
        !log.contains(&secret) && !log.contains(&new_secret),
        "a webhook secret is in dev.log"
    );
}
