//! `differently sandbox cp`, `ls` and `mkdir`: files between this machine and a sandbox,
//! directories included (walked here: the API moves one file per call and makes parent
//! directories on upload; an empty directory is made on its own), a listing, and a
//! directory made in the sandbox.

use std::path::{Path, PathBuf};

use differently_client::Client;

use super::output::{print_rows, write_raw};
use super::{to_json, CliError, Output, Printer};

/// How deep a download of a directory descends (the API's bound on one listing).
const MAX_DEPTH: u32 = 16;

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Side<'a> {
    Local(&'a str),
    Remote { sandbox: &'a str, path: String },
}

/// `SANDBOX:PATH` is remote (an id has no `/` or `.`); anything else is local — write
/// `./a:b` for a local path that would look remote. A relative `PATH` is taken from the
/// sandbox's root, as [`sandbox_path`] says.
fn side(arg: &str) -> Side<'_> {
    if let Some((id, path)) = arg.split_once(':') {
        let id_like = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if id_like && !path.is_empty() {
            return Side::Remote {
                sandbox: id,
                path: sandbox_path(path),
            };
        }
    }
    Side::Local(arg)
}

/// A path in the sandbox as the API takes it (absolute): a relative one is from the root,
/// `/`, which is where `exec` runs when no `--cwd` is given (devhost and fake pools), so
/// `cp x "$ID:work/x"` and `exec "$ID" -- cat work/x` name the same file. `.` segments are
/// dropped; `..` is left for the API to judge.
pub fn sandbox_path(path: &str) -> String {
    if path.starts_with('/') {
        return path.to_owned();
    }
    let kept: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    let mut out = format!("/{}", kept.join("/"));
    // A trailing `/` still means "into this directory".
    if path.ends_with('/') && out.len() > 1 {
        out.push('/');
    }
    out
}

fn join_remote(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// Copies `src` to `dst`, one of them in a sandbox.
pub async fn cp(c: &Client, src: &str, dst: &str) -> Result<(), CliError> {
    match (side(src), side(dst)) {
        (Side::Local(from), Side::Remote { sandbox, path }) => {
            upload(c, from, sandbox, &path).await
        }
        (Side::Remote { sandbox, path }, Side::Local(to)) => download(c, sandbox, &path, to).await,
        (Side::Local(_), Side::Local(_)) => Err(CliError::Usage(
            "cp: one side must be in a sandbox, written SANDBOX:PATH (`sbx_…:/work/notes.txt`; a relative PATH is from the sandbox's root)".into(),
        )),
        (Side::Remote { .. }, Side::Remote { .. }) => Err(CliError::Usage(
            "cp: copy between two sandboxes through this machine (down, then up)".into(),
        )),
    }
}

async fn upload(c: &Client, from: &str, sandbox: &str, to: &str) -> Result<(), CliError> {
    if from == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
            .map_err(|e| CliError::io("reading standard input", e))?;
        return Ok(c.upload(sandbox, to, bytes, None).await?);
    }
    let local = Path::new(from);
    let meta = std::fs::metadata(local).map_err(|e| CliError::io(from.to_owned(), e))?;
    if meta.is_dir() {
        let mut tree = Tree::default();
        walk(local, Path::new(""), &mut tree)?;
        let remote = |rel: &Path| {
            if rel.as_os_str().is_empty() {
                to.to_owned()
            } else {
                join_remote(to, &rel.to_string_lossy())
            }
        };
        for rel in &tree.files {
            upload_file(c, &local.join(rel), sandbox, &remote(rel)).await?;
        }
        // An upload makes a file's parents; a directory with nothing in it is made on its
        // own (`mkdir -p`, the route `sandbox mkdir` uses), with its mode.
        for rel in &tree.empty_dirs {
            c.make_dir(sandbox, &remote(rel), mode_of(&local.join(rel)))
                .await?;
        }
        return Ok(());
    }
    let remote = if to.ends_with('/') {
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| CliError::Usage(format!("cp: {from} has no file name")))?;
        join_remote(to, &name)
    } else {
        to.to_owned()
    };
    upload_file(c, local, sandbox, &remote).await
}

