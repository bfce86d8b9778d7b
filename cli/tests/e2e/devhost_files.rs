//! `differently dev`'s devhost pool as a user meets it through the API and the CLI: the files
//! API and commands share one filesystem (`/tmp` included), the read-only host directories
//! refuse writes, client mistakes are 4xx naming the path, a missing program is 127, and the
//! isolation is reported as what it is. Needs bubblewrap (`bwrap`), as `differently dev` does.

use serde_json::Value;

use crate::client_cli_dev::{json, Dev};

#[test]
fn files_and_commands_share_one_filesystem_and_path_mistakes_are_409() {
    assert!(
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file())),
        "this test needs bubblewrap: install the Debian package `bubblewrap`"
    );
    let dev = Dev::start();
    let id = dev
        .ok(&["sandbox", "create", "--wait", "-o", "id"])
        .trim()
        .to_owned();
    let local = dev.dir.path().join("hello.txt");
    std::fs::write(&local, "hello from cp\n").unwrap();
    let local = local.display().to_string();

    // OpenSandbox's README example: write /tmp/hello.txt, then cat it.
    dev.ok(&["sandbox", "cp", &local, &format!("{id}:/tmp/hello.txt")]);
    let out = dev.ok(&["sandbox", "exec", &id, "--", "cat", "/tmp/hello.txt"]);
    assert_eq!(out, "hello from cp\n");
    // And the other way: what a command writes under /tmp is what the files API reads.
    dev.ok(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "mkdir -p /work/d; echo back > /tmp/back.txt",
    ]);
    let back = dev.dir.path().join("back.txt");
    dev.ok(&[
        "sandbox",
        "cp",
        &format!("{id}:/tmp/back.txt"),
        &back.display().to_string(),
    ]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "back\n");

    // Client mistakes: 409 `conflict` naming the path, never 503 provider_unavailable.
    for dst in [
        "/work/d",
        "/tmp/hello.txt/under-a-file",
        "/usr/hello.txt",
        "/etc/hello.txt",
    ] {
        let (code, out, err) = dev.run(&["sandbox", "cp", &local, &format!("{id}:{dst}")]);
        assert_eq!(code, 1, "{dst}: {out}{err}");
        assert!(
            err.contains("409") && err.contains("conflict"),
            "{dst}: {err}"
        );
        assert!(!err.contains("provider_unavailable"), "{dst}: {err}");
        assert!(err.contains(dst), "{dst}: {err}");
    }
    let (code, _, _) = dev.run(&["sandbox", "exec", &id, "--", "test", "-e", "/usr/hello.txt"]);
    assert_eq!(code, 1, "nothing was written under /usr");

    // A missing program: 127, in words that do not name the wrapper.
    let (code, out, err) = dev.run(&["sandbox", "exec", &id, "--", "no-such-binary-xyz"]);
    assert_eq!(code, 127, "{out}{err}");
    assert!(
        err.contains("no-such-binary-xyz: command not found"),
        "{err}"
    );
    assert!(!err.contains("bwrap"), "{err}");

    // The isolation in use, reported as it is.
    let pools = dev.json(&["admin", "pools"]);
    let items: Vec<Value> = match &pools {
        Value::Array(a) => a.clone(),
        v => v["items"].as_array().cloned().unwrap_or_default(),
    };
    let local_pool = items
        .iter()
        .find(|p| p["kind"] == "devhost")
        .unwrap_or_else(|| panic!("no devhost pool in {pools}"));
    assert_eq!(local_pool["isolation"], "bwrap", "{local_pool}");
    let report = json(&dev.ok(&["admin", "trust-report", "-o", "json"]));
    let entry = report["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["kind"] == "devhost").cloned())
        .unwrap_or_else(|| panic!("no devhost pool in {report}"));
    assert_eq!(entry["isolation"], "bwrap", "{entry}");
}
