//! The E2B facade as an E2B program reaches it: the official E2B Python SDK (PyPI `e2b`, from
//! `DIFFERENTLY_E2B_PYTHON`; scripts/test installs it pinned) drives a real `differently dev`
//! (devhost pool) through e2b_client.py, set up only by `E2B_API_URL`, `E2B_SANDBOX_URL` and
//! a Differently key, and the JSON report it prints is asserted on here: create with envs and
//! metadata, info, commands (stdout, stderr, a non-zero exit, env and cwd, streaming that
//! reaches the caller while the command runs, the deadline), files (write, read, several
//! at once, relative paths, list with depth, exists, info, make dir, rename, remove) seen by
//! commands and commands' files seen by them, timeout, list by metadata, pause and resume
//! with a file surviving, snapshots (taken, listed, restored with the file as it was,
//! deleted), kill and then not found; watching a directory (the sync SDK's
//! polling watcher, the async SDK's stream); signed download and upload URLs fetched with
//! no headers; what is not served yet answers `unimplemented`; another organization's key,
//! envd token, watcher ids and signatures reach nothing of the first's. And E2B's semantics
//! where `/v1`'s differ ([`semantics_steps`]): a paused sandbox kept past its timeout, `root`'s
//! home made at create, rename as envd's `os.Rename`, names too long and empty paths,
//! timeouts and organization-wide keys refused naming what to do, E2B routes not served
//! answering 501, and `get_host` under a domain that never resolves.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};

use crate::client_cli_dev::Dev;

mod dns;
mod js;

/// The Python of `var` with the E2B SDK `version` installed (scripts/test makes both venvs).
pub(crate) fn python(var: &str, version: &str) -> String {
    let python = std::env::var(var).unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args([
            "-c",
            "from importlib.metadata import version; print(version('e2b'))",
        ])
        .output();
    let found = probe
        .as_ref()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert_eq!(
        found.as_deref(),
        Some(version),
        "{python} does not have the E2B SDK {version}: install it (pip install e2b=={version}) \
         in a venv and set {var} to its python (scripts/test does)"
    );
    python
}

const ALL: [&str; 5] = [
    "sandboxes:read",
    "sandboxes:write",
    "sandboxes:exec",
    "files:read",
    "files:write",
];

/// A stored key with every sandbox scope, bound to a new project of a new organization.
pub(crate) async fn tenant_key(dev: &Dev, name: &str) -> String {
    let org = dev.post("/v1/orgs", json!({ "name": name })).await;
    let prj = dev
        .post(
            "/v1/projects",
            json!({ "orgId": org["id"], "name": format!("{name}-prj") }),
        )
        .await;
    let key = dev
        .post(
            "/v1/keys",
            json!({ "orgId": org["id"], "projectId": prj["id"], "name": name, "scopes": ALL }),
        )
        .await;
    key["key"].as_str().unwrap().to_owned()
}

pub(crate) fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/e2b_client.py")
}

pub(crate) fn ok<'a>(r: &'a Value, step: &str) -> &'a Value {
    let o = &r[step];
    assert!(o.get("ok").is_some(), "{step} failed: {o}");
    &o["ok"]
}

/// The step raised an exception of (or derived from) `class`; its message.
pub(crate) fn raised<'a>(r: &'a Value, step: &str, class: &str) -> &'a str {
    let o = &r[step];
    let mro: Vec<&str> = o["mro"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(mro.contains(&class), "{step}: expected {class}, got {o}");
    o["message"].as_str().unwrap()
}

/// A stored key with every sandbox scope of a new organization, bound to no project: an
/// organization-wide key that is not an admin's.
pub(crate) async fn org_wide_key(dev: &Dev, name: &str) -> String {
    let org = dev.post("/v1/orgs", json!({ "name": name })).await;
    let key = dev
        .post(
            "/v1/keys",
            json!({ "orgId": org["id"], "name": name, "scopes": ALL }),
        )
        .await;
    key["key"].as_str().unwrap().to_owned()
}

