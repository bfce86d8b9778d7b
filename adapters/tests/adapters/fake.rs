use std::sync::{Arc, Barrier};
use std::time::Duration;

use differently_adapters::fake::{
    created_count, live_instances, read_ledger, FakeAdapter, FakeConfig, LedgerOp, LedgerOutcome,
};
use differently_adapters::{Adapter, AdapterError, InstanceRef};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::{create_req, exec_req};

/// Env var that turns `child_creator` from a no-op into a creator, for the cross-process test.
const CHILD_ENV: &str = "DIFFERENTLY_FAKE_CHILD";

fn fake(config: FakeConfig) -> FakeAdapter {
    FakeAdapter::new(config)
}

fn with_ledger(path: &std::path::Path) -> FakeConfig {
    FakeConfig {
        ledger: Some(path.to_path_buf()),
        ..FakeConfig::default()
    }
}

#[tokio::test]
async fn create_is_idempotent_and_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    for config in [
        FakeConfig::default(),
        with_ledger(&dir.path().join("l.jsonl")),
    ] {
        let a = fake(config);
        let (sbx, inst) = (SandboxId::new(), InstallationId::new());
        let first = a.create(&create_req(&sbx, &inst)).await.expect("create");
        let second = a
            .create(&create_req(&sbx, &inst))
            .await
            .expect("create again");
        assert_eq!(first, second);
        assert_eq!(first.sandbox_id, sbx);

        let ledger = a.ledger();
        assert_eq!(created_count(&ledger, &sbx), 1);
        let outcomes: Vec<_> = ledger.iter().map(|e| (e.op, e.outcome)).collect();
        assert_eq!(
            outcomes,
            vec![
                (LedgerOp::Create, LedgerOutcome::Created),
                (LedgerOp::Create, LedgerOutcome::Existing)
            ]
        );
        assert_eq!(
            ledger[1].backend_ref.as_deref(),
            Some(first.backend_ref.as_str())
        );
        assert!(ledger.iter().all(|e| e.pid == std::process::id()));

        assert_eq!(a.find(&sbx).await.expect("find"), Some(first.clone()));
        assert_eq!(a.list(&inst).await.expect("list"), vec![first.clone()]);
        assert!(a
            .list(&InstallationId::new())
            .await
            .expect("list")
            .is_empty());
    }
}

#[tokio::test]
async fn delete_removes_and_missing_delete_succeeds() {
    let a = fake(FakeConfig::default());
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    a.delete(&sbx).await.expect("delete of missing succeeds");
    let first = a.create(&create_req(&sbx, &inst)).await.expect("create");
    a.delete(&sbx).await.expect("delete");
    assert_eq!(a.find(&sbx).await.expect("find"), None);
    // A new instance after a delete is a new backend instance.
    let again = a.create(&create_req(&sbx, &inst)).await.expect("create");
    assert_ne!(again.backend_ref, first.backend_ref);

    let outcomes: Vec<_> = a.ledger().iter().map(|e| (e.op, e.outcome)).collect();
    assert_eq!(outcomes[0], (LedgerOp::Delete, LedgerOutcome::Missing));
    assert_eq!(outcomes[2], (LedgerOp::Delete, LedgerOutcome::Deleted));
    assert_eq!(outcomes[3], (LedgerOp::Find, LedgerOutcome::Missing));
    assert_eq!(live_instances(&a.ledger()).len(), 1);
}

#[tokio::test]
async fn fail_creates_injects_exactly_n_failures_per_sandbox() {
    let a = fake(FakeConfig {
        fail_creates: 2,
        ..FakeConfig::default()
    });
    let (sbx, other, inst) = (SandboxId::new(), SandboxId::new(), InstallationId::new());
    for _ in 0..2 {
        let err = a.create(&create_req(&sbx, &inst)).await.err();
        assert!(matches!(err, Some(AdapterError::Transient(_))), "{err:?}");
    }
    a.create(&create_req(&sbx, &inst))
        .await
        .expect("third create succeeds");
    // The count is per sandbox.
    assert!(a.create(&create_req(&other, &inst)).await.is_err());
    assert_eq!(created_count(&a.ledger(), &sbx), 1);
    assert_eq!(created_count(&a.ledger(), &other), 0);
}

