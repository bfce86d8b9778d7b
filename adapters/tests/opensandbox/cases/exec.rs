//! Commands through execd: exit codes, stderr, env, cwd and quoting, stdin, timeouts, large
//! and slow output, streams cut short, backpressure and cancellation, held commands, and the
//! endpoint's headers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_adapters::{Adapter, AdapterError, ExecEvent};
use serde_json::json;

use crate::fake_server::{FakeRuntime, Variant};
use crate::{cmd, running, setup};

use super::BOTH;

#[tokio::test]
async fn exec_exit_codes_stderr_env_cwd_and_quoting() {
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap().to_owned();
    for (variant, endings) in [(Variant::Real, "stripped"), (Variant::Spec, "kept")] {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"lineEndings": endings}),
        )
        .await;
        let r = running(&s).await;
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["bash", "-c", "echo hello; echo oops >&2; exit 3"]),
            )
            .await
            .unwrap();
        assert_eq!(
            (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
            (3, "hello\n", "oops\n")
        );

        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["printf", "%s|", "a b", "it's", "$HOME", "", "*"]),
            )
            .await
            .unwrap();
        let exact = "a b|it's|$HOME||*|";
        let want = if endings == "kept" {
            exact.to_owned()
        } else {
            format!("{exact}\n")
        };
        assert_eq!(out.stdout, want, "{variant:?}");

        let mut req = cmd(&["sh", "-c", "echo \"$FOO\"; pwd"]);
        req.env.insert("FOO".to_owned(), "bar baz".to_owned());
        req.cwd = Some(dir_s.clone());
        let out = s.adapter.exec(&r, &req).await.unwrap();
        assert_eq!(out.stdout, format!("bar baz\n{dir_s}\n"));
        assert_eq!(
            s.fake.record().command_bodies.last().unwrap()["timeout"],
            60_000
        );

        let out = s
            .adapter
            .exec(&r, &cmd(&["printf", "a\\n\\nb\\n"]))
            .await
            .unwrap();
        // Recorded on real execd: a blank line arrives as an event with text "\n" (the fake
        // used to drop it), so the blank line survives either way.
        assert_eq!(out.stdout, "a\n\nb\n", "{variant:?}: blank lines survive");

        let out = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "exit 0"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        let out = s
            .adapter
            .exec(&r, &cmd(&["no-such-program-xyz"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 127);
        let out = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "kill -9 $$"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, 137, "killed by a signal, not by our timeout");

        let mut req = cmd(&["pwd"]);
        req.cwd = Some("/definitely/not/here".to_owned());
        assert!(matches!(
            s.adapter.exec(&r, &req).await,
            Err(AdapterError::Permanent(m)) if m.field() == Some("cwd")
        ));
    }
}

#[tokio::test]
async fn exec_stdin_goes_through_a_removed_file() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let mut req = cmd(&["cat"]);
    req.stdin = Some("line1\nline2\n".to_owned());
    let out = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(out.stdout, "line1\nline2\n");
    let command = s.fake.record().command_bodies.last().unwrap()["command"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = command
        .split_whitespace()
        .find(|t| t.starts_with("/tmp/.differently-stdin-"))
        .unwrap()
        .trim_end_matches(';')
        .to_owned();
    assert!(path.starts_with("/tmp/.differently-stdin-"), "{command}");
    assert!(!std::path::Path::new(&path).exists(), "stdin file removed");

    let mut req = cmd(&["od", "-An", "-tx1"]);
    req.stdin_base64 = Some("AP+A".to_owned());
    let out = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(out.stdout.trim(), "00 ff 80");

    let mut req = cmd(&["cat"]);
    req.stdin_base64 = Some("not base64!".to_owned());
    assert!(
        matches!(s.adapter.exec(&r, &req).await, Err(AdapterError::Permanent(m)) if m.contains("stdinBase64"))
    );
}

#[tokio::test]
async fn exec_timeout_is_124() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let mut req = cmd(&["sleep", "30"]);
        req.timeout_seconds = Some(1);
        let started = Instant::now();
        let out = s.adapter.exec(&r, &req).await.unwrap();
        assert_eq!(out.exit_code, 124);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(
            s.fake.record().command_bodies.last().unwrap()["timeout"],
            1000
        );
    }
}

#[tokio::test]
async fn exec_huge_binaryish_and_slow_output() {
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        // 3 MB in 1000-byte lines: capped at 1 MiB and flagged.
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&[
                    "sh",
                    "-c",
                    "head -c 3000000 /dev/zero | tr '\\0' a | fold -w 1000",
                ]),
            )
            .await
            .unwrap();
        assert_eq!(out.exit_code, 0);
        assert!(out.stdout_truncated && !out.stderr_truncated);
        assert_eq!(out.stdout.len(), 1024 * 1024);
        // One 2 MB line in one event.
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["sh", "-c", "head -c 2000000 /dev/zero | tr '\\0' x"]),
            )
            .await
            .unwrap();
        assert!(out.stdout_truncated && out.stdout.bytes().all(|b| b == b'x'));
        // Non-UTF-8 bytes arrive lossily (execd's events are JSON text).
        let out = s
            .adapter
            .exec(&r, &cmd(&["printf", "\\377ok\\n"]))
            .await
            .unwrap();
        assert!(out.stdout.ends_with("ok\n"), "{:?}", out.stdout);

        s.fake.knobs().frame_delay_ms = 30;
        let out = s
            .adapter
            .exec(
                &r,
                &cmd(&["sh", "-c", "for i in 1 2 3 4 5; do echo $i; done"]),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout, "1\n2\n3\n4\n5\n");
    }
}

