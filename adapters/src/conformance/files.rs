//! Files: upload and download, ranges, listing, making directories, a missing file, delete.

use bytes::Bytes;
use futures::StreamExt;

use super::support::{expect_eq, expect_kind, kind, read_all, Ctx};
use crate::{AdapterError, ByteRange};

/// The file the checks write, in a directory of its own, with content that is not text.
pub(super) struct Sample {
    pub(super) dir: String,
    pub(super) path: String,
    pub(super) content: Vec<u8>,
}

impl Sample {
    pub(super) fn new(cx: &Ctx<'_>) -> Self {
        let dir = format!("/tmp/conformance-{}", cx.id.as_str().to_ascii_lowercase());
        let path = format!("{dir}/data.bin");
        let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        Sample { dir, path, content }
    }
}

/// 100,000 binary bytes uploaded in chunks download unchanged.
pub(super) async fn upload_download(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let chunks: Vec<Result<Bytes, AdapterError>> = f
        .content
        .chunks(30_000)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    a.upload(
        at,
        &f.path,
        Some(0o640),
        futures::stream::iter(chunks).boxed(),
    )
    .await
    .map_err(|e| format!("upload: {} ({e})", kind(&e)))?;
    let (total, back) = read_all(a, at, &f.path, None)
        .await
        .map_err(|e| format!("download: {} ({e})", kind(&e)))?;
    if back != f.content {
        return Err(format!(
            "downloaded {} bytes that are not the {} uploaded",
            back.len(),
            f.content.len()
        ));
    }
    if let Some(t) = total {
        expect_eq("total size", f.content.len() as u64, t)?;
    }
    Ok(format!("{} binary bytes both ways", f.content.len()))
}

/// Byte ranges, bounded and open-ended.
pub(super) async fn range(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let (_, part) = read_all(
        a,
        at,
        &f.path,
        Some(ByteRange {
            start: 10,
            end: Some(19),
        }),
    )
    .await
    .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("bytes 10-19", &f.content[10..20], part.as_slice())?;
    let (_, tail) = read_all(
        a,
        at,
        &f.path,
        Some(ByteRange {
            start: 99_990,
            end: None,
        }),
    )
    .await
    .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_eq("bytes 99990-", &f.content[99_990..], tail.as_slice())?;
    Ok("ranges 10-19 and 99990-".to_owned())
}

/// A listing gives path, type, size and mode.
pub(super) async fn list(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let entries = a
        .list_files(at, &f.dir, 1)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    let e = entries
        .iter()
        .find(|e| e.path == f.path)
        .ok_or_else(|| format!("listing {} lacks {}: {entries:?}", f.dir, f.path))?;
    expect_eq("type", crate::FileKind::File, e.kind)?;
    expect_eq("size", f.content.len() as u64, e.size)?;
    expect_eq("mode", 0o640, e.mode & 0o777)?;
    Ok("path, type, size and mode".to_owned())
}

/// `make_dir` makes a directory and its parents with the mode asked (`true`), finds it there
/// the second time (`false`), and refuses a path where a file is (`bad_path`).
pub(super) async fn make_dir(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    let parent = format!("{}/made", f.dir);
    let dir = format!("{parent}/deeper");
    let made = a
        .make_dir(at, &dir, Some(0o750))
        .await
        .map_err(|e| format!("make {dir}: {} ({e})", kind(&e)))?;
    expect_eq("made (first time)", true, made)?;
    let again = a
        .make_dir(at, &dir, Some(0o700))
        .await
        .map_err(|e| format!("make {dir} again: {} ({e})", kind(&e)))?;
    expect_eq("made (second time)", false, again)?;
    let entries = a
        .list_files(at, &parent, 1)
        .await
        .map_err(|e| format!("list {parent}: {} ({e})", kind(&e)))?;
    let e = entries
        .iter()
        .find(|e| e.path == dir)
        .ok_or_else(|| format!("listing {parent} lacks {dir}: {entries:?}"))?;
    expect_eq("type", crate::FileKind::Dir, e.kind)?;
    expect_eq("mode (the first call's, kept)", 0o750, e.mode & 0o777)?;
    expect_kind(
        "a directory where a file is",
        "bad_path",
        a.make_dir(at, &f.path, None).await,
    )?;
    Ok("made with parents and mode, found again, a file in the way refused".to_owned())
}

/// A missing file is `path_not_found`.
pub(super) async fn not_found(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    expect_kind(
        "download of a missing file",
        "path_not_found",
        read_all(a, at, &format!("{}/missing", f.dir), None)
            .await
            .map(|(_, b)| b.len()),
    )
}

/// A deleted file reads as `path_not_found`.
pub(super) async fn delete(cx: &Ctx<'_>, f: &Sample) -> Result<String, String> {
    let a = cx.a;
    let at = &cx.at;
    a.delete_file(at, &f.path)
        .await
        .map_err(|e| format!("{} ({e})", kind(&e)))?;
    expect_kind(
        "download after delete",
        "path_not_found",
        read_all(a, at, &f.path, None).await.map(|(_, b)| b.len()),
    )?;
    Ok("deleted; reads as path_not_found".to_owned())
}
