//! A sandbox's life through the CLI: snapshots and forks, ports, keepalive, TTL and label
//! updates, events and logs; and waits that give up.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use crate::harness::{run_with_stdout_closed, Proc};

use super::{ids, json, output, Dev};

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
    // /v1/events can deliver one sandbox's `running` before its `provisioning` (they are
    // published by different tasks; docs/events.md "Order"): the log prints a change only
    // when it is newer than every one printed, so it never goes back, and ends at `running`.
    let statuses: Vec<(u64, String)> = logs
        .lines()
        .map(|l| {
            let e = json(l);
            (
                e["statusVersion"].as_u64().unwrap_or(u64::MAX),
                e["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        statuses.windows(2).all(|w| w[0].0 < w[1].0),
        "versions only go up: {logs}"
    );
    assert!(
        statuses
            .iter()
            .all(|(_, s)| s == "provisioning" || s == "running"),
        "{logs}"
    );
    assert_eq!(
        statuses.last().map(|(_, s)| s.as_str()),
        Some("running"),
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
    // Its reader gone before the answer (`| head`): still exit 1, the timeout on stderr.
    let mut cmd = dev.cmd(&["sandbox", "wait", &second, "--timeout-seconds", "1"]);
    cmd.env("DIFFERENTLY_API_KEY", &key);
    let (code, err) = run_with_stdout_closed(cmd, b"");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("differently: timeout: sandbox") && !err.contains("panicked"),
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