#[tokio::test]
async fn truncated_and_silent_streams_are_transient() {
    for variant in BOTH {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"timeouts": {"streamIdleSeconds": 1}}),
        )
        .await;
        let r = running(&s).await;
        s.fake.knobs().truncate_after_frames = Some(3);
        let e = s
            .adapter
            .exec(&r, &cmd(&["sh", "-c", "echo 1; echo 2; echo 3; echo 4"]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AdapterError::Transient(m) if m.contains("ended")),
            "{e:?}"
        );
        s.fake.knobs().truncate_after_frames = None;
        s.fake.knobs().stall_ms = 2500;
        let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::Transient(m) if m.contains("no output")),
            "{e:?}"
        );
        s.fake.knobs().stall_ms = 0;
        assert_eq!(
            s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
            0
        );
    }
}

#[tokio::test]
async fn exec_stream_delivers_in_order_with_backpressure_and_cancels() {
    for variant in BOTH {
        let s = setup(
            variant,
            FakeRuntime::Docker,
            json!({"lineEndings": "stripped"}),
        )
        .await;
        let r = running(&s).await;
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(ev) = rx.recv().await {
                tokio::time::sleep(Duration::from_millis(2)).await;
                got.push(ev);
            }
            got
        });
        let exit = s
            .adapter
            .exec_stream(
                &r,
                &cmd(&[
                    "sh",
                    "-c",
                    "for i in $(seq 1 200); do echo $i; done; echo e >&2; exit 2",
                ]),
                tx,
            )
            .await
            .unwrap();
        assert_eq!(exit.exit_code, 2);
        let got = reader.await.unwrap();
        let stdout: Vec<Bytes> = got
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Stdout(b) => Some(b.clone()),
                ExecEvent::Stderr(_) => None,
            })
            .collect();
        assert_eq!(stdout.len(), 200);
        assert_eq!(stdout[0], Bytes::from("1\n"));
        assert_eq!(stdout[199], Bytes::from("200\n"));
        assert!(got.contains(&ExecEvent::Stderr(Bytes::from("e\n"))));

        // A closed receiver cancels the command on the backend.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        let a = &s.adapter;
        let endless = cmd(&["sh", "-c", "while true; do echo x; sleep 0.05; done"]);
        let run = a.exec_stream(&r, &endless, tx);
        let stop = async {
            rx.recv().await;
            drop(rx);
        };
        let (res, ()) = tokio::join!(run, stop);
        assert!(res.is_err());
        assert!(s.fake.record().interrupts >= 1);
    }
}

/// Waits up to 5 s for the fake execd to run no command; false if one still runs.
async fn no_command_runs(s: &crate::Setup) -> bool {
    for _ in 0..100 {
        if s.fake.commands_running() == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Real execd keeps a foreground command running when its stream's client goes away
/// (recorded: still running 8 s later), so the adapter must interrupt it itself: when the
/// caller's receiver goes away while the command prints nothing, and when the caller drops
/// the call altogether (an HTTP client that disconnected).
#[tokio::test]
async fn a_caller_who_goes_away_leaves_no_command_running() {
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let silent = cmd(&["sleep", "30"]);

    // The receiver goes away; the command prints nothing.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let run = s.adapter.exec_stream(&r, &silent, tx);
    let hang_up = async {
        while s.fake.commands_running() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(rx);
    };
    let (res, ()) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(run, hang_up)
    })
    .await
    .expect("the call ends soon after its receiver goes away");
    assert!(res.is_err(), "{res:?}");
    assert!(
        no_command_runs(&s).await,
        "the silent command was left running"
    );
    let interrupts = s.fake.record().interrupts;
    assert!(interrupts >= 1);

    // The call itself is dropped mid-flight.
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let dropped = tokio::time::timeout(Duration::from_millis(500), async {
        let _ = s.adapter.exec_stream(&r, &silent, tx).await;
    })
    .await;
    assert!(dropped.is_err(), "the call was still running when dropped");
    assert!(
        no_command_runs(&s).await,
        "the dropped call's command was left running"
    );
    assert!(s.fake.record().interrupts > interrupts);
    assert!(s.fake.record().abandoned >= 1, "the fake saw its client go");
}

