//! The client commands added for parity with the peers' CLIs, run as a user runs them
//! against a real `differently dev` (devhost pool: real processes and files): exec with
//! stdin and exit codes, `cp` both ways with directories, `ls`/`rm`, snapshots and forks,
//! ports, keepalive, TTL and label updates, events and logs, tenancy, quotas, policies,
//! placement dry run, audit list and export, profiles with `login`, completions, output
//! formats, and a closed pipe.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::harness::{binary, free_port, Proc};

/// A `differently dev` with its URL and admin key, and a private (absent) client config.
/// Shared with `client_cli_webhooks`.
pub(crate) struct Dev {
    _proc: Proc,
    pub(crate) url: String,
    pub(crate) key: String,
    pub(crate) dir: tempfile::TempDir,
}

impl Dev {
    pub(crate) fn start() -> Dev {
        Dev::start_with(&[])
    }

    /// Started with these extra environment variables (e.g. the webhook URL switches).
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(binary())
            .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(dir.path().join("sandboxes"))
            // A sealing key, so stored secrets are enabled.
            .env("DIFFERENTLY_SECRETS_KEY", "cd".repeat(32))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("dev.log")).unwrap())
            .spawn()
            .unwrap();
        let mut proc = Proc { child };
        let stdout = proc.child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let url = lines.next().unwrap().unwrap();
        let key = lines.next().unwrap().unwrap();
        std::thread::spawn(move || for _ in lines {});
        Dev {
            _proc: proc,
            url: url
                .strip_prefix("export DIFFERENTLY_URL=")
                .unwrap()
                .to_owned(),
            key: key
                .strip_prefix("export DIFFERENTLY_API_KEY=")
                .unwrap()
                .to_owned(),
            dir,
        }
    }

    /// `POST path` with the admin key; the JSON answer, which must be a success.
    pub(crate) async fn post(&self, path: &str, body: Value) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("client").join("client.toml")
    }

    /// `differently args…` with the URL and key in the environment.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.args(args)
            .env("DIFFERENTLY_URL", &self.url)
            .env("DIFFERENTLY_API_KEY", &self.key)
            .env("DIFFERENTLY_CLIENT_CONFIG", self.config())
            .env_remove("DIFFERENTLY_PROFILE")
            .stdin(Stdio::null());
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> (i32, String, String) {
        output(self.cmd(args), None)
    }

    /// Runs and expects exit 0; stdout.
    #[track_caller]
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args);
        assert_eq!(code, 0, "differently {args:?}: {err}\n{out}");
        out
    }

    #[track_caller]
    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        json(&self.ok(&all))
    }
}