#[test]
fn concurrent_creators_on_one_ledger_make_one_instance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger.jsonl");
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (path, sbx, inst, barrier) =
                (path.clone(), sbx.clone(), inst.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                // Each "process" has its own adapter: only the ledger file is shared.
                let a = FakeAdapter::new(FakeConfig {
                    latency_ms: 20,
                    ..with_ledger(&path)
                });
                barrier.wait();
                rt.block_on(a.create(&create_req(&sbx, &inst)))
                    .expect("create")
                    .backend_ref
            })
        })
        .collect();
    let refs: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    assert!(refs.iter().all(|r| r == &refs[0]), "{refs:?}");

    let ledger = read_ledger(&path).expect("read ledger");
    assert_eq!(ledger.len(), n);
    assert_eq!(created_count(&ledger, &sbx), 1);
    let existing = ledger
        .iter()
        .filter(|e| e.outcome == LedgerOutcome::Existing)
        .count();
    assert_eq!(existing, n - 1);
    let live = live_instances(&ledger);
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].installation_id.as_ref(), Some(&inst));
}

/// Not a test on its own: the body run by the child processes of
/// `ledger_is_shared_across_processes_and_survives_kill`.
#[tokio::test]
async fn child_creator() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(4, '|');
    let (Some(path), Some(sbx), Some(inst), Some(latency)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        panic!("bad {CHILD_ENV}: {spec}");
    };
    let a = FakeAdapter::new(FakeConfig {
        latency_ms: latency.parse().expect("latency"),
        ..with_ledger(std::path::Path::new(path))
    });
    let sbx = SandboxId::parse(sbx).expect("sandbox id");
    let inst = InstallationId::parse(inst).expect("installation id");
    a.create(&create_req(&sbx, &inst))
        .await
        .expect("child create");
}

fn spawn_child(
    path: &std::path::Path,
    sbx: &SandboxId,
    inst: &InstallationId,
    latency_ms: u64,
) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "fake::child_creator",
            "--test-threads=1",
            "--quiet",
        ])
        .env(
            CHILD_ENV,
            format!("{}|{sbx}|{inst}|{latency_ms}", path.display()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn child")
}

#[tokio::test]
async fn ledger_is_shared_across_processes_and_survives_kill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger.jsonl");
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());

    // Killed during the create latency: no trace in the ledger.
    let mut victim = spawn_child(&path, &sbx, &inst, 5_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    victim.kill().expect("kill -9");
    let _ = victim.wait();
    assert_eq!(created_count(&read_ledger(&path).expect("read"), &sbx), 0);

    // Real processes racing on the same ledger: exactly one instance.
    let children: Vec<_> = (0..3)
        .map(|_| spawn_child(&path, &sbx, &inst, 10))
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success());
    }
    let ledger = read_ledger(&path).expect("read");
    assert_eq!(created_count(&ledger, &sbx), 1);
    assert!(ledger.iter().all(|e| e.pid != std::process::id()));

    // This process sees the other processes' instance.
    let a = FakeAdapter::new(with_ledger(&path));
    let found = a.find(&sbx).await.expect("find").expect("instance exists");
    assert_eq!(Some(found.backend_ref.clone()), ledger[0].backend_ref);
    let again = a.create(&create_req(&sbx, &inst)).await.expect("create");
    assert_eq!(again.backend_ref, found.backend_ref);
    assert_eq!(created_count(&a.ledger(), &sbx), 1);
}

#[tokio::test]
async fn unavailable_fails_every_call_and_health() {
    let a = fake(FakeConfig {
        unavailable: true,
        ..FakeConfig::default()
    });
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    assert!(matches!(
        a.health().await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.create(&create_req(&sbx, &inst)).await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.delete(&sbx).await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.find(&sbx).await,
        Err(AdapterError::Unavailable(_))
    ));
    assert!(matches!(
        a.list(&inst).await,
        Err(AdapterError::Unavailable(_))
    ));
    fake(FakeConfig::default()).health().await.expect("healthy");
}

