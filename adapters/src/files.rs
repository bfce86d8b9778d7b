//! File operations the HTTP adapters build the same way over their backends' file APIs:
//! reading an upload whole for an API that takes a file in one piece, cutting a range out
//! of a download answered whole, a depth-limited listing over an API that lists one
//! directory at a time, and `mkdir -p` through a command for a backend with no call for it.

use std::future::Future;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::error::PathProblem;
use crate::{Adapter, AdapterError, ByteRange, ByteStream, FileEntry, FileKind, InstanceRef};
use differently_core::exec::ExecRequest;

/// Exit codes of [`make_dir_by_exec`]'s script (never `mkdir`'s or `chmod`'s own).
const DIR_EXISTS: i32 = 17;
const OTHER_EXISTS: i32 = 20;

/// An upload's body read whole, for a backend that takes a file in one piece. More than
/// `limit` bytes is refused, permanently (the same file fails every time), with `too_big`.
pub(crate) async fn read_whole(
    mut body: ByteStream,
    limit: usize,
    too_big: &str,
) -> Result<Vec<u8>, AdapterError> {
    let mut data = Vec::new();
    while let Some(chunk) = body.next().await {
        data.extend_from_slice(&chunk?);
        if data.len() > limit {
            return Err(AdapterError::permanent(too_big));
        }
    }
    Ok(data)
}

/// The file's whole size as a download answer tells it: the total of `Content-Range` on a
/// 206 (its `Content-Length` is the part's), `Content-Length` otherwise.
pub(crate) fn total_size(resp: &reqwest::Response) -> Option<u64> {
    if resp.status() == reqwest::StatusCode::PARTIAL_CONTENT {
        resp.headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit('/').next())
            .and_then(|t| t.trim().parse().ok())
    } else {
        resp.content_length()
    }
}

/// `body`, the whole file, cut down to `range` (inclusive end; `None` passes it as is): for
/// a backend without ranges, or one that answered a `Range` request with the whole file.
/// Errors pass through where they come; reading stops once the range is complete, so the
/// rest of a large file is never fetched.
pub(crate) fn cut_to_range<S>(body: S, range: Option<ByteRange>) -> ByteStream
where
    S: Stream<Item = Result<Bytes, AdapterError>> + Send + 'static,
{
    let Some(r) = range else {
        return body.boxed();
    };
    let end_excl = r.end.map(|e| e.saturating_add(1));
    let body = Box::pin(body);
    futures::stream::unfold((body, 0u64), move |(mut body, pos)| async move {
        if end_excl.is_some_and(|e| pos >= e) {
            return None;
        }
        let chunk = body.next().await?;
        let (piece, pos) = match chunk {
            Err(e) => (Err(e), pos),
            Ok(c) => {
                let len = u64::try_from(c.len()).unwrap_or(u64::MAX);
                let lo = r.start.saturating_sub(pos).min(len);
                let hi = end_excl.map_or(len, |e| e.saturating_sub(pos).min(len));
                let piece = if hi <= lo {
                    Bytes::new()
                } else {
                    c.slice(usize::try_from(lo).unwrap_or(0)..usize::try_from(hi).unwrap_or(0))
                };
                (Ok(piece), pos.saturating_add(len))
            }
        };
        Some((piece, (body, pos)))
    })
    .filter(|c| futures::future::ready(!matches!(c, Ok(b) if b.is_empty())))
    .boxed()
}

/// Lists `path` and, level by level, the directories found, `depth` levels deep (at least
/// one), through `list_dir`, which answers the entries of one directory.
pub(crate) async fn list_levels<F, Fut>(
    path: &str,
    depth: u32,
    mut list_dir: F,
) -> Result<Vec<FileEntry>, AdapterError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<Vec<FileEntry>, AdapterError>>,
{
    let mut out = Vec::new();
    let mut level = vec![path.to_owned()];
    for _ in 0..depth.max(1) {
        let mut next = Vec::new();
        for dir in level {
            for entry in list_dir(dir).await? {
                if entry.kind == FileKind::Dir {
                    next.push(entry.path.clone());
                }
                out.push(entry);
            }
        }
        level = next;
    }
    Ok(out)
}

/// [`Adapter::make_dir`] as one command: `/bin/sh` checks what is at the path, then runs
/// `mkdir -p` and `chmod`. The path and mode go as arguments, never into the script.
pub(crate) async fn make_dir_by_exec<A: Adapter + ?Sized>(
    adapter: &A,
    at: &InstanceRef,
    path: &str,
    mode: Option<u32>,
) -> Result<bool, AdapterError> {
    let script = format!(
        r#"if [ -d "$1" ]; then exit {DIR_EXISTS}; fi; if [ -e "$1" ] || [ -L "$1" ]; then exit {OTHER_EXISTS}; fi; mkdir -p -- "$1" && chmod "$2" -- "$1""#
    );
    let req = ExecRequest {
        command: ["/bin/sh", "-c", &script, "sh", path]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("{:o}", mode.unwrap_or(0o755) & 0o7777)])
            .collect(),
        timeout_seconds: Some(60),
        ..ExecRequest::default()
    };
    let r = adapter.exec(at, &req).await?;
    match r.exit_code {
        0 => Ok(true),
        DIR_EXISTS => Ok(false),
        OTHER_EXISTS => Err(AdapterError::bad_path(path, PathProblem::NotADirectoryHere)),
        _ => Err(mkdir_failed(path, &r.stderr)),
    }
}

/// What `mkdir`'s or `chmod`'s complaint means.
fn mkdir_failed(path: &str, stderr: &str) -> AdapterError {
    let said = stderr.trim();
    if said.contains("Not a directory") {
        AdapterError::bad_path(path, PathProblem::NotADirectory)
    } else if said.contains("Read-only file system") {
        AdapterError::bad_path(path, PathProblem::ReadOnly)
    } else {
        AdapterError::permanent(format!("cannot make directory {path}: {said}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn cut(range: Option<ByteRange>) -> String {
        let chunks = ["hel", "lo w", "orld"].map(|c| Ok(Bytes::from_static(c.as_bytes())));
        let parts: Vec<_> = cut_to_range(futures::stream::iter(chunks), range)
            .collect()
            .await;
        parts
            .into_iter()
            .map(|p| String::from_utf8(p.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_range_is_cut_across_chunks() {
        let r = |start, end| Some(ByteRange { start, end });
        assert_eq!(cut(None).await, "hello world");
        assert_eq!(cut(r(2, Some(7))).await, "llo wo");
        assert_eq!(cut(r(6, None)).await, "world");
        assert_eq!(cut(r(20, None)).await, "");
    }

    #[tokio::test]
    async fn reading_stops_once_the_range_is_complete() {
        let chunks = vec![
            Ok(Bytes::from_static(b"0123")),
            Ok(Bytes::from_static(b"4567")),
            // Never read: the range ended in the chunk before.
            Err(AdapterError::transient("the rest of the file")),
        ];
        let range = Some(ByteRange {
            start: 3,
            end: Some(6),
        });
        let parts: Vec<_> = cut_to_range(futures::stream::iter(chunks), range)
            .collect()
            .await;
        let got: Result<Vec<Bytes>, AdapterError> = parts.into_iter().collect();
        assert_eq!(got.map(|b| b.concat()), Ok(b"3456".to_vec()));
    }
}
