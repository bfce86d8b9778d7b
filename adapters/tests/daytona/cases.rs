//! Every adapter method against the fake Daytona, including its error cases.

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::{Adapter, AdapterError, ByteRange, ExecEvent, FileKind, InstanceState};
use differently_core::ids::InstallationId;
use serde_json::json;

use crate::fake_server::FakeDaytona;
use crate::support::cases::{self, one_chunk as body, read_all};
use crate::{cmd, create_req, running, settings, setup, KEY};

fn message(e: &AdapterError) -> String {
    e.to_string()
}

#[tokio::test]
async fn create_labels_the_sandbox_and_is_idempotent() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let first = s.adapter.create(&req).await.unwrap();
    assert_eq!(first.state, InstanceState::Running);
    assert_eq!(first.sandbox_id, req.sandbox_id);
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(again.backend_ref, first.backend_ref);
    assert_eq!(
        s.fake.sandboxes().len(),
        1,
        "a redelivered create finds the first"
    );
    let bodies = s.fake.record().create_bodies.clone();
    assert_eq!(bodies.len(), 1);
    let b = &bodies[0];
    assert_eq!(
        b["labels"]["differently-sandbox-id"],
        req.sandbox_id.as_str()
    );
    assert_eq!(
        b["labels"]["differently-installation-id"],
        req.installation_id.as_str()
    );
    assert_eq!(
        b["name"],
        req.sandbox_id
            .as_str()
            .to_ascii_lowercase()
            .replace('_', "-")
    );
    // No snapshot: the requested size, memory and disk in GB; never auto-stopped.
    assert_eq!(
        (b["cpu"].clone(), b["memory"].clone(), b["disk"].clone()),
        (json!(2), json!(2), json!(10))
    );
    assert_eq!(b["autoStopInterval"], 0);
    assert_eq!(b["env"]["SANDBOX_VAR"], "from-create");
    assert!(b.get("snapshot").is_none());
    let found = s.adapter.find(&req.sandbox_id).await.unwrap().unwrap();
    assert_eq!(found.backend_ref, first.backend_ref);
    assert_eq!(found.state, InstanceState::Running);
}

#[tokio::test]
async fn concurrent_creates_of_one_sandbox_make_one_instance() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let (a, b) = tokio::join!(s.adapter.create(&req), s.adapter.create(&req));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.backend_ref, b.backend_ref);
    assert_eq!(s.fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn a_taken_name_without_our_label_is_not_adopted() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let name = req
        .sandbox_id
        .as_str()
        .to_ascii_lowercase()
        .replace('_', "-");
    s.fake.insert(&name, BTreeMap::new());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(message(&e).contains("is taken"), "{e}");
}

#[tokio::test]
async fn with_a_snapshot_no_resources_are_sent() {
    let s = setup(json!({"snapshot": "daytona-python", "target": "eu"})).await;
    let i = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    assert_eq!(i.state, InstanceState::Running);
    let b = s.fake.record().create_bodies[0].clone();
    assert_eq!(b["snapshot"], "daytona-python");
    assert_eq!(b["target"], "eu");
    for k in ["cpu", "memory", "disk"] {
        assert!(b.get(k).is_none(), "{k} sent with a snapshot: {b}");
    }
    // A template names the snapshot too.
    let mut req = create_req(&InstallationId::new());
    req.template = Some("node-20".into());
    s.adapter.create(&req).await.unwrap();
    assert_eq!(s.fake.record().create_bodies[1]["snapshot"], "node-20");
}

#[tokio::test]
async fn a_failed_build_is_permanent_with_its_reason() {
    let s = setup(json!({})).await;
    s.fake.knobs().build_fails = true;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(message(&e).contains("failed to pull image"), "{e}");
}

#[tokio::test]
async fn plan_limits_and_429_are_insufficient_capacity() {
    let s = setup(json!({})).await;
    s.fake.knobs().max_sandboxes = Some(0);
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert!(message(&e).contains("insufficient capacity"), "{e}");
    s.fake.knobs().max_sandboxes = None;
    s.fake
        .knobs()
        .fail_next
        .push_back(("/api/sandbox".into(), 429));
    let e = s.adapter.list(&InstallationId::new()).await.unwrap_err();
    assert!(
        e.is_retryable() && message(&e).contains("insufficient capacity"),
        "{e}"
    );
    assert!(s.fake.sandboxes().is_empty());
}