/// The `POST …/command` requests whose heads reached the fake, with their declared length.
fn command_heads(s: &crate::Setup) -> Vec<Option<u64>> {
    s.fake
        .record()
        .heads
        .iter()
        .filter(|(line, _)| line.starts_with("POST ") && line.ends_with("/command"))
        .map(|(_, length)| *length)
        .collect()
}

/// Waits up to 5 s for `n` command request heads to reach the fake.
async fn command_heads_reach(s: &crate::Setup, n: usize) {
    for _ in 0..500 {
        if command_heads(s).len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} command request head(s) never reached execd");
}

/// `exec_stream_after`: the request to execd goes at once (its head, so the connection's
/// set-up overlaps the caller's audit record) but its body, the command, only with the
/// go-ahead; a withdrawn go-ahead runs nothing, and one that takes longer than the hold limit
/// (1 s) sends the command on a new request, once. Directly to execd and through the server's
/// proxy.
#[tokio::test]
async fn a_held_command_goes_only_with_its_go_ahead() {
    use differently_adapters::go_ahead::GoAhead;
    for proxy in [true, false] {
        let s = setup(
            Variant::Real,
            FakeRuntime::Docker,
            json!({"useServerProxy": proxy}),
        )
        .await;
        let r = running(&s).await;
        let echo = cmd(&["echo", "hi"]);
        let stdout = |rx: &mut tokio::sync::mpsc::Receiver<ExecEvent>| {
            let mut out = Vec::new();
            while let Ok(ev) = rx.try_recv() {
                if let ExecEvent::Stdout(b) = ev {
                    out.extend_from_slice(&b);
                }
            }
            out
        };

        // Given after the head arrived.
        let (giver, go) = GoAhead::pair();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let control = async {
            command_heads_reach(&s, 1).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            let early = s.fake.record().command_bodies.len();
            giver.give();
            early
        };
        let (exit, early) = tokio::join!(s.adapter.exec_stream_after(&r, &echo, tx, go), control);
        assert_eq!(
            early, 0,
            "proxy {proxy}: the command went before its go-ahead"
        );
        assert_eq!(exit.unwrap().exit_code, 0, "proxy {proxy}");
        assert_eq!(stdout(&mut rx), b"hi\n", "proxy {proxy}");
        let heads = command_heads(&s);
        assert_eq!(heads.len(), 1, "proxy {proxy}: one request");
        let sent = serde_json::to_vec(&s.fake.record().command_bodies[0]).unwrap();
        assert_eq!(
            heads[0],
            Some(sent.len() as u64),
            "proxy {proxy}: the held request declares its length, as an unheld one does"
        );

        // Withdrawn: nothing runs, and the call says why.
        let (giver, go) = GoAhead::pair();
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let touch = cmd(&["touch", "/tmp/differently-withdrawn"]);
        let control = async {
            command_heads_reach(&s, 2).await;
            drop(giver);
        };
        let (res, ()) = tokio::join!(s.adapter.exec_stream_after(&r, &touch, tx, go), control);
        assert!(
            matches!(&res, Err(AdapterError::Permanent(r)) if r.to_string().contains("withdrawn")),
            "proxy {proxy}: {res:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.fake.record().command_bodies.len(),
            1,
            "proxy {proxy}: a withdrawn command reached execd"
        );
        assert!(no_command_runs(&s).await);

        // Held past the limit: abandoned unsent, then sent once on a new request.
        let (giver, go) = GoAhead::pair();
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let control = async {
            command_heads_reach(&s, 3).await;
            tokio::time::sleep(Duration::from_millis(1300)).await;
            let before = s.fake.record().command_bodies.len();
            giver.give();
            before
        };
        let (exit, before) = tokio::join!(s.adapter.exec_stream_after(&r, &echo, tx, go), control);
        assert_eq!(before, 1, "proxy {proxy}: sent while held");
        assert_eq!(exit.unwrap().exit_code, 0, "proxy {proxy}");
        assert_eq!(stdout(&mut rx), b"hi\n", "proxy {proxy}");
        assert_eq!(
            command_heads(&s).len(),
            4,
            "proxy {proxy}: abandoned, then sent anew"
        );
        assert_eq!(
            s.fake.record().command_bodies.len(),
            2,
            "proxy {proxy}: the held-too-long command ran once"
        );
    }
}

#[tokio::test]
async fn execd_headers_from_the_endpoint_are_used_and_stale_endpoints_re_resolved() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        json!({"useServerProxy": false}),
    )
    .await;
    s.fake.knobs().execd_token = Some("execd-token".to_owned());
    s.fake.knobs().endpoint_headers =
        BTreeMap::from([("X-EXECD-ACCESS-TOKEN".to_owned(), "execd-token".to_owned())]);
    let r = running(&s).await;
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // The endpoint is resolved once and cached.
    let resolves = |s: &crate::Setup| {
        s.fake
            .record()
            .requests
            .iter()
            .filter(|q| q.contains("/endpoints/44772"))
            .count()
    };
    let before = resolves(&s);
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    assert_eq!(resolves(&s), before);
}
