//! Files anywhere in the sandbox. The bridge's file routes read and write whole files under
//! `/workspace` only (32 MiB at most per write) and it has no listing or removal, so a
//! transfer goes through the adapter's staging directory in the workspace and a script puts
//! it in place (or copies it out); listing and removal are scripts too.

use futures::StreamExt;

use super::bridge::{Bridge, Output};
use super::run::token;
use super::{instances, script};
use crate::kit::paths::check_path;
use crate::{
    AdapterError, ByteRange, ByteStream, Download, FileEntry, FileKind, InstanceRef, PathProblem,
};

/// The bridge refuses writes over 32 MiB (`payload_too_large`).
pub(crate) const MAX_FILE_BYTES: usize = 32 * 1024 * 1024;

/// The error a script's own exit code stands for, or `None` for success.
fn script_error(op: &str, path: &str, out: &Output) -> Option<AdapterError> {
    match out.exit_code {
        0 => None,
        script::NO_SUCH_PATH => Some(AdapterError::PathNotFound(path.to_owned())),
        script::IS_A_DIRECTORY => Some(AdapterError::bad_path(path, PathProblem::IsADirectory)),
        script::NOT_A_DIRECTORY => Some(AdapterError::bad_path(path, PathProblem::NotADirectory)),
        script::NOT_EMPTY => Some(AdapterError::permanent(format!(
            "{op}: {path} is a directory that is not empty"
        ))),
        script::RESERVED => Some(AdapterError::permanent(format!(
            "{op}: {path} holds Differently's own state for this sandbox"
        ))),
        code => Some(AdapterError::permanent(format!(
            "{op}: {path}: exit {code}: {}",
            out.said()
        ))),
    }
}

fn staged(name: &str) -> String {
    format!("{}/{name}", script::XFER_DIR)
}

pub(crate) async fn upload(
    bridge: &Bridge,
    at: &InstanceRef,
    path: &str,
    mode: Option<u32>,
    mut body: ByteStream,
) -> Result<(), AdapterError> {
    check_path("path", path)?;
    let mut data = Vec::new();
    while let Some(chunk) = body.next().await {
        data.extend_from_slice(&chunk?);
        if data.len() > MAX_FILE_BYTES {
            return Err(AdapterError::permanent(format!(
                "upload: the Cloudflare bridge takes files up to {} MiB",
                MAX_FILE_BYTES >> 20
            )));
        }
    }
    instances::ensure(bridge, at).await?;
    let name = token("up");
    bridge
        .put_file(&at.backend_ref, &staged(&name), data)
        .await?;
    let out = bridge
        .run(&at.backend_ref, &script::place(&name, path, mode))
        .await?;
    script_error("upload", path, &out).map_or(Ok(()), Err)
}

pub(crate) async fn download(
    bridge: &Bridge,
    at: &InstanceRef,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, AdapterError> {
    check_path("path", path)?;
    instances::ensure(bridge, at).await?;
    let name = token("down");
    let out = bridge
        .run(&at.backend_ref, &script::stage(path, &name))
        .await?;
    if let Some(e) = script_error("download", path, &out) {
        return Err(e);
    }
    let read = bridge.get_file(&at.backend_ref, &staged(&name)).await;
    // The copy goes whatever the read did; a left-over is only a stray file in the workspace.
    if let Err(e) = bridge.run(&at.backend_ref, &script::unstage(&name)).await {
        tracing::warn!(error = %e, "cloudflare: removing a staged download failed");
    }
    let bytes = read?.ok_or_else(|| {
        AdapterError::transient("download: the staged copy vanished before it was read")
    })?;
    let total = bytes.len() as u64;
    // The bridge reads whole files: a range is cut here.
    let whole = futures::stream::once(async move { Ok(bytes) });
    Ok(Download {
        total_size: Some(total),
        body: crate::files::cut_to_range(whole, range),
    })
}

pub(crate) async fn list(
    bridge: &Bridge,
    at: &InstanceRef,
    path: &str,
    depth: u32,
) -> Result<Vec<FileEntry>, AdapterError> {
    check_path("path", path)?;
    instances::ensure(bridge, at).await?;
    let out = bridge
        .run(&at.backend_ref, &script::list(path, depth))
        .await?;
    if let Some(e) = script_error("list files", path, &out) {
        return Err(e);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut entries: Vec<FileEntry> = text
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(|r| entry(path, r))
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// One `find -printf '%y\t%s\t%m\t%T@\t%P'` record as an entry under `base`.
fn entry(base: &str, record: &str) -> Option<FileEntry> {
    let mut f = record.splitn(5, '\t');
    let (kind, size, mode, mtime, rel) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let kind = match kind {
        "f" => FileKind::File,
        "d" => FileKind::Dir,
        "l" => FileKind::Symlink,
        _ => FileKind::Other,
    };
    let trimmed = base.trim_end_matches('/');
    let path = if rel.is_empty() {
        base.to_owned()
    } else if trimmed.is_empty() {
        format!("/{rel}")
    } else {
        format!("{trimmed}/{rel}")
    };
    let secs: f64 = mtime.parse().ok()?;
    Some(FileEntry {
        path,
        kind,
        size: size.parse().ok()?,
        mode: u32::from_str_radix(mode, 8).ok()?,
        modified_at: chrono::DateTime::from_timestamp(secs.trunc() as i64, 0),
    })
}

pub(crate) async fn delete(
    bridge: &Bridge,
    at: &InstanceRef,
    path: &str,
) -> Result<(), AdapterError> {
    check_path("path", path)?;
    instances::ensure(bridge, at).await?;
    let out = bridge.run(&at.backend_ref, &script::delete(path)).await?;
    script_error("delete", path, &out).map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_records_read_as_entries() {
        let e = entry("/tmp/d", "f\t11\t640\t1700000000.5\tsub/a b").unwrap();
        assert_eq!(
            (e.path.as_str(), e.kind, e.size, e.mode),
            ("/tmp/d/sub/a b", FileKind::File, 11, 0o640)
        );
        assert_eq!(entry("/", "d\t4096\t755\t1.0\tetc").unwrap().path, "/etc");
        assert_eq!(entry("/tmp/f", "f\t1\t644\t1.0\t").unwrap().path, "/tmp/f");
        assert!(entry("/x", "garbage").is_none());
    }
}
