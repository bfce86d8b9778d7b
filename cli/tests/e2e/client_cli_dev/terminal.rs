//! The CLI on a real terminal (util-linux `script` gives it one): tables and the spinner, and
//! `sandbox exec -it` in raw mode, from a terminal and from a pipe.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::harness::binary;

use super::{output, Dev};

/// `script -q<flags>c LINE /dev/null` (util-linux): `line` runs with a terminal, with the CLI
/// pointed at `dev` (its URL, key and client config).
fn in_terminal(dev: &Dev, flags: &str, line: &str) -> Command {
    let script = ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "util-linux `script` is needed to give the CLI a terminal: apt-get install util-linux",
        );
    let mut cmd = Command::new(script);
    cmd.args([&format!("-q{flags}c"), line, "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config());
    cmd
}

/// Runs `line` on a terminal with `keys` typed into it, as a person would (the terminal
/// echoing them); stdin stays open until the end, so `script` never reports an end of input.
fn typed(dev: &Dev, line: &str, keys: &[u8]) -> std::process::Output {
    let mut child = in_terminal(dev, "fe", line)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(keys).unwrap();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    out
}

/// On a terminal (util-linux `script` gives the command one): a table by default, and the
/// spinner on `--wait`, cleared before the answer. Piped, the same command printed JSON and
/// no spinner (`exec_and_files`).
#[test]
fn a_terminal_gets_tables_and_a_spinner() {
    let dev = Dev::start();
    let line = format!("{} sandbox create --wait --label tty=yes", binary());
    let mut cmd = in_terminal(&dev, "e", &line);
    cmd.stdin(Stdio::null());
    let (code, out, err) = output(cmd, None);
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(
        out.contains("waiting for sbx_"),
        "no spinner on the terminal: {out:?}"
    );
    assert!(
        out.contains("\x1b[2K"),
        "the spinner's line is not cleared: {out:?}"
    );
    let table = &out[out.find("FIELD").expect("a FIELD/VALUE table")..];
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("status") && l.trim_end().ends_with("running")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("labels") && l.contains("tty=yes")),
        "{table}"
    );
    // A list on a terminal: headers and one row.
    let mut cmd = in_terminal(&dev, "e", &format!("{} sandbox list", binary()));
    cmd.stdin(Stdio::null());
    let (code, out, err) = output(cmd, None);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATUS"),
        "{out}"
    );
    assert_eq!(lines.len(), 2, "{out}");
}

/// `sandbox exec -it` on a real terminal (util-linux `script` gives the CLI one): the keys
/// typed reach the remote shell, its output ours, its exit code ours, and our terminal's
/// settings are the same after as before (`stty -g`), raw mode undone.
#[test]
fn exec_it_runs_a_shell_on_a_terminal_and_restores_ours() {
    let dev = Dev::start();
    let (code, out, err) = dev.run(&["sandbox", "create", "--wait", "-o", "id"]);
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_owned();
    let before = dev.dir.path().join("stty.before");
    let after = dev.dir.path().join("stty.after");
    let line = format!(
        "stty -g > {b}; {bin} sandbox exec -it {id} -- sh; echo \"rc=$?\"; stty -g > {a}",
        b = before.display(),
        a = after.display(),
        bin = binary(),
    );
    let out = typed(&dev, &line, b"echo hi-$((40+2)); exit 3\n");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{shown}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("hi-42"),
        "the remote shell's output: {shown:?}"
    );
    assert!(
        shown.contains("rc=3"),
        "the remote exit code as ours: {shown:?}"
    );
    let (b, a) = (
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
    );
    assert!(!b.trim().is_empty(), "stty -g printed nothing");
    assert_eq!(b, a, "the terminal's settings changed across exec -it");

    // An error after raw mode began (a cwd that does not exist fails the terminal after the
    // upgrade): exit 1 with the API's words, the terminal restored all the same.
    let line = format!(
        "stty -g > {b}; {bin} sandbox exec -it --cwd /no/such/dir {id} -- sh; echo \"rc=$?\"; stty -g > {a}",
        b = before.display(),
        a = after.display(),
        bin = binary(),
    );
    let out = typed(&dev, &line, b"");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("rc=1"), "{shown:?}");
    assert!(
        shown.contains("/no/such/dir"),
        "the error names the cwd: {shown:?}"
    );
    let (b, a) = (
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
    );
    assert_eq!(
        b, a,
        "the terminal's settings changed across a failed exec -it"
    );

    // Our terminal resized while the remote one is open (SIGWINCH): the remote one follows.
    // `script`'s terminal has no size (its stdin is a pipe), so the remote one opens at the
    // API's 80 × 24; 2 s later ours becomes 120 × 40, and the remote shell, polling
    // `stty size` (15 s at most), sees it.
    let line = format!(
        "(sleep 2; stty cols 120 rows 40 < /dev/tty) & {bin} sandbox exec -it {id} -- sh; echo \"rc=$?\"",
        bin = binary(),
    );
    let out = typed(
        &dev,
        &line,
        b"echo \"at-open $(stty size)\"; i=0; while [ \"$(stty size)\" = '24 80' ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; echo \"resized $(stty size)\"; exit 3\n",
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("at-open 24 80"), "{shown:?}");
    assert!(
        shown.contains("resized 40 120"),
        "the resize did not reach the sandbox: {shown:?}"
    );
    assert!(shown.contains("rc=3"), "{shown:?}");
}

/// `-it` with stdin a pipe: no local terminal to make raw, so stdin is typed into the remote
/// terminal and ^D ends it; `-t` alone sends no input and shows the terminal's size.
#[test]
fn exec_it_from_a_pipe_types_it_and_t_alone_sends_nothing() {
    let dev = Dev::start();
    let (code, out, err) = dev.run(&["sandbox", "create", "--wait", "-o", "id"]);
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_owned();
    let (code, out, err) = output(
        dev.cmd(&["sandbox", "exec", "-it", &id, "--", "sh"]),
        Some(b"echo piped-$((1+1))\n"),
    );
    assert_eq!(code, 0, "{err}\n{out}");
    assert!(out.contains("piped-2"), "{out:?}");
    let (code, out, err) = output(
        dev.cmd(&[
            "sandbox",
            "exec",
            "-t",
            &id,
            "--",
            "sh",
            "-c",
            "stty size; exit 4",
        ]),
        None,
    );
    assert_eq!(code, 4, "{err}\n{out}");
    assert!(out.contains("24 80"), "the default size: {out:?}");
    // Bad input is refused before the upgrade with the API's code.
    let (code, _, err) = dev.run(&["sandbox", "exec", "-it", "sbx_01AAAAAAAAAAAAAAAAAAAAAAAA"]);
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");
    let (code, _, err) = dev.run(&["sandbox", "exec", "-t", "--timeout-seconds", "3", &id]);
    assert_eq!(code, 2, "{err}");
}