#[tokio::test]
async fn a_refused_key_is_permanent_never_echoed_and_a_rotated_one_is_used() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let new_key = "dtn_rotated_9a8b7c6d5e4f3a2b1c0d";
    s.fake.set_key(new_key);
    for e in [
        s.adapter.health().await.unwrap_err(),
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap_err(),
    ] {
        assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
        let m = format!("{e} {e:?}");
        assert!(m.contains("refused the API key"), "{m}");
        assert!(!m.contains(KEY) && !m.contains(new_key), "{m}");
    }
    std::fs::write(s.key.path(), format!("{new_key}\n")).unwrap();
    s.adapter.health().await.unwrap();
    assert_eq!(
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
}

#[tokio::test]
async fn transient_5xx_is_retried_or_reported_as_retryable() {
    let s = setup(json!({})).await;
    // A 503 on a GET is retried by the HTTP layer.
    s.fake
        .knobs()
        .fail_next
        .push_back(("/api/sandbox".into(), 503));
    let id = differently_core::SandboxId::new();
    assert!(s.adapter.find(&id).await.unwrap().is_none());
    assert!(s.fake.knobs().fail_next.is_empty(), "the 503 was answered");
    // A 500 is not retried there, but stays retryable for the worker.
    s.fake
        .knobs()
        .fail_next
        .push_back(("/api/sandbox".into(), 500));
    let req = create_req(&InstallationId::new());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    s.adapter.create(&req).await.unwrap();
    // The toolbox's 502 just after start (the proxy before the daemon) is waited out.
    assert_eq!(s.fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn exec_runs_argv_exactly_with_env_cwd_stdin_and_exit_codes() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut req = cmd(&[
        "sh",
        "-c",
        "printf '%s|%s|%s|' \"$1\" \"$SANDBOX_VAR\" \"$MINE\"; pwd; cat; exit 3",
        "-",
        "it's a \"test\" $HOME",
    ]);
    req.env = BTreeMap::from([("MINE".to_owned(), "x y".to_owned())]);
    req.cwd = Some(dir.path().to_string_lossy().into_owned());
    req.stdin = Some("from stdin".into());
    let r = s.adapter.exec(&i, &req).await.unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(
        r.stdout,
        format!(
            "it's a \"test\" $HOME|from-create|x y|{}\nfrom stdin",
            dir.path().display()
        )
    );
    // The toolbox combines the streams.
    let r = s
        .adapter
        .exec(&i, &cmd(&["sh", "-c", "echo out; echo err >&2"]))
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "out\nerr\n", "")
    );
    let body = s.fake.record().execute_bodies.last().cloned().unwrap();
    assert!(
        body["command"].as_str().unwrap().starts_with("sh -c "),
        "{body}"
    );
    assert_eq!(body["timeout"], 60, "the request's timeout, always sent");
}

#[tokio::test]
async fn exec_timeout_is_124_and_a_missing_cwd_names_the_field() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let timed_out =
        cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &i).await;
    assert!(timed_out.stdout.is_empty());
    let e = s.adapter.exec(&i, &cmd(&[])).await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
}

#[tokio::test]
async fn exec_on_a_deleted_sandbox_is_not_found() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    s.fake.set_state(&i.backend_ref, "destroyed");
    assert_eq!(
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
}

async fn stream(
    s: &crate::Setup,
    i: &differently_adapters::InstanceRef,
    req: &differently_core::exec::ExecRequest,
) -> (
    Result<differently_adapters::ExecExit, AdapterError>,
    Vec<ExecEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let run = s.adapter.exec_stream(i, req, tx);
    let collect = async {
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        events
    };
    tokio::join!(run, collect)
}

