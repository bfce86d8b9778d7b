//! Every adapter method against the fake E2B, with its error cases.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use differently_adapters::e2b::{E2bAdapter, E2bConfig, META_INSTALLATION, META_SANDBOX};
use differently_adapters::registry::{self};
use differently_adapters::{
    Adapter, AdapterError, ByteRange, ExecEvent, FileKind, InstanceRef, InstanceState,
};
use differently_core::ids::InstallationId;
use differently_core::pool::Trust;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::FakeServer;
use crate::support::cases::{
    self, a_stalled_reader_does_not_outlast_the_deadline, body, collect, field_of,
};
use crate::{at, cmd, create_req, key_file, running, settings, setup, KEY};

fn build_err(v: serde_json::Value) -> (Option<String>, String) {
    cases::build_err("e2b", v)
}

// ---------------------------------------------------------------------------------------
// Configuration

#[tokio::test]
async fn configuration_rules_name_the_field() {
    let fake = FakeServer::start(KEY).await;
    let key = key_file(KEY);
    let base = |extra| settings(&fake, &key, extra);
    let cases = [
        (json!({"apiURL": "ftp://api.e2b.app"}), "apiURL"),
        (json!({"apiURL": "https://k:v@api.e2b.app"}), "apiURL"),
        (json!({"envdURL": fake.api_url()}), "envdURL"),
        (json!({"domain": "e2b..app"}), "domain"),
        (json!({"template": "a b"}), "template"),
        (json!({"user": "root:x"}), "user"),
        (json!({"maxTimeoutSeconds": 5}), "maxTimeoutSeconds"),
        (json!({"egress": "allowlist"}), "egressAllow"),
        (json!({"egressAllow": ["example.com"]}), "egressAllow"),
        (json!({"ports": "signed"}), "ports"),
        (
            json!({"timeouts": {"readySeconds": 0}}),
            "timeouts.readySeconds",
        ),
        (
            json!({"apiKeyFile": null, "apiKeyEnv": "DIFFERENTLY_TEST_SURELY_UNSET"}),
            "apiKeyEnv",
        ),
        (json!({"apiKeyFile": "/nonexistent/key"}), "apiKeyFile"),
        (json!({"apiKeySecret": "e2b-key"}), "apiKeySecret"),
        (
            json!({"apiKeySecret": "Bad Name!", "apiKeyFile": null}),
            "apiKeySecret",
        ),
    ];
    for (extra, field) in cases {
        let (got, message) = build_err(base(extra.clone()));
        assert_eq!(got.as_deref(), Some(field), "{extra}: {message}");
    }
    // With no key reference at all, the message says how to give one.
    let (got, message) = build_err(json!({}));
    assert_eq!(got.as_deref(), Some("apiKeyEnv"));
    assert!(message.contains("apiKeySecret"), "{message}");
    // Defaults: the public API and domain; providers are always external.
    let a = E2bAdapter::new(serde_json::from_value(json!({"apiKeyFile": key.path()})).unwrap())
        .unwrap();
    assert_eq!(a.settings().api_url, "https://api.e2b.app");
    assert_eq!(a.settings().domain, "e2b.app");
    assert_eq!(a.settings().template, "base");
    assert!(!format!("{a:?}").contains(KEY));
    assert_eq!(registry::resolve_trust("e2b", None), Ok(Trust::External));
    // Self-hosted E2B-protocol servers may be declared private; the cloud stays external.
    assert_eq!(
        registry::resolve_trust("e2b", Some(Trust::Private)),
        Ok(Trust::Private)
    );
    let built = registry::build("e2b", &base(json!({}))).unwrap();
    assert_eq!(built.kind(), "e2b");
}

#[tokio::test]
async fn capabilities_are_only_what_is_implemented() {
    let s = setup(json!({})).await;
    assert_eq!(
        s.adapter.capabilities(),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.pause",
            "snapshots"
        ]
    );
    let open = setup(json!({"ports": "public", "egress": "none"})).await;
    assert_eq!(
        open.adapter.capabilities(),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.pause",
            "snapshots",
            "ports.expose",
            "network.egress-control"
        ]
    );
    // What E2B has no API for is refused, never faked.
    let r = running(&s).await;
    for res in [
        s.adapter.stop(&r).await,
        s.adapter.start(&r).await,
        s.adapter.expose_port(&r, 8080, None).await.map(drop),
    ] {
        assert!(matches!(res, Err(AdapterError::Unsupported(_))), "{res:?}");
    }
    let (_in, out) = (tokio::sync::mpsc::channel(1), tokio::sync::mpsc::channel(1));
    let pty = s
        .adapter
        .pty(
            &r,
            &differently_adapters::PtyRequest {
                command: vec!["bash".into()],
                env: BTreeMap::new(),
                cwd: None,
                size: differently_adapters::PtySize { cols: 80, rows: 24 },
            },
            _in.1,
            out.0,
        )
        .await;
    assert!(matches!(pty, Err(AdapterError::Unsupported(_))));
}

