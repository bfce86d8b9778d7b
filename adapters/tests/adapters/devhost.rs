use std::time::{Duration, Instant};

use differently_adapters::devhost::{
    DevhostAdapter, DevhostConfig, DevhostTag, IsolationMode, TAG_FILE,
};
use differently_adapters::{Adapter, AdapterError, InstanceRef};
use differently_core::exec::ExecRequest;
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::{create_req, exec_req};

/// An adapter on a fresh root with one sandbox created in it.
async fn sandbox() -> (tempfile::TempDir, DevhostAdapter, InstanceRef) {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation: IsolationMode::None,
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
    (root, a, at)
}

fn sh(script: &str) -> ExecRequest {
    exec_req(&["sh", "-c", script])
}

#[tokio::test]
async fn lifecycle_dir_tag_idempotent_list_delete() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().join("nested"),
        isolation: IsolationMode::None,
    });
    let (sbx, inst) = (SandboxId::new(), InstallationId::new());
    assert!(a
        .list(&inst)
        .await
        .expect("list of missing root")
        .is_empty());

    let first = a.create(&create_req(&sbx, &inst)).await.expect("create");
    assert_eq!(first.backend_ref, sbx.as_str());
    let dir = a.sandbox_dir(&sbx);
    assert!(dir.is_dir());
    let tag: DevhostTag =
        serde_json::from_slice(&std::fs::read(dir.join(TAG_FILE)).expect("tag")).expect("tag json");
    assert_eq!((&tag.sandbox_id, &tag.installation_id), (&sbx, &inst));

    std::fs::write(dir.join("keep.txt"), "x").expect("write");
    let second = a
        .create(&create_req(&sbx, &inst))
        .await
        .expect("create again");
    assert_eq!(first, second);
    assert!(
        dir.join("keep.txt").exists(),
        "idempotent create keeps the instance"
    );

    let other = SandboxId::new();
    a.create(&create_req(&other, &InstallationId::new()))
        .await
        .expect("create other");
    assert_eq!(a.list(&inst).await.expect("list"), vec![first.clone()]);
    assert_eq!(a.find(&sbx).await.expect("find"), Some(first));

    a.delete(&sbx).await.expect("delete");
    assert!(!dir.exists());
    assert_eq!(a.find(&sbx).await.expect("find"), None);
    a.delete(&sbx).await.expect("delete of missing succeeds");
    assert!(a.list(&inst).await.expect("list").is_empty());
    assert_eq!(
        a.capabilities(),
        [
            "exec",
            "exec.stream",
            "files",
            "lifecycle.pause",
            "snapshots",
            // The host has util-linux `setsid` (devhost needs it for a terminal).
            "exec.pty",
            "ports.expose"
        ]
        .map(String::from)
        .to_vec()
    );
    assert_eq!(a.isolation(), "none");
    a.health().await.expect("healthy");
}

#[tokio::test]
async fn exec_stdout_stderr_and_exit_code() {
    let (_root, a, at) = sandbox().await;
    let r = a.exec(&at, &sh("echo hi")).await.expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (0, "hi\n", "")
    );

    let r = a
        .exec(&at, &sh("echo out; echo err >&2"))
        .await
        .expect("exec");
    assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));

    assert_eq!(a.exec(&at, &sh("exit 3")).await.expect("exec").exit_code, 3);
    assert_eq!(
        a.exec(&at, &sh("kill -9 $$"))
            .await
            .expect("exec")
            .exit_code,
        137
    );
}