/// What a local directory holds, as paths relative to it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tree {
    /// Every file.
    files: Vec<PathBuf>,
    /// Every directory with nothing in it (the empty path when the top one is empty).
    empty_dirs: Vec<PathBuf>,
}

/// Every file and empty directory under `root/rel`, as paths relative to `root` (symlinks
/// followed).
fn walk(root: &Path, rel: &Path, out: &mut Tree) -> Result<(), CliError> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| CliError::io(dir.display().to_string(), e))?
        .collect::<Result<_, _>>()
        .map_err(|e| CliError::io(dir.display().to_string(), e))?;
    if entries.is_empty() {
        out.empty_dirs.push(rel.to_owned());
        return Ok(());
    }
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let child = rel.join(e.file_name());
        let path = root.join(&child);
        let meta =
            std::fs::metadata(&path).map_err(|e| CliError::io(path.display().to_string(), e))?;
        if meta.is_dir() {
            walk(root, &child, out)?;
        } else {
            out.files.push(child);
        }
    }
    Ok(())
}

async fn upload_file(
    c: &Client,
    local: &Path,
    sandbox: &str,
    remote: &str,
) -> Result<(), CliError> {
    let bytes = std::fs::read(local).map_err(|e| CliError::io(local.display().to_string(), e))?;
    let mode = mode_of(local);
    Ok(c.upload(sandbox, remote, bytes, mode).await?)
}

#[cfg(unix)]
fn mode_of(p: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .ok()
        .map(|m| m.permissions().mode() & 0o777)
}

#[cfg(not(unix))]
fn mode_of(_: &Path) -> Option<u32> {
    None
}

async fn download(c: &Client, sandbox: &str, from: &str, to: &str) -> Result<(), CliError> {
    let entry = c.stat(sandbox, from).await?.ok_or_else(|| {
        CliError::Outcome(format!("cp: no file or directory {from} in {sandbox}"))
    })?;
    if to == "-" {
        if entry.is_dir() {
            return Err(CliError::Usage(format!(
                "cp: {from} is a directory; copy it to a local directory, not -"
            )));
        }
        let bytes = c.download(sandbox, from).await?;
        write_raw(&mut std::io::stdout(), &bytes);
        return Ok(());
    }
    let local = Path::new(to);
    if !entry.is_dir() {
        let target = if to.ends_with('/') || local.is_dir() {
            let name = Path::new(from)
                .file_name()
                .ok_or_else(|| CliError::Usage(format!("cp: {from} has no file name")))?;
            local.join(name)
        } else {
            local.to_owned()
        };
        return download_file(c, sandbox, from, &target, entry.mode).await;
    }
    let base = from.trim_end_matches('/');
    std::fs::create_dir_all(local).map_err(|e| CliError::io(to.to_owned(), e))?;
    for e in c.list_files(sandbox, from, Some(MAX_DEPTH)).await? {
        let rel = e
            .path
            .strip_prefix(base)
            .map(|r| r.trim_start_matches('/'))
            .filter(|r| !r.is_empty() && !r.split('/').any(|s| s == ".."));
        let Some(rel) = rel else { continue };
        let target = local.join(rel);
        if e.is_dir() {
            std::fs::create_dir_all(&target)
                .map_err(|err| CliError::io(target.display().to_string(), err))?;
        } else if e.kind == "file" {
            download_file(c, sandbox, &e.path, &target, e.mode).await?;
        }
    }
    Ok(())
}

async fn download_file(
    c: &Client,
    sandbox: &str,
    remote: &str,
    local: &Path,
    mode: u32,
) -> Result<(), CliError> {
    if let Some(dir) = local.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| CliError::io(dir.display().to_string(), e))?;
    }
    let mut f =
        std::fs::File::create(local).map_err(|e| CliError::io(local.display().to_string(), e))?;
    c.download_to(sandbox, remote, None, &mut f).await?;
    #[cfg(unix)]
    if mode & 0o777 != 0 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(local, std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| CliError::io(local.display().to_string(), e))?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    Ok(())
}

