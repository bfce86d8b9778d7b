//! Devhost background processes (`process`): stdin fed while it runs, signals to the whole
//! process group, a program that never reads its stdin still signalled, env as exec's, and
//! the same under bubblewrap.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use differently_adapters::devhost::{DevhostAdapter, IsolationMode};
use differently_adapters::go_ahead::GoAhead;
use differently_adapters::process::{ProcessInput, ProcessSpec};
use differently_adapters::{Adapter, AdapterError, ExecEvent, ExecExit, InstanceRef};
use differently_core::process::ProcessSignal;
use tokio::sync::{mpsc, watch};

use super::{sandbox, sandbox_with};

fn spec(command: &[&str], stdin: bool) -> ProcessSpec {
    ProcessSpec {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        env: BTreeMap::new(),
        cwd: None,
        timeout: Some(Duration::from_secs(60)),
        pty: None,
        stdin,
    }
}

/// Runs `spec`; `drive` gets its input and every output byte so far (stdout and stderr).
async fn run<F, Fut>(
    a: &DevhostAdapter,
    at: &InstanceRef,
    spec: &ProcessSpec,
    drive: F,
) -> (Result<ExecExit, AdapterError>, String)
where
    F: FnOnce(mpsc::Sender<ProcessInput>, watch::Receiver<Vec<u8>>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (input, input_rx) = mpsc::channel(4);
    let (out, mut out_rx) = mpsc::channel(8);
    let (seen_tx, seen) = watch::channel(Vec::new());
    let call = a.process(at, spec, input_rx, out, GoAhead::now());
    let collect = async move {
        while let Some(ev) = out_rx.recv().await {
            let (ExecEvent::Stdout(b) | ExecEvent::Stderr(b)) = ev;
            seen_tx.send_modify(|all| all.extend_from_slice(&b));
        }
        seen_tx.borrow().clone()
    };
    let (exit, all, ()) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(call, collect, drive(input, seen))
    })
    .await
    .expect("the process ends");
    (exit, String::from_utf8_lossy(&all).into_owned())
}

/// Waits (generously) until the output holds `needle`.
async fn wait_for(seen: &mut watch::Receiver<Vec<u8>>, needle: &str) -> String {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let now = String::from_utf8_lossy(&seen.borrow_and_update()).into_owned();
            if now.contains(needle) {
                return now;
            }
            seen.changed().await.expect("output ended early");
        }
    })
    .await
    .expect("the output came")
}

#[tokio::test]
async fn stdin_is_fed_while_it_runs_and_env_is_exec_s() {
    for isolation in [IsolationMode::None, IsolationMode::Bwrap] {
        let (_root, a, at) = sandbox_with(isolation).await;
        let mut s = spec(
            &[
                "sh",
                "-c",
                "read a; echo \"got:$a:$FOO\"; read b; echo \"got:$b\"",
            ],
            true,
        );
        s.env.insert("FOO".into(), "bar".into());
        let (exit, out) = run(&a, &at, &s, |input, mut seen| async move {
            input
                .send(ProcessInput::Stdin(Bytes::from_static(b"one\n")))
                .await
                .expect("input");
            wait_for(&mut seen, "got:one:bar").await;
            let _ = input
                .send(ProcessInput::Stdin(Bytes::from_static(b"two\n")))
                .await;
            let _ = input.send(ProcessInput::CloseStdin).await;
        })
        .await;
        assert_eq!(exit.expect("exit").exit_code, 0, "{isolation:?}: {out}");
        assert_eq!(out, "got:one:bar\ngot:two\n", "{isolation:?}");
    }
}

/// A program that never reads its stdin, with megabytes of it waiting (far more than a pipe
/// holds, less than the adapter queues), still gets its signal.
#[tokio::test]
async fn a_signal_is_not_stuck_behind_unread_stdin() {
    let (_root, a, at) = sandbox().await;
    let s = spec(&["sleep", "30"], true);
    let (exit, _) = run(&a, &at, &s, |input, _| async move {
        let chunk = Bytes::from(vec![b'x'; 256 * 1024]);
        for _ in 0..12 {
            input
                .send(ProcessInput::Stdin(chunk.clone()))
                .await
                .expect("input is taken while the program runs");
        }
        input
            .send(ProcessInput::Signal(ProcessSignal::Term))
            .await
            .expect("the signal is taken");
    })
    .await;
    assert_eq!(exit.expect("exit").exit_code, 143);
}

/// Whether `pid` is gone, or a zombie waiting for its reaper: no longer running either way.
fn dead(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    matches!(state, None | Some("Z") | Some("X"))
}

/// A signal goes to the whole process group: a background child (its output elsewhere, so
/// nothing but the signal ends it) dies with the shell.
#[tokio::test]
async fn signals_reach_the_whole_process_group() {
    let (_root, a, at) = sandbox().await;
    let script =
        "trap 'echo trapped' TERM; sleep 30 >/dev/null 2>&1 & echo pid:$!; wait; echo done";
    let s = spec(&["sh", "-c", script], false);
    let (exit, out) = run(&a, &at, &s, |input, mut seen| async move {
        let out = wait_for(&mut seen, "pid:").await;
        let pid = out
            .lines()
            .find_map(|l| l.strip_prefix("pid:"))
            .expect("the child's pid")
            .to_owned();
        // Once the child is `sleep` itself, not the shell's fork on its way to it.
        for _ in 0..300 {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "sleep" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        input
            .send(ProcessInput::Signal(ProcessSignal::Term))
            .await
            .expect("input");
    })
    .await;
    assert_eq!(
        exit.expect("exit").exit_code,
        0,
        "the shell trapped TERM: {out}"
    );
    assert!(out.contains("trapped") && out.contains("done"), "{out}");
    let pid = out
        .lines()
        .find_map(|l| l.strip_prefix("pid:"))
        .expect("the child's pid");
    let mut gone = dead(pid);
    for _ in 0..100 {
        if gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        gone = dead(pid);
    }
    assert!(gone, "the background sleep survived its group's TERM");
}

#[tokio::test]
async fn a_missing_program_is_127_on_stderr() {
    let (_root, a, at) = sandbox().await;
    let (exit, out) = run(
        &a,
        &at,
        &spec(&["no-such-program-here"], false),
        |_, _| async {},
    )
    .await;
    assert_eq!(exit.expect("exit").exit_code, 127);
    // Said by the adapter, or by env(1) that starts programs with default signals.
    assert!(out.contains("no-such-program-here"), "{out}");
}

/// Processes on this host whose command line holds `needle`.
fn running_with(needle: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

/// A signal sent at once, while bubblewrap may still be starting (its sandbox's init ignores
/// it and the program is not there yet), leaves nothing running: what is left of the group
/// is killed with the process.
#[tokio::test]
async fn a_signal_at_start_under_bubblewrap_leaves_nothing_running() {
    let (_root, a, at) = sandbox_with(IsolationMode::Bwrap).await;
    // A duration no other test sleeps, to find the program among the host's processes.
    let marker = "47.125";
    for _ in 0..3 {
        let s = spec(&["sleep", marker], false);
        let (exit, _) = run(&a, &at, &s, |input, _| async move {
            let _ = input.send(ProcessInput::Signal(ProcessSignal::Term)).await;
        })
        .await;
        assert_eq!(exit.expect("exit").exit_code, 143);
    }
    let mut left = running_with(marker);
    for _ in 0..50 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = running_with(marker);
    }
    assert_eq!(left, 0, "a signalled process left its program running");
}
