//! Every adapter method against the fake Vercel API, with its error cases.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use differently_adapters::registry::{self, AdapterConfigError};
use differently_adapters::vercel::{
    sandbox_name, VercelAdapter, VercelConfig, TAG_INSTALLATION, TAG_SANDBOX,
};
use differently_adapters::{Adapter, AdapterError, ByteRange, ExecEvent, FileKind, InstanceState};
use differently_core::ids::InstallationId;
use differently_core::pool::Trust;
use differently_core::SandboxId;
use serde_json::json;

use crate::fake_server::{FakeServer, PROJECT, TEAM};
use crate::support::cases::{
    self, a_stalled_reader_does_not_outlast_the_deadline, body, collect, field_of,
};
use crate::{at, cmd, create_req, running, settings, setup, token_file, TOKEN};

#[tokio::test]
async fn configuration_rules_name_the_field() {
    let fake = FakeServer::start(TOKEN).await;
    let token = token_file(TOKEN);
    let cases = [
        (json!({"teamId": null}), "teamId"),
        (json!({"projectId": ""}), "projectId"),
        (json!({"projectId": "a b"}), "projectId"),
        (json!({"apiURL": "vercel.com/api"}), "apiURL"),
        (json!({"ports": [0]}), "ports"),
        (json!({"ports": [1, 2, 3, 4, 5]}), "ports"),
        (json!({"maxTimeoutSeconds": 10}), "maxTimeoutSeconds"),
        (json!({"tokenFile": null}), "tokenEnv"),
        (json!({"tokenSecret": "vercel"}), "tokenSecret"),
        (
            json!({"timeouts": {"pollMillis": 0}}),
            "timeouts.pollMillis",
        ),
    ];
    for (extra, field) in cases {
        match registry::build("vercel", &settings(&fake, &token, extra.clone())) {
            Err(AdapterConfigError::InvalidSettings {
                kind,
                field: f,
                message,
            }) => {
                assert_eq!(kind, "vercel");
                assert_eq!(f.as_deref(), Some(field), "{extra}: {message}");
            }
            Err(e) => panic!("{extra}: unexpected {e}"),
            Ok(_) => panic!("accepted {extra}"),
        }
    }
    let a = registry::build("vercel", &settings(&fake, &token, json!({}))).unwrap();
    assert_eq!(a.kind(), "vercel");
    assert_eq!(registry::resolve_trust("vercel", None), Ok(Trust::External));
    assert!(registry::resolve_trust("vercel", Some(Trust::Private)).is_err());
}

#[tokio::test]
async fn capabilities_are_only_what_is_implemented() {
    let s = setup(json!({})).await;
    assert_eq!(
        s.adapter.capabilities(),
        ["exec", "files", "exec.stream", "lifecycle.stop"]
    );
    let eph = setup(json!({"persistent": false, "ports": [3000]})).await;
    assert_eq!(
        eph.adapter.capabilities(),
        ["exec", "files", "exec.stream", "ports.expose"]
    );
    let r = running(&s).await;
    for res in [
        s.adapter.pause(&r).await,
        s.adapter.resume(&r).await,
        s.adapter.snapshot(&r, "snp_1").await.map(drop),
        s.adapter.delete_snapshot("x").await,
        s.adapter.expose_port(&r, 3000, None).await.map(drop),
    ] {
        assert!(matches!(res, Err(AdapterError::Unsupported(_))), "{res:?}");
    }
    let r2 = running(&eph).await;
    assert!(matches!(
        eph.adapter.stop(&r2).await,
        Err(AdapterError::Unsupported(_))
    ));
    let mut req = create_req(&InstallationId::new());
    req.from_snapshot = Some("snap_1".into());
    assert!(matches!(
        s.adapter.create(&req).await,
        Err(AdapterError::Unsupported(_))
    ));
}

