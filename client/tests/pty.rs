//! The terminal (`GET /v1/sandboxes/{id}/pty`) through the crate against a real
//! `differently dev`: its devhost pool runs `sh` on a real pseudo-terminal. A line typed and
//! its output, a resize seen by `stty size`, ^C as a signal, the exit code, a reattach after
//! a dropped socket, and the refusals before the upgrade as the crate's `Error::Api`.

use std::time::Duration;

use differently_client::pty::{Pty, PtyEvent, PtyRequest, PtySignal};
use differently_client::{Client, CreateSandbox, Error};

#[path = "support/dev.rs"]
mod dev;
use dev::{running, Dev};

/// Reads output until it holds `needle` (within 15 s); everything read.
async fn until(t: &mut Pty, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !seen.contains(needle) {
        match tokio::time::timeout_at(deadline, t.next()).await {
            Ok(Some(Ok(PtyEvent::Output(b)))) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(other) => panic!("waiting for {needle:?}, got {other:?} after {seen:?}"),
            Err(_) => panic!("no {needle:?} within 15 s; the terminal showed {seen:?}"),
        }
    }
    seen
}

/// Reads to the end; the exit code.
async fn exit_of(t: &mut Pty) -> i32 {
    loop {
        match tokio::time::timeout(Duration::from_secs(15), t.next()).await {
            Ok(Some(Ok(PtyEvent::Output(_)))) => continue,
            Ok(Some(Ok(PtyEvent::Exit(code)))) => {
                assert!(t.next().await.is_none(), "events after the exit");
                return code;
            }
            other => panic!("expected the exit, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sh_on_a_terminal_echoes_resizes_takes_signals_and_exits_with_its_code() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;

    let mut t = c
        .pty(
            &id,
            &PtyRequest::new()
                .command(["sh"])
                .size(90, 20)
                .env("GREETING", "hi"),
        )
        .await
        .expect("open the terminal");
    assert!(t.session_id().starts_with("pty_"), "{}", t.session_id());
    assert!(t.grace_seconds() > 0);

    // A line typed: the terminal echoes it and the shell answers (the marker keeps the echo
    // of the command itself from passing for its output).
    t.send(b"echo \"$GREETING\"-$((40+2))\n")
        .await
        .expect("type");
    until(&mut t, "hi-42").await;

    // The size asked at open, then a resize.
    t.send(b"stty size\n").await.expect("type");
    until(&mut t, "20 90").await;
    t.resize(100, 30).await.expect("resize");
    t.send(b"stty size\n").await.expect("type");
    until(&mut t, "30 100").await;

    // ^C as a signal ends the foreground `sleep`, not the shell.
    t.send(b"sleep 30; echo slept-$((1+1))\n")
        .await
        .expect("type");
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.signal(PtySignal::Int).await.expect("signal");
    t.send(b"echo after-$((2+2))\n").await.expect("type");
    let seen = until(&mut t, "after-4").await;
    assert!(
        !seen.contains("slept-2"),
        "sleep was not interrupted: {seen:?}"
    );

    t.send(b"exit 3\n").await.expect("type");
    assert_eq!(exit_of(&mut t).await, 3);

    // `wait` collects the same in one call.
    let t = c
        .pty(
            &id,
            &PtyRequest::new().command(["sh", "-c", "echo hi; exit 7"]),
        )
        .await
        .expect("open");
    let (shown, code) = t.wait().await.expect("wait");
    assert_eq!(code, 7);
    assert!(String::from_utf8_lossy(&shown).contains("hi"), "{shown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_socket_reattaches_to_the_same_shell() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;
    let mut t = c
        .pty(&id, &PtyRequest::new().command(["sh"]))
        .await
        .expect("open");
    let session = t.session_id().to_owned();
    t.send(b"X=kept; echo set-$((1+2))\n").await.expect("type");
    until(&mut t, "set-3").await;
    drop(t);

    let mut t = c
        .pty(&id, &PtyRequest::reattach(&session))
        .await
        .expect("reattach");
    assert_eq!(t.session_id(), session);
    t.send(b"echo \"$X\"-again; exit 5\n").await.expect("type");
    until(&mut t, "kept-again").await;
    assert_eq!(exit_of(&mut t).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_upgrade_are_the_api_error() {
    let dev = Dev::start();
    let c = dev.client();
    // No such sandbox: the API's 404 envelope, as every other call answers it.
    let e = c
        .pty("sbx_01AAAAAAAAAAAAAAAAAAAAAAAA", &PtyRequest::new())
        .await
        .expect_err("unknown sandbox");
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), Some("not_found")),
        "{e}"
    );

    let id = running(&c, &CreateSandbox::default()).await;
    // A session that does not exist.
    let e = c
        .pty(&id, &PtyRequest::reattach("pty_nope"))
        .await
        .expect_err("unknown session");
    assert_eq!(e.status(), Some(404), "{e}");
    // A wrong key: 401 before any upgrade.
    let bad = Client::new(&dev.url, "dly_key_nope_nope").expect("client");
    let e = bad.pty(&id, &PtyRequest::new()).await.expect_err("bad key");
    assert_eq!(e.status(), Some(401), "{e}");
    // Refused here, before any traffic, naming the argument.
    let e = c
        .pty(&id, &PtyRequest::new().size(0, 24))
        .await
        .expect_err("zero columns");
    assert!(
        matches!(&e, Error::Invalid { field, .. } if field == "cols"),
        "{e}"
    );
    // After the upgrade: a cwd that does not exist is the terminal's error event.
    let mut t = c
        .pty(&id, &PtyRequest::new().cwd("/no/such/dir"))
        .await
        .expect("open");
    match tokio::time::timeout(Duration::from_secs(15), t.next()).await {
        Ok(Some(Ok(PtyEvent::Error(f)))) => assert!(f.message.contains("/no/such/dir"), "{f:?}"),
        other => panic!("expected the terminal's error, got {other:?}"),
    }
}
