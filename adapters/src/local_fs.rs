//! Files below a base directory on this host, for the adapters whose sandboxes are local
//! directories (devhost, fake). Paths are sandbox-absolute (`/a/b`); `..` is refused.
//!
//! The base is the sandbox's `/`, and programs in the sandbox may change what is below it at
//! any moment (swap a directory for a symlink to a host path between a check and a use), so
//! no path is checked and then used by name: every operation resolves its path from a
//! descriptor of the base with `openat2(RESOLVE_IN_ROOT)`, which follows symlinks as if the
//! base were `/` (an absolute link target, or `..` above the base, stays inside it, as it
//! does for a command under bubblewrap), then works on the directory descriptor it got
//! (`mkdirat`, `openat(O_EXCL|O_NOFOLLOW)`, `renameat`, `unlinkat`). A swap can change which
//! file inside the sandbox is used, never reach one outside it.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{PathProblem, Reason};
use crate::{AdapterError, ByteRange, ByteStream, Download, FileEntry};

/// Name of the tag file at the top of each sandbox directory: reserved (not writable) and
/// hidden from listings, because the adapter keeps its own record there.
pub const TAG_FILE: &str = ".differently.json";

/// Size of one read of a download body.
const CHUNK: usize = 64 * 1024;

/// How often a resolution the kernel asks to retry (`EAGAIN`: a rename raced a `..` walk)
/// is tried before the caller is told.
const RESOLVE_TRIES: usize = 16;

/// A host I/O failure as an adapter error. (The `devhost:` prefix is the message both local
/// adapters have always given.)
pub(crate) fn io_err(what: &str, e: io::Error) -> AdapterError {
    AdapterError::Transient(Reason::caused_by(format!("devhost: {what}: {e}"), e))
}

/// A failure of a file operation on sandbox path `path`, as what it means to the caller: a
/// missing path, a path the filesystem refuses (4xx), or a host failure (retryable).
fn fs_err(path: &str, what: &str, e: Errno) -> AdapterError {
    match e {
        Errno::NOENT => AdapterError::PathNotFound(path.to_owned()),
        Errno::NOTDIR => AdapterError::bad_path(path, PathProblem::NotADirectory),
        Errno::ISDIR => AdapterError::bad_path(path, PathProblem::IsADirectory),
        Errno::ROFS => AdapterError::bad_path(path, PathProblem::ReadOnly),
        // A name over 255 bytes (or a path over 4096): the caller's to shorten, not a
        // backend failure to retry.
        Errno::NAMETOOLONG => name_too_long(path),
        Errno::LOOP => {
            AdapterError::permanent(format!("{path}: too many levels of symbolic links"))
        }
        Errno::AGAIN | Errno::XDEV => AdapterError::permanent(format!(
            "{path}: the path kept changing while it was resolved"
        )),
        Errno::ACCESS | Errno::PERM => {
            AdapterError::permanent(format!("{path}: permission denied"))
        }
        Errno::NOSYS => AdapterError::Unsupported(
            "files (this kernel has no openat2(2); Linux 5.6 or later is needed)".to_owned(),
        ),
        other => io_err(what, io::Error::from(other)),
    }
}

/// The refusal of a path with a name longer than the filesystem takes: invalid, naming the
/// path (the API answers 422 with `details.field: "path"`).
pub(crate) fn name_too_long(path: &str) -> AdapterError {
    AdapterError::invalid_field("path", format!("{path}: file name too long"))
}