#[tokio::test]
async fn exec_echo_true_false_and_not_found() {
    let a = fake(FakeConfig::default());
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    let missing = InstanceRef {
        sandbox_id: sbx.clone(),
        backend_ref: "nope".into(),
    };
    assert_eq!(
        a.exec(&missing, &exec_req(&["echo", "x"])).await,
        Err(AdapterError::NotFound)
    );
    let i = a.create(&create_req(&sbx, &inst)).await.expect("create");
    let at = InstanceRef {
        sandbox_id: sbx.clone(),
        backend_ref: i.backend_ref,
    };
    let r = a
        .exec(&at, &exec_req(&["echo", "hello", "world"]))
        .await
        .expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "hello world\n", "")
    );
    assert_eq!(
        a.exec(&at, &exec_req(&["true"]))
            .await
            .expect("exec")
            .exit_code,
        0
    );
    assert_eq!(
        a.exec(&at, &exec_req(&["false"]))
            .await
            .expect("exec")
            .exit_code,
        1
    );
    let r = a
        .exec(&at, &exec_req(&["sh", "-c", "echo secret"]))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 127);
    assert_eq!(r.stdout, "");
    assert_eq!(r.stderr, "fake: command not found: sh\n");

    // The ledger records the program only, never its arguments.
    let execs: Vec<_> = a
        .ledger()
        .into_iter()
        .filter(|e| e.op == LedgerOp::Exec)
        .collect();
    assert_eq!(execs.len(), 5);
    assert_eq!(execs[0].outcome, LedgerOutcome::Missing);
    assert_eq!(execs[4].program.as_deref(), Some("sh"));
    let raw = serde_json::to_string(&execs).expect("json");
    assert!(!raw.contains("secret") && !raw.contains("hello"));
}

#[test]
fn ledger_lines_are_camel_case_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ledger.jsonl");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let a = FakeAdapter::new(with_ledger(&path));
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    rt.block_on(a.create(&create_req(&sbx, &inst)))
        .expect("create");
    let text = std::fs::read_to_string(&path).expect("ledger file");
    let line: serde_json::Value = serde_json::from_str(text.trim_end()).expect("json line");
    assert_eq!(line["op"], "create");
    assert_eq!(line["outcome"], "created");
    assert_eq!(line["sandboxId"], sbx.as_str());
    assert!(line["backendRef"].is_string());
    assert_eq!(line["pid"], std::process::id());
    assert!(chrono::DateTime::parse_from_rfc3339(line["at"].as_str().expect("at")).is_ok());
}

// --- data plane and lifecycle ----------------------------------------------------------

const ALL_CAPS: [&str; 7] = [
    "exec",
    "exec.stream",
    "files",
    "lifecycle.pause",
    "lifecycle.stop",
    "snapshots",
    "ports.expose",
];

/// A fake with every optional operation on a file ledger, and one running instance.
async fn full_fake(dir: &std::path::Path) -> (FakeAdapter, InstanceRef) {
    let a = fake(FakeConfig {
        ledger: Some(dir.join("l.jsonl")),
        capabilities: ALL_CAPS.iter().map(|s| s.to_string()).collect(),
        ..FakeConfig::default()
    });
    let sbx = SandboxId::new();
    let i = a
        .create(&create_req(&sbx, &InstallationId::new()))
        .await
        .expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    (a, at)
}

fn bytes_body(b: &'static [u8]) -> differently_adapters::ByteStream {
    use futures::StreamExt;
    futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b))]).boxed()
}

#[tokio::test]
async fn optional_operations_are_unsupported_unless_configured() {
    let a = fake(FakeConfig::default());
    let sbx = SandboxId::new();
    let i = a
        .create(&create_req(&sbx, &InstallationId::new()))
        .await
        .expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    let before = a.ledger().len();
    assert!(
        matches!(a.pause(&at).await, Err(AdapterError::Unsupported(c)) if c == "lifecycle.pause")
    );
    assert!(matches!(
        a.stop(&at).await,
        Err(AdapterError::Unsupported(_))
    ));
    assert!(matches!(
        a.snapshot(&at, "snp_x").await,
        Err(AdapterError::Unsupported(_))
    ));
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    assert!(matches!(
        a.exec_stream(&at, &exec_req(&["true"]), tx).await,
        Err(AdapterError::Unsupported(_))
    ));
    assert_eq!(
        a.ledger().len(),
        before,
        "unsupported calls never reach the backend"
    );
}