#[tokio::test]
async fn exec_env_is_clean() {
    let (_root, a, at) = sandbox().await;
    let leak = format!("DIFFERENTLY_TEST_LEAK_{}", std::process::id());
    std::env::set_var(&leak, "leaked");
    let mut req = sh(&format!(r#"echo "$FOO|$LANG|$HOME|${{{leak}-unset}}""#));
    req.env.insert("FOO".into(), "bar".into());
    let r = a.exec(&at, &req).await.expect("exec");
    let home = a.sandbox_dir(&at.sandbox_id);
    assert_eq!(r.stdout, format!("bar|C.UTF-8|{}|unset\n", home.display()));
    // The request's env wins over the defaults.
    let mut req = sh(r#"echo "$LANG""#);
    req.env.insert("LANG".into(), "en_US.UTF-8".into());
    assert_eq!(
        a.exec(&at, &req).await.expect("exec").stdout,
        "en_US.UTF-8\n"
    );
}

#[tokio::test]
async fn exec_cwd_is_relative_to_the_sandbox() {
    let (_root, a, at) = sandbox().await;
    let dir = a.sandbox_dir(&at.sandbox_id);
    std::fs::create_dir_all(dir.join("work/sub")).expect("mkdir");

    let r = a.exec(&at, &exec_req(&["pwd"])).await.expect("exec");
    assert_eq!(r.stdout.trim_end(), dir.display().to_string());
    let mut req = exec_req(&["pwd"]);
    req.cwd = Some("/work/sub".into());
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!(
        r.stdout.trim_end(),
        dir.join("work/sub").display().to_string()
    );

    req.cwd = Some("/work/../..".into());
    assert!(matches!(
        a.exec(&at, &req).await,
        Err(AdapterError::Permanent(_))
    ));
    req.cwd = Some("/nope".into());
    assert!(matches!(
        a.exec(&at, &req).await,
        Err(AdapterError::Permanent(_))
    ));
}

#[tokio::test]
async fn exec_stdin_is_delivered() {
    let (_root, a, at) = sandbox().await;
    let mut req = exec_req(&["cat"]);
    req.stdin = Some("line one\nline two".into());
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "line one\nline two"));
    // Without stdin the program sees EOF at once instead of hanging.
    let r = a.exec(&at, &exec_req(&["cat"])).await.expect("exec");
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, ""));
}

/// Whether `pid` is gone (or a zombie waiting for its reaper).
fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn exec_timeout_kills_the_process_group() {
    let (_root, a, at) = sandbox().await;
    let mut req = sh("sleep 30 & echo $! > bg.pid; echo started; sleep 30");
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let r = a.exec(&at, &req).await.expect("exec");
    let took = started.elapsed();
    assert_eq!(r.exit_code, 124);
    assert_eq!(r.stdout, "started\n", "output before the timeout is kept");
    // Far below the 30 s the command would take: a bound a busy machine cannot break.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(r.duration_ms >= 1000);

    let pid = std::fs::read_to_string(a.sandbox_dir(&at.sandbox_id).join("bg.pid")).expect("pid");
    let pid = pid.trim();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !process_gone(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(process_gone(pid), "background child {pid} survived");
}

#[tokio::test]
async fn exec_output_is_capped_at_one_mib() {
    let (_root, a, at) = sandbox().await;
    let r = a
        .exec(
            &at,
            &sh("head -c 3000000 /dev/zero | tr '\\0' a; echo small >&2"),
        )
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.stdout.len(), 1024 * 1024);
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, "small\n");
    assert!(!r.stderr_truncated);
}

#[tokio::test]
async fn exec_missing_program_and_missing_sandbox() {
    let (_root, a, at) = sandbox().await;
    let r = a
        .exec(&at, &exec_req(&["definitely-not-a-program-xyz"]))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 127);
    assert!(
        r.stderr.contains("definitely-not-a-program-xyz"),
        "{}",
        r.stderr
    );

    let gone = InstanceRef {
        sandbox_id: SandboxId::new(),
        backend_ref: "x".into(),
    };
    assert_eq!(
        a.exec(&gone, &exec_req(&["true"])).await,
        Err(AdapterError::NotFound)
    );
}

// --- data plane and lifecycle ----------------------------------------------------------

