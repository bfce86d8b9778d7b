//! The devhost adapter under bubblewrap: its own namespaces, `/tmp` and `/` shared by the files
//! API and commands, read-only host mounts, a missing program, and `isolation = "none"` said
//! out loud.

use differently_adapters::devhost::{DevhostAdapter, IsolationMode};
use differently_adapters::{Adapter, AdapterError, InstanceRef, PathProblem};

use crate::exec_req;

use super::{body_of, read_all, sandbox, sh};

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
    super::sandbox_with(IsolationMode::Auto).await
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