#[tokio::test]
async fn lifecycle_states_are_replayed_and_checked() {
    use differently_adapters::InstanceState::*;
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, at) = full_fake(dir.path()).await;
    a.pause(&at).await.expect("pause");
    assert_eq!(
        a.find(&at.sandbox_id).await.expect("find").map(|i| i.state),
        Some(Paused)
    );
    a.pause(&at).await.expect("pause is idempotent");
    assert!(
        matches!(a.stop(&at).await, Err(AdapterError::Permanent(_))),
        "paused cannot stop"
    );
    assert!(matches!(
        a.exec(&at, &exec_req(&["true"])).await,
        Err(AdapterError::Permanent(_))
    ));
    a.resume(&at).await.expect("resume");
    a.stop(&at).await.expect("stop");
    assert_eq!(
        a.find(&at.sandbox_id).await.expect("find").map(|i| i.state),
        Some(Stopped)
    );
    a.start(&at).await.expect("start");
    assert_eq!(
        a.find(&at.sandbox_id).await.expect("find").map(|i| i.state),
        Some(Running)
    );
    // Another adapter on the same ledger sees the same state.
    let other = fake(FakeConfig {
        ledger: Some(dir.path().join("l.jsonl")),
        ..FakeConfig::default()
    });
    assert_eq!(
        other
            .find(&at.sandbox_id)
            .await
            .expect("find")
            .map(|i| i.state),
        Some(Running)
    );
    let ops: Vec<_> = a.ledger().iter().map(|e| e.op).collect();
    for op in [
        LedgerOp::Pause,
        LedgerOp::Resume,
        LedgerOp::Stop,
        LedgerOp::Start,
    ] {
        assert!(ops.contains(&op), "{op:?} recorded");
    }
}

#[tokio::test]
async fn exec_programs_stdin_env_cwd_timeout_and_truncation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, at) = full_fake(dir.path()).await;
    let mut req = exec_req(&["cat"]);
    req.stdin = Some("in".into());
    assert_eq!(a.exec(&at, &req).await.expect("cat").stdout, "in");
    let mut req = exec_req(&["env"]);
    req.env.insert("B".into(), "2".into());
    req.env.insert("A".into(), "1".into());
    assert_eq!(a.exec(&at, &req).await.expect("env").stdout, "A=1\nB=2\n");
    let mut req = exec_req(&["pwd"]);
    req.cwd = Some("/work".into());
    assert_eq!(a.exec(&at, &req).await.expect("pwd").stdout, "/work\n");
    assert_eq!(
        a.exec(&at, &exec_req(&["fake-exit", "3"]))
            .await
            .expect("exit")
            .exit_code,
        3
    );
    let r = a
        .exec(&at, &exec_req(&["fake-stderr", "oops"]))
        .await
        .expect("stderr");
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("", "oops\n"));
    let mut req = exec_req(&["sleep", "30"]);
    req.timeout_seconds = Some(1);
    let started = std::time::Instant::now();
    assert_eq!(a.exec(&at, &req).await.expect("sleep").exit_code, 124);
    assert!(started.elapsed() < Duration::from_secs(15));
    let r = a
        .exec(&at, &exec_req(&["fake-output", "3000000"]))
        .await
        .expect("output");
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert!(r.stdout_truncated && !r.stderr_truncated);
}

#[tokio::test]
async fn exec_stream_applies_backpressure_and_records_cancel() {
    use differently_adapters::ExecEvent;
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, at) = full_fake(dir.path()).await;
    // 50 MB through a 2-slot channel: the generator waits for the reader.
    let (tx, mut rx) = tokio::sync::mpsc::channel(2);
    let a2 = a.clone();
    let at2 = at.clone();
    let run = tokio::spawn(async move {
        a2.exec_stream(&at2, &exec_req(&["fake-output", "52428800"]), tx)
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !run.is_finished(),
        "the generator must block on a full channel"
    );
    let mut total = 0usize;
    while let Some(ev) = rx.recv().await {
        match ev {
            ExecEvent::Stdout(b) => {
                assert!(b.len() <= 64 * 1024);
                total += b.len();
            }
            ExecEvent::Stderr(_) => panic!("no stderr expected"),
        }
    }
    let exit = run.await.expect("join").expect("exec_stream");
    assert_eq!((exit.exit_code, total), (0, 52_428_800));

    // The reader goes away: the command is cancelled and the ledger says so.
    let (tx, mut rx) = tokio::sync::mpsc::channel(2);
    let a2 = a.clone();
    let at2 = at.clone();
    let run = tokio::spawn(async move {
        a2.exec_stream(&at2, &exec_req(&["fake-output", "1000000000"]), tx)
            .await
    });
    let _ = rx.recv().await;
    drop(rx);
    let exit = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("cancel is prompt")
        .expect("join")
        .expect("exec_stream");
    assert_eq!(exit.exit_code, 137);
    assert!(a
        .ledger()
        .iter()
        .any(|e| e.op == LedgerOp::Exec && e.outcome == LedgerOutcome::Cancelled));
}