#[tokio::test]
async fn create_is_idempotent_by_name_and_tags_the_sandbox() {
    let s = setup(json!({"image": "node:24", "region": "iad1", "ports": [3000]})).await;
    s.fake.knobs().pending_polls = 3;
    let inst = InstallationId::new();
    let req = create_req(&inst);
    let a = s.adapter.create(&req).await.unwrap();
    let b = s.adapter.create(&req).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(a.backend_ref, sandbox_name(&req.sandbox_id));
    assert_eq!(s.fake.sandboxes().len(), 1);
    assert_eq!(
        s.fake.record().create_bodies.len(),
        1,
        "the second create found the name"
    );
    let body = s.fake.record().create_bodies[0].clone();
    assert_eq!(body["projectId"], PROJECT);
    assert_eq!(body["image"], "node:24");
    assert_eq!(body["region"], "iad1");
    assert_eq!(body["timeout"], 900_000, "TTL plus a margin, in ms");
    assert_eq!(body["resources"]["vcpus"], 2);
    assert_eq!(body["persistent"], true);
    assert_eq!(body["ports"], json!([3000]));
    assert_eq!(body["env"]["SANDBOX_VAR"], "from-create");
    assert_eq!(body["tags"][TAG_SANDBOX], req.sandbox_id.as_str());
    assert_eq!(body["tags"][TAG_INSTALLATION], inst.as_str());
    assert_eq!(
        s.fake.record().missing_team,
        0,
        "every request names the team"
    );
    let found = s.adapter.find(&req.sandbox_id).await.unwrap().unwrap();
    assert_eq!(
        (found.backend_ref, found.state),
        (a.backend_ref.clone(), InstanceState::Running)
    );
    assert_eq!(s.adapter.find(&SandboxId::new()).await.unwrap(), None);
    // A name taken between find and create (another worker's attempt) is adopted.
    let req2 = create_req(&inst);
    s.fake.insert(
        &sandbox_name(&req2.sandbox_id),
        BTreeMap::from([(TAG_SANDBOX.to_owned(), req2.sandbox_id.as_str().to_owned())]),
        "running",
    );
    let adopted = s.adapter.create(&req2).await.unwrap();
    assert_eq!(adopted.backend_ref, sandbox_name(&req2.sandbox_id));
    // A failed earlier attempt is replaced.
    let req3 = create_req(&inst);
    s.fake
        .insert(&sandbox_name(&req3.sandbox_id), BTreeMap::new(), "failed");
    s.adapter.create(&req3).await.unwrap();
    assert_eq!(
        s.fake
            .sandbox(&sandbox_name(&req3.sandbox_id))
            .unwrap()
            .status,
        "running"
    );
}

#[tokio::test]
async fn list_reads_every_page_and_delete_tolerates_none() {
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
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    let orphan = SandboxId::new();
    s.fake.insert(
        &sandbox_name(&orphan),
        BTreeMap::from([
            (TAG_SANDBOX.to_owned(), orphan.as_str().to_owned()),
            (TAG_INSTALLATION.to_owned(), inst.as_str().to_owned()),
        ]),
        "stopped",
    );
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
    assert_eq!(
        listed
            .iter()
            .find(|i| i.sandbox_id == orphan)
            .unwrap()
            .state,
        InstanceState::Stopped
    );
    for id in &ids {
        s.adapter.delete(id).await.unwrap();
        s.adapter.delete(id).await.unwrap();
    }
    assert_eq!(s.fake.sandboxes().len(), 1);
}

#[tokio::test]
async fn errors_map_to_kinds_and_never_quote_the_token() {
    let s = setup(json!({})).await;
    s.fake.knobs().max_running = 1;
    running(&s).await;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("insufficient capacity"),
        "{e}"
    );
    // The plan limit is a capacity error carrying Vercel's `Retry-After: 10`.
    assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
    assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(10)));
    s.fake.knobs().max_running = 100;
    // A refused token: permanent, clear, without the token.
    s.fake.set_token("vcp_rotated_token_0000");
    let e = s.adapter.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(text.contains("refused the access token"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
    // Rotated: the next call reads the file again.
    std::fs::write(s.key.path(), "vcp_rotated_token_0000\n").unwrap();
    s.adapter.health().await.unwrap();
    // A TTL past the plan: refused before asking, or by Vercel's 400.
    let mut req = create_req(&InstallationId::new());
    req.ttl_seconds = 4000;
    assert_eq!(
        field_of(&s.adapter.create(&req).await.unwrap_err()),
        Some("ttlSeconds")
    );
    let big = setup(json!({"maxTimeoutSeconds": 18000})).await;
    assert_eq!(
        field_of(&big.adapter.create(&req).await.unwrap_err()),
        Some("ttlSeconds")
    );
    // 5xx: idempotent reads retried, a failed create transient.
    s.fake
        .knobs()
        .fail_next
        .push_back(("GET /v2/sandboxes/".into(), 503));
    assert_eq!(s.adapter.find(&SandboxId::new()).await.unwrap(), None);
    s.fake
        .knobs()
        .fail_next
        .push_back(("POST /v3/sandboxes".into(), 500));
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Transient(_)), "{e:?}");
    // Slow and unreachable.
    let slow = setup(json!({"timeouts": {"requestSeconds": 1}})).await;
    slow.fake.knobs().delay_ms = 2500;
    assert!(slow.adapter.health().await.unwrap_err().is_retryable());
    let token = token_file(TOKEN);
    let gone = VercelAdapter::new(
        serde_json::from_value::<VercelConfig>(json!({
            "apiURL": "http://127.0.0.1:9/api", "teamId": TEAM, "projectId": PROJECT,
            "tokenFile": token.path(),
        }))
        .unwrap(),
    )
    .unwrap();
    assert!(matches!(
        gone.health().await,
        Err(AdapterError::Unavailable(_))
    ));
}