fn joined(events: &[ExecEvent], stdout: bool) -> String {
    events
        .iter()
        .filter_map(|e| match (e, stdout) {
            (ExecEvent::Stdout(b), true) | (ExecEvent::Stderr(b), false) => {
                Some(String::from_utf8_lossy(b).into_owned())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn exec_stream_sends_output_as_it_comes_apart_and_in_order() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut req = cmd(&[
        "sh",
        "-c",
        "echo one; sleep 0.3; echo two >&2; sleep 0.3; printf '%s %s' \"$MINE\" \"$(pwd)\"; cat; exit 7",
    ]);
    req.env = BTreeMap::from([("MINE".to_owned(), "it's".to_owned())]);
    req.cwd = Some(dir.path().to_string_lossy().into_owned());
    req.stdin = Some("|in".into());
    let (exit, events) = stream(&s, &i, &req).await;
    assert_eq!(exit.unwrap().exit_code, 7);
    assert_eq!(
        joined(&events, true),
        format!("one\nit's {}|in", dir.path().display())
    );
    assert_eq!(joined(&events, false), "two\n");
    assert!(events.len() >= 3, "output arrived in pieces: {events:?}");
    assert_eq!(s.fake.sessions(), 0, "the session is cleaned up");
}

#[tokio::test]
async fn exec_stream_timeout_is_124_and_kills_the_command() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let mut req = cmd(&["sh", "-c", "echo started; sleep 30"]);
    req.timeout_seconds = Some(1);
    let (exit, events) = stream(&s, &i, &req).await;
    assert_eq!(exit.unwrap().exit_code, 124);
    assert_eq!(joined(&events, true), "started\n");
    assert_eq!(s.fake.record().killed, 1);
    assert_eq!(s.fake.sessions(), 0);
}

#[tokio::test]
async fn exec_stream_cancels_when_the_receiver_goes_away() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = cmd(&["sh", "-c", "echo hi; sleep 30"]);
    let run = s.adapter.exec_stream(&i, &req, tx);
    let reader = async {
        let first = rx.recv().await;
        drop(rx);
        first
    };
    let (res, first) = tokio::join!(run, reader);
    assert!(matches!(first, Some(ExecEvent::Stdout(_))));
    let e = res.unwrap_err();
    assert!(message(&e).contains("cancelled"), "{e}");
    assert_eq!(s.fake.record().killed, 1);
    assert_eq!(s.fake.commands_running(), 0);
}

#[tokio::test]
async fn slow_and_truncated_log_reads_are_survived_then_reported() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    s.fake.knobs().logs_delay_ms = 150;
    s.fake.knobs().truncate_logs = 2;
    let (exit, events) = stream(&s, &i, &cmd(&["sh", "-c", "echo a; sleep 0.2; echo b"])).await;
    assert_eq!(exit.unwrap().exit_code, 0);
    assert_eq!(joined(&events, true), "a\nb\n");
    // Cut off every time: a retryable error, not a hang, and nothing left running.
    s.fake.knobs().logs_delay_ms = 0;
    s.fake.knobs().truncate_logs = 1000;
    let (exit, _) = stream(&s, &i, &cmd(&["sh", "-c", "sleep 30"])).await;
    let e = exit.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    assert_eq!(s.fake.sessions(), 0);
    assert_eq!(s.fake.commands_running(), 0);
}

