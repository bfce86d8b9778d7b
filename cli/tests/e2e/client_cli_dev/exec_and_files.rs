//! `sandbox exec` (stdin, streaming, exit codes, a closed pipe) and the file commands (`cp`
//! both ways with directories and modes, `ls`, `rm`, `mkdir`) against `differently dev`.

use std::process::{Command, Stdio};

use crate::harness::binary;

use super::{mode, output, set_mode, Dev};

#[test]
fn exec_streams_forwards_stdin_and_exits_with_the_command_code() {
    let dev = Dev::start();
    // --wait on a pipe: the answer on stdout; no spinner on a stderr that is not a terminal,
    // one line saying what it waits for instead.
    let (code, out, err) = dev.run(&["sandbox", "create", "--wait", "-o", "id"]);
    assert_eq!(code, 0, "{err}{out}");
    let id = out.trim().to_owned();
    assert_eq!(
        err,
        format!("differently: waiting up to 120s for sandbox {id} to be running…\n")
    );

    // `echo hello | differently sandbox exec $S -- cat` prints hello.
    let (code, out, err) = output(
        dev.cmd(&["sandbox", "exec", &id, "--", "cat"]),
        Some(b"hello\n"),
    );
    assert_eq!((code, out.as_str(), err.as_str()), (0, "hello\n", ""));
    // Binary stdin arrives intact; -n sends none.
    let bytes: Vec<u8> = (0..=255u8).collect();
    let (code, out, _) = output(
        dev.cmd(&["sandbox", "exec", &id, "--", "sh", "-c", "wc -c"]),
        Some(&bytes),
    );
    assert_eq!((code, out.trim()), (0, "256"));
    let (code, out, _) = output(
        dev.cmd(&["sandbox", "exec", &id, "-n", "--", "sh", "-c", "wc -c"]),
        Some(b"ignored"),
    );
    assert_eq!((code, out.trim()), (0, "0"));
    // Both streams, and the command's exit code as ours, streamed and buffered.
    for extra in [&[][..], &["--buffered"][..]] {
        let mut args = vec!["sandbox", "exec", &id];
        args.extend_from_slice(extra);
        args.extend(["--", "sh", "-c", "echo out; echo err >&2; exit 7"]);
        let (code, out, err) = dev.run(&args);
        assert_eq!(
            (code, out.as_str(), err.as_str()),
            (7, "out\n", "err\n"),
            "{extra:?}"
        );
    }
    // Streamed output past the buffered route's 1 MiB cut arrives whole.
    let (code, out, err) = dev.run(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' y",
    ]);
    assert_eq!((code, out.len()), (0, 3_000_000), "{err}");
    // A reader that goes away (`| head -c1`) ends the command quietly: exit 0, no panic.
    let (code, _, err) = output(
        {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!(
                    "set -o pipefail; \"$0\" sandbox exec {id} -- sh -c 'yes | head -c 5000000' | head -c1 >/dev/null"
                ))
                .arg(binary())
                .env("DIFFERENTLY_URL", &dev.url)
                .env("DIFFERENTLY_API_KEY", &dev.key)
                .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
                .stdin(Stdio::null());
            c
        },
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A bad flag value is the API's error naming the field.
    let (code, _, err) = dev.run(&["sandbox", "exec", &id, "--cwd", "relative", "--", "true"]);
    assert_eq!(code, 1);
    assert!(err.contains("cwd"), "{err}");
}

