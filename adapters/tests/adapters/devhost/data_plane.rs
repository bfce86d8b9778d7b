//! The devhost adapter's data plane and lifecycle beyond exec: streamed exec and its
//! cancellation, the sandbox's env under the request's, pause and resume, files (ranges,
//! traversal, uploads onto a directory, symlinks swapped under the files API) and snapshots.

use std::time::{Duration, Instant};

use differently_adapters::devhost::{DevhostAdapter, DevhostConfig, IsolationMode};
use differently_adapters::{Adapter, AdapterError, InstanceRef, PathProblem};
use differently_core::ids::InstallationId;
use differently_core::SandboxId;

use crate::{create_req, exec_req};

use super::{body_of, process_gone, read_all, sandbox, sh};

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
