//! What is Runloop's own, against the fake: the create body (metadata, sizing on Runloop's
//! grid, one source), the lookups without a metadata filter, races, failures, the output
//! tails' reconnection, files the API has no call for, suspend and resume, snapshots,
//! tunnels, auth and limits. The contract itself is the conformance kit's (`conformance.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use differently_adapters::{Adapter, AdapterError, InstanceState, PathProblem};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use serde_json::json;

use crate::support::cases::{self, one_chunk as body, read_all};
use crate::{cmd, create_req, running, settings, setup, KEY};

#[tokio::test]
async fn create_tags_sizes_and_is_idempotent() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let first = s.adapter.create(&req).await.unwrap();
    assert_eq!(first.state, InstanceState::Running);
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(again.backend_ref, first.backend_ref);
    let bodies = s.fake.record().create_bodies.clone();
    assert_eq!(bodies.len(), 1, "a redelivered create finds the first");
    let b = &bodies[0];
    assert_eq!(
        b["metadata"]["differently-sandbox-id"],
        req.sandbox_id.as_str()
    );
    assert_eq!(
        b["metadata"]["differently-installation-id"],
        req.installation_id.as_str()
    );
    assert_eq!(b["name"], req.sandbox_id.as_str());
    assert_eq!(b["environment_variables"]["SANDBOX_VAR"], "from-create");
    // 2 CPUs, 4 GiB, 10 GiB: already on the grid; the longest keep-alive.
    let lp = &b["launch_parameters"];
    assert_eq!(lp["resource_size_request"], "CUSTOM_SIZE");
    assert_eq!(
        (
            lp["custom_cpu_cores"].clone(),
            lp["custom_gb_memory"].clone(),
            lp["custom_disk_size"].clone()
        ),
        (json!(2), json!(4), json!(10))
    );
    assert_eq!(lp["keep_alive_time_seconds"], 172_800);
    for source in ["blueprint_id", "blueprint_name", "snapshot_id"] {
        assert!(b.get(source).is_none(), "{source} in {b}");
    }
    let found = s.adapter.find(&req.sandbox_id).await.unwrap().unwrap();
    assert_eq!(found.backend_ref, first.backend_ref);
}

#[tokio::test]
async fn a_template_is_a_blueprint_by_id_or_name_and_a_size_setting_wins() {
    let s = setup(json!({"blueprint": "base-image", "resourceSize": "medium"})).await;
    let mut req = create_req(&InstallationId::new());
    s.adapter.create(&req).await.unwrap();
    req.sandbox_id = SandboxId::new();
    req.template = Some("bpt_123abc".into());
    s.adapter.create(&req).await.unwrap();
    let bodies = s.fake.record().create_bodies.clone();
    assert_eq!(bodies[0]["blueprint_name"], "base-image");
    assert_eq!(bodies[1]["blueprint_id"], "bpt_123abc");
    assert!(bodies[1].get("blueprint_name").is_none());
    for b in &bodies {
        assert_eq!(b["launch_parameters"]["resource_size_request"], "MEDIUM");
        assert!(b["launch_parameters"].get("custom_cpu_cores").is_none());
    }
}

#[tokio::test]
async fn resources_off_the_grid_are_refused_before_any_call() {
    let s = setup(json!({})).await;
    let mut req = create_req(&InstallationId::new());
    req.resources.cpu = 32;
    let e = s.adapter.create(&req).await.unwrap_err();
    assert_eq!(cases::field_of(&e), Some("resources"), "{e:?}");
    assert!(s.fake.record().create_bodies.is_empty());
}

#[tokio::test]
async fn racing_creates_keep_the_older_devbox_and_shut_the_newer_down() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    // Another create of the same sandbox got there first.
    let older = s.fake.insert(
        BTreeMap::from([
            (
                "differently-sandbox-id".to_owned(),
                req.sandbox_id.as_str().to_owned(),
            ),
            (
                "differently-installation-id".to_owned(),
                req.installation_id.as_str().to_owned(),
            ),
        ]),
        1000,
    );
    let (a, b) = tokio::join!(s.adapter.create(&req), s.adapter.create(&req));
    assert_eq!(a.unwrap().backend_ref, older);
    assert_eq!(b.unwrap().backend_ref, older);
    let live: Vec<String> = s.fake.live().into_iter().map(|d| d.id).collect();
    assert_eq!(live, [older]);

    // Two creates with nothing there yet: both create, one devbox stays.
    let req = create_req(&InstallationId::new());
    let (a, b) = tokio::join!(s.adapter.create(&req), s.adapter.create(&req));
    assert_eq!(a.unwrap().backend_ref, b.unwrap().backend_ref);
    let mine = s
        .fake
        .live()
        .into_iter()
        .filter(|d| {
            d.metadata.get("differently-sandbox-id").map(String::as_str)
                == Some(req.sandbox_id.as_str())
        })
        .count();
    assert_eq!(mine, 1);
}