#[tokio::test]
async fn files_round_trip_with_modes_ranges_listing_and_errors() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().into_owned();
    let file = format!("{root}/sub/hello.txt");
    s.adapter
        .upload(&i, &file, Some(0o640), body(b"hello, daytona"))
        .await
        .unwrap();
    let d = s.adapter.download(&i, &file, None).await.unwrap();
    assert_eq!(d.total_size, Some(14));
    assert_eq!(read_all(d.body).await, b"hello, daytona");
    let r = ByteRange {
        start: 7,
        end: Some(9),
    };
    let d = s.adapter.download(&i, &file, Some(r)).await.unwrap();
    assert_eq!(read_all(d.body).await, b"day");
    let open = ByteRange {
        start: 7,
        end: None,
    };
    let d = s.adapter.download(&i, &file, Some(open)).await.unwrap();
    assert_eq!(read_all(d.body).await, b"daytona");

    let one = s.adapter.list_files(&i, &root, 1).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0].path.clone(), one[0].kind),
        (format!("{root}/sub"), FileKind::Dir)
    );
    let two = s.adapter.list_files(&i, &root, 2).await.unwrap();
    let f = two.iter().find(|e| e.path == file).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (FileKind::File, 14, 0o640));
    assert!(f.modified_at.is_some());

    let missing = format!("{root}/nope");
    assert_eq!(
        s.adapter.download(&i, &missing, None).await.err().unwrap(),
        AdapterError::PathNotFound(missing.clone())
    );
    assert_eq!(
        s.adapter.list_files(&i, &missing, 1).await.unwrap_err(),
        AdapterError::PathNotFound(missing.clone())
    );
    let e = s
        .adapter
        .delete_file(&i, &format!("{root}/sub"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AdapterError::Permanent(_)),
        "a non-empty directory: {e:?}"
    );
    s.adapter.delete_file(&i, &file).await.unwrap();
    assert!(!std::path::Path::new(&file).exists());
    assert_eq!(
        s.adapter.delete_file(&i, &file).await.unwrap_err(),
        AdapterError::PathNotFound(file.clone())
    );
    let e = s
        .adapter
        .upload(&i, "relative", None, body(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
}

#[tokio::test]
async fn stop_and_start_wait_for_the_state_and_are_idempotent() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    s.adapter.stop(&i).await.unwrap();
    assert_eq!(s.fake.sandbox(&i.backend_ref).unwrap().state, "stopped");
    s.adapter.stop(&i).await.unwrap();
    let found = s.adapter.find(&i.sandbox_id).await.unwrap().unwrap();
    assert_eq!(found.state, InstanceState::Stopped);
    s.adapter.start(&i).await.unwrap();
    assert_eq!(s.fake.sandbox(&i.backend_ref).unwrap().state, "started");
    s.adapter.start(&i).await.unwrap();
    assert_eq!(
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
}

#[tokio::test]
async fn pause_only_where_declared() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    assert!(matches!(
        s.adapter.pause(&i).await.unwrap_err(),
        AdapterError::Unsupported(_)
    ));
    assert!(!s
        .adapter
        .capabilities()
        .contains(&differently_adapters::Capability::LifecyclePause));

    let s = setup(json!({"pause": true})).await;
    s.fake.knobs().vm = true;
    let i = running(&s).await;
    assert!(s
        .adapter
        .capabilities()
        .contains(&differently_adapters::Capability::LifecyclePause));
    s.adapter.pause(&i).await.unwrap();
    assert_eq!(s.fake.sandbox(&i.backend_ref).unwrap().state, "paused");
    s.adapter.pause(&i).await.unwrap();
    s.adapter.resume(&i).await.unwrap();
    assert_eq!(s.fake.sandbox(&i.backend_ref).unwrap().state, "started");
}

#[tokio::test]
async fn delete_during_a_change_is_retryable_and_a_missing_one_is_fine() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    s.fake.knobs().transition_polls = 1000;
    // Stop answers at once and keeps stopping; a delete now is a 409 (seen live).
    let stopping = s.adapter.stop(&i);
    let _ = tokio::time::timeout(Duration::from_millis(200), stopping).await;
    let e = s.adapter.delete(&i.sandbox_id).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    s.fake.set_state(&i.backend_ref, "stopped");
    s.fake.knobs().transition_polls = 1;
    s.adapter.delete(&i.sandbox_id).await.unwrap();
    // Delete answers while still deleting; the instance is gone for find and list.
    assert!(s.adapter.find(&i.sandbox_id).await.unwrap().is_none());
    s.adapter.delete(&i.sandbox_id).await.unwrap();
    assert!(s.fake.sandboxes().is_empty());
}

#[tokio::test]
async fn list_finds_every_instance_of_the_installation_across_pages() {
    let s = setup(json!({})).await;
    s.fake.knobs().page_size = 1;
    let mine = InstallationId::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            s.adapter
                .create(&create_req(&mine))
                .await
                .unwrap()
                .sandbox_id,
        );
    }
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    s.fake.insert("someone-elses", BTreeMap::new());
    let listed = s.adapter.list(&mine).await.unwrap();
    let mut got: Vec<_> = listed.iter().map(|i| i.sandbox_id.clone()).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
}