#[tokio::test]
async fn exec_runs_argv_with_env_cwd_stdin_and_exit_codes() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    cases::exec_sees_env_and_cwd(&s.adapter, &r, 5).await;
    let body = s.fake.record().cmd_bodies[0].clone();
    assert_eq!(
        (
            body["command"].clone(),
            body["wait"].clone(),
            body["sudo"].clone()
        ),
        (json!("bash"), json!(true), json!(false))
    );
    let res = s
        .adapter
        .exec(&r, &cmd(&["echo", "a  b", "$HOME"]))
        .await
        .unwrap();
    assert_eq!(res.stdout, "a  b $HOME\n");
    let res = s
        .adapter
        .exec(&r, &cmd(&["bash", "-c", "kill -KILL $$"]))
        .await
        .unwrap();
    assert_eq!(res.exit_code, 137);
    let mut bad = cmd(&["pwd"]);
    bad.cwd = Some("/nonexistent/dir".into());
    assert_eq!(
        field_of(&s.adapter.exec(&r, &bad).await.unwrap_err()),
        Some("cwd")
    );
    // Stdin goes through a file the shell opens and removes.
    let mut req = cmd(&["cat"]);
    req.stdin = Some("hello stdin".into());
    let res = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!((res.exit_code, res.stdout.as_str()), (0, "hello stdin"));
    let stdin_file = s
        .fake
        .record()
        .cmd_bodies
        .iter()
        .rev()
        .find_map(|b| {
            b["args"]
                .as_array()?
                .iter()
                .filter_map(|a| a.as_str())
                .find(|a| a.starts_with("/tmp/.differently-stdin-"))
                .map(str::to_owned)
        })
        .expect("the command read a stdin file");
    assert!(
        !std::path::Path::new(&stdin_file).exists(),
        "the stdin file is removed"
    );
    let mut req = cmd(&["wc", "-c"]);
    req.stdin_base64 = Some("AAEC/w==".into());
    assert_eq!(s.adapter.exec(&r, &req).await.unwrap().stdout.trim(), "4");
}

#[tokio::test]
async fn timeouts_cancellation_and_broken_streams() {
    let s = setup(json!({"timeouts": {"streamIdleSeconds": 1, "pollMillis": 20}})).await;
    let r = running(&s).await;
    let mut req = cmd(&["sleep", "30"]);
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    assert_eq!(s.adapter.exec(&r, &req).await.unwrap().exit_code, 124);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(s.fake.record().kills >= 1);

    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = cmd(&["bash", "-c", "while true; do echo tick; sleep 0.02; done"]);
    let run = s.adapter.exec_stream(&r, &req, tx);
    let stop = async {
        match rx.recv().await {
            Some(ExecEvent::Stdout(b)) => assert!(b.starts_with(b"tick")),
            other => panic!("{other:?}"),
        }
        drop(rx);
    };
    let (exit, ()) = tokio::join!(run, stop);
    assert_eq!(exit.unwrap().exit_code, 137);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.fake.running_commands(), 0);

    s.fake.knobs().truncate_after_lines = Some(2);
    cases::a_truncated_stream_is_transient(&s.adapter, &r).await;
    s.fake.knobs().truncate_after_lines = None;
    s.fake.knobs().stall_ms = 3000;
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
}

