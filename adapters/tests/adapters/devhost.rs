use std::time::{Duration, Instant};

use differently_adapters::devhost::{
    DevhostAdapter, DevhostConfig, DevhostTag, IsolationMode, TAG_FILE,
};
use differently_adapters::{Adapter, AdapterError, InstanceRef, PathProblem};
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
            "warm",
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
    // A symlink pointing outside the sandbox is followed as the sandbox sees it (its target
    // taken inside the sandbox directory), never out: here it leads nowhere.
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(outside.join("secret"), "s").expect("write");
    std::os::unix::fs::symlink(&outside, a.sandbox_dir(&at.sandbox_id).join("link"))
        .expect("symlink");
    assert!(matches!(
        a.download(&at, "/link/secret", None).await,
        Err(AdapterError::PathNotFound(_))
    ));
    let body = futures::stream::iter(vec![Ok(bytes::Bytes::from_static(b"x"))]).boxed();
    assert!(matches!(
        a.upload(&at, "/link/new", None, body).await,
        Err(AdapterError::PathNotFound(_))
    ));
    assert!(!outside.join("new").exists());
    // A symlink inside that points inside works, absolute as the sandbox writes it too.
    std::os::unix::fs::symlink("/d", a.sandbox_dir(&at.sandbox_id).join("abs")).expect("symlink");
    let dl = a
        .download(&at, "/abs/f.bin", None)
        .await
        .expect("through /abs");
    let got: Vec<u8> = dl.body.map(|c| c.expect("chunk").to_vec()).concat().await;
    assert_eq!(got, b"0123456789");
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

/// Whether `bwrap` is on `PATH`.
fn bwrap_installed() -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()))
        .unwrap_or(false)
}

/// An adapter with `isolation = "auto"` on a fresh root, one sandbox created in it; fails
/// (does not skip) when bubblewrap is missing.
async fn isolated_sandbox() -> (tempfile::TempDir, DevhostAdapter, InstanceRef) {
    assert!(
        bwrap_installed(),
        "these tests need bubblewrap: install the Debian package `bubblewrap`"
    );
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter::new(DevhostConfig {
        root: root.path().to_path_buf(),
        isolation: IsolationMode::Auto,
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

fn body_of(bytes: &'static [u8]) -> differently_adapters::ByteStream {
    use futures::StreamExt;
    futures::stream::iter(vec![Ok(bytes::Bytes::from_static(bytes))]).boxed()
}

async fn read_all(
    a: &DevhostAdapter,
    at: &InstanceRef,
    path: &str,
) -> Result<Vec<u8>, AdapterError> {
    use futures::StreamExt;
    let dl = a.download(at, path, None).await?;
    let parts: Vec<_> = dl.body.collect().await;
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

/// With `isolation = "auto"` and bubblewrap installed, commands get their own mount, PID and
/// network namespaces, and the adapter says `bwrap`.
#[tokio::test]
async fn isolation_is_bwrap_with_own_namespaces() {
    let (_root, a, at) = isolated_sandbox().await;
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
    assert!(!a
        .capabilities()
        .contains(&differently_adapters::Capability::PortsExpose));
    assert!(matches!(
        a.expose_port(&at, 8080, None).await,
        Err(AdapterError::Unsupported(m)) if m.contains("devhost")
    ));
}

/// The files API and commands see one filesystem: `/tmp`, `/work` and `/` written by one
/// side are read by the other.
#[tokio::test]
async fn files_api_and_commands_share_tmp_and_root_under_bwrap() {
    let (_root, a, at) = isolated_sandbox().await;
    a.upload(&at, "/tmp/hello.txt", None, body_of(b"from the files API"))
        .await
        .expect("upload to /tmp");
    let r = a
        .exec(&at, &exec_req(&["cat", "/tmp/hello.txt"]))
        .await
        .expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (0, "from the files API"),
        "{}",
        r.stderr
    );
    let r = a
        .exec(&at, &sh("echo from exec > /tmp/back.txt; mkdir -p /work; echo w > /work/w.txt; ls -ld /tmp | cut -c1-10"))
        .await
        .expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (0, "drwxrwxrwt\n"),
        "{}",
        r.stderr
    );
    assert_eq!(
        read_all(&a, &at, "/tmp/back.txt").await.expect("read"),
        b"from exec\n"
    );
    assert_eq!(
        read_all(&a, &at, "/work/w.txt").await.expect("read"),
        b"w\n"
    );
    // A later command still sees the first one's /tmp: it is not a fresh tmpfs per exec.
    let r = a
        .exec(&at, &exec_req(&["cat", "/tmp/back.txt"]))
        .await
        .expect("exec");
    assert_eq!(r.stdout, "from exec\n");
}

/// Host directories a command sees read-only are read-only to the files API too, and read
/// the same.
#[tokio::test]
async fn read_only_host_mounts_are_refused_for_writes_and_read_as_commands_see_them() {
    let (_root, a, at) = isolated_sandbox().await;
    for path in [
        "/usr/local/x.txt",
        "/etc/x.conf",
        "/bin/x",
        "/proc/x",
        "/dev/x",
    ] {
        let e = a
            .upload(&at, path, None, body_of(b"x"))
            .await
            .expect_err(path);
        assert!(
            matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::ReadOnly && p.path == path),
            "{path}: {e:?}"
        );
        let e = a.delete_file(&at, path).await.expect_err(path);
        assert!(matches!(&e, AdapterError::BadPath(_)), "{path}: {e:?}");
    }
    assert!(!std::path::Path::new("/etc/x.conf").exists());
    let r = a
        .exec(&at, &exec_req(&["cat", "/etc/os-release"]))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 0, "{}", r.stderr);
    let via_files = read_all(&a, &at, "/etc/os-release")
        .await
        .expect("read /etc");
    assert_eq!(String::from_utf8_lossy(&via_files), r.stdout);
    let listed = a.list_files(&at, "/usr", 1).await.expect("list /usr");
    assert!(listed.iter().any(|e| e.path == "/usr/bin"), "{listed:?}");
}

