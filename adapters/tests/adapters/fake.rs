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
