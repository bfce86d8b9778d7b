//! Files below a base directory on this host, for the adapters whose sandboxes are local
//! directories (devhost, fake). Paths are sandbox-absolute (`/a/b`); `..` is refused, and so is
//! a path whose existing part resolves (through symlinks) outside the base.

use std::io;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::Reason;
use crate::{AdapterError, ByteRange, ByteStream, Download, FileEntry};

/// Name of the tag file at the top of each sandbox directory: reserved (not writable) and
/// hidden from listings, because the adapter keeps its own record there.
pub const TAG_FILE: &str = ".differently.json";

/// Size of one read of a download body.
const CHUNK: usize = 64 * 1024;

/// A host I/O failure as an adapter error. (The `devhost:` prefix is the message both local
/// adapters have always given.)
pub(crate) fn io_err(what: &str, e: io::Error) -> AdapterError {
    AdapterError::Transient(Reason::caused_by(format!("devhost: {what}: {e}"), e))
}

/// Maps a sandbox-absolute path to a host path below `base`.
pub(crate) fn resolve(base: &Path, path: &str) -> Result<PathBuf, AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::permanent(format!(
            "path {path:?} must be absolute"
        )));
    }
    let mut out = base.to_path_buf();
    let mut depth = 0;
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => {
                if depth == 0 && part == TAG_FILE {
                    return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
                }
                depth += 1;
                out.push(part);
            }
            Component::ParentDir | Component::Prefix(_) => {
                return Err(AdapterError::permanent(
                    "paths may not contain `..`".to_owned(),
                ))
            }
        }
    }
    Ok(out)
}

/// Refuses `p` if its deepest existing ancestor resolves outside `base`.
pub(crate) async fn check_inside(base: &Path, p: &Path) -> Result<(), AdapterError> {
    let base = tokio::fs::canonicalize(base)
        .await
        .map_err(|e| io_err("resolve sandbox", e))?;
    let mut probe = p.to_path_buf();
    loop {
        match tokio::fs::canonicalize(&probe).await {
            Ok(real) => {
                return if real.starts_with(&base) {
                    Ok(())
                } else {
                    Err(AdapterError::permanent(
                        "path leaves the sandbox through a symlink".to_owned(),
                    ))
                };
            }
            Err(_) => {
                if !probe.pop() {
                    return Ok(());
                }
            }
        }
    }
}

fn not_found(path: &str, e: io::Error) -> AdapterError {
    if e.kind() == io::ErrorKind::NotFound {
        AdapterError::PathNotFound(path.to_owned())
    } else {
        io_err(path, e)
    }
}

/// Streams `body` into `path` (through a temporary file renamed at the end, so a reader
/// never sees half a file), creating parent directories.
pub(crate) async fn upload(
    base: &Path,
    path: &str,
    mode: Option<u32>,
    mut body: ByteStream,
) -> Result<(), AdapterError> {
    let target = resolve(base, path)?;
    if target == base {
        return Err(AdapterError::permanent("cannot write to /"));
    }
    check_inside(base, &target).await?;
    let parent = target
        .parent()
        .ok_or_else(|| AdapterError::permanent("no parent directory"))?;
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| io_err("create parent directories", e))?;
    check_inside(base, parent).await?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{name}.upload-{}", ulid_like()));
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| io_err("create file", e))?;
    let written = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk?;
            file.write_all(&chunk)
                .await
                .map_err(|e| io_err("write file", e))?;
        }
        file.flush().await.map_err(|e| io_err("write file", e))?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o7777))
                .await
                .map_err(|e| io_err("chmod", e))?;
        }
        tokio::fs::rename(&tmp, &target)
            .await
            .map_err(|e| io_err("rename upload", e))
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    written
}

/// A unique-enough suffix for temporary files.
fn ulid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )
}