/// `sandbox ls`: a table of type, mode, size, time, path (or the API's list as JSON).
pub async fn ls(c: &Client, p: Printer, id: &str, path: &str, depth: u32) -> Result<(), CliError> {
    let items = c.list_files(id, &sandbox_path(path), Some(depth)).await?;
    match p.output {
        Output::Table => {
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|e| {
                    vec![
                        e.kind.clone(),
                        format!("{:o}", e.mode & 0o7777),
                        e.size.to_string(),
                        e.modified_at.clone().unwrap_or_else(|| "-".into()),
                        e.path.clone(),
                    ]
                })
                .collect();
            let headers = ["TYPE", "MODE", "SIZE", "MODIFIED", "PATH"].map(str::to_owned);
            print_rows(&headers, &rows);
            Ok(())
        }
        Output::Id => {
            items
                .iter()
                .for_each(|e| super::output::print_line(&e.path));
            Ok(())
        }
        Output::Json => p.print(&serde_json::json!({ "items": to_json(&items) }), &[]),
    }
}

/// `--mode`: octal permission bits (`750`, `0750`), at most `777` (the API takes no setuid,
/// setgid or sticky bit for a directory).
pub fn octal_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not octal permission bits such as 750"))
}

/// `sandbox mkdir`: makes the directory (and its parents); says whether it was made or was
/// already there (`-o json`: the API's `{path, created}`; `-o id`: the path).
pub async fn mkdir(
    c: &Client,
    p: Printer,
    id: &str,
    path: &str,
    mode: Option<u32>,
) -> Result<(), CliError> {
    let made = c.make_dir(id, &sandbox_path(path), mode).await?;
    match p.output {
        Output::Table if made.created => {
            let mode = mode.unwrap_or(0o755);
            super::output::print_line(&format!("made {} (mode {mode:o})", made.path));
            Ok(())
        }
        Output::Table => {
            super::output::print_line(&format!(
                "{} was already a directory (left as it was)",
                made.path
            ));
            Ok(())
        }
        Output::Id => {
            super::output::print_line(&made.path);
            Ok(())
        }
        Output::Json => p.print(&to_json(&made), &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_of_a_copy() {
        assert_eq!(
            side("sbx_01ABC:/work/a"),
            Side::Remote {
                sandbox: "sbx_01ABC",
                path: "/work/a".into()
            }
        );
        assert_eq!(side("./a:/b"), Side::Local("./a:/b"));
        assert_eq!(side("notes.txt"), Side::Local("notes.txt"));
        assert_eq!(side("sbx_01ABC:"), Side::Local("sbx_01ABC:"));
        assert_eq!(join_remote("/work/", "a.txt"), "/work/a.txt");
    }

    /// A relative path in the sandbox is from its root, as `exec`'s default directory.
    #[test]
    fn relative_sandbox_paths_are_from_the_root() {
        assert_eq!(
            side("sbx_01ABC:work/notes.txt"),
            Side::Remote {
                sandbox: "sbx_01ABC",
                path: "/work/notes.txt".into()
            }
        );
        assert_eq!(sandbox_path("./work//a/"), "/work/a/");
        assert_eq!(sandbox_path("."), "/");
        assert_eq!(sandbox_path("/abs/./kept"), "/abs/./kept");
    }

    /// A walk finds files and the directories with nothing in them, the top one included.
    #[test]
    fn a_walk_finds_files_and_empty_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/empty")).unwrap();
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::write(root.join("a/f.txt"), "f").unwrap();
        let mut tree = Tree::default();
        walk(root, Path::new(""), &mut tree).unwrap();
        assert_eq!(
            tree,
            Tree {
                files: vec![PathBuf::from("a/f.txt")],
                empty_dirs: vec![PathBuf::from("a/empty"), PathBuf::from("b/c")],
            }
        );
        let mut top = Tree::default();
        walk(&root.join("a/empty"), Path::new(""), &mut top).unwrap();
        assert_eq!(top.empty_dirs, vec![PathBuf::new()]);
    }

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(octal_mode("750"), Ok(0o750));
        assert_eq!(octal_mode("0750"), Ok(0o750));
        assert_eq!(octal_mode("0777"), Ok(0o777));
        for bad in ["", "8", "rwx", "1777", "17777", "-1"] {
            assert!(octal_mode(bad).is_err(), "{bad:?}");
        }
    }
}