#[tokio::test]
async fn exec_stream_sends_output_in_order_and_binary_safe() {
    use differently_adapters::ExecEvent;
    let (_root, a, at) = sandbox().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let mut req = exec_req(&["cat"]);
    req.stdin_base64 = Some("AAEC/w==".into()); // 00 01 02 ff
    let run = tokio::spawn({
        let (a, at) = (a.clone(), at.clone());
        async move { a.exec_stream(&at, &req, tx).await }
    });
    let mut out = Vec::new();
    while let Some(ev) = rx.recv().await {
        if let ExecEvent::Stdout(b) = ev {
            out.extend_from_slice(&b);
        }
    }
    assert_eq!(out, vec![0, 1, 2, 0xff]);
    assert_eq!(run.await.expect("join").expect("exec").exit_code, 0);
}

#[tokio::test]
async fn exec_stream_cancel_kills_the_group() {
    let (_root, a, at) = sandbox().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let req = sh("echo $$ > pid; while true; do echo tick; sleep 0.05; done");
    let run = tokio::spawn({
        let (a, at) = (a.clone(), at.clone());
        async move { a.exec_stream(&at, &req, tx).await }
    });
    let _ = rx.recv().await;
    drop(rx);
    let exit = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("cancel is prompt")
        .expect("join")
        .expect("exec");
    assert_eq!(exit.exit_code, 137);
    let pid = std::fs::read_to_string(a.sandbox_dir(&at.sandbox_id).join("pid")).expect("pid");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !process_gone(pid.trim()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(process_gone(pid.trim()), "cancelled command survived");
}

#[tokio::test]
async fn sandbox_env_is_under_request_env() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation: IsolationMode::None,
    });
    let sbx = SandboxId::new();
    let mut req = create_req(&sbx, &InstallationId::new());
    req.env.insert("FROM_SANDBOX".into(), "s".into());
    req.env.insert("BOTH".into(), "sandbox".into());
    let i = a.create(&req).await.expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    let mut req = sh(r#"echo "$FROM_SANDBOX|$BOTH""#);
    req.env.insert("BOTH".into(), "request".into());
    assert_eq!(a.exec(&at, &req).await.expect("exec").stdout, "s|request\n");
}

#[tokio::test]
async fn pause_stops_the_process_groups_and_resume_continues_them() {
    let (_root, a, at) = sandbox().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let req = sh("while true; do echo tick; sleep 0.05; done");
    let _run = tokio::spawn({
        let (a, at) = (a.clone(), at.clone());
        async move { a.exec_stream(&at, &req, tx).await }
    });
    let _ = rx.recv().await;
    a.pause(&at).await.expect("pause");
    assert_eq!(
        a.find(&at.sandbox_id).await.expect("find").map(|i| i.state),
        Some(differently_adapters::InstanceState::Paused)
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    while rx.try_recv().is_ok() {}
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        rx.try_recv().is_err(),
        "a paused command must not produce output"
    );
    assert!(matches!(
        a.exec(&at, &exec_req(&["true"])).await,
        Err(AdapterError::Permanent(_))
    ));
    a.resume(&at).await.expect("resume");
    let got = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
    assert!(
        matches!(got, Ok(Some(_))),
        "resumed command produces output again"
    );
    a.delete(&at.sandbox_id)
        .await
        .expect("delete kills everything");
    assert!(matches!(
        a.stop(&at).await,
        Err(AdapterError::Unsupported(_))
    ));
}

#[tokio::test]
async fn files_round_trip_range_and_traversal_refused() {
    use futures::StreamExt;
    let (root, a, at) = sandbox().await;
    let body = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"0123456789"))]).boxed();
    a.upload(&at, "/d/f.bin", None, body).await.expect("upload");
    let dl = a
        .download(
            &at,
            "/d/f.bin",
            Some(differently_adapters::ByteRange {
                start: 2,
                end: Some(4),
            }),
        )
        .await
        .expect("download");
    let got: Vec<u8> = dl.body.map(|c| c.expect("chunk").to_vec()).concat().await;
    assert_eq!(got, b"234");
    // A symlink pointing outside the sandbox is not a way out.
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(outside.join("secret"), "s").expect("write");
    std::os::unix::fs::symlink(&outside, a.sandbox_dir(&at.sandbox_id).join("link"))
        .expect("symlink");
    assert!(matches!(
        a.download(&at, "/link/secret", None).await,
        Err(AdapterError::Permanent(_))
    ));
    let body = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"x"))]).boxed();
    assert!(matches!(
        a.upload(&at, "/link/new", None, body).await,
        Err(AdapterError::Permanent(_))
    ));
    assert!(!outside.join("new").exists());
    for bad in ["/../x", "relative", "/.differently.json"] {
        assert!(
            matches!(
                a.download(&at, bad, None).await,
                Err(AdapterError::Permanent(_))
            ),
            "{bad}"
        );
    }
    a.delete_file(&at, "/d/f.bin").await.expect("delete");
    assert!(matches!(
        a.delete_file(&at, "/d/f.bin").await,
        Err(AdapterError::PathNotFound(_))
    ));
}