#[test]
fn files_copy_both_ways_with_directories_ls_and_rm() {
    let dev = Dev::start();
    let id = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let local = dev.dir.path().join("up");
    std::fs::create_dir_all(local.join("sub/deeper")).unwrap();
    std::fs::write(local.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(local.join("sub/deeper/b.bin"), [0u8, 1, 2, 255]).unwrap();
    set_mode(&local.join("a.txt"), 0o750);
    // Empty directories go up too, with their modes (`POST …/files/directories`).
    std::fs::create_dir_all(local.join("empty")).unwrap();
    std::fs::create_dir_all(local.join("sub/void")).unwrap();
    set_mode(&local.join("empty"), 0o700);
    let remote = format!("{id}:/work/up");
    dev.ok(&["sandbox", "cp", local.to_str().unwrap(), &remote]);
    // ls: JSON list, a table, and paths with -o id.
    let listed = dev.json(&["sandbox", "ls", &id, "/work/up", "--depth", "3"]);
    let mut paths: Vec<(&str, &str)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            ("/work/up/a.txt", "file"),
            ("/work/up/empty", "dir"),
            ("/work/up/sub", "dir"),
            ("/work/up/sub/deeper", "dir"),
            ("/work/up/sub/deeper/b.bin", "file"),
            ("/work/up/sub/void", "dir"),
        ],
        "{listed}"
    );
    let empty = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "/work/up/empty")
        .unwrap();
    assert_eq!(empty["mode"].as_u64().unwrap() & 0o777, 0o700, "{empty}");
    let table = dev.ok(&["sandbox", "ls", &id, "/work/up", "-o", "table"]);
    let header = table.lines().next().unwrap();
    assert!(
        header.starts_with("TYPE") && header.ends_with("PATH"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("file") && l.contains(" 750 ") && l.ends_with("/work/up/a.txt")),
        "{table}"
    );
    // Down again: the same tree, bytes and modes.
    let down = dev.dir.path().join("down");
    dev.ok(&["sandbox", "cp", &remote, down.to_str().unwrap()]);
    assert_eq!(std::fs::read(down.join("a.txt")).unwrap(), b"alpha\n");
    assert_eq!(
        std::fs::read(down.join("sub/deeper/b.bin")).unwrap(),
        [0u8, 1, 2, 255]
    );
    assert_eq!(mode(&down.join("a.txt")), 0o750);
    assert!(down.join("sub/void").is_dir() && down.join("empty").is_dir());
    // An empty directory on its own is made where it is copied to.
    let alone = dev.dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    dev.ok(&[
        "sandbox",
        "cp",
        alone.to_str().unwrap(),
        &format!("{id}:/work/alone"),
    ]);
    let (code, _, err) = dev.run(&["sandbox", "exec", &id, "--", "test", "-d", "/work/alone"]);
    assert_eq!(code, 0, "/work/alone was not made: {err}");
    // One file into a directory (its name kept), to stdout, and from stdin.
    dev.ok(&[
        "sandbox",
        "cp",
        &format!("{id}:/work/up/a.txt"),
        &format!("{}/", down.display()),
    ]);
    let (code, out, _) = dev.run(&["sandbox", "cp", &format!("{id}:/work/up/a.txt"), "-"]);
    assert_eq!((code, out.as_str()), (0, "alpha\n"));
    let (code, _, err) = output(
        dev.cmd(&["sandbox", "cp", "-", &format!("{id}:/work/from-stdin.txt")]),
        Some(b"piped"),
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = dev.run(&["sandbox", "cp", &format!("{id}:/work/from-stdin.txt"), "-"]);
    assert_eq!((code, out.as_str()), (0, "piped"));
    // rm, then the file is gone (404 on stderr, exit 1).
    dev.ok(&["sandbox", "rm", &id, "/work/up/a.txt"]);
    let (code, _, err) = dev.run(&["sandbox", "cp", &format!("{id}:/work/up/a.txt"), "-"]);
    assert_eq!(code, 1);
    assert!(err.contains("no file or directory /work/up/a.txt"), "{err}");
    // Two local sides is a usage error.
    let (code, _, err) = dev.run(&["sandbox", "cp", "a", "b"]);
    assert_eq!(code, 2);
    assert!(err.contains("SANDBOX:PATH"), "{err}");

    // A relative path in the sandbox is from its root, where exec runs without --cwd: the
    // README's `cp notes.txt "$ID:…"` then `exec -- cat work/notes.txt` in relative terms.
    let notes = dev.dir.path().join("notes.txt");
    std::fs::write(&notes, "relative notes\n").unwrap();
    dev.ok(&[
        "sandbox",
        "cp",
        notes.to_str().unwrap(),
        &format!("{id}:work/notes.txt"),
    ]);
    let (code, out, err) = dev.run(&["sandbox", "exec", &id, "--", "cat", "work/notes.txt"]);
    assert_eq!((code, out.as_str()), (0, "relative notes\n"), "{err}");
    let (code, out, err) = dev.run(&["sandbox", "cp", &format!("{id}:./work/notes.txt"), "-"]);
    assert_eq!((code, out.as_str()), (0, "relative notes\n"), "{err}");
    let listed = dev.ok(&["sandbox", "ls", &id, "work", "-o", "id"]);
    assert!(listed.lines().any(|l| l == "/work/notes.txt"), "{listed}");
    dev.ok(&["sandbox", "rm", &id, "work/notes.txt"]);
    let (code, _, err) = dev.run(&["sandbox", "cp", &format!("{id}:/work/notes.txt"), "-"]);
    assert_eq!(code, 1, "rm of a relative path left the file: {err}");
}