/// The components of a sandbox-absolute path, checked: absolute, no NUL, no `..`, and not
/// the tag file at the top.
pub(crate) fn components(path: &str) -> Result<Vec<String>, AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::permanent(format!(
            "path {path:?} must be absolute"
        )));
    }
    let mut out = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => {
                if out.is_empty() && part == TAG_FILE {
                    return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
                }
                out.push(part.to_string_lossy().into_owned());
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

/// The relative form of checked components (`.` for the base itself).
fn relative(parts: &[String]) -> PathBuf {
    if parts.is_empty() {
        PathBuf::from(".")
    } else {
        parts.iter().collect()
    }
}

/// A descriptor of the base directory, which every resolution starts from. The base itself
/// is the adapter's (`<root>/<sandbox>`), not the sandbox's to change.
fn open_base(base: &Path) -> Result<OwnedFd, AdapterError> {
    rustix::fs::open(
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open sandbox directory", io::Error::from(e)))
}

/// Opens `rel` below `root` as if `root` were `/`: symlinks are followed, but never out.
fn open_in(root: &OwnedFd, rel: &Path, flags: OFlags) -> Result<OwnedFd, Errno> {
    // openat2 refuses (EINVAL) any flag beside these with `O_PATH`.
    let flags = if flags.contains(OFlags::PATH) {
        flags | OFlags::CLOEXEC
    } else {
        flags | OFlags::CLOEXEC | OFlags::NOCTTY
    };
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            root,
            rel,
            flags,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::AGAIN | Errno::INTR) if tries < RESOLVE_TRIES => tries += 1,
            other => return other,
        }
    }
}

/// Whether two descriptors are the same file.
fn same_file(a: impl AsFd, b: impl AsFd) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// Whether `name` in directory `dir` is the base's tag file (reached through a symlink to
/// the base, say).
fn is_tag(root: &OwnedFd, dir: &OwnedFd, name: &str) -> bool {
    name == TAG_FILE && same_file(root, dir)
}

/// Runs blocking descriptor work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AdapterError> + Send + 'static,
) -> Result<T, AdapterError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AdapterError::transient(format!("devhost: file task failed: {e}")))?
}

/// The directory `parents` below `root`, each missing one created (`mkdir -p`), as a
/// descriptor.
fn make_parents(root: &OwnedFd, parents: &[String], path: &str) -> Result<OwnedFd, AdapterError> {
    let mut dir = open_in(root, Path::new("."), OFlags::PATH | OFlags::DIRECTORY)
        .map_err(|e| fs_err(path, "open sandbox directory", e))?;
    for (i, part) in parents.iter().enumerate() {
        let rel = relative(&parents[..=i]);
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        dir = match open_in(root, &rel, flags) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, part.as_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(fs_err(path, "create parent directories", e)),
                }
                open_in(root, &rel, flags)
                    .map_err(|e| fs_err(path, "create parent directories", e))?
            }
            Err(e) => return Err(fs_err(path, "open parent directory", e)),
        };
    }
    Ok(dir)
}

/// A unique-enough suffix for temporary files.
fn ulid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or_default()
    )
}

/// Streams `body` into `path` (through a temporary file renamed at the end, so a reader
/// never sees half a file), creating parent directories.
pub(crate) async fn upload(
    base: &Path,
    path: &str,
    mode: Option<u32>,
    mut body: ByteStream,
) -> Result<(), AdapterError> {
    let parts = components(path)?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(AdapterError::bad_path(path, PathProblem::IsADirectory));
    };
    let (name, parents) = (name.clone(), parents.to_vec());
    let (base, shown) = (base.to_path_buf(), path.to_owned());
    let tmp = format!(".{name}.upload-{}", ulid_like());
    let (dir, file) = blocking({
        let (name, tmp) = (name.clone(), tmp.clone());
        move || {
            let root = open_base(&base)?;
            let dir = make_parents(&root, &parents, &shown)?;
            if is_tag(&root, &dir, &name) {
                return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
            }
            // Refused before the body is read; the rename below refuses it again if a
            // directory appears meanwhile.
            if let Ok(st) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
                    return Err(AdapterError::bad_path(&shown, PathProblem::IsADirectory));
                }
            }
            let file = rustix::fs::openat(
                &dir,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| fs_err(&shown, "create file", e))?;
            Ok((dir, file))
        }
    })
    .await?;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(file));
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
            file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
                .await
                .map_err(|e| io_err("chmod", e))?;
        }
        Ok(())
    }
    .await;
    drop(file);
    let shown = path.to_owned();
    blocking(move || {
        let renamed = written.and_then(|()| {
            rustix::fs::renameat(&dir, tmp.as_str(), &dir, name.as_str())
                .map_err(|e| fs_err(&shown, "rename upload", e))
        });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp.as_str(), AtFlags::empty());
        }
        renamed
    })
    .await
}

