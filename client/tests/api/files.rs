//! `make_dir` (`POST …/files/directories`) against `differently dev`: made with its parents
//! and the mode asked for, made again as already there, and refused where a file stands.

use super::*;

/// The permission bits of the entry at `path`, read from its parent's listing (a listing of
/// the directory itself shows only what is in it).
async fn mode_of(c: &Client, id: &str, path: &str) -> u32 {
    let parent = path.rsplit_once('/').map(|(p, _)| p).unwrap_or("/");
    let parent = if parent.is_empty() { "/" } else { parent };
    let entries = c
        .list_files(id, parent, Some(1))
        .await
        .expect("list parent");
    let entry = entries
        .iter()
        .find(|e| e.path == path)
        .unwrap_or_else(|| panic!("{path} not listed in {parent}: {entries:?}"));
    assert!(entry.is_dir(), "{entry:?}");
    entry.mode & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_dir_makes_parents_reports_existing_and_refuses_files() {
    let dev = Dev::start();
    let c = dev.client();
    let id = running(&c, &CreateSandbox::default()).await;

    // Made with its missing parents: the directory with the mode asked for, parents 755.
    let made = c
        .make_dir(&id, "/work/mk/a/b", Some(0o750))
        .await
        .expect("make_dir");
    assert_eq!((made.path.as_str(), made.created), ("/work/mk/a/b", true));
    assert_eq!(mode_of(&c, &id, "/work/mk/a/b").await, 0o750);
    assert_eq!(mode_of(&c, &id, "/work/mk/a").await, 0o755);
    assert!(c
        .list_files(&id, "/work/mk/a/b", Some(1))
        .await
        .expect("list the new directory")
        .is_empty());

    // Already there: not made again, and its mode is left alone.
    let again = c
        .make_dir(&id, "/work/mk/a/b", Some(0o700))
        .await
        .expect("make_dir again");
    assert_eq!(
        (again.path.as_str(), again.created),
        ("/work/mk/a/b", false)
    );
    assert_eq!(mode_of(&c, &id, "/work/mk/a/b").await, 0o750);

    // Without a mode: 755.
    let plain = c
        .make_dir(&id, "/work/mk/plain", None)
        .await
        .expect("make_dir default mode");
    assert!(plain.created);
    assert_eq!(mode_of(&c, &id, "/work/mk/plain").await, 0o755);

    // A file at the path, or among its parents: 409 conflict, saying which.
    c.upload(&id, "/work/mk/f.txt", b"x".to_vec(), None)
        .await
        .expect("upload");
    for (path, reason) in [
        ("/work/mk/f.txt", "exists_not_directory"),
        ("/work/mk/f.txt/sub", "not_a_directory"),
    ] {
        let e = c.make_dir(&id, path, None).await.expect_err(path);
        let api = e.api().unwrap_or_else(|| panic!("{path}: {e}"));
        assert_eq!(
            (api.status, api.code.as_str(), &api.details["reason"]),
            (409, "conflict", &serde_json::json!(reason)),
            "{path}: {e}"
        );
    }
    assert_eq!(
        &c.download(&id, "/work/mk/f.txt").await.expect("file kept")[..],
        b"x"
    );

    // Bad input: a relative path is refused before sending, a mode past 7777 by the API.
    let e = c
        .make_dir(&id, "relative", None)
        .await
        .expect_err("relative");
    assert!(
        matches!(&e, Error::Invalid { field, .. } if field == "path"),
        "{e}"
    );
    let e = c
        .make_dir(&id, "/work/mk/bad", Some(0o17777))
        .await
        .expect_err("mode");
    let api = e.api().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(
        (api.status, api.field.as_deref()),
        (400, Some("mode")),
        "{e}"
    );
    assert_eq!(c.stat(&id, "/work/mk/bad").await.expect("stat bad"), None);

    // A sandbox that does not exist: 404.
    let e = c
        .make_dir("sbx_00000000000000000000000000", "/work/x", None)
        .await
        .expect_err("unknown sandbox");
    assert_eq!(e.status(), Some(404), "{e}");
}