#[tokio::test]
async fn snapshots_are_asynchronous_restore_by_name_and_delete_by_id() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let first = s.adapter.snapshot(&i, "snp_01TEST").await.unwrap();
    assert!(!first.ready);
    let mut info = first.clone();
    for _ in 0..10 {
        if info.ready {
            break;
        }
        info = s.adapter.snapshot(&i, "snp_01TEST").await.unwrap();
    }
    assert!(info.ready, "active after a few polls");
    assert_eq!(info.backend_ref, first.backend_ref);
    assert_eq!(
        s.fake.snapshots().len(),
        1,
        "asking again never takes a second one"
    );

    let mut req = create_req(&InstallationId::new());
    req.from_snapshot = Some(info.backend_ref.clone());
    s.adapter.create(&req).await.unwrap();
    let b = s.fake.record().create_bodies.last().cloned().unwrap();
    assert_eq!(b["snapshot"], info.backend_ref.as_str());
    assert!(b.get("cpu").is_none());

    s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
    assert!(s.fake.snapshots().is_empty());
    s.adapter.delete_snapshot(&info.backend_ref).await.unwrap();
}

#[tokio::test]
async fn ports_are_signed_urls_that_open_without_a_header() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let e = s
        .adapter
        .expose_port(&i, 8080, Some(Duration::from_secs(120)))
        .await
        .unwrap();
    let left = e.expires_at.unwrap() - chrono::Utc::now();
    assert!((110..=121).contains(&left.num_seconds()), "{left}");
    let page = reqwest::get(&e.url).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("8080-"));
    let d = s.adapter.expose_port(&i, 3000, None).await.unwrap();
    assert!(d.url.contains("/3000-"));
    let rec = s.fake.record();
    assert_eq!(rec.preview_expiries, [120, 3600]);
    assert_eq!(
        rec.auth_on_preview, 0,
        "the key never reaches a preview URL"
    );
}

#[tokio::test]
async fn capabilities_are_honest_and_the_rest_unsupported() {
    let s = setup(json!({})).await;
    assert_eq!(
        s.adapter.capabilities(),
        [
            "exec",
            "files",
            "exec.stream",
            "lifecycle.stop",
            "snapshots",
            "ports.expose"
        ]
    );
    let i = running(&s).await;
    let (_in_tx, in_rx) = tokio::sync::mpsc::channel(1);
    let (out_tx, _out_rx) = tokio::sync::mpsc::channel(1);
    let pty = differently_adapters::PtyRequest {
        command: vec!["bash".into()],
        env: BTreeMap::new(),
        cwd: None,
        size: differently_adapters::PtySize { cols: 80, rows: 24 },
    };
    assert!(matches!(
        s.adapter.pty(&i, &pty, in_rx, out_tx).await.unwrap_err(),
        AdapterError::Unsupported(_)
    ));
    let s = setup(json!({"egress": "none"})).await;
    assert!(s
        .adapter
        .capabilities()
        .contains(&differently_adapters::Capability::NetworkEgressControl));
    running(&s).await;
    assert_eq!(s.fake.record().create_bodies[0]["networkBlockAll"], true);
}

#[tokio::test]
async fn the_registry_builds_daytona_pools_and_names_bad_settings() {
    let fake = FakeDaytona::start(KEY).await;
    let key = crate::key_file(KEY);
    let a = differently_adapters::registry::build("daytona", &settings(&fake, &key, json!({})))
        .unwrap();
    assert_eq!(a.kind(), "daytona");
    a.health().await.unwrap();
    for (bad, field) in [
        (json!({"apiURL": "ftp://x"}), "apiURL"),
        (
            json!({"timeouts": {"pollMillis": 0}}),
            "timeouts.pollMillis",
        ),
        (json!({"portURLSeconds": 5}), "portURLSeconds"),
        (json!({"apiKeyFile": "/nonexistent/key"}), "apiKeyFile"),
    ] {
        let e = differently_adapters::registry::build("daytona", &settings(&fake, &key, bad))
            .err()
            .unwrap();
        assert!(e.to_string().contains(field), "{e}");
    }
    let e = differently_adapters::registry::build(
        "daytona",
        &json!({"apiKeyEnv": "DIFFERENTLY_SURELY_UNSET"}),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("DIFFERENTLY_SURELY_UNSET"), "{e}");
    assert_eq!(
        differently_adapters::registry::resolve_trust("daytona", None),
        Ok(differently_core::pool::Trust::External)
    );
}
