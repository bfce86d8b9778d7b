//! The same scenario against a real OpenSandbox server. Opt in with
//! `DIFFERENTLY_TEST_OPENSANDBOX_URL` (the lifecycle API, ending in `/v1`) and
//! `DIFFERENTLY_TEST_OPENSANDBOX_KEY`, then `cargo test -p differently-adapters --test
//! opensandbox -- --ignored live`. Optional: `DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS` (JSON
//! merged into the pool settings, e.g. `{"runtime":"kubernetes","lineEndings":"kept"}`).
//!
//! Besides the adapter, the scenario talks to the server itself (its lifecycle API, with the
//! key) for what happens behind Differently's back: an instance deleted, an orphan created with
//! our tags, and a snapshot's state after a delete.

use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_adapters::opensandbox::{OpenSandboxAdapter, OpenSandboxConfig};
use differently_adapters::{Adapter, AdapterError, ByteRange, InstanceState};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::{FutureExt, StreamExt};

use crate::fake_server::{FakeRuntime, Variant};
use crate::support::live::{self, done};
use crate::{at, cmd, create_req, key_file, setup, KEY};

/// The server's lifecycle API reached directly, as an operator (or another tool) would.
struct Backdoor {
    api: String,
    key: String,
    http: reqwest::Client,
}