/// Reads `path`, optionally a range of it (clamped to the file; a start past the end
/// gives an empty body, and the caller compares with `total_size`).
pub(crate) async fn download(
    base: &Path,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, AdapterError> {
    let parts = components(path)?;
    let (base, shown) = (base.to_path_buf(), path.to_owned());
    let (file, meta) = blocking(move || {
        let root = open_base(&base)?;
        // Non-blocking: opening a FIFO the sandbox left there must not hang this thread.
        let fd = open_in(&root, &relative(&parts), OFlags::RDONLY | OFlags::NONBLOCK)
            .map_err(|e| fs_err(&shown, "open file", e))?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| io_err("stat file", e))?;
        if meta.is_dir() {
            return Err(AdapterError::bad_path(&shown, PathProblem::IsADirectory));
        }
        if !meta.is_file() {
            return Err(AdapterError::permanent(format!(
                "{shown} is not a regular file"
            )));
        }
        if let Ok(tag) = open_in(&root, Path::new(TAG_FILE), OFlags::PATH) {
            if same_file(&tag, &file) {
                return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
            }
        }
        Ok((file, meta))
    })
    .await?;
    let size = meta.len();
    let (start, end) = match range {
        None => (0, size),
        Some(r) => (
            r.start.min(size),
            r.end.map_or(size, |e| e.saturating_add(1).min(size)),
        ),
    };
    let mut file = tokio::fs::File::from_std(file);
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
    let parts = components(path)?;
    let (base, shown) = (base.to_path_buf(), path.to_owned());
    blocking(move || {
        let root = open_base(&base)?;
        let rel = relative(&parts);
        let at = open_in(&root, &rel, OFlags::PATH).map_err(|e| fs_err(&shown, "list", e))?;
        let meta = std::fs::File::from(at)
            .metadata()
            .map_err(|e| io_err("list", e))?;
        if !meta.is_dir() {
            return Ok(vec![entry_of(shown, &meta)]);
        }
        let top = open_in(&root, &rel, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| fs_err(&shown, "list", e))?;
        let mut out = Vec::new();
        let mut todo = vec![(top, shown.trim_end_matches('/').to_owned(), 1u32)];
        while let Some((dir, prefix, level)) = todo.pop() {
            let hide_tag = same_file(&root, &dir);
            let entries =
                rustix::fs::Dir::read_from(&dir).map_err(|e| fs_err(&prefix, "list", e))?;
            for entry in entries {
                let entry = entry.map_err(|e| fs_err(&prefix, "list", e))?;
                let name = OsStr::from_bytes(entry.file_name().to_bytes());
                if name == "." || name == ".." || (hide_tag && name == TAG_FILE) {
                    continue;
                }
                // The entry itself, never what a symlink points at.
                let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let Ok(fd) = rustix::fs::openat(&dir, name, flags, Mode::empty()) else {
                    continue;
                };
                let Ok(meta) = std::fs::File::from(fd).metadata() else {
                    continue;
                };
                let child = format!("{prefix}/{}", name.to_string_lossy());
                if meta.is_dir() && level < depth {
                    let flags =
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                    if let Ok(sub) = rustix::fs::openat(&dir, name, flags, Mode::empty()) {
                        todo.push((sub, child.clone(), level + 1));
                    }
                }
                out.push(entry_of(child, &meta));
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    })
    .await
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

/// Removes a file or an empty directory (a symlink itself, not what it points at).
pub(crate) async fn delete(base: &Path, path: &str) -> Result<(), AdapterError> {
    let parts = components(path)?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(AdapterError::permanent("refusing to delete /"));
    };
    let (name, parents) = (name.clone(), parents.to_vec());
    let (base, shown) = (base.to_path_buf(), path.to_owned());
    blocking(move || {
        let root = open_base(&base)?;
        let dir = open_in(&root, &relative(&parents), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| fs_err(&shown, "delete", e))?;
        if is_tag(&root, &dir, &name) {
            return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
        }
        let st = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_err(&shown, "delete", e))?;
        let flags = if rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&dir, name.as_str(), flags).map_err(|e| match e {
            Errno::NOTEMPTY | Errno::EXIST => {
                AdapterError::permanent(format!("{shown} is a directory that is not empty"))
            }
            e => fs_err(&shown, "delete", e),
        })
    })
    .await
}