#[tokio::test]
async fn a_failed_boot_is_permanent_and_its_devbox_can_be_deleted() {
    let s = setup(json!({})).await;
    s.fake.knobs().boot_failure = Some("health_check_failed".into());
    let req = create_req(&InstallationId::new());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("health_check_failed")),
        "{e:?}"
    );
    let found = s.adapter.find(&req.sandbox_id).await.unwrap().unwrap();
    assert_eq!(found.state, InstanceState::Failed);
    s.adapter.delete(&req.sandbox_id).await.unwrap();
    assert_eq!(s.adapter.find(&req.sandbox_id).await.unwrap(), None);
}

#[tokio::test]
async fn lookups_page_through_each_live_status_and_skip_shut_down_devboxes() {
    let s = setup(json!({})).await;
    s.fake.knobs().page_cap = 2;
    let installation = InstallationId::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        let i = s.adapter.create(&create_req(&installation)).await.unwrap();
        ids.push(i.sandbox_id);
    }
    // An orphan of another installation, and a shut-down devbox of ours.
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    s.adapter.delete(&ids[0]).await.unwrap();
    let listed = s.adapter.list(&installation).await.unwrap();
    let mut got: Vec<&SandboxId> = listed.iter().map(|i| &i.sandbox_id).collect();
    got.sort();
    let mut want: Vec<&SandboxId> = ids[1..].iter().collect();
    want.sort();
    assert_eq!(got, want);
    let record = s.fake.record();
    let queries: Vec<&String> = record
        .requests
        .iter()
        .filter(|r| r.starts_with("GET /v1/devboxes?"))
        .collect();
    assert!(
        queries.iter().any(|q| q.contains("starting_after=")),
        "paged: {queries:?}"
    );
    assert!(
        !queries.iter().any(|q| q.contains("status=shutdown")),
        "never lists the shut-down history"
    );
}

#[tokio::test]
async fn delete_is_a_shutdown_and_waits_out_a_snapshot_in_progress() {
    let s = setup(json!({})).await;
    s.fake.knobs().snapshot_ms = 400;
    let r = running(&s).await;
    let snap = s.adapter.snapshot(&r, "snp_inflight").await.unwrap();
    assert!(!snap.ready);
    let e = s.adapter.delete(&r.sandbox_id).await.unwrap_err();
    assert!(e.is_retryable(), "a 409 during a snapshot settles: {e:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    s.adapter.delete(&r.sandbox_id).await.unwrap();
    s.adapter.delete(&r.sandbox_id).await.unwrap();
    let d = s.fake.devbox(&r.backend_ref).unwrap();
    assert_eq!(d.status, "shutdown", "Runloop keeps shut-down devboxes");
    assert!(matches!(
        s.adapter.exec(&r, &cmd(&["true"])).await,
        Err(AdapterError::NotFound)
    ));
}

#[tokio::test]
async fn exec_runs_with_env_cwd_stdin_and_its_deadline() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    cases::exec_sees_env_and_cwd(&s.adapter, &r, 3).await;
    cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &r).await;
    let mut req = cmd(&["cat"]);
    req.stdin_base64 = Some("AAEC/w==".into());
    let res = s.adapter.exec(&r, &req).await.unwrap();
    // 0x00 0x01 0x02 arrive; 0xff is not UTF-8 and comes back replaced, as declared.
    assert_eq!(res.stdout.as_bytes(), "\u{0}\u{1}\u{2}\u{fffd}".as_bytes());
    let mut bad = cmd(&["true"]);
    bad.env.insert("A;B".into(), "x".into());
    let e = s.adapter.exec(&r, &bad).await.unwrap_err();
    assert_eq!(cases::field_of(&e), Some("env"));
    let cmds = s.fake.record().commands.clone();
    assert!(
        !cmds.iter().any(|c| c.contains("A;B")),
        "refused before sending"
    );
}