impl Backdoor {
    fn new(api: &str, key: &str) -> Backdoor {
        let url = reqwest::Url::parse(api).expect("server URL");
        let host = url.host_str().unwrap_or_default();
        // Traffic of this test goes to loopback only.
        assert!(
            matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1"),
            "the live test only talks to a server on loopback, not {host}"
        );
        Backdoor {
            api: api.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .timeout(Duration::from_secs(120))
    }

    /// The HTTP status of `GET path`.
    async fn status(&self, path: &str) -> u16 {
        self.req(reqwest::Method::GET, path)
            .send()
            .await
            .expect("backdoor GET")
            .status()
            .as_u16()
    }

    /// Deletes a sandbox by its OpenSandbox id, as an operator would.
    async fn delete_sandbox(&self, id: &str) {
        let r = self
            .req(reqwest::Method::DELETE, &format!("/sandboxes/{id}"))
            .send()
            .await
            .expect("backdoor delete");
        assert!(r.status().is_success(), "backdoor delete: {}", r.status());
    }

    /// Creates a sandbox tagged as Differently's, which no row knows: an orphan.
    async fn create_tagged(
        &self,
        image: &str,
        sandbox: &SandboxId,
        inst: &InstallationId,
    ) -> String {
        let body = serde_json::json!({
            "image": {"uri": image},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": 600,
            "resourceLimits": {"cpu": "1", "memory": "512Mi"},
            "metadata": {
                "differently-sandbox-id": sandbox.as_str(),
                "differently-installation-id": inst.as_str(),
            },
        });
        let r = self
            .req(reqwest::Method::POST, "/sandboxes")
            .json(&body)
            .send()
            .await
            .expect("backdoor create");
        let status = r.status();
        let v: serde_json::Value = r.json().await.expect("backdoor create body");
        assert!(status.is_success(), "backdoor create: {status} {v}");
        v["id"].as_str().expect("sandbox id").to_owned()
    }
}

/// What the server under test is known to do where the published spec and the real server
/// differ (`Variant::Spec` is the spec's reading; a live server and `Variant::Real` the real).
#[derive(Clone, Copy)]
struct Expect {
    /// Restoring from a snapshot still `Creating` is `409 SNAPSHOT::NOT_READY` (the spec
    /// says nothing), and deleting one a sandbox still uses is `409 SNAPSHOT::DELETE_CONFLICT`.
    real_snapshots: bool,
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY and run with --ignored"]
async fn live_opensandbox() {
    let [url, key] = required_vars();
    let raw = Backdoor::new(&url, &key);
    let key = key_file(&key);
    let settings = live::with_settings_from(
        serde_json::json!({
            "apiURL": url, "trust": "private", "apiKeyFile": key.path(),
            "timeouts": {"readySeconds": 300},
        }),
        "DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS",
    );
    let cfg: OpenSandboxConfig = serde_json::from_value(settings).expect("settings");
    let a = OpenSandboxAdapter::new(cfg).expect("adapter");
    scenario(
        &a,
        &raw,
        Expect {
            real_snapshots: true,
        },
    )
    .await;
}

/// The server's URL and key, or a failure naming the variables.
fn required_vars() -> [String; 2] {
    live::required(
        [
            "DIFFERENTLY_TEST_OPENSANDBOX_URL",
            "DIFFERENTLY_TEST_OPENSANDBOX_KEY",
        ],
        &["DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS"],
        "OpenSandbox",
    )
}

/// The live scenario run against the fake too, so it is known to be right before it meets a
/// real server.
#[tokio::test]
async fn live_scenario_against_the_fake() {
    for variant in [Variant::Real, Variant::Spec] {
        let s = setup(variant, FakeRuntime::Docker, serde_json::json!({})).await;
        let raw = Backdoor::new(&s.fake.api_url(), KEY);
        let expect = Expect {
            real_snapshots: variant == Variant::Real,
        };
        scenario(&s.adapter, &raw, expect).await;
        assert!(s.fake.sandboxes().is_empty(), "{variant:?}: cleaned up");
    }
    // The fake's sandboxes share the test host's file system.
    let _ = std::fs::remove_dir_all("/tmp/differently-live");
    let _ = std::fs::remove_file("/tmp/differently-live-state");
    let _ = std::fs::remove_file("/tmp/differently-live-snapfile");
}

async fn scenario(a: &OpenSandboxAdapter, raw: &Backdoor, expect: Expect) {
    let caps = a.capabilities();
    a.health().await.expect("health");

    let installation = InstallationId::new();
    let mut req = create_req(&installation);
    req.resources.cpu = 1;
    req.resources.memory_mib = 512;
    req.ttl_seconds = 900;
    let began = Instant::now();
    let inst = a.create(&req).await.expect("create");
    let r = at(&inst);
    let scenario = async {
        assert_eq!(
            a.create(&req).await.expect("create again"),
            inst,
            "idempotent"
        );
        done(
            "create, then the same create again is the same instance",
            began,
        );
        let began = Instant::now();

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
        done(
            "exec: exit code and stderr, env and cwd, quoting, lines, timeout, stdin",
            began,
        );
        let began = Instant::now();
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
        done("streamed exec of three paced lines", began);
        held_commands(a, &r).await;

        // Files, binary round trip with a range.
        let began = Instant::now();
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
        done("files: upload, download, range, list, delete", began);

        // Pause/resume or stop/start, whichever the runtime offers.
        if caps.iter().any(|c| c == "lifecycle.pause") {
            let began = Instant::now();
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
            done("pause, then resume keeps the file system", began);
        }
        if caps.iter().any(|c| c == "lifecycle.stop") {
            a.stop(&r).await.expect("stop");
            a.start(&r).await.expect("start");
        }

        // Snapshot, then fork at once; deleting the snapshot while the fork uses it; the
        // fork, then the snapshot.
        if caps.iter().any(|c| c == "snapshots") {
            a.exec(
                &r,
                &cmd(&["sh", "-c", "echo snap > /tmp/differently-live-snapfile"]),
            )
            .await
            .expect("mark");
            let t = Instant::now();
            let mut info = a.snapshot(&r, "snp_live").await.expect("snapshot");
            let mut restore = create_req(&installation);
            restore.from_snapshot = Some(info.backend_ref.clone());
            restore.ttl_seconds = 600;
            if !info.ready && expect.real_snapshots {
                // A fork right away: the server refuses a restore from a snapshot still being
                // written (409 SNAPSHOT::NOT_READY), which must be retryable, never final.
                match a.create(&restore).await {
                    Err(AdapterError::Transient(e)) => {
                        assert!(e.to_string().contains("NOT_READY"), "{e}")
                    }
                    other => panic!("fork of a snapshot being written: {other:?}"),
                }
                assert_eq!(a.find(&restore.sandbox_id).await.expect("find"), None);
                done(
                    "immediate fork of a snapshot being written: retryable NOT_READY",
                    t,
                );
            } else {
                eprintln!(
                    "live case immediate fork: not run (snapshot ready at once, or spec server)"
                );
            }
            // The snapshot is re-asked (the adapter's snapshot is idempotent on the name) until
            // it is ready, as the worker does.
            for _ in 0..3000 {
                if info.ready {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                info = a.snapshot(&r, "snp_live").await.expect("snapshot poll");
            }
            assert!(info.ready, "snapshot ready");
            done("snapshot until ready", t);
            let t = Instant::now();
            let restored = a.create(&restore).await.expect("fork");
            assert_ne!(restored.backend_ref, inst.backend_ref);
            let out = a
                .exec(
                    &at(&restored),
                    &cmd(&["cat", "/tmp/differently-live-snapfile"]),
                )
                .await
                .expect("forked exec");
            assert_eq!(out.stdout, "snap\n");
            // The fork carries the source's metadata on the server; the adapter still tells
            // them apart.
            assert_eq!(
                a.find(&req.sandbox_id)
                    .await
                    .expect("find source")
                    .map(|i| i.backend_ref),
                Some(inst.backend_ref.clone())
            );
            done("fork of the ready snapshot", t);
            let snap_path = format!("/snapshots/{}", info.backend_ref);
            if expect.real_snapshots {
                let t = Instant::now();
                match a.delete_snapshot(&info.backend_ref).await {
                    Err(AdapterError::Transient(e)) => {
                        assert!(
                            e.to_string()
                                .contains("in use by a sandbox restored from it"),
                            "{e}"
                        )
                    }
                    other => panic!("delete of a snapshot in use: {other:?}"),
                }
                assert_eq!(
                    raw.status(&snap_path).await,
                    200,
                    "still there while in use"
                );
                done("delete of the snapshot in use refused, retryable", t);
            }
            let t = Instant::now();
            a.delete(&restore.sandbox_id).await.expect("delete fork");
            assert_eq!(a.find(&restore.sandbox_id).await.expect("find fork"), None);
            a.delete_snapshot(&info.backend_ref)
                .await
                .expect("delete snapshot");
            assert_eq!(raw.status(&snap_path).await, 404, "snapshot gone");
            a.delete_snapshot(&info.backend_ref)
                .await
                .expect("deleting a deleted snapshot is fine");
            done("delete of the fork, then the snapshot", t);
        }

        // A missing path is `PathNotFound` (the API's 404), never `NotFound` (sandbox gone).
        let t = Instant::now();
        match a.download(&r, "/nope/differently-missing", None).await {
            Err(AdapterError::PathNotFound(_)) => {}
            other => panic!("download of a missing file: {:?}", other.map(|_| "a body")),
        }
        match a.list_files(&r, "/nope/differently-missing", 1).await {
            Err(AdapterError::PathNotFound(_)) => {}
            other => panic!("list of a missing directory: {other:?}"),
        }
        match a.delete_file(&r, "/nope/differently-missing").await {
            Err(AdapterError::PathNotFound(_)) => {}
            other => panic!("delete of a missing file: {other:?}"),
        }
        done("missing path is path_not_found", t);

        // Endpoints: a URL without headers, or a refusal; never the server's proxy.
        match a.expose_port(&r, 8080, None).await {
            Ok(ep) => assert!(!ep.url.contains("/proxy/"), "{}", ep.url),
            Err(AdapterError::Unsupported(_)) | Err(AdapterError::Permanent(_)) => {}
            Err(e) => panic!("expose_port: {e}"),
        }

        // The reaper: an untracked instance of our installation shows up in list.
        let listed = a.list(&installation).await.expect("list");
        assert!(listed.iter().any(|i| i.sandbox_id == req.sandbox_id));

        // An instance deleted behind Differently's back: find and list say it is gone (the
        // reconciler then fails its row; the e2e test covers that part).
        let t = Instant::now();
        let mut gone_req = create_req(&installation);
        gone_req.resources.cpu = 1;
        gone_req.resources.memory_mib = 512;
        let gone = a.create(&gone_req).await.expect("create the one to vanish");
        raw.delete_sandbox(&gone.backend_ref).await;
        let mut vanished = false;
        for _ in 0..600 {
            if a.find(&gone_req.sandbox_id).await.expect("find").is_none() {
                vanished = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            vanished,
            "find still reports an instance deleted on the server"
        );
        let listed = a.list(&installation).await.expect("list");
        assert!(!listed.iter().any(|i| i.sandbox_id == gone_req.sandbox_id));
        assert!(listed.iter().any(|i| i.sandbox_id == req.sandbox_id));
        done("instance deleted behind our back is gone", t);

        // An orphan carrying our tags, made by someone else: list shows it, and the
        // reconciler's way out (delete by sandbox id) removes it on the server.
        let t = Instant::now();
        let orphan = SandboxId::new();
        let orphan_ref = raw
            .create_tagged(&a.settings().image, &orphan, &installation)
            .await;
        let mut seen = false;
        for _ in 0..600 {
            let listed = a.list(&installation).await.expect("list");
            if listed
                .iter()
                .any(|i| i.sandbox_id == orphan && i.backend_ref == orphan_ref)
            {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "the orphan is not in the installation's listing");
        a.delete(&orphan).await.expect("delete the orphan");
        assert_eq!(a.find(&orphan).await.expect("find orphan"), None);
        assert!(!a
            .list(&installation)
            .await
            .expect("list")
            .iter()
            .any(|i| i.sandbox_id == orphan));
        assert_eq!(
            raw.status(&format!("/sandboxes/{orphan_ref}")).await,
            404,
            "the orphan is gone on the server"
        );
        done("orphan with our tags deleted", t);
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

/// The terminal case on a running instance `r`: what both a real execd and the fake do the
/// same way (prompts and the timing of the echo differ, so only program output is matched:
/// text that never appears in the echoed keystrokes).
/// A command held for its go-ahead (`exec_stream_after`, as the API's exec sends it): execd
/// runs it once when it is given, never when it is withdrawn (the request is abandoned with
/// its head sent and no body), and once when it is held past the hold limit (abandoned, then
/// sent anew). Each command appends to a file of its own, read back after.
async fn held_commands(a: &OpenSandboxAdapter, r: &differently_adapters::InstanceRef) {
    use differently_adapters::go_ahead::GoAhead;
    let t = Instant::now();
    let tag = ulid_tag();
    let file = |what: &str| format!("/tmp/differently-held-{tag}-{what}");
    let append = |what: &str| cmd(&["sh", "-c", &format!("echo ran >> {}", file(what))]);
    let held = async |what: &str, hold: Duration, give: bool| {
        let (giver, go) = GoAhead::pair();
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let control = async {
            tokio::time::sleep(hold).await;
            if give {
                giver.give();
            }
        };
        let command = append(what);
        let (res, ()) = tokio::join!(a.exec_stream_after(r, &command, tx, go), control);
        res
    };
    let given = held("given", Duration::from_millis(50), true).await;
    assert_eq!(given.expect("given").exit_code, 0);
    let withdrawn = held("withdrawn", Duration::from_millis(50), false).await;
    assert!(
        matches!(&withdrawn, Err(AdapterError::Permanent(m)) if m.to_string().contains("withdrawn")),
        "{withdrawn:?}"
    );
    let long = held("long", Duration::from_millis(1300), true).await;
    assert_eq!(long.expect("held past the limit").exit_code, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read = cmd(&[
        "sh",
        "-c",
        &format!(
            "for f in given withdrawn long; do printf '%s=' $f; cat {0}-$f 2>/dev/null | wc -l; done; rm -f {0}-*",
            file("").trim_end_matches('-')
        ),
    ]);
    let out = a.exec(r, &read).await.expect("read the markers");
    assert_eq!(
        out.stdout.split_whitespace().collect::<Vec<_>>(),
        ["given=1", "withdrawn=0", "long=1"],
        "{out:?}"
    );
    done(
        "held command: given runs once, withdrawn never, held too long once",
        t,
    );
}

/// A tag unique to this run, for file names in the sandbox.
fn ulid_tag() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}

pub(crate) async fn pty_case(a: &OpenSandboxAdapter, r: &differently_adapters::InstanceRef) {
    use differently_adapters::{PtyInput, PtyRequest, PtySignal, PtySize};
    assert!(
        a.capabilities().iter().any(|c| c == "exec.pty"),
        "the pool must offer exec.pty (useServerProxy false)"
    );
    let req = PtyRequest {
        command: vec!["sh".into()],
        env: [("PTY_VAR".to_owned(), "it's set".to_owned())]
            .into_iter()
            .collect(),
        cwd: Some("/tmp".into()),
        size: PtySize {
            cols: 100,
            rows: 30,
        },
    };
    let (tx, in_rx) = tokio::sync::mpsc::channel(8);
    let (out_tx, mut rx) = tokio::sync::mpsc::channel(8);
    let run = a.pty(r, &req, in_rx, out_tx);
    let drive = async move {
        let mut seen = String::new();
        let key = |s: &str| PtyInput::Stdin(Bytes::from(s.to_owned()));
        tx.send(key("stty size\n")).await.unwrap();
        crate::pty::read_until(&mut rx, &mut seen, "30 100").await;
        tx.send(PtyInput::Resize(PtySize {
            cols: 132,
            rows: 43,
        }))
        .await
        .unwrap();
        tx.send(key("stty size\n")).await.unwrap();
        crate::pty::read_until(&mut rx, &mut seen, "43 132").await;
        // On OpenSandbox 1.1.1 (Docker) execd itself runs with SIGINT ignored (bootstrap.sh
        // starts it in the background; `SigIgn: …0002`, recorded), so every command inherits
        // that and ^C cannot interrupt it there: the sleep is short enough to end on its own,
        // and INT is checked where it works (the fake here, devhost end to end).
        tx.send(key("sleep 3\n")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        tx.send(PtyInput::Signal(PtySignal::Int)).await.unwrap();
        // Two spaces typed, one printed: the output never matches the echoed keystrokes.
        tx.send(key("echo  alive  now\n")).await.unwrap();
        crate::pty::read_until(&mut rx, &mut seen, "alive now").await;
        tx.send(key("exit 3\n")).await.unwrap();
        // Keep reading so the last output never blocks the terminal.
        while rx.recv().await.is_some() {}
    };
    let (exit, ()) = tokio::join!(run, drive);
    assert_eq!(exit.expect("pty").exit_code, 3);
}

#[tokio::test]
#[ignore = "live: set DIFFERENTLY_TEST_OPENSANDBOX_URL and DIFFERENTLY_TEST_OPENSANDBOX_KEY and run with --ignored"]
async fn live_opensandbox_pty() {
    let [url, key] = required_vars();
    // Backdoor::new checks the server is on loopback; direct execd endpoints of a server with
    // `publish_host = "127.0.0.1"` are too.
    let _raw = Backdoor::new(&url, &key);
    let key = key_file(&key);
    let mut settings = live::with_settings_from(
        serde_json::json!({
            "apiURL": url, "trust": "private", "apiKeyFile": key.path(),
            "timeouts": {"readySeconds": 300},
        }),
        "DIFFERENTLY_TEST_OPENSANDBOX_SETTINGS",
    );
    // execd reached directly: the only way the adapter offers a terminal.
    settings["useServerProxy"] = serde_json::json!(false);
    let cfg: OpenSandboxConfig = serde_json::from_value(settings).expect("settings");
    let a = OpenSandboxAdapter::new(cfg).expect("adapter");
    let mut req = create_req(&InstallationId::new());
    req.resources.cpu = 1;
    req.resources.memory_mib = 512;
    let inst = a.create(&req).await.expect("create");
    let r = at(&inst);
    let began = Instant::now();
    let result = std::panic::AssertUnwindSafe(tokio::time::timeout(
        Duration::from_secs(120),
        pty_case(&a, &r),
    ))
    .catch_unwind()
    .await;
    a.delete(&req.sandbox_id).await.expect("delete");
    match result {
        Ok(Ok(())) => done("terminal (PTY) on execd reached directly", began),
        Ok(Err(_)) => panic!("live pty case timed out"),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The live terminal case against the fake, so it is known to be right before it meets a
/// real execd.
#[tokio::test]
async fn live_pty_case_against_the_fake() {
    let s = setup(
        Variant::Real,
        FakeRuntime::Docker,
        serde_json::json!({"useServerProxy": false}),
    )
    .await;
    let r = crate::running(&s).await;
    pty_case(&s.adapter, &r).await;
    assert!(s.fake.ptys.views().is_empty(), "the session was deleted");
}