// ---------------------------------------------------------------------------------------
// Create, find, list, delete

#[tokio::test]
async fn create_is_idempotent_and_tags_the_sandbox() {
    let s = setup(json!({})).await;
    let inst = InstallationId::new();
    let req = create_req(&inst);
    let a = s.adapter.create(&req).await.unwrap();
    let b = s.adapter.create(&req).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(a.state, InstanceState::Running);
    assert_eq!(
        s.fake.sandboxes().len(),
        1,
        "a second create found the first"
    );
    let body = s.fake.record().create_bodies[0].clone();
    assert_eq!(body["templateID"], "base");
    assert_eq!(body["secure"], true, "envd must want the sandbox's token");
    assert_eq!(body["autoPause"], false);
    assert_eq!(
        body["timeout"], 900,
        "the TTL plus a margin: Differently acts first"
    );
    assert_eq!(body["metadata"][META_SANDBOX], req.sandbox_id.as_str());
    assert_eq!(body["metadata"][META_INSTALLATION], inst.as_str());
    assert_eq!(body["envVars"]["SANDBOX_VAR"], "from-create");
    assert_eq!(body["network"]["allowPublicTraffic"], false);
    assert!(body.get("allow_internet_access").is_none());

    let found = s.adapter.find(&req.sandbox_id).await.unwrap();
    assert_eq!(found.as_ref(), Some(&a));
    assert_eq!(s.adapter.find(&SandboxId::new()).await.unwrap(), None);
    // A sandbox's own template wins over the pool's.
    let mut other = create_req(&inst);
    other.template = Some("nope".into());
    let e = s.adapter.create(&other).await.unwrap_err();
    assert_eq!(field_of(&e), Some("template"), "{e:?}");
    assert!(e.to_string().contains("`nope`"), "{e}");
}

#[tokio::test]
async fn create_waits_for_envd_and_resumes_a_paused_earlier_instance() {
    let s = setup(json!({})).await;
    s.fake.knobs().envd_boot_polls = 3;
    let req = create_req(&InstallationId::new());
    let started = Instant::now();
    let i = s.adapter.create(&req).await.unwrap();
    let health = s
        .fake
        .record()
        .requests
        .iter()
        .filter(|r| r.as_str() == "GET /health")
        .count();
    assert_eq!(health, 4, "three 502s from the edge, then 204");
    assert!(started.elapsed() < Duration::from_secs(20));
    // An earlier attempt's sandbox that got paused is resumed, not duplicated.
    s.fake.set_state(&i.backend_ref, "paused");
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(again.backend_ref, i.backend_ref);
    assert_eq!(s.fake.sandbox(&i.backend_ref).unwrap().state, "running");
    assert_eq!(s.fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn egress_and_ports_settings_reach_the_create_body() {
    let s = setup(json!({"egress": "allowlist", "egressAllow": ["pypi.org", "10.0.0.0/8"], "ports": "public"})).await;
    running(&s).await;
    let body = s.fake.record().create_bodies[0].clone();
    assert_eq!(
        body["network"]["allowOut"],
        json!(["pypi.org", "10.0.0.0/8"])
    );
    assert_eq!(body["network"]["denyOut"], json!(["0.0.0.0/0"]));
    assert_eq!(body["network"]["allowPublicTraffic"], true);
    let s = setup(json!({"egress": "none"})).await;
    running(&s).await;
    assert_eq!(
        s.fake.record().create_bodies[0]["allow_internet_access"],
        false
    );
}

#[tokio::test]
async fn list_reads_every_page_and_only_our_tags() {
    let s = setup(json!({})).await;
    s.fake.knobs().page_size = 2;
    let inst = InstallationId::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            s.adapter
                .create(&create_req(&inst))
                .await
                .unwrap()
                .sandbox_id,
        );
    }
    // An orphan (no row knows it) and another installation's sandbox.
    let orphan = SandboxId::new();
    s.fake.insert(
        BTreeMap::from([
            (META_SANDBOX.to_owned(), orphan.as_str().to_owned()),
            (META_INSTALLATION.to_owned(), inst.as_str().to_owned()),
        ]),
        "paused",
    );
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    s.fake.insert(BTreeMap::new(), "running");
    ids.push(orphan.clone());
    ids.sort();
    let listed = s.adapter.list(&inst).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| i.sandbox_id.clone())
            .collect::<Vec<_>>(),
        ids
    );
    let o = listed.iter().find(|i| i.sandbox_id == orphan).unwrap();
    assert_eq!(o.state, InstanceState::Paused);
    // A server that ignored the filter still cannot hand us someone else's sandboxes.
    s.fake.knobs().ignore_metadata_filter = true;
    assert_eq!(s.adapter.list(&inst).await.unwrap().len(), 4);
}

