//! What is the bridge's own: names as identity and the marker, containers that sleep and
//! come back empty, the index behind `list`, the bridge's error codes, exec wrapped for env,
//! stdin and deadline, files through the workspace, and tunnels.

use std::time::Duration;

use bytes::Bytes;
use differently_adapters::{Adapter, AdapterError, ExecEvent, InstanceRef, PathProblem};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;
use futures::StreamExt;

use crate::support::cases::{self, collect, one_chunk};
use crate::{at, cmd, create_req, running, setup, KEY};

/// The index sandbox's name: `differently-index` in lower-case base32.
const INDEX: &str = "mruwmztfojsw45dmpewws3temv4a";

/// The fake's workspace of the index sandbox.
fn index_dir(s: &crate::Setup) -> std::path::PathBuf {
    s.fake
        .workspace(INDEX)
        .expect("an index sandbox")
        .join("differently-index")
}

#[tokio::test]
async fn create_names_the_sandbox_tags_it_and_is_idempotent() {
    let s = setup(serde_json::json!({})).await;
    let installation = InstallationId::new();
    let req = create_req(&installation);
    let first = s.adapter.create(&req).await.unwrap();
    let again = s.adapter.create(&req).await.unwrap();
    assert_eq!(first, again);
    let name = &first.backend_ref;
    assert!(name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b)));
    let ws = s.fake.workspace(name).unwrap();
    let marker: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ws.join(".differently/sandbox.json")).unwrap())
            .unwrap();
    assert_eq!(marker["sandboxId"], req.sandbox_id.as_str());
    assert_eq!(marker["installationId"], installation.as_str());
    let env = std::fs::read_to_string(ws.join(".differently/env")).unwrap();
    assert!(
        env.ends_with("\nexport SANDBOX_VAR='from-create'\n"),
        "{env}"
    );
    let entry = std::fs::read_to_string(index_dir(&s).join(name)).unwrap();
    assert!(
        entry.starts_with(&format!("{} ", installation.as_str())),
        "{entry}"
    );
    // One container for the sandbox, one for the index.
    assert_eq!(s.fake.record().started, 2);
    let listed = s.adapter.list(&installation).await.unwrap();
    assert_eq!(listed, vec![first.clone()]);
    assert!(s
        .adapter
        .list(&InstallationId::new())
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_container_that_slept_comes_back_empty_and_the_sandbox_is_gone() {
    let s = setup(serde_json::json!({})).await;
    let installation = InstallationId::new();
    let made = s.adapter.create(&create_req(&installation)).await.unwrap();
    let r = at(&made);
    s.fake.sleep(&made.backend_ref);
    assert_eq!(s.adapter.find(&made.sandbox_id).await.unwrap(), None);
    assert!(matches!(
        s.adapter.exec(&r, &cmd(&["true"])).await,
        Err(AdapterError::NotFound)
    ));
    assert!(s.adapter.list(&installation).await.unwrap().is_empty());
    // The entry stays while young (it could be a create in flight); once old it is
    // dropped, and the empty container the probe started is destroyed.
    let entry = index_dir(&s).join(&made.backend_ref);
    assert!(entry.exists());
    std::fs::write(&entry, format!("{} 1", installation.as_str())).unwrap();
    assert!(s.adapter.list(&installation).await.unwrap().is_empty());
    assert!(!entry.exists());
    assert!(!s.fake.assigned().contains(&made.backend_ref));
}

#[tokio::test]
async fn unknown_names_refs_and_deletes() {
    let s = setup(serde_json::json!({})).await;
    let nowhere = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "Not-A-Bridge-Name".into(),
    };
    assert!(matches!(
        s.adapter.exec(&nowhere, &cmd(&["true"])).await,
        Err(AdapterError::NotFound)
    ));
    assert!(
        s.fake.record().requests.is_empty(),
        "refused before any request"
    );
    // A name the bridge never saw: it starts an empty container, which holds no marker.
    let id = SandboxId::new();
    assert_eq!(s.adapter.find(&id).await.unwrap(), None);
    // Delete of a name without a container starts nothing.
    let started = s.fake.record().started;
    s.adapter.delete(&SandboxId::new()).await.unwrap();
    assert_eq!(
        s.fake.record().started,
        started + 1,
        "only the index sandbox"
    );
    // Another sandbox's ref is not this one.
    let r = running(&s).await;
    let wrong = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: r.backend_ref.clone(),
    };
    assert!(matches!(
        s.adapter.exec(&wrong, &cmd(&["true"])).await,
        Err(AdapterError::NotFound)
    ));
}

