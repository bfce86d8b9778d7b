//! Every adapter method against the fake Freestyle, including its error cases.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use differently_adapters::{Adapter, AdapterError, ByteRange, FileKind, InstanceState};
use differently_core::ids::InstallationId;
use serde_json::json;

use crate::fake_server::FakeFreestyle;
use crate::support::cases::{self, one_chunk as body, read_all};
use crate::{cmd, create_req, running, settings, setup, KEY};

#[tokio::test]
async fn create_is_idempotent_by_slug_and_writes_the_env_file() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let first = s.adapter.create(&req).await.unwrap();
    assert_eq!(first.state, InstanceState::Running);
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(again.backend_ref, first.backend_ref);
    assert_eq!(s.fake.vms().len(), 1);
    let b = s.fake.record().create_bodies[0].clone();
    assert_eq!(s.fake.record().create_bodies.len(), 1);
    assert_eq!(
        b["slug"],
        req.sandbox_id
            .as_str()
            .to_ascii_lowercase()
            .replace('_', "-")
    );
    assert_eq!(
        b["metadata"]["differently-sandbox-id"],
        req.sandbox_id.as_str()
    );
    assert_eq!(
        b["metadata"]["differently-installation-id"],
        req.installation_id.as_str()
    );
    assert_eq!(
        b["automaticRestart"], false,
        "a powered-off VM must stay off"
    );
    assert_eq!(b["firewall"], json!({"rules": []}));
    assert_eq!(b["snapshotId"], "freestyle/ubuntu");
    // The env file: mode sent as the decimal the API reads (0o644 = 420).
    let env = s.etc.path().join("differently.env");
    assert_eq!(
        std::fs::metadata(&env).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert!(s.fake.record().write_modes.contains(&"420".to_owned()));
    let found = s.adapter.find(&req.sandbox_id).await.unwrap().unwrap();
    assert_eq!(found.backend_ref, first.backend_ref);
}

#[tokio::test]
async fn concurrent_creates_make_one_vm_and_a_foreign_slug_is_not_adopted() {
    let s = setup(json!({})).await;
    let req = create_req(&InstallationId::new());
    let (a, b) = tokio::join!(s.adapter.create(&req), s.adapter.create(&req));
    assert_eq!(a.unwrap().backend_ref, b.unwrap().backend_ref);
    assert_eq!(s.fake.vms().len(), 1);

    let other = create_req(&InstallationId::new());
    let slug = other
        .sandbox_id
        .as_str()
        .to_ascii_lowercase()
        .replace('_', "-");
    s.fake.insert(&slug, BTreeMap::new());
    let e = s.adapter.create(&other).await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("not ours"),
        "{e}"
    );
    assert!(s.adapter.find(&other.sandbox_id).await.unwrap().is_none());
}

#[tokio::test]
async fn templates_and_restores_name_the_snapshot() {
    let s = setup(
        json!({"snapshot": "freestyle/ubuntu-sm", "idleTimeoutSeconds": 600,
                          "firewallRules": [{"action": "allow", "domain": "pypi.org"}]}),
    )
    .await;
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    let mut req = create_req(&InstallationId::new());
    req.template = Some("sh-custom".into());
    s.adapter.create(&req).await.unwrap();
    let bodies = s.fake.record().create_bodies.clone();
    assert_eq!(bodies[0]["snapshotId"], "freestyle/ubuntu-sm");
    assert_eq!(bodies[0]["idleTimeoutSeconds"], 600);
    assert_eq!(bodies[0]["firewall"]["rules"][0]["domain"], "pypi.org");
    assert_eq!(bodies[1]["snapshotId"], "sh-custom");
}