#[tokio::test]
async fn a_stalled_reader_ends_at_the_deadline_and_the_command_is_killed() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let fake = s.fake.clone();
    cases::a_stalled_reader_does_not_outlast_the_deadline(&s.adapter, &r, move || {
        fake.executions_running()
    })
    .await;
    assert!(s.fake.record().kills >= 1);
}

#[tokio::test]
async fn output_tails_reconnect_where_the_server_ends_them() {
    let s = setup(json!({})).await;
    s.fake.knobs().stream_hold_ms = Some(60);
    let r = running(&s).await;
    let script = "for i in 1 2 3 4 5 6; do echo line$i; echo err$i >&2; sleep 0.05; done";
    let res = s
        .adapter
        .exec(&r, &cmd(&["bash", "-c", script]))
        .await
        .unwrap();
    let want: String = (1..=6).map(|i| format!("line{i}\n")).collect();
    assert_eq!(res.stdout, want);
    let want: String = (1..=6).map(|i| format!("err{i}\n")).collect();
    assert_eq!(res.stderr, want);
    assert!(
        s.fake.record().stream_timeouts >= 2,
        "the holds ended mid-command"
    );
}

#[tokio::test]
async fn files_the_api_has_no_call_for_are_scripts() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    cases::files_round_trip(&s.adapter, &r, &d).await;
    let file = format!("{d}/plain");
    s.adapter.upload(&r, &file, None, body(b"x")).await.unwrap();
    let e = s
        .adapter
        .upload(&r, &format!("{file}/under"), None, body(b"y"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::NotADirectory),
        "{e:?}"
    );
    let e = s
        .adapter
        .upload(&r, &d, None, body(b"y"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    let e = s.adapter.download(&r, &d, None).await.err().unwrap();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    let got = read_all(s.adapter.download(&r, &file, None).await.unwrap().body).await;
    assert_eq!(got, b"x");
    std::fs::create_dir(format!("{d}/full")).unwrap();
    std::fs::write(format!("{d}/full/a"), "a").unwrap();
    let e = s
        .adapter
        .delete_file(&r, &format!("{d}/full"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
        "{e:?}"
    );
    let listed = s.adapter.list_files(&r, &d, 2).await.unwrap();
    assert!(
        listed.iter().any(|e| e.path == format!("{d}/full/a")),
        "{listed:?}"
    );
    assert!(matches!(
        s.adapter.list_files(&r, &format!("{d}/nope"), 1).await,
        Err(AdapterError::PathNotFound(_))
    ));
    // A missing file reads as such; a shut-down devbox as the instance gone.
    s.adapter.delete(&r.sandbox_id).await.unwrap();
    assert!(matches!(
        s.adapter.download(&r, &file, None).await.err(),
        Some(AdapterError::NotFound)
    ));
}

#[tokio::test]
async fn stop_suspends_and_start_resumes_each_idempotent() {
    let s = setup(json!({})).await;
    let r = running(&s).await;
    s.adapter.stop(&r).await.unwrap();
    s.adapter.stop(&r).await.unwrap();
    assert_eq!(s.fake.devbox(&r.backend_ref).unwrap().status, "suspended");
    assert_eq!(
        s.adapter.find(&r.sandbox_id).await.unwrap().unwrap().state,
        InstanceState::Stopped
    );
    let again = s.adapter.create(&create_req_of(&r)).await.unwrap();
    assert_eq!(
        again.state,
        InstanceState::Stopped,
        "a redelivered create does not resume"
    );
    s.adapter.start(&r).await.unwrap();
    s.adapter.start(&r).await.unwrap();
    assert_eq!(s.fake.devbox(&r.backend_ref).unwrap().status, "running");
    let transitions: Vec<String> = s
        .fake
        .record()
        .requests
        .iter()
        .filter(|q| q.contains("/suspend?") || q.contains("/resume?"))
        .cloned()
        .collect();
    assert_eq!(
        transitions.len(),
        2,
        "one suspend, one resume: {transitions:?}"
    );
}

fn create_req_of(r: &differently_adapters::InstanceRef) -> differently_adapters::CreateInstance {
    let mut req = create_req(&InstallationId::new());
    req.sandbox_id = r.sandbox_id.clone();
    req
}

#[tokio::test]
async fn snapshots_are_found_by_their_id_and_restore_from_the_snapshot_alone() {
    let s = setup(json!({"blueprint": "base-image"})).await;
    let r = running(&s).await;
    let first = s.adapter.snapshot(&r, "snp_one").await.unwrap();
    assert!(!first.ready);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let done = s.adapter.snapshot(&r, "snp_one").await.unwrap();
    assert_eq!(
        (done.backend_ref.as_str(), done.ready),
        (first.backend_ref.as_str(), true)
    );
    assert_eq!(s.fake.snapshots().len(), 1, "taken once");
    let snap = &s.fake.snapshots()[0];
    assert_eq!(snap.metadata["differently-snapshot-id"], "snp_one");
    let mut req = create_req(&InstallationId::new());
    req.from_snapshot = Some(done.backend_ref.clone());
    s.adapter.create(&req).await.unwrap();
    let bodies = s.fake.record().create_bodies.clone();
    let last = bodies.last().unwrap();
    assert_eq!(last["snapshot_id"], done.backend_ref.as_str());
    assert!(
        last.get("blueprint_name").is_none(),
        "one source only: {last}"
    );
    s.adapter.delete_snapshot(&done.backend_ref).await.unwrap();
    s.adapter.delete_snapshot(&done.backend_ref).await.unwrap();
}

#[tokio::test]
async fn a_port_is_served_by_one_open_tunnel() {
    let s = setup(json!({"tunnelDomain": "tunnel.example.test"})).await;
    let r = running(&s).await;
    let a = s.adapter.expose_port(&r, 8080, None).await.unwrap();
    let b = s.adapter.expose_port(&r, 3000, None).await.unwrap();
    let key = s.fake.devbox(&r.backend_ref).unwrap().tunnel.unwrap()["tunnel_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(a.url, format!("https://8080-{key}.tunnel.example.test"));
    assert_eq!(b.url, format!("https://3000-{key}.tunnel.example.test"));
    let enables = s
        .fake
        .record()
        .requests
        .iter()
        .filter(|q| q.contains("/enable_tunnel"))
        .count();
    assert_eq!(enables, 1);
}

#[tokio::test]
async fn a_refused_key_is_permanent_and_never_shown_and_a_rotated_one_is_read() {
    let s = setup(json!({})).await;
    s.fake.set_key("ak_other");
    let e = s.adapter.health().await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    assert!(
        text.contains("apiKeyEnv, apiKeyFile or apiKeySecret"),
        "{text}"
    );
    assert!(!text.contains(KEY));
    std::fs::write(s.key.path(), "ak_other\n").unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    s.adapter.health().await.unwrap();
}

#[tokio::test]
async fn the_accounts_limit_is_capacity_with_the_servers_wait() {
    let s = setup(json!({})).await;
    s.fake
        .knobs()
        .fail_next
        .push_back(("/v1/devboxes".into(), 429));
    let e = s.adapter.health().await.unwrap_err();
    assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
    s.fake.knobs().max_devboxes = Some(1);
    running(&s).await;
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Capacity(_)), "{e:?}");
}

#[tokio::test]
async fn settings_are_checked_naming_the_field_and_the_pool_is_external() {
    use differently_adapters::registry;
    let fake = crate::fake::FakeRunloop::start(KEY).await;
    let key = crate::key_file(KEY);
    let ok = settings(&fake, &key, json!({}));
    assert!(registry::build("runloop", &ok).is_ok());
    for (extra, field) in [
        (json!({"resourceSize": "HUGE"}), "resourceSize"),
        (json!({"keepAliveSeconds": 10}), "keepAliveSeconds"),
        (json!({"architecture": "sparc"}), "architecture"),
        (json!({"apiURL": "https://u:p@api.runloop.ai"}), "apiURL"),
        (json!({"nope": 1}), "nope"),
    ] {
        let (got, message) = cases::build_err("runloop", crate::support::merged(ok.clone(), extra));
        assert_eq!(got.as_deref(), Some(field), "{message}");
    }
    assert_eq!(
        registry::trust_rule("runloop"),
        differently_core::pool::TrustRule::ForcedExternal
    );
    assert!(
        registry::resolve_trust("runloop", Some(differently_core::pool::Trust::Private)).is_err()
    );
}
