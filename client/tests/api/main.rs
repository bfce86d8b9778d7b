//! The client against a real `differently dev` (the binary this workspace builds, started on
//! a free loopback port with its own devhost root): every group of routes, called through
//! the crate as an application would, with what the API answers checked.

use std::time::Duration;

use differently_client::events::{EventFilter, PublicEventFilter};
use differently_client::exec::{ExecEvent, StreamFormat};
use differently_client::sandboxes::Lifecycle;
use differently_client::tenancy::Scope;
use differently_client::{
    AuditFilter, Client, CreateKey, CreateSandbox, CreateWebhook, Error, EventCredentialsRequest,
    ExecRequest, PortExposure, Quota, SandboxFilter, SnapshotDeletion, TransportKind, UpdateOrg,
    UpdateSandbox, UpdateWebhook,
};
use futures::TryStreamExt;

#[path = "../support/dev.rs"]
mod dev;
mod files;
mod tenancy;
mod webhooks;
use dev::{free_port, running, Dev};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_lifecycle_list_patch_placement_and_ports() {
    let dev = Dev::start();
    let c = dev.client();
    assert_eq!(c.health().await.expect("health")["status"], "ok");
    assert!(c.openapi().await.expect("openapi")["paths"]["/v1/sandboxes"].is_object());

    let mut req = CreateSandbox::default();
    req.labels.insert("team".into(), "client".into());
    let first = c
        .create_sandbox(&req, Some("idem-1"))
        .await
        .expect("create");
    let again = c.create_sandbox(&req, Some("idem-1")).await.expect("retry");
    assert_eq!(
        first.id, again.id,
        "the same Idempotency-Key is the same sandbox"
    );
    let s = c
        .wait_sandbox(&first.id, "running", Duration::from_secs(30))
        .await
        .expect("wait");
    assert_eq!(
        (s.status.as_str(), s.pool.as_deref()),
        ("running", Some("local"))
    );
    let id = s.id.clone();
    let _other = running(&c, &CreateSandbox::default()).await;

    // The list is a stream over pages: a page size of 1 still yields both.
    let all: Vec<_> = c
        .list_sandboxes(&SandboxFilter {
            limit: Some(1),
            ..SandboxFilter::default()
        })
        .try_collect()
        .await
        .expect("list");
    assert_eq!(all.len(), 2, "{all:?}");
    let page = c
        .list_sandboxes_page(
            &SandboxFilter {
                limit: Some(1),
                ..SandboxFilter::default()
            },
            None,
        )
        .await
        .expect("page");
    assert_eq!(page.items.len(), 1);
    assert!(
        page.next_cursor.is_some(),
        "a first page of 1 of 2 has a cursor"
    );
    let labelled: Vec<_> = c
        .list_sandboxes(&SandboxFilter {
            label: Some("team=client".into()),
            ..SandboxFilter::default()
        })
        .try_collect()
        .await
        .expect("filtered");
    assert_eq!(
        labelled.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );

    // Patch: TTL and labels.
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("stage".to_owned(), "two".to_owned());
    let patched = c
        .update_sandbox(
            &id,
            &UpdateSandbox {
                ttl_seconds: Some(7200),
                labels: Some(labels.clone()),
                idle_timeout_seconds: Some(600),
            },
        )
        .await
        .expect("patch");
    assert_eq!(
        (
            patched.ttl_seconds,
            &patched.labels,
            patched.idle_timeout_seconds
        ),
        (7200, &labels, Some(600))
    );
    let e = c
        .update_sandbox(&id, &UpdateSandbox::default())
        .await
        .expect_err("empty patch");
    assert!(matches!(e, Error::Invalid { .. }), "{e}");

    c.keepalive(&id).await.expect("keepalive");
    let placement = c.placement(&id).await.expect("placement");
    assert_eq!(placement["decision"], "placed", "{placement}");
    let dry = c
        .placement_dry_run(&CreateSandbox::default())
        .await
        .expect("dry run");
    assert_eq!(
        (dry["decision"].as_str(), dry["pool"].as_str()),
        (Some("placed"), Some("local"))
    );

    // devhost exposes ports only when it runs unisolated (bubblewrap unshares the network);
    // either way the answer is the one its capabilities promise.
    let local = c.get_pool("local").await.expect("pool");
    match c.expose_port(&id, 8080, Some(60)).await {
        Ok(PortExposure::Ready(p)) => {
            assert!(local.capabilities.iter().any(|c| c == "ports.expose"));
            assert!(p.url.contains("8080"), "{p:?}");
        }
        Ok(PortExposure::Pending(p)) => panic!("devhost exposes at once: {p:?}"),
        Err(e) => {
            assert!(
                !local.capabilities.iter().any(|c| c == "ports.expose"),
                "{e}"
            );
            assert_eq!(
                (e.status(), e.code()),
                (Some(501), Some("unsupported_operation")),
                "{e}"
            );
        }
    }

    // Lifecycle: pause, resume, stop, start.
    let paused = c.lifecycle(&id, Lifecycle::Pause).await.expect("pause");
    assert_eq!(paused.status, "paused");
    let resumed = c.lifecycle(&id, Lifecycle::Resume).await.expect("resume");
    assert_eq!(resumed.status, "running");
    // devhost cannot stop: the API says so with 501 and the capability it lacks.
    let e = c
        .lifecycle(&id, Lifecycle::Stop)
        .await
        .expect_err("devhost has no stop");
    assert_eq!(
        (e.status(), e.code()),
        (Some(501), Some("unsupported_operation")),
        "{e}"
    );
    assert_eq!(
        e.api().map(|a| a.details["capability"].clone()),
        Some("lifecycle.stop".into())
    );
    let e = c
        .lifecycle(&id, Lifecycle::Start)
        .await
        .expect_err("running: nothing to start");
    assert!(matches!(e.status(), Some(409 | 501)), "{e}");

    // Errors: status, code, field; a missing sandbox is 404 not_found.
    let e = c
        .get_sandbox("sbx_01M8S304WGM0FZ9K4VKSZ41QY1")
        .await
        .expect_err("404");
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), Some("not_found")),
        "{e}"
    );
    let bad = CreateSandbox {
        profile: Some("enormous".into()),
        ..CreateSandbox::default()
    };
    let e = c.create_sandbox(&bad, None).await.expect_err("bad profile");
    let api = e.api().expect("an API error");
    assert_eq!(api.field.as_deref(), Some("profile"), "{e}");
    assert!(api.request_id.is_some(), "{e}");

    let deleted = c.delete_sandbox(&id).await.expect("delete");
    assert_eq!(deleted.status, "terminating");
    let gone = c
        .wait_sandbox(&id, "terminated", Duration::from_secs(30))
        .await
        .expect("wait terminated");
    assert!(gone.is_final());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_buffered_and_streamed_in_both_formats_files_and_snapshots() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;

    let r = c
        .exec(
            &id,
            &ExecRequest::new(["sh", "-c", "echo out; echo err >&2; exit 3"]),
        )
        .await
        .expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (3, "out\n", "err\n")
    );

    // Streamed, both formats, with binary stdin: the same bytes and exit code come back.
    let input: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    for format in [StreamFormat::Frames, StreamFormat::Sse] {
        let mut req =
            ExecRequest::new(["sh", "-c", "cat; echo done >&2; exit 5"]).stdin_bytes(&input);
        if format == StreamFormat::Sse {
            // SSE carries JSON strings: base64 keeps arbitrary bytes intact.
            req.output_encoding = Some("base64".into());
        }
        let mut s = c.exec_stream(&id, &req, format).await.expect("stream");
        let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
        while let Some(ev) = s.next().await {
            match ev.expect("event") {
                ExecEvent::Stdout(b) => out.extend_from_slice(&b),
                ExecEvent::Stderr(b) => err.extend_from_slice(&b),
                ExecEvent::Exit(x) => exit = Some(x.exit_code),
                ExecEvent::Error(e) => panic!("{format:?}: {e:?}"),
            }
        }
        assert_eq!(out.len(), input.len(), "{format:?}");
        assert!(out == input, "{format:?}: stdout differs from stdin");
        assert_eq!(
            (err.as_slice(), exit),
            (&b"done\n"[..], Some(5)),
            "{format:?}"
        );
    }
    let e = c
        .exec(&id, &ExecRequest::new(Vec::<String>::new()))
        .await
        .expect_err("empty");
    assert!(
        matches!(&e, Error::Invalid { field, .. } if field == "command"),
        "{e}"
    );

    // Files: upload (parents made), stat, list, download whole and a range, delete.
    c.upload(&id, "/work/dir/a.txt", b"hello world".to_vec(), Some(0o600))
        .await
        .expect("upload");
    c.upload(&id, "/work/dir/sub/b.bin", vec![0u8, 1, 2, 255], None)
        .await
        .expect("upload 2");
    let a = c
        .stat(&id, "/work/dir/a.txt")
        .await
        .expect("stat")
        .expect("exists");
    assert_eq!(
        (a.kind.as_str(), a.size, a.mode & 0o777),
        ("file", 11, 0o600)
    );
    let d = c
        .stat(&id, "/work/dir")
        .await
        .expect("stat dir")
        .expect("dir");
    assert!(d.is_dir(), "{d:?}");
    assert_eq!(c.stat(&id, "/work/none").await.expect("stat none"), None);
    let mut listed: Vec<String> = c
        .list_files(&id, "/work/dir", Some(3))
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.path)
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        ["/work/dir/a.txt", "/work/dir/sub", "/work/dir/sub/b.bin"]
    );
    assert_eq!(
        &c.download(&id, "/work/dir/a.txt").await.expect("download")[..],
        b"hello world"
    );
    assert_eq!(
        &c.download_range(&id, "/work/dir/a.txt", 6, Some(10))
            .await
            .expect("range")[..],
        b"world"
    );
    assert_eq!(
        &c.download(&id, "/work/dir/sub/b.bin")
            .await
            .expect("binary")[..],
        &[0u8, 1, 2, 255]
    );
    c.delete_file(&id, "/work/dir/a.txt")
        .await
        .expect("delete file");
    let e = c.download(&id, "/work/dir/a.txt").await.expect_err("gone");
    assert_eq!(e.status(), Some(404), "{e}");
    let e = c.download(&id, "relative").await.expect_err("relative");
    assert!(
        matches!(&e, Error::Invalid { field, .. } if field == "path"),
        "{e}"
    );

    // Snapshots, and a fork that has the file.
    let snap = c
        .create_snapshot(&id, Some("first"), None)
        .await
        .expect("snapshot");
    assert_eq!(
        (snap.status.as_str(), snap.name.as_deref()),
        ("ready", Some("first"))
    );
    let got = c.get_snapshot(&snap.id).await.expect("get snapshot");
    assert_eq!(got.sandbox_id, id);
    let of_sandbox: Vec<_> = c
        .list_sandbox_snapshots(&id)
        .try_collect()
        .await
        .expect("list sandbox's");
    let all: Vec<_> = c
        .list_snapshots(None)
        .try_collect()
        .await
        .expect("list all");
    assert_eq!((of_sandbox.len(), all.len()), (1, 1));
    let fork = c
        .fork(&snap.id, CreateSandbox::default(), None)
        .await
        .expect("fork");
    let fork = c
        .wait_sandbox(&fork.id, "running", Duration::from_secs(30))
        .await
        .expect("fork runs");
    assert_eq!(
        &c.download(&fork.id, "/work/dir/sub/b.bin")
            .await
            .expect("forked file")[..],
        &[0u8, 1, 2, 255]
    );
    c.delete_sandbox(&fork.id).await.expect("delete fork");
    match c.delete_snapshot(&snap.id).await.expect("delete snapshot") {
        SnapshotDeletion::Deleted => {}
        SnapshotDeletion::Pending(s) => assert_eq!(s.status, "deleting"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resume_after_the_last_id_without_loss_or_repeat() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;
    // From the start: provisioning, running.
    let mut events = c
        .events(EventFilter {
            sandbox_id: Some(id.clone()),
            after: Some(0),
            ..EventFilter::default()
        })
        .await
        .expect("events");
    let mut seen = Vec::new();
    while seen.last().map(|(_, s): &(u64, String)| s.as_str()) != Some("running") {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("event");
        assert_eq!(ev.event.sandbox_id, id);
        seen.push((ev.id, ev.event.status));
    }
    let last = events.last_event_id().expect("a last id");
    drop(events);
    // Resumed after the last one: only what came after (the delete).
    c.delete_sandbox(&id).await.expect("delete");
    let mut resumed = c
        .events(EventFilter {
            sandbox_id: Some(id.clone()),
            after: Some(last),
            ..EventFilter::default()
        })
        .await
        .expect("resume");
    // Both changes of the delete, each once. The API publishes `terminating` and the worker
    // `terminated`, each after its own commit, so the stream may hold them in either order
    // (docs/events.md, "Ordering and delivery").
    let mut after = Vec::new();
    while after.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(10), resumed.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("event");
        assert!(ev.id > last, "{} after {last}", ev.id);
        assert_eq!(ev.event.sandbox_id, id);
        after.push(ev.event.status);
    }
    after.sort();
    assert_eq!(after, ["terminated", "terminating"], "after {seen:?}");
    let e = c
        .events(EventFilter {
            sandbox_id: Some("nope".into()),
            ..EventFilter::default()
        })
        .await
        .err()
        .expect("a bad sandbox id");
    assert_eq!(e.status(), Some(400), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_errors_say_what_to_check_and_never_show_the_key() {
    let port = free_port();
    let c = Client::new(
        format!("http://127.0.0.1:{port}"),
        "dly_key_x_topsecretvalue",
    )
    .expect("client");
    let e = c.get_sandbox("sbx_x").await.expect_err("nothing listens");
    let Error::Transport(t) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(t.kind, TransportKind::Connect);
    let text = e.to_string();
    assert!(
        text.contains(&format!("cannot reach the API at http://127.0.0.1:{port}"))
            && text.contains("differently dev")
            && text.to_lowercase().contains("connection refused"),
        "{text}"
    );
    assert!(
        !text.contains("topsecret") && !format!("{e:?}").contains("topsecret"),
        "{e:?}"
    );

    let dev = Dev::start();
    let bad = Client::new(
        &dev.url,
        "dly_key_01M8PX56B2BMV5VM228QHCMTS7_notTheRealSecretAtAll",
    )
    .expect("client");
    let e = bad.get_sandbox("sbx_x").await.expect_err("401");
    assert_eq!(e.status(), Some(401));
    assert!(!e.to_string().contains("notTheRealSecret"), "{e}");
}
