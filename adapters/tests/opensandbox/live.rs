//! The same scenario against a real OpenSandbox server. Opt in with
//! `DIFFERENTLY_TEST_OPENSANDBOX_URL` (the lifecycle API, ending in `/v1`) and
//! `DIFFERENTLY_TEST_OPENSANDBOX_KEY`, then `cargo test -p differently-adapters --test
//! opensandbox -- --ignored live`. Optional: `DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS` (JSON
//! merged into the pool settings, e.g. `{"runtime":"kubernetes","lineEndings":"kept"}`).

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, AdapterError, ByteRange, InstanceState};
use differently_core::ids::InstallationId;
use futures::{FutureExt, StreamExt};

use crate::fake_server::{FakeRuntime, Variant};
use crate::{at, cmd, create_req, key_file, setup};

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY and run with --ignored"]
async fn live_opensandbox() {
    let (Ok(url), Ok(key)) = (
        std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_URL"),
        std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_KEY"),
    ) else {
        panic!("live test requested but DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY are not both set");
    };
    let key = key_file(&key);
    let mut settings = serde_json::json!({
        "apiURL": url, "trust": "private", "apiKeyFile": key.path(),
        "timeouts": {"readySeconds": 300},
    });
    if let Ok(extra) = std::env::var("DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS") {
        let extra: serde_json::Value = serde_json::from_str(&extra).expect("settings JSON");
        for (k, v) in extra.as_object().expect("settings object") {
            settings[k] = v.clone();
        }
    }
    let cfg: OpenSandboxConfig = serde_json::from_value(settings).expect("settings");
    let a = OpenSandboxAdapter::new(cfg).expect("adapter");
    scenario(&a).await;
}

/// The live scenario run against the fake too, so it is known to be right before it meets a
/// real server.
#[tokio::test]
async fn live_scenario_against_the_fake() {
    for variant in [Variant::Real, Variant::Spec] {
        let s = setup(variant, FakeRuntime::Docker, serde_json::json!({})).await;
        scenario(&s.adapter).await;
        assert!(s.fake.sandboxes().is_empty(), "{variant:?}: cleaned up");
    }
    // The fake's sandboxes share the test host's file system.
    let _ = std::fs::remove_dir_all("/tmp/differently-live");
    let _ = std::fs::remove_file("/tmp/differently-live-state");
    let _ = std::fs::remove_file("/tmp/differently-live-snapfile");
}

