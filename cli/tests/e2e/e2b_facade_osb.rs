//! The E2B facade on an OpenSandbox pool: the official E2B Python SDK (2.63.0, from
//! `DIFFERENTLY_E2B_PYTHON`) runs e2b_client.py's flow against a `differently dev` whose only
//! eligible pool is an `opensandbox` pool on the adapters' fake OpenSandbox server (the real
//! 1.1.1 server's behaviour; its commands really run, with `bash -c` on this host). So every
//! call goes E2B SDK → facade → `/v1` → the opensandbox adapter → lifecycle server and execd,
//! and this shows what e2b_facade.rs shows on devhost, less what the backend cannot do:
//! execd has no stdin for a running command, so `stdin=True` answers `unimplemented` (the
//! documented per-backend gap in docs/e2b-facade.md) and a background command runs without it;
//! a final output line without a newline arrives with one (execd 1.1 strips terminators).
//!
//! The fake's file paths are this host's: the flow keeps to `/tmp/e2b-<tag>…` and one
//! `rel.txt` in `/home/user` (the facade's home, made at create), removed at the end.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::client_cli_dev::Dev;
use crate::e2b_facade::{
    flow_report, in_order, ok, org_wide_key, python, raised, script, semantics_steps,
    snapshot_steps, tenant_key,
};
use crate::fake_opensandbox::{FakeRuntime, FakeServer, Variant};
use crate::harness::wait_pool_healthy;

const OSB_KEY: &str = "fake-osb-key";

/// Adds pool `osb` (the `opensandbox` adapter on `osb`, reaching execd directly as a pool
/// that offers terminals must), denies the dev's own `local` pool in the global policy (so
/// every sandbox lands on `osb`), and waits until `osb` is healthy.
async fn osb_pool(dev: &Dev, osb: &FakeServer) {
    let key_file = dev.dir.path().join("osb.key");
    std::fs::write(&key_file, OSB_KEY).unwrap();
    dev.post(
        "/v1/admin/pools",
        json!({
            "name": "osb", "kind": "opensandbox", "trust": "private",
            "settings": {
                "apiURL": osb.api_url(), "trust": "private", "apiKeyFile": key_file,
                "image": "osb/debian:bookworm", "useServerProxy": false,
            },
        }),
    )
    .await;
    only_pool(dev, "osb").await;
}