#[tokio::test]
async fn exec_sources_the_env_then_request_env_wins_and_keeps_streams_apart() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut req = cmd(&[
        "sh",
        "-c",
        "printf '%s|%s|%s|%s|' \"$1\" \"$SANDBOX_VAR\" \"$SHADOWED\" \"$(pwd)\"; cat; echo oops >&2; exit 5",
        "-",
        "it's \"quoted\" $HOME",
    ]);
    req.env = BTreeMap::from([("SHADOWED".to_owned(), "request".to_owned())]);
    req.cwd = Some(dir.path().to_string_lossy().into_owned());
    req.stdin = Some("in".into());
    let r = s.adapter.exec(&i, &req).await.unwrap();
    assert_eq!(r.exit_code, 5);
    assert_eq!(
        r.stdout,
        format!(
            "it's \"quoted\" $HOME|from-create|request|{}|in",
            dir.path().display()
        )
    );
    assert_eq!(r.stderr, "oops\n");
    let b = s.fake.record().exec_bodies.last().cloned().unwrap();
    assert_eq!(b["stdin"], "aW4=", "stdin inline, base64");
    assert_eq!(b["timeoutMs"], 60_000);
}

#[tokio::test]
async fn exec_timeout_is_124_and_a_missing_cwd_names_the_field() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &i).await;
}

#[tokio::test]
async fn files_round_trip_with_decimal_modes_ranges_and_errors() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().into_owned();
    let file = format!("{root}/sub/a.txt");
    s.adapter
        .upload(&i, &file, Some(0o640), body(b"hello, freestyle"))
        .await
        .unwrap();
    let listed = s.adapter.list_files(&i, &root, 2).await.unwrap();
    let f = listed.iter().find(|e| e.path == file).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (FileKind::File, 16, 0o640));
    assert!(listed
        .iter()
        .any(|e| e.path == format!("{root}/sub") && e.kind == FileKind::Dir));
    assert_eq!(s.adapter.list_files(&i, &root, 1).await.unwrap().len(), 1);
    let d = s.adapter.download(&i, &file, None).await.unwrap();
    assert_eq!(d.total_size, Some(16));
    assert_eq!(read_all(d.body).await, b"hello, freestyle");
    let r = Some(ByteRange {
        start: 7,
        end: Some(10),
    });
    let d = s.adapter.download(&i, &file, r).await.unwrap();
    assert_eq!(d.total_size, Some(16), "from Content-Range");
    assert_eq!(read_all(d.body).await, b"free");
    s.fake.knobs().ignore_range = true;
    let d = s.adapter.download(&i, &file, r).await.unwrap();
    assert_eq!(
        read_all(d.body).await,
        b"free",
        "cut client-side when Range is ignored"
    );

    let missing = format!("{root}/nope");
    assert_eq!(
        s.adapter.download(&i, &missing, None).await.err().unwrap(),
        AdapterError::PathNotFound(missing.clone())
    );
    let e = s
        .adapter
        .delete_file(&i, &format!("{root}/sub"))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    s.adapter.delete_file(&i, &file).await.unwrap();
    assert_eq!(
        s.adapter.delete_file(&i, &file).await.unwrap_err(),
        AdapterError::PathNotFound(file.clone())
    );
}

#[tokio::test]
async fn pause_resume_stop_start_are_idempotent_and_stop_stays_stopped() {
    let s = setup(json!({})).await;
    let i = running(&s).await;
    s.adapter.pause(&i).await.unwrap();
    assert_eq!(s.fake.vm(&i.backend_ref).unwrap().state, "paused");
    s.adapter.pause(&i).await.unwrap();
    s.adapter.resume(&i).await.unwrap();
    assert_eq!(s.fake.vm(&i.backend_ref).unwrap().state, "running");
    s.adapter.resume(&i).await.unwrap();

    s.adapter.stop(&i).await.unwrap();
    let last = s.fake.record().exec_bodies.last().cloned().unwrap();
    assert_eq!(last["linuxUser"], "root", "poweroff needs root");
    // automaticRestart is off: polls later it is still stopped.
    for _ in 0..5 {
        let f = s.adapter.find(&i.sandbox_id).await.unwrap().unwrap();
        assert_eq!(f.state, InstanceState::Stopped);
    }
    s.adapter.stop(&i).await.unwrap();
    s.adapter.start(&i).await.unwrap();
    assert_eq!(
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
    );
    // Stop from paused wakes the VM first.
    s.adapter.pause(&i).await.unwrap();
    s.adapter.stop(&i).await.unwrap();
    assert_eq!(s.fake.vm(&i.backend_ref).unwrap().state, "stopped");
}