async fn scenario(a: &OpenSandboxAdapter) {
    let caps = a.capabilities();
    a.health().await.expect("health");

    let installation = InstallationId::new();
    let mut req = create_req(&installation);
    req.resources.cpu = 1;
    req.resources.memory_mib = 512;
    req.ttl_seconds = 900;
    let inst = a.create(&req).await.expect("create");
    let r = at(&inst);
    let scenario = async {
        assert_eq!(
            a.create(&req).await.expect("create again"),
            inst,
            "idempotent"
        );

        // Exec: exit codes, stderr, env (sandbox and command), cwd, quoting, multi-line.
        let out = a
            .exec(&r, &cmd(&["sh", "-c", "echo out; echo err >&2; exit 4"]))
            .await
            .expect("exec");
        assert_eq!(
            (out.exit_code, out.stdout.as_str(), out.stderr.as_str()),
            (4, "out\n", "err\n")
        );
        let mut e = cmd(&["sh", "-c", "echo \"$SANDBOX_VAR $CMD_VAR\"; pwd"]);
        e.env.insert("CMD_VAR".into(), "per command".into());
        e.cwd = Some("/tmp".into());
        let out = a.exec(&r, &e).await.expect("env/cwd");
        assert_eq!(out.stdout, "from-create per command\n/tmp\n");
        let out = a
            .exec(&r, &cmd(&["printf", "%s|", "a b", "it's", "$HOME"]))
            .await
            .expect("quoting");
        assert!(
            out.stdout.starts_with("a b|it's|$HOME|"),
            "{:?}",
            out.stdout
        );
        let out = a
            .exec(&r, &cmd(&["sh", "-c", "seq 1 3"]))
            .await
            .expect("lines");
        assert_eq!(out.stdout, "1\n2\n3\n");
        let mut t = cmd(&["sleep", "20"]);
        t.timeout_seconds = Some(2);
        assert_eq!(a.exec(&r, &t).await.expect("timeout").exit_code, 124);
        let mut s = cmd(&["cat"]);
        s.stdin = Some("from stdin\n".into());
        assert_eq!(a.exec(&r, &s).await.expect("stdin").stdout, "from stdin\n");
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while rx.recv().await.is_some() {
                n += 1;
            }
            n
        });
        let exit = a
            .exec_stream(
                &r,
                &cmd(&["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done"]),
                tx,
            )
            .await
            .expect("stream");
        assert_eq!(exit.exit_code, 0);
        assert_eq!(reader.await.expect("reader"), 3);

        // Files, binary round trip with a range.
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let chunks: Vec<Result<Bytes, AdapterError>> = data
            .chunks(8192)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = futures::stream::iter(chunks).boxed();
        a.upload(&r, "/tmp/differently-live/data.bin", Some(0o600), body)
            .await
            .expect("upload");
        let d = a
            .download(&r, "/tmp/differently-live/data.bin", None)
            .await
            .expect("download");
        let got: Vec<u8> = d.body.map(|c| c.expect("chunk").to_vec()).concat().await;
        assert_eq!(got, data);
        let d = a
            .download(
                &r,
                "/tmp/differently-live/data.bin",
                Some(ByteRange {
                    start: 256,
                    end: Some(511),
                }),
            )
            .await
            .expect("range");
        let got: Vec<u8> = d.body.map(|c| c.expect("chunk").to_vec()).concat().await;
        assert_eq!(got, data[256..512]);
        let list = a
            .list_files(&r, "/tmp/differently-live", 1)
            .await
            .expect("list");
        assert!(list
            .iter()
            .any(|e| e.path.ends_with("data.bin") && e.size == 70_000 && e.mode == 0o600));
        a.delete_file(&r, "/tmp/differently-live/data.bin")
            .await
            .expect("delete file");

        // Pause/resume or stop/start, whichever the runtime offers.
        if caps.iter().any(|c| c == "lifecycle.pause") {
            a.exec(
                &r,
                &cmd(&["sh", "-c", "echo kept > /tmp/differently-live-state"]),
            )
            .await
            .expect("state");
            a.pause(&r).await.expect("pause");
            assert_eq!(
                a.find(&req.sandbox_id)
                    .await
                    .expect("find")
                    .map(|i| i.state),
                Some(InstanceState::Paused)
            );
            a.resume(&r).await.expect("resume");
            assert_eq!(
                a.exec(&r, &cmd(&["cat", "/tmp/differently-live-state"]))
                    .await
                    .expect("after resume")
                    .stdout,
                "kept\n"
            );
        }
        if caps.iter().any(|c| c == "lifecycle.stop") {
            a.stop(&r).await.expect("stop");
            a.start(&r).await.expect("start");
        }

        // Snapshot and restore.
        if caps.iter().any(|c| c == "snapshots") {
            a.exec(
                &r,
                &cmd(&["sh", "-c", "echo snap > /tmp/differently-live-snapfile"]),
            )
            .await
            .expect("mark");
            let mut info = a.snapshot(&r, "snp_live").await.expect("snapshot");
            for _ in 0..300 {
                if info.ready {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                info = a.snapshot(&r, "snp_live").await.expect("snapshot poll");
            }
            assert!(info.ready, "snapshot ready");
            let mut restore = create_req(&installation);
            restore.from_snapshot = Some(info.backend_ref.clone());
            restore.ttl_seconds = 600;
            let restored = a.create(&restore).await.expect("restore");
            let out = a
                .exec(
                    &at(&restored),
                    &cmd(&["cat", "/tmp/differently-live-snapfile"]),
                )
                .await
                .expect("restored exec");
            assert_eq!(out.stdout, "snap\n");
            a.delete(&restore.sandbox_id)
                .await
                .expect("delete restored");
            a.delete_snapshot(&info.backend_ref)
                .await
                .expect("delete snapshot");
        }

        // Endpoints: a URL without headers, or a refusal; never the server's proxy.
        match a.expose_port(&r, 8080, None).await {
            Ok(ep) => assert!(!ep.url.contains("/proxy/"), "{}", ep.url),
            Err(AdapterError::Unsupported(_)) | Err(AdapterError::Permanent(_)) => {}
            Err(e) => panic!("expose_port: {e}"),
        }

        // The reaper: an untracked instance of our installation shows up in list.
        let orphan = a.list(&installation).await.expect("list");
        assert!(orphan.iter().any(|i| i.sandbox_id == req.sandbox_id));
    };
    // Clean up whatever happened, then report the scenario's failure if any.
    let result =
        std::panic::AssertUnwindSafe(tokio::time::timeout(Duration::from_secs(1800), scenario))
            .catch_unwind()
            .await;
    a.delete(&req.sandbox_id).await.expect("delete");
    assert_eq!(a.find(&req.sandbox_id).await.expect("find"), None);
    match result {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("live scenario timed out"),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