#[tokio::test]
async fn delete_removes_every_instance_and_tolerates_none() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    s.adapter.create(&req).await.unwrap();
    // A twin from a create race.
    s.fake.insert(
        BTreeMap::from([(META_SANDBOX.to_owned(), req.sandbox_id.as_str().to_owned())]),
        "running",
    );
    assert_eq!(s.fake.sandboxes().len(), 2);
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    assert!(s.fake.sandboxes().is_empty());
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    s.adapter.delete(&SandboxId::new()).await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Errors

#[tokio::test]
async fn plan_limits_are_insufficient_capacity_and_retryable() {
    let s = setup(json!({})).await;
    s.fake.knobs().max_running = 1;
    running(&s).await;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
    assert!(e.to_string().contains("insufficient capacity"), "{e}");
    // A rate limit on any call reads the same.
    s.fake
        .knobs()
        .fail_next
        .push_back(("GET /v2/sandboxes".into(), 429));
    let e = s.adapter.find(&SandboxId::new()).await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("insufficient capacity"),
        "{e}"
    );
    assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
}

#[tokio::test]
async fn a_refused_key_is_a_clear_permanent_error_that_never_echoes_it() {
    let s = setup(json!({})).await;
    s.fake.set_key("e2b_another_key_entirely");
    let e = s.adapter.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains("refused the API key"), "{text}");
    assert!(!text.contains(KEY), "the key leaked: {text}");
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(!format!("{e} {e:?}").contains(KEY));
    // The key file is rotated to the accepted key: the next call reads it (a refusal
    // forgets the cached value).
    std::fs::write(s.key.path(), "e2b_another_key_entirely\n").unwrap();
    s.adapter.health().await.unwrap();
}

#[tokio::test]
async fn ttls_past_the_plan_are_refused_naming_the_field() {
    let s = setup(json!({})).await;
    let mut req = create_req(&InstallationId::new());
    req.ttl_seconds = 7200;
    let e = s.adapter.create(&req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("ttlSeconds"), "{e:?}");
    assert!(
        s.fake.record().create_bodies.is_empty(),
        "refused before asking E2B"
    );
    // A pool that claims a bigger plan than the account has gets E2B's own 400.
    let s = setup(json!({"maxTimeoutSeconds": 86400})).await;
    let e = s.adapter.create(&req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("ttlSeconds"), "{e:?}");
}

#[tokio::test]
async fn server_errors_are_transient_and_idempotent_calls_retried() {
    let s = setup(json!({})).await;
    s.fake
        .knobs()
        .fail_next
        .push_back(("GET /v2/sandboxes".into(), 503));
    assert_eq!(
        s.adapter.find(&SandboxId::new()).await.unwrap(),
        None,
        "retried past one 503"
    );
    s.fake
        .knobs()
        .fail_next
        .push_back(("POST /sandboxes".into(), 500));
    let req = create_req(&InstallationId::new());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    // The worker's retry creates it (nothing was made by the failed attempt).
    s.adapter.create(&req).await.unwrap();
    assert_eq!(s.fake.sandboxes().len(), 1);
    // Slow: a control plane slower than the request timeout is transient, not a hang.
    let slow = setup(json!({"timeouts": {"requestSeconds": 1, "pollMillis": 20}})).await;
    slow.fake.knobs().delay_ms = 2500;
    let started = Instant::now();
    let e = slow.adapter.find(&SandboxId::new()).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // Unreachable.
    let key = key_file(KEY);
    let cfg: E2bConfig = serde_json::from_value(json!({
        "apiURL": "http://127.0.0.1:9", "apiKeyFile": key.path(),
    }))
    .unwrap();
    let gone = E2bAdapter::new(cfg).unwrap();
    let e = gone.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Unavailable(_)), "{e:?}");
}