#[tokio::test]
async fn list_filters_by_installation_and_delete_is_idempotent() {
    let s = setup(json!({})).await;
    let mine = InstallationId::new();
    let a = s.adapter.create(&create_req(&mine)).await.unwrap();
    let b = s.adapter.create(&create_req(&mine)).await.unwrap();
    s.adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap();
    s.fake.insert("someone-elses", BTreeMap::new());
    let mut got: Vec<_> = s
        .adapter
        .list(&mine)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.sandbox_id)
        .collect();
    got.sort();
    let mut want = vec![a.sandbox_id.clone(), b.sandbox_id.clone()];
    want.sort();
    assert_eq!(got, want);
    s.adapter.delete(&a.sandbox_id).await.unwrap();
    s.adapter.delete(&a.sandbox_id).await.unwrap();
    assert!(s.adapter.find(&a.sandbox_id).await.unwrap().is_none());
    assert_eq!(s.fake.vms().len(), 3);
}

#[tokio::test]
async fn limits_keys_and_5xx_map_to_their_kinds() {
    let s = setup(json!({})).await;
    s.fake.knobs().max_vms = Some(0);
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("insufficient capacity"),
        "{e}"
    );
    s.fake.knobs().max_vms = None;
    s.fake.knobs().fail_next.push_back(("/v5/vms".into(), 429));
    let e = s.adapter.list(&InstallationId::new()).await.unwrap_err();
    assert!(
        e.is_retryable() && e.to_string().contains("insufficient capacity"),
        "{e}"
    );
    s.fake.knobs().fail_next.push_back(("/v5/vms".into(), 503));
    s.adapter.list(&InstallationId::new()).await.unwrap();
    s.fake.knobs().fail_next.push_back(("/v5/vms".into(), 500));
    assert!(s.adapter.health().await.unwrap_err().is_retryable());

    let i = running(&s).await;
    let rotated = "fs_rotated_0f1e2d3c4b5a69788796";
    s.fake.set_key(rotated);
    let e = s.adapter.exec(&i, &cmd(&["true"])).await.unwrap_err();
    let m = format!("{e} {e:?}");
    assert!(
        matches!(e, AdapterError::Permanent(_)) && m.contains("refused the API key"),
        "{m}"
    );
    assert!(!m.contains(KEY) && !m.contains(rotated), "{m}");
    std::fs::write(s.key.path(), rotated).unwrap();
    assert_eq!(
        s.adapter.exec(&i, &cmd(&["true"])).await.unwrap().exit_code,
        0
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
            "lifecycle.pause",
            "lifecycle.stop",
            "network.egress-control"
        ]
    );
    let i = running(&s).await;
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    assert!(matches!(
        s.adapter
            .exec_stream(&i, &cmd(&["true"]), tx)
            .await
            .unwrap_err(),
        AdapterError::Unsupported(_)
    ));
    assert!(matches!(
        s.adapter.snapshot(&i, "snp_x").await.unwrap_err(),
        AdapterError::Unsupported(_)
    ));
    assert!(matches!(
        s.adapter.expose_port(&i, 3000, None).await.unwrap_err(),
        AdapterError::Unsupported(_)
    ));
}

#[tokio::test]
async fn the_registry_builds_freestyle_pools_and_names_bad_settings() {
    let fake = FakeFreestyle::start(KEY).await;
    let key = crate::key_file(KEY);
    let etc = crate::etc_dir();
    let a =
        differently_adapters::registry::build("freestyle", &settings(&fake, &key, &etc, json!({})))
            .unwrap();
    assert_eq!(a.kind(), "freestyle");
    a.health().await.unwrap();
    for (bad, field) in [
        (json!({"envFile": "/tmp/env"}), "envFile"),
        (json!({"firewallRules": ["allow all"]}), "firewallRules"),
        (json!({"idleTimeoutSeconds": 0}), "idleTimeoutSeconds"),
        (json!({"apiURL": "https://u:p@api.freestyle.sh"}), "apiURL"),
    ] {
        let e =
            differently_adapters::registry::build("freestyle", &settings(&fake, &key, &etc, bad))
                .err()
                .unwrap()
                .to_string();
        assert!(e.contains(field) && e.contains("freestyle"), "{e}");
    }
    assert_eq!(
        differently_adapters::registry::resolve_trust("freestyle", None),
        Ok(differently_core::pool::Trust::External)
    );
}
