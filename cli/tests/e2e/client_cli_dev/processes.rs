//! `differently process …` against `differently dev`: a process started in the background
//! outlives the command that started it; `attach` prints its output and exits with its code,
//! from any offset; `stdin` feeds it and closes at end of input; `signal`, `kill`, `ls`, `get`.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{json, output, Dev};

/// Generous: the machine running the suite may be busy.
const DEADLINE: Duration = Duration::from_secs(60);

fn running_sandbox(dev: &Dev) -> String {
    let out = dev.ok(&["sandbox", "create", "--wait", "-o", "id"]);
    out.trim().to_owned()
}

/// `process get` until its status is no longer `running`; the process then.
fn ended(dev: &Dev, id: &str, pid: &str) -> Value {
    let start = Instant::now();
    loop {
        let p = dev.json(&["process", "get", id, pid]);
        if p["status"] != "running" {
            return p;
        }
        assert!(start.elapsed() < DEADLINE, "process {pid} still runs: {p}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn start_prints_the_pid_and_attach_exits_with_the_process_code() {
    let dev = Dev::start();
    let id = running_sandbox(&dev);
    let pid = dev.ok(&[
        "process",
        "start",
        "--tag",
        "job",
        &id,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 5",
    ]);
    let pid = pid.trim().to_owned();
    assert!(pid.parse::<u32>().is_ok(), "start prints the pid: {pid:?}");
    let (code, out, err) = dev.run(&["process", "attach", &id, &pid]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (5, "out\n", "err\n"),
        "attach prints both streams and exits with the process's code"
    );
    // From an offset: the bytes past it. The two pipes race, so which line was kept first is
    // not known; past the first 4 bytes is the other one, whole.
    let (code, out, err) = dev.run(&["process", "attach", &id, &pid, "--from", "4"]);
    assert_eq!(code, 5);
    assert!(
        (out.as_str(), err.as_str()) == ("out\n", "")
            || (out.as_str(), err.as_str()) == ("", "err\n"),
        "{out:?} {err:?}"
    );
    let p = dev.json(&["process", "get", &id, &pid]);
    assert_eq!(
        (&p["status"], &p["exitCode"], &p["tag"], &p["outputBytes"]),
        (
            &Value::from("exited"),
            &Value::from(5),
            &Value::from("job"),
            &Value::from(8)
        )
    );
    let listed = dev.json(&["process", "ls", &id]);
    let pids: Vec<String> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| p["pid"].to_string())
        .collect();
    assert!(pids.contains(&pid), "{listed}");
    assert_eq!(
        dev.ok(&["process", "ls", &id, "--status", "running", "-o", "id"]),
        ""
    );
    // An unknown pid is not found, named on stderr; exit 1.
    let (code, _, err) = dev.run(&["process", "get", &id, "4000000000"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not_found"), "{err}");
}

#[test]
fn stdin_feeds_a_process_that_outlives_its_starter_and_closes_at_eof() {
    let dev = Dev::start();
    let id = running_sandbox(&dev);
    let pid = dev
        .ok(&[
            "process",
            "start",
            "--stdin",
            &id,
            "--",
            "sh",
            "-c",
            "cat; echo end",
        ])
        .trim()
        .to_owned();
    // --no-follow while it waits for input: the output kept (none), no exit, exit 0.
    let (code, out, _) = dev.run(&["process", "attach", "--no-follow", &id, &pid]);
    assert_eq!((code, out.as_str()), (0, ""));
    let bytes: Vec<u8> = (0..=255u8).collect();
    let (code, _, err) = output(dev.cmd(&["process", "stdin", &id, &pid]), Some(&bytes));
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = output(dev.cmd(&["process", "attach", &id, &pid]), None);
    assert_eq!(code, 0);
    let mut want = String::from_utf8_lossy(&bytes).into_owned();
    want.push_str("end\n");
    assert_eq!(out, want, "the bytes reach cat in order, then its end");
    // Its stdin is closed now: more is a conflict.
    let (code, _, err) = output(dev.cmd(&["process", "stdin", &id, &pid]), Some(b"late"));
    assert_eq!(code, 1);
    assert!(err.contains("conflict"), "{err}");
}

#[test]
fn signal_and_kill_end_it_with_128_plus_the_signal() {
    let dev = Dev::start();
    let id = running_sandbox(&dev);
    let term = dev
        .ok(&["process", "start", &id, "--", "sleep", "60"])
        .trim()
        .to_owned();
    let kill = dev
        .ok(&["process", "start", &id, "--", "sleep", "60"])
        .trim()
        .to_owned();
    assert_eq!(
        dev.ok(&["process", "ls", &id, "--status", "running", "-o", "id"])
            .lines()
            .count(),
        2
    );
    dev.ok(&["process", "signal", &id, &term, "TERM"]);
    let (code, _, err) = dev.run(&["process", "attach", &id, &term]);
    assert_eq!(code, 128 + 15, "{err}");
    dev.ok(&["process", "kill", &id, &kill]);
    assert_eq!(ended(&dev, &id, &kill)["exitCode"], 128 + 9);
    // Killing an ended one is fine; a signal the API does not take is a usage error.
    dev.ok(&["process", "kill", &id, &kill]);
    let (code, _, err) = dev.run(&["process", "signal", &id, &kill, "USR1"]);
    assert_eq!(code, 2, "{err}");
    let started = json(&dev.ok(&["process", "start", "-o", "json", &id, "--", "true"]));
    assert_eq!(started["command"], serde_json::json!(["true"]));
}