/// Reads `path`, optionally a range of it (clamped to the file; a start past the end
/// gives an empty body, and the caller compares with `total_size`).
pub(crate) async fn download(
    base: &Path,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, AdapterError> {
    let target = resolve(base, path)?;
    check_inside(base, &target).await?;
    let meta = tokio::fs::metadata(&target)
        .await
        .map_err(|e| not_found(path, e))?;
    if meta.is_dir() {
        return Err(AdapterError::permanent(format!("{path} is a directory")));
    }
    let size = meta.len();
    let (start, end) = match range {
        None => (0, size),
        Some(r) => (
            r.start.min(size),
            r.end.map_or(size, |e| e.saturating_add(1).min(size)),
        ),
    };
    let mut file = tokio::fs::File::open(&target)
        .await
        .map_err(|e| not_found(path, e))?;
    use tokio::io::AsyncSeekExt;
    file.seek(io::SeekFrom::Start(start))
        .await
        .map_err(|e| io_err("seek", e))?;
    let left = end.saturating_sub(start);
    let body = futures::stream::unfold((file, left), |(mut file, left)| async move {
        if left == 0 {
            return None;
        }
        let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        let mut buf = vec![0u8; want];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), (file, left - n as u64)))
            }
            Err(e) => Some((Err(io_err("read file", e)), (file, 0))),
        }
    });
    Ok(Download {
        total_size: Some(size),
        body: body.boxed(),
    })
}

/// Lists `path` to `depth` levels (1: its direct children). The tag file is hidden.
pub(crate) async fn list(
    base: &Path,
    path: &str,
    depth: u32,
) -> Result<Vec<FileEntry>, AdapterError> {
    let target = resolve(base, path)?;
    check_inside(base, &target).await?;
    let meta = tokio::fs::metadata(&target)
        .await
        .map_err(|e| not_found(path, e))?;
    if !meta.is_dir() {
        return Ok(vec![entry_of(path.to_owned(), &meta)]);
    }
    let mut out = Vec::new();
    let mut todo = vec![(target, path.trim_end_matches('/').to_owned(), 1u32)];
    while let Some((dir, shown, level)) = todo.pop() {
        let mut rd = tokio::fs::read_dir(&dir)
            .await
            .map_err(|e| not_found(path, e))?;
        while let Some(e) = rd.next_entry().await.map_err(|e| io_err("list", e))? {
            let name = e.file_name().to_string_lossy().into_owned();
            if shown.is_empty() && name == TAG_FILE {
                continue;
            }
            let meta = match tokio::fs::symlink_metadata(e.path()).await {
                Ok(m) => m,
                Err(_) => continue,
            };
            let child = format!("{shown}/{name}");
            if meta.is_dir() && level < depth {
                todo.push((e.path(), child.clone(), level + 1));
            }
            out.push(entry_of(child, &meta));
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn entry_of(path: String, meta: &std::fs::Metadata) -> FileEntry {
    use std::os::unix::fs::PermissionsExt;
    let kind = if meta.is_dir() {
        crate::FileKind::Dir
    } else if meta.is_symlink() {
        crate::FileKind::Symlink
    } else if meta.is_file() {
        crate::FileKind::File
    } else {
        crate::FileKind::Other
    };
    FileEntry {
        path,
        kind,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        modified_at: meta.modified().ok().map(DateTime::<Utc>::from),
    }
}

/// Removes a file or an empty directory.
pub(crate) async fn delete(base: &Path, path: &str) -> Result<(), AdapterError> {
    let target = resolve(base, path)?;
    if target == base {
        return Err(AdapterError::permanent("refusing to delete /"));
    }
    check_inside(base, target.parent().unwrap_or(base)).await?;
    let meta = tokio::fs::symlink_metadata(&target)
        .await
        .map_err(|e| not_found(path, e))?;
    let res = if meta.is_dir() {
        tokio::fs::remove_dir(&target).await
    } else {
        tokio::fs::remove_file(&target).await
    };
    res.map_err(|e| match e.kind() {
        io::ErrorKind::DirectoryNotEmpty => {
            AdapterError::permanent(format!("{path} is a directory that is not empty"))
        }
        _ => not_found(path, e),
    })
}

/// Copies a directory tree (files, directories, symlinks), for the fake's snapshots.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let ty = e.file_type()?;
        let dest = to.join(e.file_name());
        if ty.is_dir() {
            copy_tree(&e.path(), &dest)?;
        } else if ty.is_symlink() {
            let link = std::fs::read_link(e.path())?;
            let _ = std::fs::remove_file(&dest);
            std::os::unix::fs::symlink(link, dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn an_io_failure_keeps_its_cause() {
        let e = io_err("read tag", io::Error::other("disk on fire"));
        assert_eq!(
            e.to_string(),
            "backend transient error: devhost: read tag: disk on fire"
        );
        let cause = e.source().and_then(|r| r.source()).map(|c| c.to_string());
        assert_eq!(cause.as_deref(), Some("disk on fire"));
    }
}
