use super::*;

#[test]
fn cwd_is_relative_to_the_sandbox_and_refuses_parent() {
    let base = Path::new("/r/sbx");
    assert_eq!(resolve_cwd(base, None).ok(), Some(base.to_path_buf()));
    assert_eq!(resolve_cwd(base, Some("/")).ok(), Some(base.to_path_buf()));
    assert_eq!(
        resolve_cwd(base, Some("/a/./b")).ok(),
        Some(base.join("a").join("b"))
    );
    assert!(matches!(
        resolve_cwd(base, Some("/a/../../etc")),
        Err(AdapterError::Permanent(_))
    ));
}

#[test]
fn file_paths_are_absolute_without_parent_or_tag() {
    assert_eq!(
        local_fs::components("/a//b.txt").ok(),
        Some(vec!["a".to_owned(), "b.txt".to_owned()])
    );
    for bad in [
        "a/b",
        "/a/../../x",
        "/../etc/passwd",
        "/.differently.json",
        "/a\0b",
    ] {
        assert!(
            matches!(local_fs::components(bad), Err(AdapterError::Permanent(_))),
            "{bad:?}"
        );
    }
}

/// Without `bwrap` on `PATH` and isolation not explicitly `none`, commands are refused
/// with the package to install; they never run unisolated, and the files API serves the
/// sandbox as an isolated command would see it.
#[tokio::test]
async fn missing_bubblewrap_refuses_commands_naming_the_package() {
    let root = tempfile::tempdir().expect("tempdir");
    let a = DevhostAdapter {
        config: DevhostConfig {
            root: root.path().to_path_buf(),
            isolation: IsolationMode::Auto,
        },
        runner: Runner::MissingBwrap,
        setsid: which("setsid"),
        default_signals: None,
    };
    assert_eq!(a.isolation(), "bwrap");
    assert!(!a.capabilities().iter().any(|c| c == "ports.expose"));
    let sbx = SandboxId::new();
    let req = CreateInstance {
        sandbox_id: sbx.clone(),
        installation_id: InstallationId::new(),
        template: None,
        resources: differently_core::Resources::DEFAULT,
        env: BTreeMap::new(),
        ttl_seconds: 60,
        from_snapshot: None,
    };
    a.create(&req).await.expect("create");
    let at = InstanceRef {
        sandbox_id: sbx,
        backend_ref: String::new(),
    };
    let exec = ExecRequest {
        command: vec!["touch".into(), "/tmp/ran".into()],
        ..ExecRequest::default()
    };
    let e = a.exec(&at, &exec).await.expect_err("refused");
    assert!(
        matches!(&e, AdapterError::Unsupported(m) if m.contains("`bubblewrap`") && m.contains("isolation = \"none\"")),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    let (tx, _rx) = mpsc::channel(1);
    let (_in_tx, in_rx) = mpsc::channel(1);
    let pty = PtyRequest {
        command: vec!["sh".into()],
        env: BTreeMap::new(),
        cwd: None,
        size: crate::PtySize { cols: 80, rows: 24 },
    };
    if a.setsid.is_some() {
        assert!(matches!(
            a.pty(&at, &pty, in_rx, tx).await,
            Err(AdapterError::Unsupported(m)) if m.contains("bubblewrap")
        ));
    }
    use futures::StreamExt;
    let body = futures::stream::iter(vec![Ok(Bytes::from_static(b"x"))]).boxed();
    assert!(matches!(
        a.upload(&at, "/usr/x", None, body).await,
        Err(AdapterError::BadPath(p)) if p.problem == PathProblem::ReadOnly
    ));
    // `mkdir -p` of a read-only host directory finds it there; a new one under it is refused.
    assert_eq!(a.make_dir(&at, "/usr", None).await, Ok(false));
    assert!(matches!(
        a.make_dir(&at, "/usr/differently-new-dir", None).await,
        Err(AdapterError::BadPath(p)) if p.problem == PathProblem::ReadOnly
    ));
    assert_eq!(a.make_dir(&at, "/work/made", Some(0o700)).await, Ok(true));
    assert_eq!(a.make_dir(&at, "/work/made", None).await, Ok(false));
}

#[test]
fn bwrap_unshares_everything_and_binds_the_sandbox_as_root() {
    let a = bwrap_args(Path::new("/r/sbx"), "/work");
    let s = a.join(" ");
    assert!(s.starts_with("--bind /r/sbx /"), "{s}");
    assert!(s.contains("--unshare-all"));
    assert!(s.contains("--ro-bind-try /usr /usr"));
    assert!(s.ends_with("--chdir /work"));
    // `/tmp` is the sandbox directory's own, the one the files API writes.
    assert!(!s.contains("--tmpfs"), "{s}");
}