/// A missing program is 127 as a shell reports it, in words that do not name bubblewrap;
/// one that cannot be run is 126.
#[tokio::test]
async fn a_missing_program_is_127_without_the_wrapper_under_bwrap() {
    let (_root, a, at) = isolated_sandbox().await;
    let r = a
        .exec(&at, &exec_req(&["no-such-binary-xyz"]))
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 127, "{}", r.stderr);
    assert!(
        r.stderr.contains("no-such-binary-xyz: command not found"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("bwrap"), "{}", r.stderr);
    a.upload(
        &at,
        "/work/script.sh",
        Some(0o644),
        body_of(b"#!/bin/sh\necho no\n"),
    )
    .await
    .expect("upload");
    let mut req = exec_req(&["./script.sh"]);
    req.cwd = Some("/work".into());
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!(r.exit_code, 126, "{}", r.stderr);
    assert!(!r.stderr.contains("bwrap"), "{}", r.stderr);
    // Programs from the host's PATH and from the sandbox itself still run.
    a.upload(
        &at,
        "/work/ok.sh",
        Some(0o755),
        body_of(b"#!/bin/sh\necho yes\n"),
    )
    .await
    .expect("upload");
    req.command = vec!["/work/ok.sh".into()];
    let r = a.exec(&at, &req).await.expect("exec");
    assert_eq!(
        (r.exit_code, r.stdout.as_str()),
        (0, "yes\n"),
        "{}",
        r.stderr
    );
}

/// Only an explicit `isolation = "none"` runs commands unisolated, and says so.
#[tokio::test]
async fn isolation_none_is_explicit_and_reported() {
    let (_root, a, _at) = sandbox().await;
    assert_eq!(a.isolation(), "none");
    assert_eq!(
        DevhostAdapter::isolation_of(&serde_json::json!({"isolation": "none"})),
        Some("none")
    );
    for settings in [
        serde_json::Value::Null,
        serde_json::json!({"isolation": "auto"}),
        serde_json::json!({"isolation": "bwrap"}),
    ] {
        assert_eq!(
            DevhostAdapter::isolation_of(&settings),
            Some("bwrap"),
            "{settings}"
        );
    }
}

