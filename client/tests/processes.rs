//! Processes (`/v1/sandboxes/{id}/processes`) through the crate against a real
//! `differently dev` (devhost: `exec.stdin`, terminals, signals to the process group): start,
//! list, get, the output in both formats from an offset, a detach that leaves it running,
//! stdin and its close, a signal, a resize, kill, and the refusals as `Error::Api`.

use std::time::Duration;

use differently_client::exec::{ExecEvent, StreamFormat};
use differently_client::processes::{OutputOptions, ProcessSignal};
use differently_client::{Client, CreateSandbox, Error, Process, StartProcess, TerminalSize};

#[path = "support/dev.rs"]
mod dev;
use dev::{running, Dev};

/// Generous: the machine running the suite may be busy.
const DEADLINE: Duration = Duration::from_secs(60);

fn start(command: &[&str]) -> StartProcess {
    StartProcess {
        command: command.iter().map(|s| s.to_string()).collect(),
        ..StartProcess::default()
    }
}

/// Reads the output to its end: (stdout, stderr, exit code if it came, offset after).
async fn read_all(
    c: &Client,
    id: &str,
    pid: u32,
    opts: OutputOptions,
) -> (Vec<u8>, Vec<u8>, Option<i32>, u64) {
    let mut out = c.processes().output(id, pid, opts).await.expect("output");
    let (mut o, mut e, mut code) = (vec![], vec![], None);
    while let Some(ev) = out.next().await {
        match ev.expect("an event") {
            ExecEvent::Stdout(b) => o.extend_from_slice(&b),
            ExecEvent::Stderr(b) => e.extend_from_slice(&b),
            ExecEvent::Exit(x) => code = Some(x.exit_code),
            ExecEvent::Error(err) => panic!("the process failed: {err:?}"),
        }
    }
    (o, e, code, out.offset())
}

