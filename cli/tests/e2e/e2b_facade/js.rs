//! The official E2B JS SDK (npm `e2b`) through the facade, on `differently dev`.

use super::*;

/// The official E2B JS SDK (npm `e2b` 2.51.0 from `DIFFERENTLY_E2B_NODE_MODULES`; scripts/test
/// pins it), run by Node through e2b_client.mjs: create with envs and metadata, commands with
/// stdout, stderr, a non-zero exit and streaming that reaches the caller while the command
/// runs, files, watchDir, a signed download URL, timeout, list by metadata, pause and resume,
/// snapshots, another organization's key, kill, then not found.
#[tokio::test(flavor = "multi_thread")]
async fn e2b_js_sdk_flow_against_dev() {
    let modules = std::env::var("DIFFERENTLY_E2B_NODE_MODULES").unwrap_or_default();
    let pkg = std::fs::read_to_string(PathBuf::from(&modules).join("e2b/package.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    assert_eq!(
        pkg.as_ref().map(|p| p["version"].clone()),
        Some(json!("2.51.0")),
        "DIFFERENTLY_E2B_NODE_MODULES ({modules:?}) has no e2b@2.51.0: `npm install \
         e2b@2.51.0` in a directory and point it at its node_modules (scripts/test does)"
    );
    let dev = Dev::start();
    let key_a = tenant_key(&dev, "e2b-js-a").await;
    let key_b = tenant_key(&dev, "e2b-js-b").await;
    let out = tokio::process::Command::new("node")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/e2b_client.mjs"))
        .env("DIFFERENTLY_E2B_NODE_MODULES", &modules)
        .env("E2B_API_URL", format!("{}/e2b", dev.url))
        .env("E2B_SANDBOX_URL", format!("{}/e2b/envd", dev.url))
        .env("E2B_API_KEY", &key_a)
        .env("KEY_B", &key_b)
        .output()
        .await
        .expect("node (>= 20) on PATH");
    let r = super::flow_report(&dev, "e2b_client.mjs", &out);
    let threw = |step: &str, class: &str| -> String {
        let o = &r[step];
        let chain: Vec<&str> = o["chain"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(chain.contains(&class), "{step}: expected {class}, got {o}");
        o["message"].as_str().unwrap_or_default().to_owned()
    };
    assert_eq!(r["sdk"], "2.51.0");
    let tag = r["tag"].as_str().unwrap();
    let id = r["id"].as_str().unwrap();
    assert_eq!(r["info"]["state"], "running");
    assert_eq!(r["info"]["sandboxId"], id);
    assert_eq!(r["info"]["metadata"], json!({ "flow": tag }));
    assert_eq!(r["is_running"], true);

    let run = ok(&r, "run");
    assert_eq!(run["stdout"], format!("out {tag}\n"));
    assert_eq!(run["stderr"], "err line\n");
    assert_eq!(run["exitCode"], 0);
    let exit = ok(&r, "exit");
    assert_eq!(exit["exitCode"], 3, "{exit}");
    assert_eq!(exit["stdout"], "before\n");
    assert_eq!(exit["stderr"], "oops\n");
    assert_eq!(exit["error"], "exit status 3");
    assert_eq!(*ok(&r, "stream"), json!("first\nsecond\n"));
    assert_eq!(r["stream_chunks"][0], "first\n", "{r}");

    let d = format!("/tmp/e2b-js-{tag}");
    let text = format!("hello {tag}\nzwei: grüße ✓\n");
    assert_eq!(*ok(&r, "write"), json!(format!("{d}/a.txt")));
    assert_eq!(*ok(&r, "read"), json!(text));
    assert_eq!(
        *ok(&r, "write_files"),
        json!([format!("{d}/m1.txt"), format!("{d}/sub/m2.txt")])
    );
    assert_eq!(*ok(&r, "cmd_sees_file"), json!("one"));
    assert_eq!(
        *ok(&r, "list"),
        json!([["a.txt", "file"], ["m1.txt", "file"], ["sub", "dir"]])
    );
    assert_eq!(*ok(&r, "exists"), json!([true, false]));
    assert_eq!(*ok(&r, "make_dir"), json!([true, false]));
    assert_eq!(*ok(&r, "rename"), json!(format!("{d}/new/b.txt")));
    assert_eq!(*ok(&r, "after_rename"), json!([false, text]));
    assert_eq!(*ok(&r, "remove"), json!([null, false]));
    threw("read_missing", "FileNotFoundError");
    in_order(
        &r,
        "watch",
        &[("f.txt", "create"), ("f.txt", "write"), ("f.txt", "remove")],
    );
    let url = ok(&r, "signed_url").as_str().unwrap();
    assert!(
        url.starts_with(&format!("{}/files?path=", dev.url)),
        "{url}"
    );
    assert_eq!(*ok(&r, "signed_get"), json!([200, format!("signed {tag}")]));

    let bg = ok(&r, "background");
    let pid = bg["pid"].as_u64().unwrap();
    assert_eq!(
        bg["listed"],
        json!([[pid, "/bin/bash", ["-l", "-c", "cat"], {}, "/home/user"]]),
        "{bg}"
    );
    assert_eq!(bg["seen"], format!("ping {tag}\n"), "{bg}");
    assert_eq!(bg["killed"], true, "{bg}");
    assert_eq!(bg["end"], json!([137, "exit status 137"]), "{bg}");
    assert_eq!(bg["after"], 0, "{bg}");
    assert_eq!(bg["killAgain"], false, "{bg}");
    let det = ok(&r, "detached");
    assert_eq!(det["running"], true, "{det}");
    assert_eq!(
        det["later"], "late\n",
        "no replay of what came before: {det}"
    );
    assert_eq!(
        det["first"], "early\n",
        "the dropped stream got nothing more: {det}"
    );
    assert_eq!(det["killed"], true, "{det}");
    assert_eq!(det["end"], 137, "{det}");

    assert!(r["set_timeout"].get("ok").is_some(), "{}", r["set_timeout"]);
    assert_eq!(*ok(&r, "list_meta"), json!([id]));
    assert_eq!(*ok(&r, "list_other_tag"), json!([]));
    assert_eq!(*ok(&r, "pause"), json!(true));
    assert_eq!(*ok(&r, "state_paused"), json!("paused"));
    assert_eq!(*ok(&r, "resume"), json!(id));
    assert_eq!(*ok(&r, "survived"), json!("survives"));

    // Snapshots: taken, listed a page at a time and by name, restored with the file as it
    // was, another organization finding none of it, deleted (true, then false).
    let snaps = ok(&r, "snapshots");
    let s1 = snaps["first"]["snapshotId"].as_str().unwrap();
    let s2 = snaps["second"]["snapshotId"].as_str().unwrap();
    assert!(s1.starts_with("snp_") && s2.starts_with("snp_"), "{snaps}");
    assert_eq!(snaps["first"]["names"], json!([format!("snap-{tag}")]));
    assert_eq!(snaps["second"]["names"], json!([]));
    assert_eq!(snaps["pages"], json!([[s1], [s2]]), "{snaps}");
    assert_eq!(
        snaps["by_name"],
        json!([[s1, [format!("snap-{tag}")]]]),
        "{snaps}"
    );
    assert_eq!(
        *ok(snaps, "restored"),
        json!([format!("in snapshot {tag}"), s1])
    );
    assert_eq!(*ok(snaps, "b_list_sandbox"), json!([]));
    let chain = |step: &str| snaps[step]["chain"].clone();
    assert!(
        chain("b_create_from").to_string().contains("SandboxError"),
        "{}",
        snaps["b_create_from"]
    );
    assert!(
        chain("b_take").to_string().contains("NotFoundError"),
        "{}",
        snaps["b_take"]
    );
    assert_eq!(*ok(snaps, "b_delete"), json!(false));
    assert_eq!(*ok(snaps, "delete"), json!([true, false, true]));
    assert_eq!(*ok(snaps, "after_delete"), json!([]));

    threw("b_get", "NotFoundError");
    assert_eq!(*ok(&r, "b_kill"), json!(false));
    assert_eq!(*ok(&r, "b_list"), json!([]));

    // E2B routes not served: the facade's 501 message reaches the caller, not "not found".
    for (step, route) in [("update_network", "PUT"), ("fork", "POST")] {
        let m = threw(step, "SandboxError");
        assert!(
            m.starts_with(&format!("501: {route} /e2b/sandboxes/{id}/"))
                && m.ends_with("is not served by the Differently E2B facade"),
            "{step}: {m}"
        );
        assert!(
            !r[step]["chain"].to_string().contains("NotFound"),
            "{}",
            r[step]
        );
    }
    assert_eq!(*ok(&r, "after_unserved"), json!(true));
    assert_eq!(r["get_host"], format!("3000-{id}.e2b-facade.invalid"));

    assert_eq!(*ok(&r, "kill"), json!(true));
    threw("after_kill_get", "NotFoundError");
    assert_eq!(*ok(&r, "after_kill_kill"), json!(false));
    assert!(
        r["after_kill_run"].get("error").is_some(),
        "{}",
        r["after_kill_run"]
    );
    assert_eq!(*ok(&r, "after_kill_list"), json!([]));
}
