//! Files through execd: upload, download (ranges), listing and deletion, and the real
//! execd's metadata part.

use differently_adapters::{Adapter, AdapterError, ByteRange, FileKind};
use serde_json::json;

use crate::fake_server::{FakeRuntime, Variant};
use crate::support::cases::{body, collect};
use crate::{running, setup, KEY};

use super::BOTH;

#[tokio::test]
async fn files_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    for variant in BOTH {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let file = format!("{root}/{variant:?}/sub/data.bin");
        s.adapter
            .upload(
                &r,
                &file,
                Some(0o640),
                body(&[b"\x00\x01binary", b"\xff rest\n"]),
            )
            .await
            .unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"\x00\x01binary\xff rest\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o640
        );
        s.adapter
            .upload(
                &r,
                &format!("{root}/{variant:?}/plain.txt"),
                None,
                body(&[b"hi"]),
            )
            .await
            .unwrap();
        let mode = std::fs::metadata(format!("{root}/{variant:?}/plain.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "not execd's default 755");

        let d = s.adapter.download(&r, &file, None).await.unwrap();
        assert_eq!(d.total_size, Some(15));
        assert_eq!(collect(d).await, b"\x00\x01binary\xff rest\n");
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 2,
                    end: Some(7),
                }),
            )
            .await
            .unwrap();
        assert_eq!(d.total_size, Some(15));
        assert_eq!(collect(d).await, b"binary");
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 8,
                    end: None,
                }),
            )
            .await
            .unwrap();
        assert_eq!(collect(d).await, b"\xff rest\n");
        s.fake.knobs().ignore_range = true;
        let d = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 2,
                    end: Some(7),
                }),
            )
            .await
            .unwrap();
        assert_eq!(
            collect(d).await,
            b"binary",
            "cut client-side when the server ignores Range"
        );
        s.fake.knobs().ignore_range = false;
        let e = s
            .adapter
            .download(
                &r,
                &file,
                Some(ByteRange {
                    start: 99,
                    end: None,
                }),
            )
            .await
            .err()
            .unwrap();
        assert!(matches!(e, AdapterError::Permanent(_)), "416: {e:?}");
        let e = s
            .adapter
            .download(&r, &format!("{root}/nope"), None)
            .await
            .err()
            .unwrap();
        // Real execd answers 404 FILE_NOT_FOUND: the path is missing, the sandbox is not.
        let nope = format!("{root}/nope");
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "PathNotFound, not NotFound or Permanent: {e:?}"
        );
        let e = s.adapter.list_files(&r, &nope, 1).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "list: {e:?}"
        );
        let e = s.adapter.delete_file(&r, &nope).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::PathNotFound(p) if p == &nope),
            "delete: {e:?}"
        );
        assert!(matches!(
            s.adapter.download(&r, "relative", None).await,
            Err(AdapterError::Permanent(_))
        ));

        let base = format!("{root}/{variant:?}");
        let entries = s.adapter.list_files(&r, &base, 2).await.unwrap();
        let names: Vec<(&str, FileKind)> =
            entries.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            names,
            [
                (format!("{base}/plain.txt").as_str(), FileKind::File),
                (format!("{base}/sub").as_str(), FileKind::Dir),
                (file.as_str(), FileKind::File),
            ]
        );
        assert_eq!(entries[2].mode, 0o640);
        assert_eq!(entries[2].size, 15);
        assert!(entries[2].modified_at.is_some());

        let e = s
            .adapter
            .delete_file(&r, &format!("{base}/sub"))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AdapterError::Permanent(m) if m.contains("not empty")),
            "{e:?}"
        );
        s.adapter.delete_file(&r, &file).await.unwrap();
        assert!(!std::path::Path::new(&file).exists());
        s.adapter
            .delete_file(&r, &format!("{base}/sub"))
            .await
            .unwrap();
        assert!(!std::path::Path::new(&format!("{base}/sub")).exists());
    }
}

#[tokio::test]
async fn the_metadata_part_must_be_a_file_part_on_the_real_execd() {
    for (variant, status) in [(Variant::Real, 400), (Variant::Spec, 200)] {
        let s = setup(variant, FakeRuntime::Docker, json!({})).await;
        let r = running(&s).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.txt");
        let meta = json!({"path": path}).to_string();
        let b = "XyZ";
        let form = format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"metadata\"\r\n\r\n{meta}\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\nhello\r\n--{b}--\r\n"
        );
        let url = format!(
            "{}/sandboxes/{}/proxy/44772/files/upload",
            s.fake.api_url(),
            r.backend_ref
        );
        let resp = reqwest::Client::new()
            .post(url)
            .header("content-type", format!("multipart/form-data; boundary={b}"))
            .header("OPEN-SANDBOX-API-KEY", KEY)
            .body(form)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{variant:?}");
    }
}

/// `make_dir` on execd as a real 1.1 answered it: a new directory with its mode (parents
/// 755), the same path again left alone, a symlink to a directory found (execd's `/files/info`
/// is an `lstat`, its `POST` leaves the link alone), and what is in the way refused by kind:
/// a file, a symlink to a file or to nothing, a file among the parents. Mode 0 (which execd
/// would not apply) is refused before anything is sent.
#[tokio::test]
async fn directories_are_made_as_execd_makes_them() {
    use differently_adapters::PathProblem;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_owned();
    let s = setup(Variant::Real, FakeRuntime::Docker, json!({})).await;
    let r = running(&s).await;
    let mode = |p: &str| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

    let made = format!("{root}/a/b/c");
    assert!(s.adapter.make_dir(&r, &made, Some(0o750)).await.unwrap());
    assert_eq!(mode(&made), 0o750);
    assert_eq!(mode(&format!("{root}/a/b")), 0o755);
    assert!(!s.adapter.make_dir(&r, &made, Some(0o700)).await.unwrap());
    assert_eq!(
        mode(&made),
        0o750,
        "a directory already there keeps its mode"
    );

    let link = format!("{root}/to-dir");
    std::os::unix::fs::symlink(&made, &link).unwrap();
    assert!(!s.adapter.make_dir(&r, &link, None).await.unwrap());

    let file = format!("{root}/f.txt");
    std::fs::write(&file, "x").unwrap();
    let to_file = format!("{root}/to-file");
    std::os::unix::fs::symlink(&file, &to_file).unwrap();
    let dangling = format!("{root}/dangling");
    std::os::unix::fs::symlink(format!("{root}/nothing"), &dangling).unwrap();
    for (path, problem) in [
        (file.clone(), PathProblem::NotADirectoryHere),
        (to_file, PathProblem::NotADirectoryHere),
        (dangling, PathProblem::NotADirectoryHere),
        (format!("{file}/sub/dir"), PathProblem::NotADirectory),
    ] {
        let e = s.adapter.make_dir(&r, &path, None).await.unwrap_err();
        assert!(
            matches!(&e, AdapterError::BadPath(p) if p.problem == problem),
            "{path}: {e:?}"
        );
    }
    assert!(!std::path::Path::new(&format!("{root}/nothing")).exists());
    let e = s
        .adapter
        .make_dir(&r, &format!("{root}/zero"), Some(0))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Permanent(m) if m.field() == Some("mode")),
        "{e:?}"
    );
    assert!(!std::path::Path::new(&format!("{root}/zero")).exists());
}