async fn ended(c: &Client, id: &str, pid: u32) -> Process {
    let start = std::time::Instant::now();
    loop {
        let p = c.processes().get(id, pid).await.expect("get");
        if p.status != "running" {
            return p;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "process {pid} still runs: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_in_both_formats_from_an_offset_and_the_exit_code() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;
    let p = c
        .processes()
        .start(
            &id,
            &StartProcess {
                tag: Some("t".into()),
                ..start(&["sh", "-c", "echo out; echo err >&2; exit 3"])
            },
        )
        .await
        .expect("start");
    assert_eq!((p.tag.as_deref(), p.command[0].as_str()), (Some("t"), "sh"));
    for format in [StreamFormat::Frames, StreamFormat::Sse] {
        let all = OutputOptions {
            format,
            ..OutputOptions::default()
        };
        let got = read_all(&c, &id, p.pid, all).await;
        assert_eq!(
            got,
            (b"out\n".to_vec(), b"err\n".to_vec(), Some(3), 8),
            "{format:?}"
        );
        // From an offset: the bytes past it. The two pipes race, so which line was kept
        // first is not known; past the first 4 bytes is the other one, whole.
        let past_first = OutputOptions { from: 4, ..all };
        let (o, e, code, offset) = read_all(&c, &id, p.pid, past_first).await;
        assert!(
            (o.as_slice(), e.as_slice()) == (&b"out\n"[..], &b""[..])
                || (o.as_slice(), e.as_slice()) == (&b""[..], &b"err\n"[..]),
            "{format:?}: {o:?} {e:?}"
        );
        assert_eq!((code, offset), (Some(3), 8), "{format:?}");
    }
    let e = c.processes().get(&id, p.pid).await.expect("get");
    assert_eq!(
        (e.status.as_str(), e.exit_code, e.output_bytes),
        ("exited", Some(3), 8)
    );
    let exited = c.processes().list(&id, Some("exited")).await.expect("list");
    assert!(exited.iter().any(|x| x.pid == p.pid), "{exited:?}");
    let missing = c
        .processes()
        .get(&id, 4_000_000_000)
        .await
        .expect_err("no such pid");
    assert!(
        matches!(&missing, Error::Api(a) if a.status == 404 && a.code == "not_found"),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_process_runs_on_takes_stdin_and_ends_at_its_close() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;
    let p = c
        .processes()
        .start(
            &id,
            &StartProcess {
                stdin: Some(true),
                ..start(&["sh", "-c", "echo ready; cat; echo done"])
            },
        )
        .await
        .expect("start");
    assert!(p.stdin_open);
    let mut out = c
        .processes()
        .output(&id, p.pid, OutputOptions::default())
        .await
        .expect("attach");
    let first = out.next().await.expect("an event").expect("output");
    assert_eq!(first, ExecEvent::Stdout("ready\n".into()));
    assert_eq!(out.offset(), 6);
    drop(out); // detach
    assert_eq!(
        c.processes().get(&id, p.pid).await.expect("get").status,
        "running"
    );
    let bytes: Vec<u8> = (0..=255u8).collect();
    c.processes()
        .send_stdin(&id, p.pid, bytes.clone())
        .await
        .expect("stdin");
    c.processes().close_stdin(&id, p.pid).await.expect("close");
    c.processes()
        .close_stdin(&id, p.pid)
        .await
        .expect("a second close is fine");
    let from = OutputOptions {
        from: 6,
        ..OutputOptions::default()
    };
    let (o, _, code, _) = read_all(&c, &id, p.pid, from).await;
    let mut want = bytes;
    want.extend_from_slice(b"done\n");
    assert_eq!((o, code), (want, Some(0)));
    let late = c
        .processes()
        .send_stdin(&id, p.pid, &b"late"[..])
        .await
        .expect_err("stdin after its close");
    assert!(matches!(&late, Error::Api(a) if a.status == 409), "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_kill_resize_and_follow_false() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;
    let sleeper = c
        .processes()
        .start(&id, &start(&["sh", "-c", "echo one; sleep 60"]))
        .await
        .expect("start");
    let t0 = std::time::Instant::now();
    while c
        .processes()
        .get(&id, sleeper.pid)
        .await
        .expect("get")
        .output_bytes
        < 4
    {
        assert!(t0.elapsed() < DEADLINE, "no output");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept = OutputOptions {
        follow: false,
        ..OutputOptions::default()
    };
    let got = read_all(&c, &id, sleeper.pid, kept).await;
    assert_eq!(
        got,
        (b"one\n".to_vec(), vec![], None, 4),
        "no exit while it runs"
    );
    c.processes()
        .signal(&id, sleeper.pid, ProcessSignal::Term)
        .await
        .expect("signal");
    assert_eq!(ended(&c, &id, sleeper.pid).await.exit_code, Some(128 + 15));
    let other = c
        .processes()
        .start(&id, &start(&["sleep", "60"]))
        .await
        .expect("start");
    c.processes().kill(&id, other.pid).await.expect("kill");
    assert_eq!(ended(&c, &id, other.pid).await.exit_code, Some(128 + 9));
    c.processes()
        .kill(&id, other.pid)
        .await
        .expect("an ended one is fine");

    let term = c
        .processes()
        .start(
            &id,
            &StartProcess {
                pty: Some(TerminalSize { cols: 80, rows: 24 }),
                ..start(&["sh", "-c", "read x; stty size; echo got $x"])
            },
        )
        .await
        .expect("start on a terminal");
    assert!(term.pty);
    c.processes()
        .resize(&id, term.pid, 100, 30)
        .await
        .expect("resize");
    c.processes()
        .send_stdin(&id, term.pid, &b"hi\n"[..])
        .await
        .expect("typed");
    let (o, _, code, _) = read_all(&c, &id, term.pid, OutputOptions::default()).await;
    let text = String::from_utf8_lossy(&o);
    assert!(text.contains("30 100") && text.contains("got hi"), "{text}");
    assert_eq!(code, Some(0));
    let plain = c
        .processes()
        .resize(&id, other.pid, 80, 24)
        .await
        .expect_err("not a terminal");
    assert!(
        matches!(&plain, Error::Api(a) if a.status == 409),
        "{plain}"
    );
}