/// An upload onto a directory, or below a file, is the caller's mistake: a path error, not
/// a backend failure to retry.
#[tokio::test]
async fn uploads_onto_a_directory_or_below_a_file_are_path_errors() {
    let (_root, a, at) = sandbox().await;
    a.upload(&at, "/d/f.txt", None, body_of(b"x"))
        .await
        .expect("upload");
    let e = a
        .upload(&at, "/d", None, body_of(b"y"))
        .await
        .expect_err("onto a directory");
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory && p.path == "/d"),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    let e = a
        .upload(&at, "/d/f.txt/g.txt", None, body_of(b"z"))
        .await
        .expect_err("below a file");
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::NotADirectory),
        "{e:?}"
    );
    let e = a
        .download(&at, "/d", None)
        .await
        .err()
        .expect("a directory is not downloaded");
    assert!(
        matches!(&e, AdapterError::BadPath(p) if p.problem == PathProblem::IsADirectory),
        "{e:?}"
    );
    assert_eq!(read_all(&a, &at, "/d/f.txt").await.expect("kept"), b"x");
}

/// A program in the sandbox that keeps swapping a path between a symlink inside and one to a
/// host directory never gets the files API to read or write there: every resolution stays
/// below the sandbox directory, whichever link it meets, and no answer is a retryable error.
#[tokio::test]
async fn a_symlink_swapped_during_file_operations_never_reaches_outside() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (root, a, at) = sandbox().await;
    let dir = a.sandbox_dir(&at.sandbox_id);
    std::fs::create_dir_all(dir.join("inside")).expect("mkdir");
    std::fs::write(dir.join("inside/data"), "inside").expect("write");
    let outside = root.path().join("host-secrets");
    std::fs::create_dir_all(&outside).expect("mkdir");
    std::fs::write(outside.join("data"), "SECRET").expect("write");
    std::fs::write(outside.join("only-outside"), "SECRET").expect("write");
    let before: Vec<_> = std::fs::read_dir(&outside)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();

    // The link exists before the first operation: an upload that ran before the swapper's
    // first rename would otherwise make `race` a real directory, which no rename replaces.
    std::os::unix::fs::symlink("inside", dir.join("race")).expect("link");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (stop, dir, outside) = (stop.clone(), dir.clone(), outside.clone());
        // Absolute and relative ways out, alternated with the way in.
        let depth = dir.components().count();
        let relative_out = format!("{}{}", "../".repeat(depth + 2), outside.display());
        move || {
            let targets = [
                std::path::PathBuf::from("inside"),
                outside.clone(),
                std::path::PathBuf::from("inside"),
                std::path::PathBuf::from(relative_out),
            ];
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for t in &targets {
                    let tmp = dir.join("race.tmp");
                    let _ = std::fs::remove_file(&tmp);
                    if std::os::unix::fs::symlink(t, &tmp).is_ok()
                        && std::fs::rename(&tmp, dir.join("race")).is_ok()
                    {
                        swaps += 1;
                    }
                }
            }
            swaps
        }
    });

    let (mut reads_inside, mut writes_inside) = (0, 0);
    for i in 0..300 {
        match read_all(&a, &at, "/race/data").await {
            Ok(b) => {
                assert_eq!(b, b"inside", "read {i} reached outside the sandbox");
                reads_inside += 1;
            }
            Err(e) => assert!(!e.is_retryable(), "read {i}: {e:?}"),
        }
        let path = format!("/race/up-{i}");
        match a.upload(&at, &path, None, body_of(b"written")).await {
            Ok(()) => writes_inside += 1,
            Err(e) => assert!(!e.is_retryable(), "write {i}: {e:?}"),
        }
        match a.list_files(&at, "/race", 1).await {
            Ok(entries) => assert!(
                !entries.iter().any(|e| e.path.ends_with("only-outside")),
                "list {i} reached outside the sandbox: {entries:?}"
            ),
            Err(e) => assert!(!e.is_retryable(), "list {i}: {e:?}"),
        }
        if let Err(e) = a.delete_file(&at, &format!("/race/up-{}", i / 2)).await {
            assert!(!e.is_retryable(), "delete {i}: {e:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper");
    assert!(swaps > 100, "the link was swapped only {swaps} times");

    let after: Vec<_> = std::fs::read_dir(&outside)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        before.len(),
        after.len(),
        "a file appeared outside: {after:?}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("data")).expect("read"),
        "SECRET"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("only-outside")).expect("read"),
        "SECRET"
    );
    // The race was real: some operations did go through the link inside.
    assert!(
        reads_inside > 0 && writes_inside > 0,
        "reads {reads_inside}, writes {writes_inside}"
    );
}
