//! File operations the HTTP adapters build the same way over their backends' file APIs:
//! cutting a range out of a download answered whole, and a depth-limited listing over an
//! API that lists one directory at a time.

use std::future::Future;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::{AdapterError, ByteRange, ByteStream, FileEntry, FileKind};

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
/// Errors pass through where they come.
pub(crate) fn cut_to_range<S>(body: S, range: Option<ByteRange>) -> ByteStream
where
    S: Stream<Item = Result<Bytes, AdapterError>> + Send + 'static,
{
    let mut pos: u64 = 0;
    body.filter_map(move |chunk| {
        let out = match (chunk, range) {
            (Err(e), _) => Some(Err(e)),
            (Ok(b), None) => Some(Ok(b)),
            (Ok(b), Some(r)) => {
                let start = pos;
                let end = start + b.len() as u64;
                pos = end;
                let lo = r.start.max(start);
                let hi = r.end.map_or(end, |e| (e + 1).min(end));
                (lo < hi).then(|| Ok(b.slice((lo - start) as usize..(hi - start) as usize)))
            }
        };
        futures::future::ready(out)
    })
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
}
