//! The client commands (`differently sandbox …`, `differently admin …`) against a running
//! control plane: what they print, the exit codes scripts rely on, and that the key never
//! shows in an error.

use serde_json::Value;

use crate::harness::{binary, run_with_stdout_closed, Cluster, Opts};

/// Runs `differently args…` with the cluster's URL and `key`; (exit code, stdout, stderr).
async fn run(c: &Cluster, key: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(binary());
    cmd.args(args)
        .env("DIFFERENTLY_URL", c.url())
        // No profile from the developer's own client config.
        .env(
            "DIFFERENTLY_CLIENT_CONFIG",
            "/nonexistent/differently-client.toml",
        )
        .env_remove("DIFFERENTLY_API_KEY");
    if let Some(k) = key {
        cmd.env("DIFFERENTLY_API_KEY", k);
    }
    output(cmd).await
}

/// Runs `cmd` to its end off the async workers; (exit code, stdout, stderr).
async fn output(mut cmd: std::process::Command) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn json(text: &str) -> Value {
    match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => panic!("not JSON ({e}): {text}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_and_admin_commands_over_the_api() {
    let c = Cluster::started(Opts::default()).await;
    let key = Some(c.key.as_str());

    // Create and wait: the running sandbox is printed.
    let (code, out, err) = run(
        &c,
        key,
        &[
            "sandbox",
            "create",
            "--wait",
            "--label",
            "team=cli",
            "--idempotency-key",
            "cli-1",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let created = json(&out);
    assert_eq!(created["status"], "running", "{out}");
    let id = created["id"].as_str().unwrap().to_owned();
    // The same Idempotency-Key is the same sandbox.
    let retry = [
        "sandbox",
        "create",
        "--label",
        "team=cli",
        "--idempotency-key",
        "cli-1",
    ];
    let (code, out, err) = run(&c, key, &retry).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["id"].as_str(), Some(id.as_str()));
    // `-o id`: only the id, for scripts; a list prints each item's id on its own line.
    let mut with_id = retry.to_vec();
    with_id.extend(["-o", "id"]);
    let (code, out, err) = run(&c, key, &with_id).await;
    assert_eq!(
        (code, out.as_str()),
        (0, format!("{id}\n").as_str()),
        "{err}"
    );
    let (code, out, err) = run(
        &c,
        key,
        &["sandbox", "list", "-o", "id", "--label", "team=cli"],
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, format!("{id}\n").as_str()),
        "{err}"
    );
    // A reader that is gone before the answer (`| true`, like `| head`) ends the command quietly, exit 0, no panic.
    let mut piped = std::process::Command::new("bash");
    piped
        .arg("-c")
        .arg(format!(
            "set -o pipefail; \"$0\" sandbox placement {id} | true"
        ))
        .arg(binary())
        .env("DIFFERENTLY_URL", c.url())
        .env("DIFFERENTLY_API_KEY", &c.key);
    let (code, _, err) = output(piped).await;
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Another body under the same key is the API's 409, exit 1.
    let (code, _, err) = run(
        &c,
        key,
        &["sandbox", "create", "--idempotency-key", "cli-1"],
    )
    .await;
    assert_eq!(code, 1);
    assert!(err.contains("409 conflict"), "{err}");

    // Exec: the command's output on our stdout and stderr, its exit code as ours.
    let (code, out, err) = run(
        &c,
        key,
        &["sandbox", "exec", &id, "--", "echo", "hi", "there"],
    )
    .await;
    assert_eq!((code, out.as_str(), err.as_str()), (0, "hi there\n", ""));
    let (code, _, err) = run(
        &c,
        key,
        &["sandbox", "exec", &id, "--", "fake-stderr", "oops"],
    )
    .await;
    assert_eq!((code, err.as_str()), (0, "oops\n"));
    let (code, _, _) = run(&c, key, &["sandbox", "exec", &id, "--", "fake-exit", "3"]).await;
    assert_eq!(code, 3);

    // Reads.
    let (code, out, _) = run(&c, key, &["sandbox", "list", "--label", "team=cli"]).await;
    assert_eq!(code, 0);
    let ids: Vec<String> = json(&out)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec![id.clone()]);
    let (code, out, _) = run(&c, key, &["sandbox", "placement", &id]).await;
    assert_eq!((code, json(&out)["decision"].as_str()), (0, Some("placed")));
    let (code, out, _) = run(&c, key, &["admin", "pools"]).await;
    assert_eq!(code, 0);
    assert!(json(&out)["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fake"));
    let (code, out, err) = run(&c, key, &["admin", "trust-report"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["pools"].is_array(), "{out}");
    let (code, out, err) = run(&c, key, &["admin", "audit-verify"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["ok"], true, "{out}");

    // Errors: the API's code on stderr, exit 1; no key is exit 2; a key never shows.
    let bogus = "dly_key_01M8PX56B2BMV5VM228QHCMTS7_notTheRealSecretAtAll";
    let (code, out, err) = run(&c, Some(bogus), &["sandbox", "get", &id]).await;
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("401 unauthenticated"), "{err}");
    assert!(!err.contains("notTheRealSecret"), "the key leaked: {err}");
    let (code, _, err) = run(&c, key, &["sandbox", "get", "sbx_nope"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("404 not_found"), "{err}");
    let (code, _, err) = run(&c, None, &["sandbox", "list"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("DIFFERENTLY_API_KEY"), "{err}");
    let (code, _, err) = run(&c, key, &["sandbox", "create", "--label", "nolabel"]).await;
    assert_eq!(code, 2);
    assert!(err.contains("--label"), "{err}");
    // Nothing listening: the cause and what to check, not only "error sending request".
    let mut cmd = std::process::Command::new(binary());
    cmd.args(["sandbox", "list", "--url", "http://127.0.0.1:1"])
        .env("DIFFERENTLY_API_KEY", &c.key);
    let (code, _, err) = output(cmd).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("Connection refused")
            && err.contains("cannot reach the API at http://127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains(&c.key), "the key leaked: {err}");

    // Delete: terminating now, terminated after.
    let (code, out, _) = run(&c, key, &["sandbox", "delete", &id]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("terminating"))
    );
    let (code, out, _) = run(&c, key, &["sandbox", "wait", &id, "--status", "terminated"]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("terminated"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_checks_what_a_server_needs_and_names_what_is_missing() {
    let c = Cluster::new(Opts::default()).await;
    // Everything in place: one passing line per check, the pool's included.
    let (code, out, _) = output(c.command(&["preflight"])).await;
    assert_eq!(code, 0, "{out}");
    for line in [
        "ok    keys",
        "ok    bootstrap key",
        "ok    postgres",
        "ok    nats",
        "ok    pool fake",
    ] {
        assert!(out.contains(line), "no {line:?} in:\n{out}");
    }
    // An unreachable bus and a missing bootstrap key fail, named; the rest still runs.
    let mut cmd = c.command(&["preflight"]);
    cmd.env("DIFFERENTLY_NATS_URL", "nats://127.0.0.1:1")
        .env_remove("DIFFERENTLY_BOOTSTRAP_KEY");
    let (code, out, _) = output(cmd).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  nats"), "{out}");
    assert!(out.contains("FAIL  bootstrap key"), "{out}");
    assert!(out.contains("ok    postgres"), "{out}");
    assert!(!out.contains(&c.key), "the bootstrap key leaked:\n{out}");
    // Its reader gone before the lines (`| head`): still exit 1, what failed on stderr.
    let mut cmd = c.command(&["preflight"]);
    cmd.env("DIFFERENTLY_NATS_URL", "nats://127.0.0.1:1");
    let (code, err) = run_with_stdout_closed(cmd, b"");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("preflight failed: nats"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// What devhost cannot do (stop, and ports when isolated) through the CLI on the fake pool
/// that has it: `expose` prints the URL; pause, resume, stop and start go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expose_stop_and_start_where_the_pool_has_them() {
    let c = crate::dataplane::cluster(Opts::default()).await;
    let key = Some(c.key.as_str());
    let (code, out, err) = run(
        &c,
        key,
        &[
            "sandbox",
            "create",
            "--wait",
            "--capability",
            "lifecycle.stop",
            "--capability",
            "ports.expose",
            "-o",
            "id",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let id = out.trim().to_owned();
    let (code, out, err) = run(&c, key, &["sandbox", "get", &id]).await;
    assert_eq!(
        (code, json(&out)["pool"].as_str()),
        (0, Some("fake")),
        "{err}"
    );
    let (code, out, err) = run(&c, key, &["sandbox", "expose", &id, "3000", "-o", "id"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.trim().starts_with("http") && out.lines().count() == 1,
        "{out}"
    );
    let (code, out, err) = run(
        &c,
        key,
        &["sandbox", "expose", &id, "3000", "--expires-seconds", "60"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(json(&out)["expiresAt"].is_string(), "{out}");
    let (code, out, err) = run(&c, key, &["sandbox", "pause", &id]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        matches!(json(&out)["status"].as_str(), Some("pausing" | "paused")),
        "{out}"
    );
    let (code, out, err) = run(&c, key, &["sandbox", "wait", &id, "--status", "paused"]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("paused")),
        "{err}"
    );
    let (code, _, err) = run(&c, key, &["sandbox", "resume", &id]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&c, key, &["sandbox", "wait", &id]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("running")),
        "{err}"
    );
    let (code, _, err) = run(&c, key, &["sandbox", "stop", &id]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&c, key, &["sandbox", "wait", &id, "--status", "stopped"]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("stopped")),
        "{err}"
    );
    let (code, _, err) = run(&c, key, &["sandbox", "start", &id]).await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&c, key, &["sandbox", "wait", &id]).await;
    assert_eq!(
        (code, json(&out)["status"].as_str()),
        (0, Some("running")),
        "{err}"
    );
}