// ---------------------------------------------------------------------------------------
// Exec

#[tokio::test]
async fn exec_runs_argv_with_env_cwd_and_exit_codes() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    cases::exec_sees_env_and_cwd(&s.adapter, &r, 3).await;
    // argv is passed as is: no shell splits or expands it.
    let res = s
        .adapter
        .exec(&r, &cmd(&["echo", "a  b", "$HOME", "'q'"]))
        .await
        .unwrap();
    assert_eq!(
        (res.exit_code, res.stdout.as_str()),
        (0, "a  b $HOME 'q'\n")
    );
    // A clean exit has no exitCode in protobuf JSON: still 0.
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // Killed by a signal: 128+n.
    let res = s
        .adapter
        .exec(&r, &cmd(&["bash", "-c", "kill -TERM $$"]))
        .await
        .unwrap();
    assert_eq!(res.exit_code, 143);
    // The Linux user goes to envd.
    assert!(s.fake.record().users.iter().all(|u| u == "user"));
    // A cwd that does not exist names the field.
    let mut bad = cmd(&["pwd"]);
    bad.cwd = Some("/nonexistent/dir".into());
    let e = s.adapter.exec(&r, &bad).await.unwrap_err();
    assert_eq!(field_of(&e), Some("cwd"), "{e:?}");
    let e = s.adapter.exec(&r, &cmd(&[])).await.unwrap_err();
    assert_eq!(field_of(&e), Some("command"));
}

#[tokio::test]
async fn exec_feeds_stdin_text_and_binary() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let mut req = cmd(&["cat"]);
    req.stdin = Some("hello stdin".into());
    let res = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!((res.exit_code, res.stdout.as_str()), (0, "hello stdin"));
    let mut req = cmd(&["wc", "-c"]);
    req.stdin_base64 = Some("AAEC/w==".into());
    assert_eq!(s.adapter.exec(&r, &req).await.unwrap().stdout.trim(), "4");
    let mut req = cmd(&["cat"]);
    req.stdin_base64 = Some("%%%".into());
    let e = s.adapter.exec(&r, &req).await.unwrap_err();
    assert_eq!(field_of(&e), Some("stdinBase64"));
}

#[tokio::test]
async fn a_command_past_its_timeout_is_killed_with_124() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let mut req = cmd(&["sleep", "30"]);
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let res = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(res.exit_code, 124);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        s.fake.record().signals >= 1,
        "the command was killed on envd"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.fake.running_commands(), 0);
}

#[tokio::test]
async fn exec_stream_sends_output_in_order_and_a_closed_receiver_cancels() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let req = cmd(&[
        "bash",
        "-c",
        "for i in 1 2 3; do echo $i; sleep 0.05; done; echo e >&2",
    ]);
    let run = s.adapter.exec_stream(&r, &req, tx);
    let read = async {
        let mut out = String::new();
        let mut err = String::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                ExecEvent::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
                ExecEvent::Stderr(b) => err.push_str(&String::from_utf8_lossy(&b)),
            }
        }
        (out, err)
    };
    let (exit, (out, err)) = tokio::join!(run, read);
    assert_eq!(exit.unwrap().exit_code, 0);
    assert_eq!((out.as_str(), err.as_str()), ("1\n2\n3\n", "e\n"));

    // The caller goes away: the command is stopped on envd.
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = cmd(&["bash", "-c", "while true; do echo tick; sleep 0.02; done"]);
    let run = s.adapter.exec_stream(&r, &req, tx);
    let drop_after_one = async {
        rx.recv().await;
        drop(rx);
    };
    let (exit, ()) = tokio::join!(run, drop_after_one);
    assert_eq!(exit.unwrap().exit_code, 137);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.fake.running_commands(), 0);
}