#[tokio::test]
async fn a_session_vercel_stopped_is_started_again_and_a_gone_sandbox_is_not_found() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let first = s.fake.sandbox(&r.backend_ref).unwrap().session;
    s.adapter.exec(&r, &cmd(&["true"])).await.unwrap();
    s.fake.stop_session(&r.backend_ref);
    assert_eq!(
        s.adapter.exec(&r, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    assert_ne!(s.fake.sandbox(&r.backend_ref).unwrap().session, first);
    s.fake.remove(&r.backend_ref);
    s.fake.stop_session(&r.backend_ref);
    let fresh =
        VercelAdapter::new(serde_json::from_value(settings(&s.fake, &s.key, json!({}))).unwrap())
            .unwrap();
    assert_eq!(
        fresh.exec(&r, &cmd(&["true"])).await.unwrap_err(),
        AdapterError::NotFound
    );
}

#[tokio::test]
async fn files_round_trip_through_tar_with_modes_ranges_and_listing() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().display().to_string();
    let path = format!("{base}/sub/hello.txt");
    s.adapter
        .upload(&r, &path, Some(0o750), body(&[b"hello ", b"world"]))
        .await
        .unwrap();
    let d = s.adapter.download(&r, &path, None).await.unwrap();
    assert_eq!(d.total_size, Some(11));
    assert_eq!(collect(d).await, b"hello world");
    let d = s
        .adapter
        .download(
            &r,
            &path,
            Some(ByteRange {
                start: 2,
                end: Some(6),
            }),
        )
        .await
        .unwrap();
    assert_eq!(collect(d).await, b"llo w");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let big_path = format!("{base}/big.bin");
    s.adapter
        .upload(
            &r,
            &big_path,
            None,
            differently_adapters::vercel::body_of(big.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        collect(s.adapter.download(&r, &big_path, None).await.unwrap()).await,
        big
    );

    let listed = s.adapter.list_files(&r, &base, 2).await.unwrap();
    let f = listed.iter().find(|e| e.path == path).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (FileKind::File, 11, 0o750));
    assert!(f.modified_at.is_some());
    assert_eq!(
        listed
            .iter()
            .find(|e| e.path.ends_with("/sub"))
            .unwrap()
            .kind,
        FileKind::Dir
    );
    assert_eq!(s.adapter.list_files(&r, &base, 1).await.unwrap().len(), 2);
    let e = s
        .adapter
        .list_files(&r, &format!("{base}/nope"), 1)
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::PathNotFound(_)), "{e:?}");
    assert_eq!(
        field_of(&s.adapter.list_files(&r, &path, 1).await.unwrap_err()),
        Some("path")
    );

    let e = s
        .adapter
        .delete_file(&r, &format!("{base}/sub"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
        "{e:?}"
    );
    s.adapter.delete_file(&r, &path).await.unwrap();
    s.adapter
        .delete_file(&r, &format!("{base}/sub"))
        .await
        .unwrap();
    assert!(matches!(
        s.adapter.delete_file(&r, &path).await,
        Err(AdapterError::PathNotFound(_))
    ));
    assert!(matches!(
        s.adapter.download(&r, &path, None).await.err(),
        Some(AdapterError::PathNotFound(_))
    ));
    assert_eq!(
        field_of(&s.adapter.download(&r, &base, None).await.err().unwrap()),
        Some("path")
    );
    assert_eq!(
        field_of(&s.adapter.download(&r, "rel", None).await.err().unwrap()),
        Some("path")
    );
}

#[tokio::test]
async fn stop_and_start_are_idempotent_and_keep_the_name() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let r = at(&s.adapter.create(&req).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    s.adapter.stop(&r).await.unwrap();
    s.adapter.stop(&r).await.unwrap();
    assert_eq!(
        s.adapter
            .find(&req.sandbox_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        InstanceState::Stopped
    );
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("stopped")),
        "{e:?}"
    );
    s.fake.knobs().pending_polls = 2;
    s.adapter.start(&r).await.unwrap();
    s.adapter.start(&r).await.unwrap();
    assert_eq!(
        s.adapter
            .find(&req.sandbox_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        InstanceState::Running
    );
    let out = s
        .adapter
        .exec(&r, &cmd(&["ls", &dir.path().display().to_string()]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
}

#[tokio::test]
async fn ports_come_from_routes_and_renew_extends_the_session() {
    let s = setup(json!({"ports": [3000]})).await;
    let r = running(&s).await;
    let ep = s.adapter.expose_port(&r, 3000, None).await.unwrap();
    assert!(
        ep.url.starts_with("https://") && ep.url.ends_with(".vercel.run"),
        "{}",
        ep.url
    );
    assert_eq!(ep.expires_at, None);
    assert!(!ep.url.contains(TOKEN));
    assert_eq!(
        field_of(&s.adapter.expose_port(&r, 8080, None).await.unwrap_err()),
        Some("port")
    );
    let session = s.fake.sandbox(&r.backend_ref).unwrap().session;
    let before = s.fake.session(&session).unwrap().timeout;
    s.adapter
        .renew(&r, Duration::from_secs(1800))
        .await
        .unwrap();
    let after = s.fake.session(&session).unwrap().timeout;
    assert!(after > before && after >= 2_000_000, "{before} -> {after}");
    // Already long enough: nothing to extend.
    let n = s.fake.record().extends.len();
    s.adapter.renew(&r, Duration::from_secs(60)).await.unwrap();
    assert_eq!(s.fake.record().extends.len(), n);
    assert_eq!(
        field_of(
            &s.adapter
                .renew(&r, Duration::from_secs(9000))
                .await
                .unwrap_err()
        ),
        Some("ttlSeconds")
    );
    s.adapter.health().await.unwrap();
}

#[tokio::test]
async fn a_reader_that_stops_reading_does_not_outlast_the_deadline() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    a_stalled_reader_does_not_outlast_the_deadline(&s.adapter, &r, || s.fake.running_commands())
        .await;
}
