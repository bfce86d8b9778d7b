//! Files anywhere in the sandbox. The bridge's file routes read and write whole files under
//! `/workspace` only (32 MiB at most per write) and it has no listing or removal, so a
//! transfer goes through the adapter's staging directory in the workspace and a script puts
//! it in place (or copies it out); listing and removal are scripts too.

use super::bridge::{Bridge, Output};
use super::run::token;
use super::{instances, script};
use crate::kit::listing::{self, Fields};
use crate::kit::paths::check_path;
use crate::{AdapterError, ByteRange, ByteStream, Download, FileEntry, InstanceRef, PathProblem};

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
    body: ByteStream,
) -> Result<(), AdapterError> {
    check_path("path", path)?;
    let too_big = format!(
        "upload: the Cloudflare bridge takes files up to {} MiB",
        MAX_FILE_BYTES >> 20
    );
    let data = crate::files::read_whole(body, MAX_FILE_BYTES, &too_big).await?;
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
        .filter_map(|r| {
            let mut e = listing::record(r, '\t', Fields::SizeMode)?;
            e.path = listing::under(path, &e.path);
            Some(e)
        })
        .collect();
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
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