#[tokio::test]
async fn files_snapshots_fork_and_ports() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, at) = full_fake(dir.path()).await;
    a.upload(&at, "/data/x.txt", Some(0o600), bytes_body(b"hello world"))
        .await
        .expect("upload");
    let dl = a
        .download(
            &at,
            "/data/x.txt",
            Some(differently_adapters::ByteRange {
                start: 6,
                end: None,
            }),
        )
        .await
        .expect("download");
    assert_eq!(dl.total_size, Some(11));
    let body: Vec<u8> = dl.body.map(|c| c.expect("chunk").to_vec()).concat().await;
    assert_eq!(body, b"world");
    let entries = a.list_files(&at, "/", 2).await.expect("list");
    let paths: Vec<_> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, vec!["/data", "/data/x.txt"]);
    assert_eq!(entries[1].mode, 0o600);
    assert!(matches!(
        a.download(&at, "/../../etc/passwd", None).await,
        Err(AdapterError::Permanent(_))
    ));
    assert!(matches!(
        a.download(&at, "/nope", None).await,
        Err(AdapterError::PathNotFound(_))
    ));

    let snap = a.snapshot(&at, "snp_1").await.expect("snapshot");
    assert!(snap.ready);
    let fork = SandboxId::new();
    let mut req = create_req(&fork, &InstallationId::new());
    req.from_snapshot = Some(snap.backend_ref.clone());
    let inst = a.create(&req).await.expect("fork");
    let fork_at = InstanceRef {
        sandbox_id: fork,
        backend_ref: inst.backend_ref,
    };
    let dl = a
        .download(&fork_at, "/data/x.txt", None)
        .await
        .expect("forked file");
    let body: Vec<u8> = dl.body.map(|c| c.expect("chunk").to_vec()).concat().await;
    assert_eq!(body, b"hello world");
    let created = a
        .ledger()
        .into_iter()
        .find(|e| e.op == LedgerOp::Create && e.sandbox_id.as_ref() == Some(&fork_at.sandbox_id))
        .expect("created line");
    assert_eq!(created.snapshot.as_deref(), Some(snap.backend_ref.as_str()));
    a.delete_snapshot(&snap.backend_ref)
        .await
        .expect("delete snapshot");
    let mut again = create_req(&SandboxId::new(), &InstallationId::new());
    again.from_snapshot = Some(snap.backend_ref);
    assert!(matches!(
        a.create(&again).await,
        Err(AdapterError::Permanent(_))
    ));

    let ep = a
        .expose_port(&at, 8080, Some(Duration::from_secs(60)))
        .await
        .expect("port");
    assert!(ep.url.contains("/8080"), "{}", ep.url);
    let left = ep.expires_at.expect("expiry") - chrono::Utc::now();
    assert!(left.num_seconds() > 50 && left.num_seconds() <= 60);
}