#[tokio::test]
async fn truncated_and_silent_streams_are_errors_not_exit_codes() {
    let s = setup(json!({"timeouts": {"streamIdleSeconds": 1, "pollMillis": 20}})).await;
    let r = running(&s).await;
    s.fake.knobs().truncate_after_frames = Some(2);
    cases::a_truncated_stream_is_transient(&s.adapter, &r).await;
    s.fake.knobs().truncate_after_frames = None;
    s.fake.knobs().stall_ms = 30_000;
    let started = Instant::now();
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    // The 1 s idle limit ended it, well before the 30 s stall would have.
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[tokio::test]
async fn exec_on_a_gone_or_paused_sandbox_says_which() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    s.fake.set_state(&r.backend_ref, "paused");
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("paused")),
        "{e:?}"
    );
    s.fake.remove(&r.backend_ref);
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert_eq!(e, AdapterError::NotFound);
}

#[tokio::test]
async fn credentials_go_only_where_they_belong() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    s.adapter.list_files(&r, "/", 1).await.unwrap();
    let (key_seen, bad_tokens) = {
        let rec = s.fake.record();
        (rec.key_seen_on_envd, rec.bad_tokens)
    };
    assert_eq!(key_seen, 0, "the API key never goes to envd");
    assert_eq!(bad_tokens, 0, "envd got the sandbox's token every time");
    // A fresh adapter (a restarted worker) gets the token from the control plane.
    let cfg: E2bConfig = serde_json::from_value(settings(&s.fake, &s.key, json!({}))).unwrap();
    let fresh = E2bAdapter::new(cfg).unwrap();
    fresh.exec(&r, &cmd(&["true"])).await.unwrap();
    assert_eq!(s.fake.record().bad_tokens, 0);
}

// ---------------------------------------------------------------------------------------
// Files

#[tokio::test]
async fn files_round_trip_with_ranges_listing_and_modes() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}/sub/hello.txt", dir.path().display());
    s.adapter
        .upload(&r, &path, Some(0o750), body(&[b"hello ", b"world"]))
        .await
        .unwrap();
    let d = s.adapter.download(&r, &path, None).await.unwrap();
    assert_eq!(d.total_size, Some(11));
    assert_eq!(collect(d).await, b"hello world");
    let range = ByteRange {
        start: 2,
        end: Some(6),
    };
    let d = s.adapter.download(&r, &path, Some(range)).await.unwrap();
    assert_eq!(d.total_size, Some(11));
    assert_eq!(collect(d).await, b"llo w");
    // A server that ignores Range: the adapter cuts.
    s.fake.knobs().ignore_range = true;
    let d = s.adapter.download(&r, &path, Some(range)).await.unwrap();
    assert_eq!(collect(d).await, b"llo w");
    let d = s
        .adapter
        .download(
            &r,
            &path,
            Some(ByteRange {
                start: 6,
                end: None,
            }),
        )
        .await
        .unwrap();
    assert_eq!(collect(d).await, b"world");

    let listed = s
        .adapter
        .list_files(&r, &dir.path().display().to_string(), 2)
        .await
        .unwrap();
    let sub = listed.iter().find(|e| e.path.ends_with("/sub")).unwrap();
    assert_eq!(sub.kind, FileKind::Dir);
    assert!(
        sub.mode <= 0o7777,
        "Go's ModeDir bit is not a permission: {:o}",
        sub.mode
    );
    let f = listed.iter().find(|e| e.path == path).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (FileKind::File, 11, 0o750));
    assert!(f.modified_at.is_some());
    let one = s
        .adapter
        .list_files(&r, &dir.path().display().to_string(), 1)
        .await
        .unwrap();
    assert_eq!(one.len(), 1, "depth 1 is the directory's own entries");

    // A non-empty directory is refused (envd's Remove would delete the tree).
    let e = s
        .adapter
        .delete_file(&r, &format!("{}/sub", dir.path().display()))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
        "{e:?}"
    );
    assert!(std::path::Path::new(&path).exists());
    s.adapter.delete_file(&r, &path).await.unwrap();
    s.adapter
        .delete_file(&r, &format!("{}/sub", dir.path().display()))
        .await
        .unwrap();
    let e = s.adapter.delete_file(&r, &path).await.unwrap_err();
    assert!(matches!(e, AdapterError::PathNotFound(_)), "{e:?}");
    let e = s.adapter.download(&r, &path, None).await.err().unwrap();
    assert!(matches!(e, AdapterError::PathNotFound(_)), "{e:?}");
    let e = s.adapter.list_files(&r, &path, 1).await.unwrap_err();
    assert!(matches!(e, AdapterError::PathNotFound(_)), "{e:?}");
    let e = s
        .adapter
        .download(&r, "relative.txt", None)
        .await
        .err()
        .unwrap();
    assert_eq!(field_of(&e), Some("path"));
    // A directory cannot be downloaded.
    let e = s
        .adapter
        .download(&r, &dir.path().display().to_string(), None)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
}