#[test]
fn mkdir_makes_parents_with_the_mode_and_says_when_one_was_there() {
    let dev = Dev::start();
    let id = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let stat = |path: &str| {
        let (code, out, err) =
            dev.run(&["sandbox", "exec", &id, "--", "stat", "-c", "%F %a", path]);
        assert_eq!(code, 0, "stat {path}: {err}");
        out.trim().to_owned()
    };

    // Made, with its parents: a line saying so, the mode asked for, parents 755.
    let out = dev.ok(&[
        "sandbox",
        "mkdir",
        &id,
        "/work/mk/a/b",
        "--mode",
        "750",
        "-o",
        "table",
    ]);
    assert_eq!(out, "made /work/mk/a/b (mode 750)\n");
    assert_eq!(stat("/work/mk/a/b"), "directory 750");
    assert_eq!(stat("/work/mk/a"), "directory 755");
    // Again: already there, still exit 0, its mode left alone; JSON is the API's answer.
    let again = dev.json(&["sandbox", "mkdir", &id, "/work/mk/a/b", "--mode", "700"]);
    assert_eq!(
        again,
        serde_json::json!({ "path": "/work/mk/a/b", "created": false })
    );
    assert_eq!(stat("/work/mk/a/b"), "directory 750");
    let out = dev.ok(&["sandbox", "mkdir", &id, "/work/mk/a/b", "-o", "table"]);
    assert_eq!(
        out,
        "/work/mk/a/b was already a directory (left as it was)\n"
    );
    // A relative path is from the root, the default mode 755, `-o id` the path.
    let out = dev.ok(&["sandbox", "mkdir", &id, "work/rel", "-o", "id"]);
    assert_eq!(out, "/work/rel\n");
    assert_eq!(stat("/work/rel"), "directory 755");
    let made = dev.json(&["sandbox", "mkdir", &id, "/work/rel/x"]);
    assert_eq!(made["created"], true, "{made}");

    // A file in the way: the API's conflict on stderr, exit 1, the file kept.
    let (code, _, err) = output(
        dev.cmd(&["sandbox", "cp", "-", &format!("{id}:/work/mk/f.txt")]),
        Some(b"kept"),
    );
    assert_eq!(code, 0, "{err}");
    for (path, reason) in [
        ("/work/mk/f.txt", "exists_not_directory"),
        ("/work/mk/f.txt/sub", "not_a_directory"),
    ] {
        let (code, out, err) = dev.run(&["sandbox", "mkdir", &id, path]);
        assert_eq!((code, out.as_str()), (1, ""), "{path}: {err}");
        assert!(
            err.contains("409 conflict") && err.contains(reason),
            "{path}: {err}"
        );
    }
    assert!(stat("/work/mk/f.txt").starts_with("regular file"));
    // A mode that is not octal permission bits is a usage error, nothing sent.
    let (code, _, err) = dev.run(&["sandbox", "mkdir", &id, "/work/bad", "--mode", "rwx"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--mode"), "{err}");
    let (code, _, _) = dev.run(&["sandbox", "exec", &id, "--", "test", "-e", "/work/bad"]);
    assert_eq!(code, 1, "/work/bad was made");
}