/// `differently key e2b-alias` with `key` on standard input; checked against the configured
/// key's alias (`DIFFERENTLY_API_KEY`, nothing piped) and the alias's definition.
fn cli_alias(key: &str) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(crate::harness::binary())
        .args(["key", "e2b-alias"])
        .env_remove("DIFFERENTLY_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{key}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "key e2b-alias: {out:?}");
    let alias = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let configured = Command::new(crate::harness::binary())
        .args(["key", "e2b-alias"])
        .env("DIFFERENTLY_API_KEY", key)
        .env(
            "DIFFERENTLY_CLIENT_CONFIG",
            "/nonexistent/differently-client.toml",
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(configured.status.success(), "key e2b-alias: {configured:?}");
    assert_eq!(String::from_utf8_lossy(&configured.stdout).trim(), alias);
    assert_eq!(
        alias,
        differently_api::facade::e2b::alias::to_alias(key),
        "the CLI and the facade spell it alike"
    );
    assert!(alias.starts_with("e2b_") && alias[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    alias
}

/// What commands did, as the step's `[name, type]` events show it: each of `want` is there,
/// first seen in this order.
pub(crate) fn in_order(r: &Value, step: &str, want: &[(&str, &str)]) {
    let got = ok(r, step).as_array().unwrap();
    let at: Vec<usize> = want
        .iter()
        .map(|(n, t)| {
            got.iter()
                .position(|e| *e == json!([n, t]))
                .unwrap_or_else(|| panic!("{step}: no {t} of {n} in {got:?}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{step}: {got:?}");
}

/// An envd refusal of `/files`: the status, and `{code: status, message}`.
fn envd_refusal(answer: &Value, status: u16, message: &str) {
    assert_eq!(answer[0], status, "{answer}");
    let body: Value = serde_json::from_str(answer[1].as_str().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"code": status, "message": message}),
        "{answer}"
    );
}

/// e2b_client.py's snapshot steps: two snapshots of the sandbox (one named), listed a page
/// at a time and by name, a memory snapshot refused (SDKs with `mode`), a restore by
/// create(template=<snapshot id>) that has the file as it was when the first was taken
/// (`restored_file`: what the backend's restore shows), another organization finding none of
/// it on any route, then deleted (True, then False) and gone. The first snapshot's id.
pub(crate) fn snapshot_steps(r: &Value, tag: &str, restored_file: &str) -> String {
    assert_eq!(
        r["snapshots_skipped"],
        Value::Null,
        "{}",
        r["snapshots_skipped"]
    );
    let s = ok(r, "snapshots");
    let s1 = s["first"]["id"].as_str().unwrap().to_owned();
    let s2 = s["second"]["id"].as_str().unwrap();
    assert!(
        s1.starts_with("snp_") && s2.starts_with("snp_") && s1 != s2,
        "{s}"
    );
    assert_eq!(s["first"]["names"], json!([format!("snap-{tag}")]), "{s}");
    assert_eq!(s["second"]["names"], json!([]), "{s}");
    assert_eq!(s["pages"], json!([[s1], [s2]]), "one a page: {s}");
    assert_eq!(s["own_list"], json!([s1, s2]), "{s}");
    assert_eq!(s["by_name"], json!([[s1, [format!("snap-{tag}")]]]), "{s}");
    if let Some(memory) = s.get("memory") {
        let m = raised(s, "memory", "SandboxException");
        assert!(
            m.starts_with("400") && m.contains("filesystem only"),
            "{memory}"
        );
    }
    assert_eq!(*ok(s, "restored"), json!([restored_file, s1]), "{s}");
    assert_eq!(*ok(s, "b_list_sandbox"), json!([]), "{s}");
    assert_eq!(*ok(s, "b_list_all"), json!([]), "{s}");
    let m = raised(s, "b_create_from", "SandboxException");
    assert!(m.starts_with("404") && m.contains("not found"), "{m}");
    raised(s, "b_take", "NotFoundException");
    assert_eq!(*ok(s, "b_delete"), json!(false), "{s}");
    assert_eq!(*ok(s, "delete"), json!([true, false, true]), "{s}");
    assert_eq!(*ok(s, "delete_template"), json!(false), "{s}");
    assert_eq!(*ok(s, "after_delete"), json!([]), "{s}");
    let m = raised(s, "create_from_deleted", "SandboxException");
    assert!(m.starts_with("404"), "{m}");
    s1
}

/// What e2b_client.py's steps show on every backend of the flows of the facade's E2B semantics
/// (`id` the flow's sandbox, `d` its directory): get_host's domain, users' homes, a paused
/// sandbox kept past its timeout, rename as envd's, names too long, empty paths, timeouts
/// and keys refused naming what to do, E2B routes not served.
pub(crate) fn semantics_steps(r: &Value, id: &str, tag: &str) {
    let d = format!("/tmp/e2b-{tag}");
    // get_host is built from a domain that never resolves, not E2B's `e2b.app`; envd calls
    // still go to E2B_SANDBOX_URL (every step below).
    assert_eq!(r["get_host"], format!("3000-{id}.e2b-facade.invalid"));
    assert_eq!(r["sandbox_domain"], "e2b-facade.invalid");

    // Users: root runs in /root on a fresh sandbox; another user's missing home is named.
    assert_eq!(*ok(r, "user_root"), json!("/root\n/root\n"));
    let m = raised(r, "user_other", "InvalidArgumentException");
    assert!(
        m.contains("home directory /home/alice") && m.contains("pass cwd"),
        "{m}"
    );
    assert_eq!(*ok(r, "user_other_cwd"), json!("/tmp\n"));

    // A paused sandbox outlives its timeout (3 s) and is kept for 30 days; connect resumes it
    // with the timeout it passes, the file still there.
    let kept = ok(r, "paused_kept");
    assert_eq!(kept["paused"], json!(["paused", 30]), "{kept}");
    assert_eq!(kept["resumed"][0], "running", "{kept}");
    let left = kept["resumed"][1].as_f64().unwrap();
    assert!((60.0..=90.0).contains(&left), "{kept}");
    assert_eq!(kept["resumed"][2], format!("kept {tag}"), "{kept}");

    // Rename is envd's (Go's os.Rename): never into a directory, onto one an error (empty or
    // not, itself too); a file onto itself a no-op; the entry answered the destination's.
    let ren = ok(r, "rename_semantics");
    let rd = format!("{d}/ren");
    for step in ["file_onto_dir", "dir_onto_empty_dir", "dir_onto_itself"] {
        let m = raised(ren, step, "SandboxException");
        assert!(
            m.contains("INTERNAL") && m.contains("file exists"),
            "{step}: {m}"
        );
    }
    assert_eq!(
        *ok(ren, "file_onto_itself"),
        json!([format!("{rd}/f.txt"), "file"])
    );
    assert_eq!(
        *ok(ren, "file_onto_file"),
        json!([format!("{rd}/f.txt"), "file"])
    );
    assert_eq!(
        *ok(ren, "dir_to_new"),
        json!([format!("{rd}/moved"), "dir"])
    );
    assert_eq!(
        ren["tree"],
        json!(["empty", "f.txt", "moved", "moved/x.txt"])
    );
    assert_eq!(ren["f_txt"], "g");
    // A name too long is invalid input naming the path, not the backend unavailable.
    for step in ["write", "make_dir"] {
        let m = raised(&r["long_name"], step, "InvalidArgumentException");
        assert!(
            m.ends_with("file name too long") && m.contains(&d),
            "{step}: {m}"
        );
    }
    // An empty path (left out by proto3 JSON) is the home.
    assert_eq!(*ok(r, "empty_path"), json!([true, true, true, false]));
    for step in ["timeout_negative", "set_timeout_negative"] {
        let m = raised(r, step, "SandboxException");
        assert_eq!(m, "400: timeout: must be between 1 and 2592000", "{step}");
    }
    let m = raised(r, "org_wide_key", "SandboxException");
    assert_eq!(
        m,
        format!(
            "400: {}",
            differently_api::facade::e2b::control::ORG_WIDE_KEY
        )
    );
    // E2B routes not served: 501 with the message, which the SDK shows; the sandbox runs on.
    for step in ["update_network", "fork"] {
        let route = if step == "fork" { "POST" } else { "PUT" };
        let m = raised(r, step, "SandboxException");
        assert!(
            m.starts_with(&format!("501: {route} /e2b/sandboxes/{id}/"))
                && m.ends_with("is not served by the Differently E2B facade"),
            "{step}: {m}"
        );
        assert!(
            !r[step]["mro"].to_string().contains("NotFound"),
            "{step}: {}",
            r[step]
        );
    }
    let unserved = &r["unserved_routes"];
    envd_refusal(
        &unserved["templates_get"],
        501,
        "GET /e2b/templates/base is not served by the Differently E2B facade",
    );
    envd_refusal(
        &unserved["sandboxes_metrics"],
        501,
        "GET /e2b/sandboxes/metrics is not served by the Differently E2B facade",
    );
    envd_refusal(
        &unserved["unknown"],
        404,
        "GET /e2b/no/such/route is not served by the Differently E2B facade",
    );
    assert_eq!(*ok(r, "after_unserved"), json!(true));
}

/// What differs between the SDK versions a flow runs with.
#[derive(Clone, Copy, PartialEq)]
enum Sdk {
    /// 2.63: the v2 routes, any key shape.
    Current,
    /// 2.45.1: the v1 routes, and only `e2b_<hex>` keys (so the keys' aliases), with the
    /// SDK's key check on (no `E2B_VALIDATE_API_KEY`).
    V1Routes,
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_python_sdk_flow_against_dev() {
    let python = python("DIFFERENTLY_E2B_PYTHON", "2.63.0");
    python_flow(&python, Sdk::Current).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_python_sdk_2_45_1_flow_with_key_alias_on_v1_routes() {
    let python = python("DIFFERENTLY_E2B_PYTHON_2451", "2.45.1");
    python_flow(&python, Sdk::V1Routes).await;
}

/// A flow script's report, the last line of its stdout as JSON, once the script exited 0;
/// otherwise the test fails with the script's output and the dev's log.
pub(crate) fn flow_report(dev: &Dev, script: &str, out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed:\n{stderr}\n{stdout}\n{}",
        std::fs::read_to_string(dev.dir.path().join("dev.log")).unwrap_or_default()
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}

async fn python_flow(python: &str, sdk: Sdk) {
    let dev = Dev::start();
    let key_a = tenant_key(&dev, "e2b-a").await;
    let key_b = tenant_key(&dev, "e2b-b").await;
    let key_a2 = tenant_key(&dev, "e2b-a2").await;
    let key_org_wide = org_wide_key(&dev, "e2b-org-wide").await;
    // The aliases as a user gets them: `differently key e2b-alias`, the key piped in.
    let shown = |k: &str| match sdk {
        Sdk::Current => k.to_owned(),
        Sdk::V1Routes => cli_alias(k),
    };
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(script())
        .env("DIFFERENTLY_URL", &dev.url)
        .env("KEY_A", shown(&key_a))
        .env("KEY_B", shown(&key_b))
        .env("KEY_A2", shown(&key_a2))
        .env("KEY_ORG_WIDE", shown(&key_org_wide))
        .env("ADMIN_KEY", &dev.key)
        .env_remove("E2B_VALIDATE_API_KEY");
    if sdk == Sdk::V1Routes {
        cmd.env("E2B_FLOW_ALIAS", "1").env("DLY_KEY_A", &key_a);
    }
    let out = cmd.output().await.unwrap();
    let r = flow_report(&dev, "e2b_client.py", &out);
    let tag = r["tag"].as_str().unwrap();
    let id = r["id"].as_str().unwrap();
    assert!(id.starts_with("sbx_"), "{r}");

    // Create, info.
    assert_eq!(r["info"]["state"], "running");
    assert_eq!(r["info"]["sandbox_id"], id);
    assert_eq!(
        r["info"]["metadata"],
        json!({ "flow": tag, "a=b": "odd key" })
    );
    assert_eq!(r["info"]["template"], "base");
    assert_eq!(*ok(&r, "metrics"), json!(0));
    assert_eq!(r["is_running"], true);
    semantics_steps(&r, id, tag);
    // devhost reads a name too long as the invalid name it is.
    let m = raised(&r["long_name"], "read", "InvalidArgumentException");
    assert!(m.ends_with("file name too long"), "{m}");
    // Commands.
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
    // The command could only end after on_stdout had the first line (the gate file).
    assert_eq!(*ok(&r, "stream"), json!("first\nsecond\n"));
    assert_eq!(r["stream_chunks"][0], "first\n", "{r}");
    let deadline = raised(&r, "deadline", "TimeoutException");
    assert!(
        deadline.contains("deadline") || deadline.contains("timeout"),
        "{deadline}"
    );

    // Files.
    let d = format!("/tmp/e2b-{tag}");
    let text = format!("hello {tag}\nzwei: grüße ✓\n");
    assert_eq!(*ok(&r, "write"), json!(format!("{d}/a.txt")));
    assert_eq!(*ok(&r, "read"), json!(text));
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(ok(&r, "read_bytes").as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, text.as_bytes());
    assert_eq!(
        *ok(&r, "write_files"),
        json!([format!("{d}/m1.txt"), format!("{d}/sub/m2.txt")])
    );
    assert_eq!(*ok(&r, "relative"), json!(["/home/user/rel.txt", "rel"]));
    assert_eq!(*ok(&r, "cmd_sees_file"), json!("one"));
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
    assert_eq!(info["permissions"].as_str().unwrap().len(), 10, "{info}");
    assert_eq!(*ok(&r, "make_dir"), json!([true, false]));
    assert_eq!(*ok(&r, "rename"), json!(format!("{d}/new/b.txt")));
    assert_eq!(*ok(&r, "after_rename"), json!([false, text]));
    raised(&r, "rename_missing", "NotFoundException");
    assert_eq!(*ok(&r, "remove"), json!([null, false]));
    raised(&r, "read_missing", "FileNotFoundException");

    // Watching directories: the sync SDK's polling watcher, the async SDK's stream
    // (recursive), each seeing what commands create, write and remove, in that order.
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

    // Signed URLs: made by the SDK from E2B_SANDBOX_URL's origin (its /e2b/envd prefix
    // dropped, no sandbox id), fetched with no headers.
    let url = r["signed_url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/files?path=", dev.url)) && url.contains("signature=v1_"),
        "{url}"
    );
    let signed_text = json!([200, format!("signed {tag}")]);
    assert_eq!(r["signed_get"], signed_text);
    assert_eq!(r["signed_get_expiring"], signed_text);
    envd_refusal(
        &r["signed_get_expired"],
        401,
        "signature is already expired",
    );
    envd_refusal(&r["signed_get_forged"], 401, "invalid signature");
    envd_refusal(&r["signed_read_as_write"], 401, "invalid signature");
    assert_eq!(r["signed_post"][0], 200, "{}", r["signed_post"]);
    let written: Value = serde_json::from_str(r["signed_post"][1].as_str().unwrap()).unwrap();
    assert_eq!(written[0]["path"], format!("{d}/uploaded.txt"));
    assert_eq!(*ok(&r, "signed_post_read"), json!(format!("up {tag}")));

    // Background processes: fed stdin (send_stdin, and stream_input where the SDK has it),
    // listed with their command and no environment, output through the handle, killed by
    // pid (exit 128+9: /v1's code for a process SIGKILL ended), then gone from the list.
    let bg = ok(&r, "background");
    let pid = bg["pid"].as_u64().unwrap();
    assert!(pid > 0, "{bg}");
    assert_eq!(
        bg["listed"],
        json!([[pid, "/bin/bash", ["-l", "-c", "cat"], {}, "/home/user"]]),
        "{bg}"
    );
    assert_eq!(bg["seen"], bg["want"], "{bg}");
    if sdk == Sdk::Current {
        assert_eq!(bg["want"], format!("ping {tag}\none\ntwo\n"));
    }
    assert_eq!(bg["killed"], true, "{bg}");
    assert_eq!(bg["end"], json!([137, "exit status 137"]), "{bg}");
    assert_eq!(bg["after"], json!([]), "{bg}");
    assert_eq!(bg["kill_again"], false, "{bg}");
    // A dropped stream detaches: reconnected by pid, it ran on and its later output came.
    let det = ok(&r, "detached");
    assert_eq!(det["running_after_drop"], true, "{det}");
    assert_eq!(
        det["reattached"], "late\n",
        "no replay of what came before: {det}"
    );
    assert_eq!(det["killed"], true, "{det}");
    assert_eq!(det["end"], 137, "{det}");
    assert_eq!(*ok(&r, "close_stdin"), json!("last\n"));
    raised(&r, "connect_missing", "NotFoundException");
    let term = ok(&r, "terminal");
    assert_eq!(
        (&term["exit"], &term["echo"], &term["size"]),
        (&json!(0), &json!(true), &json!(true)),
        "{term}"
    );
    assert_eq!(*ok(&r, "kill_missing"), json!(false));

    // Lifecycle.
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
    snapshot_steps(&r, tag, &format!("in snapshot {tag}"));

    // Another organization reaches nothing of this one's.
    for step in [
        "b_get",
        "b_connect",
        "b_set_timeout",
        "b_pause",
        "b_metrics",
    ] {
        raised(&r, step, "NotFoundException");
    }
    assert_eq!(*ok(&r, "b_kill"), json!(false));
    assert_eq!(*ok(&r, "b_list"), json!([]));
    assert_eq!(*ok(&r, "b_token_own"), json!("b\n"));
    // B's token on A's pid (through B's sandbox) finds nothing; A's process runs on.
    assert_eq!(*ok(&r, "b_pid_kill"), json!(false));
    raised(&r, "b_pid_stdin", "NotFoundException");
    raised(&r, "b_pid_connect", "NotFoundException");
    assert_eq!(*ok(&r, "b_pid_list"), json!([]));
    for (route, answer) in r["cross_envd"].as_object().unwrap() {
        if route == "no_token" {
            assert_eq!(answer[0], 401, "{route}: {answer}");
            continue;
        }
        assert_eq!(answer[0], 502, "{route}: {answer}");
        let body: Value = serde_json::from_str(answer[1].as_str().unwrap()).unwrap();
        assert_eq!(body["code"], 502, "{route}: {answer}");
        assert_eq!(
            body["message"],
            format!("The sandbox {id} was not found"),
            "{route}"
        );
    }
    assert_eq!(*ok(&r, "after_cross"), json!(["survives", false, false]));
    assert_eq!(*ok(&r, "a_bg_after_cross"), json!([true, true]));
    // B's token does not find A's watcher (not even to remove it); B's signed URL opens B's
    // sandbox only, and naming A's sandbox (or A's URL naming B's) is refused.
    for step in ["b_watcher", "b_remove_watcher"] {
        let body: Value = serde_json::from_str(r[step][1].as_str().unwrap()).unwrap();
        assert_eq!(
            (&r[step][0], &body["code"]),
            (&json!(404), &json!("not_found")),
            "{step}"
        );
    }
    assert!(
        ok(&r, "a_watcher_after_b").is_array(),
        "{}",
        r["a_watcher_after_b"]
    );
    assert_eq!(r["b_signed_own"][0], 404, "{}", r["b_signed_own"]);
    envd_refusal(&r["b_signed_naming_a"], 401, "invalid signature");
    envd_refusal(&r["a_signed_naming_b"], 401, "invalid signature");

    // Connect-Timeout-Ms is the command's deadline on the facade's side too: start event,
    // output, keepalives, then the end envelope with deadline_exceeded.
    let msgs = ok(&r, "own_deadline").as_array().unwrap();
    assert_eq!(
        msgs[0],
        json!([0, {"event": {"start": {"pid": msgs[0][1]["event"]["start"]["pid"]}}}])
    );
    assert!(msgs[0][1]["event"]["start"]["pid"].as_u64().unwrap() > 0);
    assert_eq!(
        msgs[1][1]["event"]["data"]["stdout"], "c3RhcnRlZAo=",
        "{msgs:?}"
    );
    let last = msgs.last().unwrap();
    assert_eq!(last[0], 2, "{msgs:?}");
    assert_eq!(last[1]["error"]["code"], "deadline_exceeded", "{msgs:?}");

    // A watch stream: the start message first, keepalives at the asked interval, the end
    // envelope at Connect-Timeout-Ms.
    let msgs = ok(&r, "watch_own_deadline").as_array().unwrap();
    assert_eq!(msgs[0], json!([0, {"start": {}}]), "{msgs:?}");
    assert!(msgs.contains(&json!([0, {"keepalive": {}}])), "{msgs:?}");
    let last = msgs.last().unwrap();
    assert_eq!(last[0], 2, "{msgs:?}");
    assert_eq!(last[1]["error"]["code"], "deadline_exceeded", "{msgs:?}");

    // The key a token names is checked on every call: revoked, the token stops working.
    assert_eq!(*ok(&r, "a2_before"), json!("a2\n"));
    assert_eq!(r["a2_revoke"], 200);
    for step in ["a2_run_after", "a2_read_after", "a2_stat_after"] {
        raised(&r, step, "AuthenticationException");
    }

    // Bad input.
    raised(&r, "bad_key", "AuthenticationException");
    let m = raised(&r, "bad_alias", "AuthenticationException");
    assert!(m.contains("401"), "the facade refused it, not the SDK: {m}");
    let m = raised(&r, "bad_env", "SandboxException");
    assert!(m.starts_with("400") && m.contains("env"), "{m}");
    // Kill, then not found everywhere.
    assert_eq!(*ok(&r, "kill"), json!(true));
    raised(&r, "after_kill_get", "NotFoundException");
    assert_eq!(*ok(&r, "after_kill_kill"), json!(false));
    assert!(
        r["after_kill_run"].get("error").is_some(),
        "{}",
        r["after_kill_run"]
    );
    assert_eq!(*ok(&r, "after_kill_list"), json!([]));
    // A watcher goes with its sandbox.
    let gone = ok(&r, "watcher_after_kill");
    assert_eq!(gone[0], 404, "{gone}");
    let body: Value = serde_json::from_str(gone[1].as_str().unwrap()).unwrap();
    assert_eq!(body["code"], "not_found", "{gone}");

    // What only the older SDK shows: its own key check was on, and it used the v1 routes.
    assert_eq!(r["validate_env"], Value::Null);
    if sdk == Sdk::V1Routes {
        assert_eq!(r["sdk"], "2.45.1");
        let m = raised(&r, "dly_key_refused", "AuthenticationException");
        assert!(m.contains("Invalid API key format"), "{m}");
        let routes: Vec<&str> = r["routes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(routes.contains(&"POST /e2b/sandboxes"), "{routes:?}");
        assert!(
            routes.contains(&format!("POST /e2b/sandboxes/{id}/connect").as_str()),
            "{routes:?}"
        );
        // Its list is already v2's (`GET /v2/sandboxes`); create and connect are not.
        assert!(
            !routes.iter().any(|r| r.starts_with("POST /e2b/v2/")),
            "a v2 create or connect: {routes:?}"
        );
    }
}
