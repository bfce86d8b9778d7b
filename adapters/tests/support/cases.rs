//! Case bodies that are the same against every provider's fake (and, for `files_round_trip`,
//! its live account): each binary's test calls them with its own adapter and fake.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use differently_adapters::registry::{self, AdapterConfigError};
use differently_adapters::{Adapter, AdapterError, ByteRange, ByteStream, Download, InstanceRef};
use differently_core::exec::ExecResult;
use futures::StreamExt;

use super::cmd;

/// An upload body of `parts`, one chunk each.
pub fn body(parts: &[&'static [u8]]) -> ByteStream {
    let v: Vec<Result<Bytes, AdapterError>> =
        parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
    futures::stream::iter(v).boxed()
}

/// An upload body of one chunk.
pub fn one_chunk(bytes: &'static [u8]) -> ByteStream {
    body(&[bytes])
}

/// Every byte of `s`; a failed chunk fails the test.
pub async fn read_all(mut s: ByteStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// Every byte of a download's body.
pub async fn collect(d: Download) -> Vec<u8> {
    read_all(d.body).await
}

/// The field a `Permanent` error names, if any.
pub fn field_of(e: &AdapterError) -> Option<&'static str> {
    match e {
        AdapterError::Permanent(r) => r.field(),
        _ => None,
    }
}

/// The field and message with which the registry refuses `v` as settings of `kind`; the
/// test fails if it accepts them or fails otherwise.
pub fn build_err(kind: &str, v: serde_json::Value) -> (Option<String>, String) {
    match registry::build(kind, &v) {
        Err(AdapterConfigError::InvalidSettings { field, message, .. }) => (field, message),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("accepted {v}"),
    }
}

/// A command past its timeout ends with 124 well before it would have (answered, for the
/// provider's own checks), and a missing working directory is refused naming `cwd`.
pub async fn exec_timeout_is_124_and_a_missing_cwd_names_the_field<A: Adapter + ?Sized>(
    adapter: &A,
    r: &InstanceRef,
) -> ExecResult {
    let mut req = cmd(&["sleep", "5"]);
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let timed_out = adapter.exec(r, &req).await.unwrap();
    assert_eq!(timed_out.exit_code, 124);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let mut req = cmd(&["true"]);
    req.cwd = Some("/nonexistent/dir".into());
    match adapter.exec(r, &req).await.unwrap_err() {
        AdapterError::Permanent(r) => assert_eq!(r.field(), Some("cwd")),
        e => panic!("{e:?}"),
    }
    timed_out
}

/// A command sees the sandbox's environment with the request's added, runs in the request's
/// directory, and its stdout, stderr and exit code (`exit`) come back apart.
pub async fn exec_sees_env_and_cwd<A: Adapter + ?Sized>(adapter: &A, r: &InstanceRef, exit: i32) {
    let dir = tempfile::tempdir().unwrap();
    let script = format!("echo out:$SANDBOX_VAR:$X; echo err >&2; pwd; exit {exit}");
    let mut req = cmd(&["bash", "-c", &script]);
    req.env = BTreeMap::from([("X".to_owned(), "from-exec".to_owned())]);
    req.cwd = Some(dir.path().display().to_string());
    let res = adapter.exec(r, &req).await.unwrap();
    assert_eq!(res.exit_code, exit);
    assert_eq!(
        res.stdout,
        format!("out:from-create:from-exec\n{}\n", dir.path().display())
    );
    assert_eq!(res.stderr, "err\n");
}

/// With the fake set to cut its output stream short, an exec is a `Transient` error saying
/// the stream was truncated, never an exit code.
pub async fn a_truncated_stream_is_transient<A: Adapter + ?Sized>(adapter: &A, r: &InstanceRef) {
    let e = adapter
        .exec(
            r,
            &cmd(&["bash", "-c", "echo a; sleep 0.1; echo b; sleep 0.1; echo c"]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AdapterError::Transient(m) if m.contains("truncated")),
        "{e:?}"
    );
}

/// An exec stream whose reader stops reading ends at the command's deadline (exit 124) and
/// the command is killed: `running_commands` is the fake's count of commands still running.
pub async fn a_stalled_reader_does_not_outlast_the_deadline<A: Adapter + ?Sized>(
    adapter: &A,
    r: &InstanceRef,
    running_commands: impl Fn() -> usize,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut req = cmd(&["yes"]);
    req.timeout_seconds = Some(1);
    let started = Instant::now();
    let exit = adapter.exec_stream(r, &req, tx).await.unwrap();
    assert_eq!(exit.exit_code, 124);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(rx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(running_commands(), 0, "the command was killed");
}

/// Upload with a mode, a ranged download, a listing that shows size and mode, a delete, and
/// a download of the deleted file that is `PathNotFound`; files go under `dir`.
pub async fn files_round_trip<A: Adapter + ?Sized>(a: &A, r: &InstanceRef, dir: &str) {
    let path = format!("{dir}/differently-live/hello.txt");
    let body: differently_adapters::ByteStream =
        futures::stream::iter(vec![Ok(Bytes::from_static(b"hello world"))]).boxed();
    a.upload(r, &path, Some(0o640), body).await.expect("upload");
    let d = a
        .download(
            r,
            &path,
            Some(ByteRange {
                start: 6,
                end: None,
            }),
        )
        .await
        .expect("download");
    let got: Vec<u8> = d.body.map(|c| c.expect("chunk").to_vec()).concat().await;
    assert_eq!(got, b"world");
    let listed = a
        .list_files(r, &format!("{dir}/differently-live"), 1)
        .await
        .expect("list files");
    let e = listed.iter().find(|e| e.path == path).expect("listed");
    assert_eq!((e.size, e.mode), (11, 0o640));
    a.delete_file(r, &path).await.expect("delete file");
    assert!(matches!(
        a.download(r, &path, None).await.err(),
        Some(AdapterError::PathNotFound(_))
    ));
}