#[tokio::test]
async fn snapshot_is_an_archive_and_restores_into_a_new_sandbox() {
    let (_root, a, at) = sandbox().await;
    std::fs::write(a.sandbox_dir(&at.sandbox_id).join("state.txt"), "v1").expect("write");
    let snap = a.snapshot(&at, "snp_test1").await.expect("snapshot");
    assert!(snap.ready);
    let fork = SandboxId::new();
    let mut req = create_req(&fork, &InstallationId::new());
    req.from_snapshot = Some(snap.backend_ref.clone());
    a.create(&req).await.expect("restore");
    assert_eq!(
        std::fs::read_to_string(a.sandbox_dir(&fork).join("state.txt")).expect("restored"),
        "v1"
    );
    a.delete_snapshot(&snap.backend_ref).await.expect("delete");
    a.delete_snapshot(&snap.backend_ref)
        .await
        .expect("delete of missing");
    let mut req = create_req(&SandboxId::new(), &InstallationId::new());
    req.from_snapshot = Some("../../etc".into());
    assert!(matches!(
        a.create(&req).await,
        Err(AdapterError::Permanent(_))
    ));
}

/// With `bwrap` on `PATH` (`isolation = "auto"`), commands get their own mount, PID and network
/// namespaces; without it the adapter says `isolation: none`. Both branches assert behaviour.
#[tokio::test]
async fn isolation_is_bwrap_when_installed_and_reported_none_otherwise() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation: IsolationMode::Auto,
    });
    let installed = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()))
        .unwrap_or(false);
    let sbx = SandboxId::new();
    let i = a
        .create(&create_req(&sbx, &InstallationId::new()))
        .await
        .expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: i.backend_ref,
    };
    if !installed {
        eprintln!("bubblewrap not installed: checking the reported isolation only");
        assert_eq!(a.isolation(), "none");
        assert!(a.capabilities().contains(&"ports.expose".to_owned()));
        return;
    }
    assert_eq!(a.isolation(), "bwrap");
    // Own PID namespace: the shell is among the first processes; the host's are invisible.
    let r = a
        .exec(&at, &sh("echo $$; ls /proc | grep -c '^[0-9]'"))
        .await
        .expect("exec");
    let mut lines = r.stdout.lines();
    let pid: u32 = lines.next().and_then(|l| l.parse().ok()).expect("pid");
    let procs: u32 = lines.next().and_then(|l| l.parse().ok()).expect("count");
    assert!(pid < 10 && procs < 10, "{}", r.stdout);
    // The sandbox directory is `/`: a file written at / lands in it, the host's root is not seen.
    let r = a
        .exec(
            &at,
            &sh("echo hi > /mine.txt && test ! -e /root/.bashrc-host-marker && echo ok"),
        )
        .await
        .expect("exec");
    assert_eq!(r.stdout, "ok\n", "{}", r.stderr);
    assert!(a.sandbox_dir(&at.sandbox_id).join("mine.txt").exists());
    // No network: only loopback exists.
    let r = a
        .exec(
            &at,
            &sh("ls /sys/class/net 2>/dev/null || cat /proc/net/dev | tail -n +3 | cut -d: -f1"),
        )
        .await
        .expect("exec");
    assert!(!r.stdout.contains("eth"), "{}", r.stdout);
    assert!(!a.capabilities().contains(&"ports.expose".to_owned()));
}