/// The fault suite's S13 knobs: the backend acts, then the caller hears a timeout; only a
/// retry tells what happened (the create finds the instance, the delete finds none).
#[tokio::test]
async fn time_out_after_acting_leaves_the_effect_and_a_retry_finds_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for config in [
        FakeConfig::default(),
        with_ledger(&dir.path().join("t.jsonl")),
    ] {
        let a = fake(FakeConfig {
            time_out_after_create: true,
            time_out_after_delete: true,
            ..config
        });
        let (sbx, inst) = (SandboxId::new(), InstallationId::new());
        let first = a.create(&create_req(&sbx, &inst)).await;
        assert!(
            matches!(first, Err(AdapterError::Transient(_))),
            "{first:?}"
        );
        assert!(
            a.find(&sbx).await.expect("find").is_some(),
            "the create acted"
        );
        let again = a.create(&create_req(&sbx, &inst)).await.expect("retry");
        assert_eq!(created_count(&a.ledger(), &sbx), 1);
        assert_eq!(again.sandbox_id, sbx);

        let gone = a.delete(&sbx).await;
        assert!(matches!(gone, Err(AdapterError::Transient(_))), "{gone:?}");
        assert!(
            a.find(&sbx).await.expect("find").is_none(),
            "the delete acted"
        );
        a.delete(&sbx).await.expect("retried delete answers ok");
        let outcomes: Vec<_> = a
            .ledger()
            .iter()
            .filter(|e| e.op != LedgerOp::Find)
            .map(|e| (e.op, e.outcome))
            .collect();
        assert_eq!(
            outcomes,
            vec![
                (LedgerOp::Create, LedgerOutcome::Created),
                (LedgerOp::Create, LedgerOutcome::Existing),
                (LedgerOp::Delete, LedgerOutcome::Deleted),
                (LedgerOp::Delete, LedgerOutcome::Missing),
            ]
        );
    }
}

/// The fault suite's S12 knob: only a sandbox's first create call hangs.
#[tokio::test]
async fn only_the_first_create_of_a_sandbox_hangs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = fake(FakeConfig {
        hang_first_create_ms: 300,
        ..with_ledger(&dir.path().join("h.jsonl"))
    });
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    let t = std::time::Instant::now();
    a.create(&create_req(&sbx, &inst)).await.expect("create");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    let t = std::time::Instant::now();
    a.create(&create_req(&sbx, &inst))
        .await
        .expect("create again");
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn fake_pty_is_scripted_and_needs_its_capability() {
    use differently_adapters::{PtyInput, PtyRequest, PtySignal, PtySize};
    let req = PtyRequest {
        command: vec!["sh".into()],
        env: Default::default(),
        cwd: None,
        size: PtySize { cols: 80, rows: 24 },
    };
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    let without = fake(FakeConfig::default());
    without
        .create(&create_req(&sbx, &inst))
        .await
        .expect("create");
    let at = InstanceRef {
        sandbox_id: sbx.clone(),
        backend_ref: sbx.to_string(),
    };
    let (_in_tx, in_rx) = tokio::sync::mpsc::channel(4);
    let (out_tx, _out_rx) = tokio::sync::mpsc::channel(4);
    assert!(matches!(
        without.pty(&at, &req, in_rx, out_tx).await,
        Err(AdapterError::Unsupported(_))
    ));

    let a = fake(FakeConfig {
        capabilities: vec!["exec".into(), "exec.pty".into()],
        ..FakeConfig::default()
    });
    let i = a.create(&create_req(&sbx, &inst)).await.expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    let (in_tx, in_rx) = tokio::sync::mpsc::channel(4);
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel(64);
    let run = tokio::spawn(async move { a.pty(&at, &req, in_rx, out_tx).await });
    let send = |s: &str| PtyInput::Stdin(bytes::Bytes::from(s.to_owned()));
    in_tx.send(send("stty size\n")).await.expect("send");
    in_tx
        .send(PtyInput::Resize(PtySize {
            cols: 100,
            rows: 30,
        }))
        .await
        .expect("send");
    in_tx
        .send(send("stty size\necho hi there\n"))
        .await
        .expect("send");
    in_tx.send(send("sleep 100\n")).await.expect("send");
    in_tx
        .send(PtyInput::Signal(PtySignal::Int))
        .await
        .expect("send");
    in_tx.send(send("exit 3\n")).await.expect("send");
    let exit = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("ends")
        .expect("join")
        .expect("pty");
    assert_eq!(exit.exit_code, 3);
    let mut seen = String::new();
    while let Ok(b) = out_rx.try_recv() {
        seen.push_str(&String::from_utf8_lossy(&b));
    }
    assert_eq!(
        seen,
        "$ stty size\r\n24 80\r\n$ stty size\r\n30 100\r\n$ echo hi there\r\nhi there\r\n\
         $ sleep 100\r\n^C\r\n$ exit 3\r\n"
    );
}