/// Makes directory `path` and its missing parents; `mode` (default 0o755) is set on the last
/// one when it is made, whatever the umask. `Ok(false)` when a directory was already there
/// (a symlink to one counts, as for `mkdir -p`).
pub(crate) async fn make_dir(
    base: &Path,
    path: &str,
    mode: Option<u32>,
) -> Result<bool, AdapterError> {
    let parts = components(path)?;
    let Some((name, parents)) = parts.split_last() else {
        return Ok(false); // the sandbox's `/`
    };
    let (name, parents) = (name.clone(), parents.to_vec());
    let (base, shown) = (base.to_path_buf(), path.to_owned());
    let mode = mode.unwrap_or(0o755) & 0o7777;
    blocking(move || {
        let root = open_base(&base)?;
        let rel = relative(&parts);
        match open_in(&root, &rel, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(_) => return Ok(false),
            Err(Errno::NOTDIR) if open_in(&root, &rel, OFlags::PATH).is_ok() => {
                return Err(AdapterError::bad_path(
                    &shown,
                    PathProblem::NotADirectoryHere,
                ))
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fs_err(&shown, "make directory", e)),
        }
        let dir = make_parents(&root, &parents, &shown)?;
        if is_tag(&root, &dir, &name) {
            return Err(AdapterError::permanent(format!("{TAG_FILE} is reserved")));
        }
        match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) => {}
            // Made meanwhile by someone else: theirs, as it stands.
            Err(Errno::EXIST) => {
                return match open_in(&root, &rel, OFlags::PATH | OFlags::DIRECTORY) {
                    Ok(_) => Ok(false),
                    Err(_) => Err(AdapterError::bad_path(
                        &shown,
                        PathProblem::NotADirectoryHere,
                    )),
                }
            }
            Err(e) => return Err(fs_err(&shown, "make directory", e)),
        }
        // Made 0700, then given its mode through a descriptor resolved in the root: a swap
        // for a symlink in between can only change which sandbox directory gets the mode.
        let made = open_in(&root, &rel, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| fs_err(&shown, "make directory", e))?;
        rustix::fs::fchmod(&made, Mode::from_raw_mode(mode))
            .map_err(|e| fs_err(&shown, "set directory mode", e))?;
        Ok(true)
    })
    .await
}

/// What is at sandbox path `path` (following symlinks, never out of the base), if anything:
/// for checks such as whether a program exists before running it.
pub(crate) fn metadata_in(base: &Path, path: &str) -> Option<std::fs::Metadata> {
    let parts = components(path).ok()?;
    let root = open_base(base).ok()?;
    let fd = open_in(&root, &relative(&parts), OFlags::PATH).ok()?;
    std::fs::File::from(fd).metadata().ok()
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

    #[test]
    fn a_name_too_long_is_the_callers_and_names_the_path() {
        let long = format!("/tmp/{}", "n".repeat(300));
        let e = fs_err(&long, "create file", Errno::NAMETOOLONG);
        assert!(!e.is_retryable(), "{e:?}");
        let AdapterError::Permanent(r) = &e else {
            panic!("{e:?}");
        };
        assert_eq!(r.field(), Some("path"));
        assert_eq!(r.message(), format!("{long}: file name too long"));
    }

    /// Through a real directory: the host's ENAMETOOLONG on each file call that makes or
    /// opens the name.
    #[tokio::test]
    async fn long_names_are_refused_as_invalid_on_every_file_call() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("/{}", "n".repeat(256));
        let body: ByteStream = Box::pin(futures::stream::empty());
        let refused = |e: AdapterError| {
            matches!(&e, AdapterError::Permanent(r) if r.field() == Some("path")
                && r.message().ends_with("file name too long"))
        };
        let up = upload(dir.path(), &long, None, body).await.err();
        assert!(up.is_some_and(refused));
        let made = make_dir(dir.path(), &long, None).await.err();
        assert!(made.is_some_and(refused));
        let read = download(dir.path(), &long, None).await.err();
        assert!(read.is_some_and(refused));
    }
}