/// Runs `cmd` with `stdin` (or none); (exit code, stdout, stderr).
fn output(mut cmd: Command, stdin: Option<&[u8]>) -> (i32, String, String) {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().unwrap();
        w.write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
pub(crate) fn json(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

fn ids(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

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
    let remote = format!("{id}:/work/up");
    dev.ok(&["sandbox", "cp", local.to_str().unwrap(), &remote]);
    // ls: JSON list, a table, and paths with -o id.
    let listed = dev.json(&["sandbox", "ls", &id, "/work/up", "--depth", "3"]);
    let mut paths: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "/work/up/a.txt",
            "/work/up/sub",
            "/work/up/sub/deeper",
            "/work/up/sub/deeper/b.bin"
        ]
    );
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

#[cfg(unix)]
fn set_mode(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn snapshots_forks_ports_keepalive_updates_events_and_logs() {
    let dev = Dev::start();
    let id = dev
        .ok(&[
            "sandbox", "create", "--wait", "--label", "team=a", "-o", "id",
        ])
        .trim()
        .to_owned();
    // Relative to the command's directory, the sandbox's root (devhost may run unisolated,
    // where an absolute path would be this machine's).
    dev.ok(&[
        "sandbox",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo kept > work-file",
    ]);

    // Update: TTL and labels (replaced), then cleared; keepalive answers nothing, exit 0.
    let s = dev.json(&[
        "sandbox",
        "update",
        &id,
        "--ttl-seconds",
        "7200",
        "--label",
        "team=b",
    ]);
    assert_eq!(
        (s["ttlSeconds"].as_u64(), s["labels"]["team"].as_str()),
        (Some(7200), Some("b"))
    );
    let s = dev.json(&["sandbox", "update", &id, "--clear-labels"]);
    assert_eq!(s["labels"], serde_json::json!({}));
    let (code, _, err) = dev.run(&["sandbox", "update", &id]);
    assert_eq!(code, 2);
    assert!(err.contains("nothing to change"), "{err}");
    assert_eq!(dev.ok(&["sandbox", "keepalive", &id]), "");
    // A port's URL, alone with -o id, where devhost can expose one (unisolated; bubblewrap
    // unshares the network): else the API's 501. The fake pool's success is in client_cli.rs.
    let caps = dev.json(&["admin", "pool", "local"])["capabilities"].clone();
    let (code, url, err) = dev.run(&["sandbox", "expose", &id, "8080", "-o", "id"]);
    if caps.as_array().unwrap().iter().any(|c| c == "ports.expose") {
        assert_eq!(code, 0, "{err}");
        assert!(
            url.trim().starts_with("http") && url.contains("8080"),
            "{url}"
        );
    } else {
        assert_eq!(code, 1);
        assert!(err.contains("501 unsupported_operation"), "{err}");
    }

    // Snapshots: create, list (of the sandbox, and all), get, fork (has the file), delete.
    let snap = dev.json(&["snapshot", "create", &id, "--name", "first"]);
    let sid = snap["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (snap["status"].as_str(), snap["name"].as_str()),
        (Some("ready"), Some("first"))
    );
    assert_eq!(
        ids(&dev.json(&["snapshot", "list", "--sandbox", &id])),
        [sid.as_str()]
    );
    assert_eq!(ids(&dev.json(&["snapshot", "list"])), [sid.as_str()]);
    assert_eq!(
        dev.json(&["snapshot", "get", &sid])["sandboxId"].as_str(),
        Some(id.as_str())
    );
    let table = dev.ok(&["snapshot", "list", "-o", "table"]);
    assert!(
        table.starts_with("ID") && table.contains(&sid) && table.contains("first"),
        "{table}"
    );
    let fork = dev.json(&["snapshot", "fork", &sid, "--wait", "--label", "forked=yes"]);
    let fid = fork["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (fork["status"].as_str(), fork["labels"]["forked"].as_str()),
        (Some("running"), Some("yes"))
    );
    let (code, out, _) = dev.run(&["sandbox", "cp", &format!("{fid}:/work-file"), "-"]);
    assert_eq!((code, out.as_str()), (0, "kept\n"));
    // The same through `sandbox create --from-snapshot`.
    let restored = dev.json(&["sandbox", "create", "--from-snapshot", &sid, "--wait"]);
    assert_eq!(restored["status"], "running");
    dev.ok(&["sandbox", "delete", &fid]);
    dev.ok(&["sandbox", "delete", restored["id"].as_str().unwrap()]);
    dev.ok(&["snapshot", "delete", &sid]);
    let (code, _, err) = dev.run(&["snapshot", "get", &sid]);
    assert_eq!(code, 1, "{err}");

    // Logs: this sandbox's status changes from its start, as JSON lines; the events of
    // everything with --sandbox give the same.
    let logs = dev.ok(&["sandbox", "logs", &id, "-o", "json"]);
    // In status-version order: /v1/events can deliver one sandbox's `running` before its
    // `provisioning` (they are published by different tasks; a known gap, see the closing
    // note of 2026-12-01), so the order of arrival is not asserted here.
    let mut statuses: Vec<(u64, String)> = logs
        .lines()
        .map(|l| {
            let e = json(l);
            (
                e["statusVersion"].as_u64().unwrap_or(u64::MAX),
                e["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    statuses.sort();
    assert_eq!(
        statuses[..2]
            .iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>(),
        ["provisioning", "running"],
        "{logs}"
    );
    let events = dev.ok(&["events", "--sandbox", &id, "-o", "json"]);
    assert_eq!(events, logs);
    let first_seq = json(logs.lines().next().unwrap())["id"].as_u64().unwrap();
    let after = dev.ok(&[
        "events",
        "--sandbox",
        &id,
        "--after",
        &first_seq.to_string(),
        "-o",
        "id",
    ]);
    assert!(
        !after.lines().any(|l| l == first_seq.to_string()),
        "{after}"
    );
    // -f follows: a delete while it runs shows up as terminating.
    let mut follow = dev.cmd(&["sandbox", "logs", &id, "-f", "-o", "json"]);
    follow.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = Proc {
        child: follow.spawn().unwrap(),
    };
    let mut lines = BufReader::new(child.child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // The history from its start (either of its first two changes; see above).
    let first_status = json(&first)["status"].clone();
    assert!(
        first_status == "provisioning" || first_status == "running",
        "{first}"
    );
    dev.ok(&["sandbox", "delete", &id]);
    let terminating = lines
        .by_ref()
        .map(|l| json(&l.unwrap()))
        .find(|e| e["status"] == "terminating");
    assert!(
        terminating.is_some(),
        "the followed log never showed the delete"
    );
    drop(child);
}

#[test]
fn tenancy_quotas_policies_dry_run_and_audit() {
    let dev = Dev::start();
    let org = dev.json(&["org", "create", "acme"]);
    let org_id = org["id"].as_str().unwrap().to_owned();
    assert!(ids(&dev.json(&["org", "list"])).contains(&org_id));
    assert_eq!(dev.json(&["org", "get", &org_id])["name"], "acme");
    assert_eq!(
        dev.json(&["org", "update", &org_id, "--status", "suspended"])["status"],
        "suspended"
    );
    dev.ok(&["org", "update", &org_id, "--status", "active"]);
    let project = dev.json(&["project", "create", "web", "--org", &org_id]);
    let pid = project["id"].as_str().unwrap().to_owned();
    assert_eq!(
        ids(&dev.json(&["project", "list", "--org", &org_id])),
        [pid.as_str()]
    );
    assert_eq!(
        dev.json(&["project", "rename", &pid, "site"])["name"],
        "site"
    );
    assert_eq!(dev.json(&["project", "get", &pid])["name"], "site");

    // A key: its secret with -o id, and it works for that project only.
    let secret = dev
        .ok(&[
            "key",
            "create",
            "ci",
            "--org",
            &org_id,
            "--project",
            &pid,
            "--scope",
            "sandboxes:read",
            "--scope",
            "sandboxes:write",
            "-o",
            "id",
        ])
        .trim()
        .to_owned();
    assert!(secret.starts_with("dly_"), "{secret}");
    let mut as_tenant = dev.cmd(&["sandbox", "list", "-o", "json"]);
    as_tenant.env("DIFFERENTLY_API_KEY", &secret);
    let (code, out, err) = output(as_tenant, None);
    assert_eq!(
        (code, json(&out)["items"].as_array().map(Vec::len)),
        (0, Some(0)),
        "{err}"
    );
    let keys = dev.json(&["key", "list", "--org", &org_id]);
    let key_id = keys["items"][0]["id"].as_str().unwrap().to_owned();
    assert!(
        !keys.to_string().contains(&secret),
        "a list shows the secret"
    );
    assert_eq!(dev.json(&["key", "get", &key_id])["name"], "ci");
    assert!(dev.json(&["key", "revoke", &key_id])["revokedAt"].is_string());

    // Quotas and policies.
    let q = dev.json(&["quota", "set", "--org", &org_id, "--max-active", "3"]);
    assert_eq!(q["quota"]["maxActive"], 3, "{q}");
    assert_eq!(
        dev.json(&["quota", "get", "--org", &org_id])["effective"]["maxActive"],
        3
    );
    let (code, _, err) = dev.run(&["quota", "get"]);
    assert_eq!(code, 2, "a quota needs --org or --project: {err}");
    let policy = dev.dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"allowedClassifications":["internal"]}"#).unwrap();
    let set = dev.json(&[
        "policy",
        "set",
        "--org",
        &org_id,
        "--file",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(
        set["allowedClassifications"],
        serde_json::json!(["internal"])
    );
    assert_eq!(
        dev.json(&["policy", "get", "--org", &org_id])["allowedClassifications"],
        serde_json::json!(["internal"])
    );
    std::fs::write(&policy, r#"{"allowedClasifications":["internal"]}"#).unwrap();
    let (code, _, err) = dev.run(&[
        "policy",
        "set",
        "--global",
        "--file",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("allowedClasifications"),
        "the API names the unknown field: {err}"
    );
    let global = dev.dir.path().join("global.json");
    std::fs::write(&global, r#"{"deniedPools":["elsewhere"]}"#).unwrap();
    let set = dev.json(&[
        "policy",
        "set",
        "--global",
        "--file",
        global.to_str().unwrap(),
    ]);
    assert_eq!(set["deniedPools"], serde_json::json!(["elsewhere"]));
    assert_eq!(
        dev.json(&["policy", "get", "--global"])["deniedPools"],
        serde_json::json!(["elsewhere"])
    );
    let mut from_stdin = dev.cmd(&[
        "policy",
        "set",
        "--project",
        &pid,
        "--file",
        "-",
        "-o",
        "json",
    ]);
    from_stdin.stdin(Stdio::piped());
    let (code, out, err) = output(from_stdin, Some(br#"{"allowedRegions":["eu"]}"#));
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["allowedRegions"], serde_json::json!(["eu"]));
    assert_eq!(
        dev.json(&["policy", "get", "--project", &pid])["allowedRegions"],
        serde_json::json!(["eu"])
    );
    let q = dev.json(&[
        "quota",
        "set",
        "--project",
        &pid,
        "--max-active",
        "2",
        "--max-cpu",
        "4",
    ]);
    assert_eq!(
        (
            q["quota"]["maxActive"].as_u64(),
            q["quota"]["maxCpu"].as_u64()
        ),
        (Some(2), Some(4)),
        "{q}"
    );
    let q = dev.json(&["quota", "get", "--project", &pid]);
    assert_eq!(q["effective"]["maxActive"], 2, "{q}");
    dev.ok(&["project", "delete", &pid]);
    dev.ok(&["org", "delete", &org_id]);

    // Placement dry run: where it would go, nothing created.
    let dry = dev.json(&["sandbox", "create", "--dry-run", "--profile", "small"]);
    assert_eq!(
        (dry["decision"].as_str(), dry["pool"].as_str()),
        (Some("placed"), Some("local"))
    );
    assert_eq!(ids(&dev.json(&["sandbox", "list"])).len(), 0);

    // Audit: list with a filter, export as JSON lines that verify offline.
    let listed = dev.json(&[
        "admin",
        "audit-list",
        "--org",
        &org_id,
        "--action",
        "org.create",
    ]);
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let table = dev.ok(&["admin", "audit-list", "--org", &org_id, "-o", "table"]);
    assert!(
        table.starts_with("SEQ") && table.contains("org.create"),
        "{table}"
    );
    let export = dev.dir.path().join("audit.jsonl");
    dev.ok(&["admin", "audit-export", "--file", export.to_str().unwrap()]);
    let text = std::fs::read_to_string(&export).unwrap();
    assert!(text.lines().count() >= 5, "{text}");
    let (code, out, _) = dev.run(&["admin", "audit-export"]);
    assert_eq!((code, out.lines().count()), (0, text.lines().count()));
    // A checkpoint now; a second one right after has nothing new to sign.
    let (code, out, err) = dev.run(&["admin", "audit-checkpoint", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(json(&out).is_object(), "{out}");
    let (code, out, err) = dev.run(&["admin", "audit-checkpoint"]);
    assert_eq!((code, out.as_str()), (0, ""));
    assert!(err.contains("nothing changed"), "{err}");
    let pools = dev.ok(&["admin", "pools", "-o", "table"]);
    assert!(
        pools.starts_with("NAME") && pools.contains("devhost"),
        "{pools}"
    );
    // The trust report as a table: its sections as tables and lines, never a cell of JSON.
    let report = dev.ok(&["admin", "trust-report", "-o", "table"]);
    for heading in [
        "POOLS",
        "CREDENTIALS",
        "EXTERNAL PLACEMENTS",
        "NOT ENFORCED",
    ] {
        assert!(
            report.lines().any(|l| l == heading),
            "no {heading}: {report}"
        );
    }
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("local ") && l.contains("devhost")),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("- Differently does not isolate sandboxes")),
        "{report}"
    );
    assert!(
        !report.contains("[\"") && !report.contains("{\""),
        "JSON in the table: {report}"
    );
    // Every signature verifies: a new segment is refused (409), exit 1.
    let (code, _, err) = dev.run(&["admin", "audit-segment", "--reason", "drill"]);
    assert_eq!(code, 1);
    assert!(err.contains("409"), "{err}");

    // Pools registered through the API: create, update, delete.
    let pool = dev.dir.path().join("pool.json");
    std::fs::write(&pool, r#"{"name":"extra","kind":"fake"}"#).unwrap();
    let made = dev.json(&["admin", "pool-create", "--file", pool.to_str().unwrap()]);
    assert_eq!(
        (made["name"].as_str(), made["source"].as_str()),
        (Some("extra"), Some("api"))
    );
    std::fs::write(&pool, r#"{"maxConcurrent":4}"#).unwrap();
    let changed = dev.json(&[
        "admin",
        "pool-update",
        "extra",
        "--file",
        pool.to_str().unwrap(),
    ]);
    assert_eq!(changed["maxConcurrent"], 4, "{changed}");
    dev.ok(&["admin", "pool-delete", "extra"]);
    let (code, _, err) = dev.run(&["admin", "pool", "extra"]);
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");

    // Secrets: the value from stdin, never printed back.
    let mut set = dev.cmd(&["admin", "secret-set", "backend-token", "-o", "json"]);
    set.stdin(Stdio::piped());
    let (code, out, err) = output(set, Some(b"s3cr3t-value\n"));
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("s3cr3t") && !err.contains("s3cr3t"),
        "{out}{err}"
    );
    let listed = dev.json(&["admin", "secrets"]);
    assert_eq!(listed["items"][0]["name"], "backend-token", "{listed}");
    assert!(!listed.to_string().contains("s3cr3t"));
    let (code, _, err) = dev.run(&["admin", "secret-set", "empty"]);
    assert_eq!(code, 2, "no value on stdin: {err}");
}

#[test]
fn login_profiles_env_overrides_and_completions() {
    let dev = Dev::start();
    // No key anywhere: exit 2, naming the ways to give one.
    let mut none = dev.cmd(&["sandbox", "list"]);
    none.env_remove("DIFFERENTLY_API_KEY")
        .env_remove("DIFFERENTLY_URL");
    let (code, _, err) = output(none, None);
    assert_eq!(code, 2);
    assert!(err.contains("differently login"), "{err}");

    // A bad key is refused by login and stores nothing.
    let mut bad = dev.cmd(&["login", "--url", &dev.url]);
    bad.env_remove("DIFFERENTLY_API_KEY");
    let (code, _, err) = output(bad, Some(b"dly_key_01M8PX56B2BMV5VM228QHCMTS7_nope\n"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401"), "{err}");
    assert!(!dev.config().exists());

    // login with the key on stdin writes the profile, mode 0600.
    let mut login = dev.cmd(&["login", "--url", &dev.url, "--config-profile", "local"]);
    login
        .env_remove("DIFFERENTLY_API_KEY")
        .env_remove("DIFFERENTLY_URL");
    let (code, _, err) = output(login, Some(format!("{}\n", dev.key).as_bytes()));
    assert_eq!(code, 0, "{err}");
    #[cfg(unix)]
    assert_eq!(mode(&dev.config()), 0o600);
    let text = std::fs::read_to_string(dev.config()).unwrap();
    assert!(
        text.contains("[profiles.local]") && text.contains(&dev.url),
        "{text}"
    );
    assert!(!err.contains(&dev.key), "login printed the key: {err}");

    // The profile alone is enough; an unknown one is an error naming it.
    let with_profile = |profile: &str| {
        let mut c = dev.cmd(&["sandbox", "list", "-o", "json", "--config-profile", profile]);
        c.env_remove("DIFFERENTLY_API_KEY")
            .env_remove("DIFFERENTLY_URL");
        output(c, None)
    };
    let (code, out, err) = with_profile("local");
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["items"].is_array());
    let (code, _, err) = with_profile("staging");
    assert_eq!(code, 2);
    assert!(err.contains("no profile \"staging\""), "{err}");
    // The environment overrides the profile: a URL where nothing listens wins, and says so.
    let mut c = dev.cmd(&["sandbox", "list", "--config-profile", "local"]);
    c.env("DIFFERENTLY_URL", "http://127.0.0.1:1")
        .env_remove("DIFFERENTLY_API_KEY");
    let (code, _, err) = output(c, None);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot reach the API at http://127.0.0.1:1")
            && err.contains("differently dev"),
        "{err}"
    );
    assert!(!err.contains(&dev.key), "the key leaked: {err}");

    // Completions for the shells clap_complete knows; bash's names the commands.
    let bash = dev.ok(&["completions", "bash"]);
    assert!(
        bash.contains("_differently") && bash.contains("snapshot"),
        "{}",
        &bash[..200.min(bash.len())]
    );
    for shell in ["zsh", "fish"] {
        assert!(!dev.ok(&["completions", shell]).is_empty());
    }
    let (code, _, _) = dev.run(&["completions", "tcsh-nope"]);
    assert_eq!(code, 2);
}

/// `sandbox wait` and `create --wait` that give up exit 1 with `timeout` on stderr (a script
/// under `set -e` stops there), print the sandbox as last seen on stdout, and say on stderr,
/// once, what they wait for when stderr is not a terminal. A sandbox held back by its org's
/// quota stays `queued`.
#[test]
fn waits_that_give_up_exit_1_and_say_what_they_wait_for() {
    let dev = Dev::start();
    let org = dev.json(&["org", "create", "waiting"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let project = dev.json(&["project", "create", "web", "--org", &org])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let key = dev
        .ok(&[
            "key",
            "create",
            "ci",
            "--org",
            &org,
            "--project",
            &project,
            "--scope",
            "sandboxes:read",
            "--scope",
            "sandboxes:write",
            "-o",
            "id",
        ])
        .trim()
        .to_owned();
    dev.ok(&["quota", "set", "--org", &org, "--max-active", "1"]);
    let tenant = |args: &[&str]| {
        let mut c = dev.cmd(args);
        c.env("DIFFERENTLY_API_KEY", &key);
        output(c, None)
    };
    let (code, out, err) = tenant(&["sandbox", "create", "--wait", "-o", "id"]);
    assert_eq!(code, 0, "{err}");
    let first = out.trim().to_owned();

    // The second is held by the quota: `create --wait` gives up, exit 1, the id still printed.
    let (code, out, err) = tenant(&[
        "sandbox",
        "create",
        "--wait",
        "--wait-seconds",
        "2",
        "-o",
        "id",
    ]);
    assert_eq!(code, 1, "{err}{out}");
    let second = out.trim().to_owned();
    assert!(second.starts_with("sbx_"), "{out}");
    assert!(
        err.starts_with(&format!(
            "differently: waiting up to 2s for sandbox {second} to be running…\n"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "differently: timeout: sandbox {second} is still queued after 2s, not running (wait longer with --wait-seconds)"
        )),
        "{err}"
    );
    // `sandbox wait` on it: the same, with its own flag named; stdout stays the JSON answer.
    let (code, out, err) = tenant(&["sandbox", "wait", &second, "--timeout-seconds", "1"]);
    assert_eq!(code, 1, "{err}{out}");
    assert_eq!(json(&out)["status"], "queued", "{out}");
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        err.contains("differently: timeout: sandbox")
            && err.contains("--timeout-seconds")
            && err.contains(&format!(
                "waiting up to 1s for sandbox {second} to be running"
            )),
        "{err}"
    );
    // Waiting for what it already is: exit 0.
    let (code, out, err) = tenant(&["sandbox", "wait", &first]);
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("running")),
        "{err}"
    );
    // Deleted while queued, it ends without running: exit 1, `ended`.
    let (code, _, err) = tenant(&["sandbox", "delete", &second]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tenant(&["sandbox", "wait", &second, "--timeout-seconds", "60"]);
    assert_eq!(code, 1, "{err}{out}");
    assert!(
        err.contains(&format!("differently: ended: sandbox {second} is ")),
        "{err}"
    );
}

/// `login` stores the key it was given (stdin or `--key`), not `DIFFERENTLY_API_KEY`; it saves
/// nothing the API refuses or cannot be asked about, unless told `--no-verify`; it never
/// prints a key.
#[test]
fn login_takes_the_key_given_and_saves_only_what_the_api_accepts() {
    let dev = Dev::start();
    let bogus = "dly_key_01M8PX56B2BMV5VM228QHCMTS7_nope";
    let login = |args: &[&str], env_key: Option<&str>, stdin: Option<&[u8]>| {
        let mut all = vec!["login", "--url"];
        all.extend_from_slice(args);
        let mut c = dev.cmd(&all);
        c.env_remove("DIFFERENTLY_URL");
        match env_key {
            Some(k) => c.env("DIFFERENTLY_API_KEY", k),
            None => c.env_remove("DIFFERENTLY_API_KEY"),
        };
        let (code, out, err) = output(c, stdin);
        for secret in [bogus, dev.key.as_str()] {
            assert!(
                !out.contains(secret) && !err.contains(secret),
                "login printed a key: {out}{err}"
            );
        }
        (code, err)
    };
    let saved = || std::fs::read_to_string(dev.config()).unwrap_or_default();

    // A valid key in the environment, a bad one given on stdin: the given one is checked,
    // refused, and nothing is saved (it once saved the environment's and said so).
    let (code, err) = login(
        &[&dev.url],
        Some(&dev.key),
        Some(format!("{bogus}\n").as_bytes()),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("401") && err.contains("nothing was saved"),
        "{err}"
    );
    assert!(!dev.config().exists(), "{}", saved());

    // The other way round: the good key on stdin is saved, the environment's ignored, said so.
    let (code, err) = login(
        &[&dev.url, "--config-profile", "stdin"],
        Some(bogus),
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("using the key from standard input (DIFFERENTLY_API_KEY is ignored)"),
        "{err}"
    );
    assert!(
        saved().contains(&dev.key) && !saved().contains(bogus),
        "{}",
        saved()
    );
    // --key wins over the environment too.
    let (code, err) = login(
        &[&dev.url, "--config-profile", "flag", "--key", &dev.key],
        Some(bogus),
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(saved().contains("[profiles.flag]"), "{}", saved());
    // Only the environment's: used, and said so.
    let (code, err) = login(&[&dev.url, "--config-profile", "env"], Some(&dev.key), None);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("using the key in DIFFERENTLY_API_KEY"),
        "{err}"
    );

    // An API that cannot be reached: nothing saved, the way around named; --no-verify saves.
    let (code, err) = login(
        &["http://127.0.0.1:1", "--config-profile", "down"],
        None,
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot check the key") && err.contains("--no-verify"),
        "{err}"
    );
    assert!(!saved().contains("[profiles.down]"), "{}", saved());
    let (code, err) = login(
        &[
            "http://127.0.0.1:1",
            "--config-profile",
            "down",
            "--no-verify",
        ],
        None,
        Some(format!("{}\n", dev.key).as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("without being checked"), "{err}");
    assert!(
        saved().contains("[profiles.down]") && saved().contains("http://127.0.0.1:1"),
        "{}",
        saved()
    );
    #[cfg(unix)]
    assert_eq!(mode(&dev.config()), 0o600);
}

/// On a terminal (util-linux `script` gives the command one): a table by default, and the
/// spinner on `--wait`, cleared before the answer. Piped, the same command printed JSON and
/// no spinner (above).
#[test]
fn a_terminal_gets_tables_and_a_spinner() {
    let dev = Dev::start();
    let script = ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "util-linux `script` is needed to give the CLI a terminal: apt-get install util-linux",
        );
    let line = format!("{} sandbox create --wait --label tty=yes", binary());
    let mut cmd = Command::new(script);
    cmd.args(["-qec", &line, "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
        .stdin(Stdio::null());
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
    let mut cmd = Command::new(script);
    cmd.args(["-qec", &format!("{} sandbox list", binary()), "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
        .stdin(Stdio::null());
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
    let script = ["/usr/bin/script", "/bin/script"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "util-linux `script` is needed to give the CLI a terminal: apt-get install util-linux",
        );
    let before = dev.dir.path().join("stty.before");
    let after = dev.dir.path().join("stty.after");
    let line = format!(
        "stty -g > {b}; {bin} sandbox exec -it {id} -- sh; echo \"rc=$?\"; stty -g > {a}",
        b = before.display(),
        a = after.display(),
        bin = binary(),
    );
    let mut child = Command::new(script)
        .args(["-qfec", &line, "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Typed as a person would, the terminal echoing it; stdin stays open until the end, so
    // `script` never reports an end of input.
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(b"echo hi-$((40+2)); exit 3\n").unwrap();
    let out = child.wait_with_output().unwrap();
    drop(keys);
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
    let mut child = Command::new(script)
        .args(["-qfec", &line, "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let keys = child.stdin.take().unwrap();
    let out = child.wait_with_output().unwrap();
    drop(keys);
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
    let mut child = Command::new(script)
        .args(["-qfec", &line, "/dev/null"])
        .env("DIFFERENTLY_URL", &dev.url)
        .env("DIFFERENTLY_API_KEY", &dev.key)
        .env("DIFFERENTLY_CLIENT_CONFIG", dev.config())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut keys = child.stdin.take().unwrap();
    keys.write_all(
        b"echo \"at-open $(stty size)\"; i=0; while [ \"$(stty size)\" = '24 80' ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; echo \"resized $(stty size)\"; exit 3\n",
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    drop(keys);
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