#[tokio::test]
async fn delete_destroys_and_drops_the_entry() {
    let s = setup(serde_json::json!({})).await;
    let installation = InstallationId::new();
    let made = s.adapter.create(&create_req(&installation)).await.unwrap();
    s.adapter.delete(&made.sandbox_id).await.unwrap();
    assert!(!s.fake.assigned().contains(&made.backend_ref));
    assert!(!index_dir(&s).join(&made.backend_ref).exists());
    s.adapter.delete(&made.sandbox_id).await.unwrap();
    assert!(s.adapter.list(&installation).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_refused_key_is_permanent_and_never_shown_and_a_new_one_is_read() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    s.fake.set_key("another-key-0123456789");
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(matches!(&e, AdapterError::Permanent(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("refused the API key") && text.contains("apiKeyFile"),
        "{text}"
    );
    assert!(
        !text.contains(KEY) && !text.contains("another-key"),
        "{text}"
    );
    assert!(s.adapter.health().await.is_err());
    std::fs::write(s.key.path(), "another-key-0123456789\n").unwrap();
    s.adapter.health().await.unwrap();
    assert_eq!(s.adapter.backend_version().as_deref(), Some("1.0.0"));
    assert!(s.fake.record().unauthorized >= 2);
}

#[tokio::test]
async fn no_free_instance_slot_is_insufficient_capacity_and_pool_errors_are_transient() {
    let s = setup(serde_json::json!({})).await;
    let _first = running(&s).await; // its container and the index's
    s.fake.knobs().max_instances = Some(2);
    let e = s
        .adapter
        .create(&create_req(&InstallationId::new()))
        .await
        .unwrap_err();
    assert!(matches!(&e, AdapterError::Capacity(_)), "{e:?}");
    assert!(e.to_string().contains("instance limit reached"), "{e}");
    // The pool failing otherwise is worth retrying; a refused request is not.
    s.fake.knobs().max_instances = None;
    let r = running(&s).await;
    s.fake
        .knobs()
        .fail_next
        .push_back(("/exec".into(), 502, "pool_error"));
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(matches!(&e, AdapterError::Transient(_)), "{e:?}");
    s.fake
        .knobs()
        .fail_next
        .push_back(("/exec".into(), 400, "invalid_request"));
    let e = s.adapter.exec(&r, &cmd(&["true"])).await.unwrap_err();
    assert!(matches!(&e, AdapterError::Permanent(_)), "{e:?}");
}

#[tokio::test]
async fn exec_carries_env_cwd_stdin_and_its_deadline() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    cases::exec_sees_env_and_cwd(&s.adapter, &r, 3).await;
    cases::exec_timeout_is_124_and_a_missing_cwd_names_the_field(&s.adapter, &r).await;
    let mut req = cmd(&["sh", "-c", "cat; printf '%s' \"$X\""]);
    req.stdin = Some("in\n".into());
    req.env.insert("X".into(), "it's".into());
    let res = s.adapter.exec(&r, &req).await.unwrap();
    assert_eq!(res.stdout, "in\nit's");
    // The bridge took the command in /workspace, with timeout_ms, and no env of its own.
    let body = s.fake.record().exec_bodies.last().cloned().unwrap();
    assert_eq!(body["cwd"], "/workspace");
    assert!(body["timeout_ms"].as_u64().is_some_and(|t| t >= 60_000));
    assert!(body.get("env").is_none());
    // The request's values travel in a staged file, never in the command line the bridge's
    // SDK logs; stdin and env files are gone after the run.
    assert!(!body["argv"].to_string().contains("it's"), "{body}");
    let ws = s.fake.workspace(&r.backend_ref).unwrap();
    let left: Vec<_> = std::fs::read_dir(ws.join(".differently/xfer"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A variable a shell cannot export is refused naming the field.
    let mut bad = cmd(&["true"]);
    bad.env.insert("A-B".into(), "x".into());
    let e = s.adapter.exec(&r, &bad).await.unwrap_err();
    assert_eq!(cases::field_of(&e), Some("env"));
    // Output that is not UTF-8 arrives replaced, as the exec fidelity says.
    let res = s
        .adapter
        .exec(&r, &cmd(&["printf", "a\\377b"]))
        .await
        .unwrap();
    assert_eq!(res.stdout, "a\u{FFFD}b");
}

#[tokio::test]
async fn a_stream_that_stops_is_not_an_exit_and_a_stalled_reader_kills_the_command() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    s.fake.knobs().cut_exec_after.push_back(1);
    cases::a_truncated_stream_is_transient(&s.adapter, &r).await;
    let fake = s.fake.clone();
    cases::a_stalled_reader_does_not_outlast_the_deadline(&s.adapter, &r, move || {
        fake.commands_running()
    })
    .await;
    // A reader that goes away stops the command too (exit 137).
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = cmd(&["sh", "-c", "echo first; sleep 30"]);
    let reader = async move {
        let first = rx.recv().await;
        drop(rx);
        first
    };
    let (exit, first) = tokio::join!(s.adapter.exec_stream(&r, &req, tx), reader);
    assert_eq!(
        first,
        Some(ExecEvent::Stdout(Bytes::from_static(b"first\n")))
    );
    let exit = exit.unwrap();
    assert_eq!(exit.exit_code, 137);
    assert!(exit.duration_ms < 20_000, "{exit:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.fake.commands_running(), 0);
}

#[tokio::test]
async fn files_anywhere_go_through_the_workspace() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    let dir = tempfile::tempdir().unwrap();
    cases::files_round_trip(&s.adapter, &r, &dir.path().display().to_string()).await;
    // Inside /workspace, a path lands in the bridge's workspace.
    s.adapter
        .upload(&r, "/workspace/a/b.txt", Some(0o600), one_chunk(b"bee"))
        .await
        .unwrap();
    let ws = s.fake.workspace(&r.backend_ref).unwrap();
    assert_eq!(std::fs::read(ws.join("a/b.txt")).unwrap(), b"bee");
    let got = collect(
        s.adapter
            .download(&r, "/workspace/a/b.txt", None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(got, b"bee");
    let listed = s.adapter.list_files(&r, "/workspace", 2).await.unwrap();
    let paths: Vec<&str> = listed.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/workspace/a", "/workspace/a/b.txt"],
        "the adapter's state is hidden"
    );
    assert_eq!(listed[1].mode, 0o600);
    // Staged copies do not stay behind.
    let xfer: Vec<_> = std::fs::read_dir(ws.join(".differently/xfer"))
        .unwrap()
        .collect();
    assert!(xfer.is_empty(), "{xfer:?}");
    // What the adapter keeps for the sandbox cannot be removed or overwritten through it.
    let e = s
        .adapter
        .delete_file(&r, "/workspace/.differently/sandbox.json")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Differently's own state"), "{e}");
    let e = s
        .adapter
        .upload(&r, "/workspace/.differently/env", None, one_chunk(b"x"))
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::Permanent(_)), "{e:?}");
    // Paths: a directory is not downloaded, a non-empty one not deleted, parents checked.
    let e = s
        .adapter
        .download(&r, "/workspace/a", None)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    let e = s.adapter.delete_file(&r, "/workspace/a").await.unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
    let e = s
        .adapter
        .upload(&r, "/workspace/a/b.txt/c", None, one_chunk(b"x"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::NotADirectory),
        "{e:?}"
    );
    let e = s
        .adapter
        .list_files(&r, "/workspace/missing", 1)
        .await
        .unwrap_err();
    assert!(matches!(e, AdapterError::PathNotFound(_)), "{e:?}");
    // Larger than the bridge's 32 MiB write limit: refused before it is sent.
    let big = futures::stream::iter((0..33).map(|_| Ok(Bytes::from(vec![0u8; 1 << 20])))).boxed();
    let before = s.fake.record().requests.len();
    let e = s
        .adapter
        .upload(&r, "/tmp/big", None, big)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("32 MiB"), "{e}");
    assert_eq!(s.fake.record().requests.len(), before);
}

#[tokio::test]
async fn ports_are_tunnels_only_when_published() {
    let s = setup(serde_json::json!({})).await;
    let r = running(&s).await;
    assert!(matches!(
        s.adapter.expose_port(&r, 8080, None).await,
        Err(AdapterError::Unsupported(_))
    ));
    let s = setup(serde_json::json!({"ports": "public"})).await;
    let r = running(&s).await;
    let a = s.adapter.expose_port(&r, 8080, None).await.unwrap();
    let b = s
        .adapter
        .expose_port(&r, 8080, Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(a, b, "the bridge reuses the port's tunnel");
    assert!(
        a.url.starts_with("https://") && a.url.ends_with(".trycloudflare.com"),
        "{a:?}"
    );
    assert_eq!(a.expires_at, None);
    let e = s.adapter.expose_port(&r, 3000, None).await.unwrap_err();
    assert_eq!(cases::field_of(&e), Some("port"));
}

#[tokio::test]
async fn settings_are_refused_naming_the_key() {
    let (field, msg) = cases::build_err("cloudflare", serde_json::json!({"apiKeySecret": "k"}));
    assert_eq!(field.as_deref(), Some("bridgeURL"), "{msg}");
    let (field, _) = cases::build_err(
        "cloudflare",
        serde_json::json!({"bridgeURL": "https://b.example", "apiKeySecret": "k", "ports": "open"}),
    );
    assert_eq!(field.as_deref(), Some("ports"));
    let (field, _) = cases::build_err(
        "cloudflare",
        serde_json::json!({"bridgeURL": "https://b.example", "apiKeySecret": "k", "timeouts": {"requestSeconds": 0}}),
    );
    assert_eq!(field.as_deref(), Some("timeouts.requestSeconds"));
    let (field, _) = cases::build_err(
        "cloudflare",
        serde_json::json!({"bridgeURL": "https://b.example"}),
    );
    assert_eq!(field.as_deref(), Some("apiKeyEnv"));
}

#[tokio::test]
async fn templates_and_snapshots_are_not_the_bridges() {
    let s = setup(serde_json::json!({})).await;
    let mut req = create_req(&InstallationId::new());
    req.template = Some("python".into());
    let e = s.adapter.create(&req).await.unwrap_err();
    assert_eq!(cases::field_of(&e), Some("template"));
    req.template = None;
    req.from_snapshot = Some("snap".into());
    assert!(matches!(
        s.adapter.create(&req).await,
        Err(AdapterError::Unsupported(_))
    ));
    assert!(s.fake.record().requests.is_empty());
}