// ---------------------------------------------------------------------------------------
// Lifecycle, snapshots, ports, renew, health

#[tokio::test]
async fn pause_and_resume_are_idempotent() {
    let s = setup(json!({})).await;
    let inst = InstallationId::new();
    let req = create_req(&inst);
    let r = at(&s.adapter.create(&req).await.unwrap());
    s.adapter.pause(&r).await.unwrap();
    s.adapter.pause(&r).await.unwrap();
    assert_eq!(
        s.adapter
            .find(&req.sandbox_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        InstanceState::Paused
    );
    s.fake.knobs().envd_boot_polls = 2;
    s.adapter.resume(&r).await.unwrap();
    s.adapter.resume(&r).await.unwrap();
    assert_eq!(
        s.adapter
            .find(&req.sandbox_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        InstanceState::Running
    );
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    let gone = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "i-missing".into(),
    };
    assert_eq!(s.adapter.pause(&gone).await, Err(AdapterError::NotFound));
    assert_eq!(s.adapter.resume(&gone).await, Err(AdapterError::NotFound));
}

#[tokio::test]
async fn snapshots_are_idempotent_restore_and_delete() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let a = s.adapter.snapshot(&r, "snp_01JTESTSNAPSHOT").await.unwrap();
    let b = s.adapter.snapshot(&r, "snp_01JTESTSNAPSHOT").await.unwrap();
    assert_eq!(a, b);
    assert!(a.ready);
    assert_eq!(
        s.fake.record().snapshot_builds,
        1,
        "the second call found the first"
    );
    assert_eq!(
        s.fake.snapshots()[0].name,
        "differently-snp-01jtestsnapshot"
    );
    // Restore: a sandbox from the snapshot's template.
    let mut req = create_req(&InstallationId::new());
    req.env.clear();
    req.from_snapshot = Some(a.backend_ref.clone());
    let restored = s.adapter.create(&req).await.unwrap();
    assert_eq!(
        s.fake.sandbox(&restored.backend_ref).unwrap().template,
        a.backend_ref
    );
    let out = s
        .adapter
        .exec(&at(&restored), &cmd(&["bash", "-c", "echo $SANDBOX_VAR"]))
        .await
        .unwrap();
    assert_eq!(
        out.stdout, "from-create\n",
        "the snapshot's environment came along"
    );
    s.adapter.delete_snapshot(&a.backend_ref).await.unwrap();
    assert!(s.fake.snapshots().is_empty());
    s.adapter.delete_snapshot(&a.backend_ref).await.unwrap();
}

#[tokio::test]
async fn ports_are_public_sandbox_urls_without_credentials() {
    let s = setup(json!({"ports": "public"})).await;
    let r = running(&s).await;
    let ep = s.adapter.expose_port(&r, 8080, None).await.unwrap();
    assert_eq!(ep.url, format!("https://8080-{}.e2b.app", r.backend_ref));
    assert_eq!(ep.expires_at, None);
    assert!(!ep.url.contains(KEY) && !ep.url.contains("token"));
    let e = s.adapter.expose_port(&r, 0, None).await.unwrap_err();
    assert_eq!(field_of(&e), Some("port"));
}

#[tokio::test]
async fn renew_moves_the_backstop_and_health_checks_the_key() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    s.adapter
        .renew(&r, Duration::from_secs(1200))
        .await
        .unwrap();
    assert_eq!(
        s.fake.record().timeouts.last(),
        Some(&(r.backend_ref.clone(), 1500))
    );
    let e = s
        .adapter
        .renew(&r, Duration::from_secs(7200))
        .await
        .unwrap_err();
    assert_eq!(field_of(&e), Some("ttlSeconds"));
    s.adapter.health().await.unwrap();
}

#[tokio::test]
async fn a_reader_that_stops_reading_does_not_outlast_the_deadline() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    a_stalled_reader_does_not_outlast_the_deadline(&s.adapter, &r, || s.fake.running_commands())
        .await;
}