/// Denies the dev's own `local` pool in the global policy, so every new sandbox lands on
/// `pool`, and waits (60 s at most) until `pool` is healthy.
pub(crate) async fn only_pool(dev: &Dev, pool: &str) {
    let http = reqwest::Client::new();
    let resp = http
        .put(format!("{}/v1/admin/policies/global", dev.url))
        .bearer_auth(&dev.key)
        .json(&json!({"deniedPools": ["local"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    if let Err(pools) = wait_pool_healthy(&dev.url, &dev.key, pool, Duration::from_secs(60)).await {
        panic!("pool {pool} never healthy: {pools}");
    }
}

/// What the flow leaves on this host (the fake's paths are the host's): its files (those
/// under `/tmp` when its report names its `tag`), and `/home/user` only when the run made it
/// (`home_existed` false) and nothing else is in it.
fn clean_host(tag: Option<&str>, home_existed: bool) {
    if let Some(tag) = tag {
        let _ = std::fs::remove_dir_all(format!("/tmp/e2b-{tag}"));
        let _ = std::fs::remove_file(format!("/tmp/e2b-gate-{tag}"));
        let _ = std::fs::remove_file(format!("/tmp/e2b-bg-gate-{tag}"));
        let _ = std::fs::remove_file(format!("/tmp/e2b-kept-{tag}.txt"));
    }
    let _ = std::fs::remove_file("/home/user/rel.txt");
    if !home_existed {
        let _ = std::fs::remove_dir("/home/user");
    }
}

/// The step was refused as a backend without `exec.stdin` refuses it: the SDK's
/// `SandboxException` carrying Connect's `unimplemented`.
fn no_stdin(r: &Value, step: &str) {
    let m = raised(r, step, "SandboxException");
    assert!(
        m.contains("Code.UNIMPLEMENTED") && m.contains("exec.stdin"),
        "{step}: {m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_python_sdk_flow_on_an_opensandbox_pool() {
    let python = python("DIFFERENTLY_E2B_PYTHON", "2.63.0");
    let osb = FakeServer::start(Variant::Real, FakeRuntime::Docker, OSB_KEY).await;
    let dev = Dev::start();
    osb_pool(&dev, &osb).await;
    let key_a = tenant_key(&dev, "e2b-osb-a").await;
    let key_b = tenant_key(&dev, "e2b-osb-b").await;
    let key_a2 = tenant_key(&dev, "e2b-osb-a2").await;
    let key_org_wide = org_wide_key(&dev, "e2b-osb-org-wide").await;
    let home_existed = Path::new("/home/user").exists();
    let out = tokio::process::Command::new(&python)
        .arg(script())
        .env("DIFFERENTLY_URL", &dev.url)
        .env("KEY_A", &key_a)
        .env("KEY_B", &key_b)
        .env("KEY_A2", &key_a2)
        .env("KEY_ORG_WIDE", &key_org_wide)
        .env("ADMIN_KEY", &dev.key)
        .env("E2B_FLOW_BACKEND", "opensandbox")
        .env_remove("E2B_VALIDATE_API_KEY")
        .output()
        .await
        .unwrap();
    // The host is cleaned whatever the flow did, before its result is judged.
    let tag: Option<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|r| r["tag"].as_str().map(str::to_owned));
    clean_host(tag.as_deref(), home_existed);
    let r = flow_report(&dev, "e2b_client.py", &out);
    eprintln!("{r}");
    let tag = r["tag"].as_str().unwrap();
    let id = r["id"].as_str().unwrap();

    // Every sandbox the flow made is (or was) an OpenSandbox one: A's, B's, A2's.
    let made: Vec<Value> = osb
        .record()
        .create_bodies
        .iter()
        .map(|b| b["metadata"]["differently-sandbox-id"].clone())
        .collect();
    assert!(
        made.len() >= 3,
        "the creates that reached OpenSandbox: {made:?}"
    );
    assert!(
        made.contains(&json!(id)),
        "{id} is no OpenSandbox sandbox: {made:?}"
    );

    // Create with envs and metadata, info.
    assert_eq!(r["info"]["state"], "running");
    assert_eq!(r["info"]["sandbox_id"], id);
    assert_eq!(
        r["info"]["metadata"],
        json!({ "flow": tag, "a=b": "odd key" })
    );
    assert_eq!(r["info"]["template"], "base");
    assert_eq!(r["is_running"], true);
    // The facade's E2B semantics, as on devhost; the OpenSandbox adapter maps execd's "file
    // name too long" to the invalid path it is.
    semantics_steps(&r, id, tag);

    // Commands: the sandbox's env, stdout, stderr, a non-zero exit, env and cwd per call,
    // the home as the default cwd, streaming that reaches the caller while the command runs
    // (the command ends only once on_stdout had its first line), a deadline.
    assert_eq!(r["run"]["stdout"], format!("out {tag}\n"));
    assert_eq!(r["run"]["stderr"], "err line\n");
    assert_eq!(r["run"]["exit_code"], 0);
    let exit = ok(&r, "exit");
    assert_eq!(exit["exit_code"], 3, "{exit}");
    assert_eq!(exit["stdout"], "before\n");
    assert_eq!(exit["stderr"], "oops\n");
    assert_eq!(exit["error"], "exit status 3");
    assert_eq!(*ok(&r, "env_cwd"), json!("v1:/tmp:/home/user\n"));
    assert_eq!(*ok(&r, "home_cwd"), json!("/home/user\n"));
    assert_eq!(*ok(&r, "stream"), json!("first\nsecond\n"));
    assert_eq!(r["stream_chunks"][0], "first\n", "{r}");
    raised(&r, "deadline", "TimeoutException");

    // Files, and commands and files seeing one filesystem.
    let d = format!("/tmp/e2b-{tag}");
    let text = format!("hello {tag}\nzwei: grüße ✓\n");
    assert_eq!(*ok(&r, "write"), json!(format!("{d}/a.txt")));
    assert_eq!(*ok(&r, "read"), json!(text));
    assert_eq!(
        *ok(&r, "write_files"),
        json!([format!("{d}/m1.txt"), format!("{d}/sub/m2.txt")])
    );
    // execd 1.1 sends output a line at a time, terminators stripped: a final line without
    // one arrives with one (docs/opensandbox.md, exec fidelity), so `cat` of "rel" is "rel\n".
    assert_eq!(*ok(&r, "relative"), json!(["/home/user/rel.txt", "rel\n"]));
    assert_eq!(*ok(&r, "cmd_sees_file"), json!("one\n"));
    assert_eq!(*ok(&r, "file_sees_cmd"), json!("from-cmd\n"));
    assert_eq!(
        *ok(&r, "list"),
        json!([
            ["a.txt", "file"],
            ["cmd.txt", "file"],
            ["m1.txt", "file"],
            ["sub", "dir"]
        ])
    );
    let deep = ok(&r, "list_depth2").as_array().unwrap();
    assert!(deep.contains(&json!(format!("{d}/sub/m2.txt"))), "{deep:?}");
    assert_eq!(*ok(&r, "exists"), json!([true, false]));
    let info = ok(&r, "get_info");
    assert_eq!(info["name"], "a.txt");
    assert_eq!(info["size"], text.len());
    assert_eq!(info["type"], "file");
    assert_eq!(*ok(&r, "make_dir"), json!([true, false]));
    assert_eq!(*ok(&r, "rename"), json!(format!("{d}/new/b.txt")));
    assert_eq!(*ok(&r, "after_rename"), json!([false, text]));
    raised(&r, "rename_missing", "NotFoundException");
    assert_eq!(*ok(&r, "remove"), json!([null, false]));
    raised(&r, "read_missing", "FileNotFoundException");
    in_order(
        &r,
        "watch_sync",
        &[("f.txt", "create"), ("f.txt", "write"), ("f.txt", "remove")],
    );
    in_order(
        &r,
        "watch_async",
        &[
            ("sub", "create"),
            ("sub/g.txt", "create"),
            ("sub/g.txt", "write"),
            ("sub/g.txt", "remove"),
        ],
    );
    assert_eq!(r["signed_get"], json!([200, format!("signed {tag}")]));
    assert_eq!(*ok(&r, "signed_post_read"), json!(format!("up {tag}")));

    // Background commands: stdin is refused at start (no `exec.stdin`); without it a
    // command runs in the background, its output comes through its handle, it is listed
    // (its command, no environment), input to it is refused, kill ends it, then it is gone.
    no_stdin(&r, "background");
    no_stdin(&r, "close_stdin");
    let bg = ok(&r, "background_no_stdin");
    let pid = bg["pid"].as_u64().unwrap();
    assert_eq!(bg["seen"], format!("bg {tag}\n"), "{bg}");
    assert_eq!(
        bg["listed"],
        json!([[
            pid,
            "/bin/bash",
            ["-l", "-c", format!("echo bg {tag}; exec sleep 600")],
            {},
            "/home/user"
        ]]),
        "{bg}"
    );
    assert!(bg["stdin"].get("error").is_some(), "{bg}");
    assert_eq!(bg["killed"], true, "{bg}");
    assert_eq!(bg["end"][0], 137, "{bg}");
    assert_eq!(bg["after"], json!([]), "{bg}");
    assert_eq!(bg["kill_again"], false, "{bg}");
    // A dropped stream detaches: reconnected by pid, it ran on and its later output came.
    let det = ok(&r, "detached");
    assert_eq!(det["running_after_drop"], true, "{det}");
    assert_eq!(det["reattached"], "late\n", "{det}");
    assert_eq!(det["killed"], true, "{det}");
    raised(&r, "connect_missing", "NotFoundException");
    // A terminal (execd's PTY, reached directly): resized, typed into, exited.
    let term = ok(&r, "terminal");
    assert_eq!(
        (&term["exit"], &term["echo"], &term["size"]),
        (&json!(0), &json!(true), &json!(true)),
        "{term}"
    );
    assert_eq!(*ok(&r, "kill_missing"), json!(false));

    // Lifecycle: timeout, list by metadata, pause and resume with a file surviving.
    assert!(r["set_timeout"].get("ok").is_some(), "{}", r["set_timeout"]);
    assert_eq!(*ok(&r, "list_meta"), json!([id]));
    assert_eq!(*ok(&r, "list_odd_key"), json!([id]));
    assert_eq!(*ok(&r, "list_other_tag"), json!([]));
    assert_eq!(*ok(&r, "pause"), json!(true));
    assert_eq!(*ok(&r, "state_paused"), json!("paused"));
    assert_eq!(*ok(&r, "pause_again"), json!(false));
    assert_eq!(*ok(&r, "resume"), json!(id));
    assert_eq!(*ok(&r, "state_resumed"), json!("running"));
    assert_eq!(*ok(&r, "survived"), json!("survives"));

    // Snapshots through OpenSandbox's snapshot API: taken, listed, restored (a create that
    // reached OpenSandbox with `snapshotId`), deleted. The fake's files are this host's, so
    // the restored sandbox reads the file as it is now, not as the snapshot kept it.
    snapshot_steps(&r, tag, &format!("changed after {tag}"));
    let restores = osb
        .record()
        .create_bodies
        .iter()
        .filter(|b| b["snapshotId"].is_string())
        .count();
    assert_eq!(
        restores, 1,
        "one create from a snapshot reached OpenSandbox"
    );

    // Another organization reaches nothing of this one's.
    for step in ["b_get", "b_connect", "b_set_timeout", "b_pause"] {
        raised(&r, step, "NotFoundException");
    }
    assert_eq!(*ok(&r, "b_kill"), json!(false));
    assert_eq!(*ok(&r, "b_list"), json!([]));
    assert_eq!(*ok(&r, "b_token_own"), json!("b\n"));
    assert_eq!(*ok(&r, "a2_before"), json!("a2\n"));
    raised(&r, "a2_run_after", "AuthenticationException");

    // Kill, then not found.
    assert_eq!(*ok(&r, "kill"), json!(true));
    raised(&r, "after_kill_get", "NotFoundException");
    assert_eq!(*ok(&r, "after_kill_kill"), json!(false));
    assert!(
        r["after_kill_run"].get("error").is_some(),
        "{}",
        r["after_kill_run"]
    );
    assert_eq!(*ok(&r, "after_kill_list"), json!([]));
}
