//! execd's file API: multipart upload (the metadata part must be a *file* part, as execd 1.1
//! requires), ranged download, directory listing and removal.

use chrono::{DateTime, Utc};
use futures::StreamExt;
use reqwest::Method;
use serde::Deserialize;

use super::client::Client;
use super::execd::{execd_error_at, Target};
use crate::error::{PathProblem, Reason};
use crate::kit::multipart::Multipart;
use crate::{AdapterError, ByteRange, ByteStream, Download, FileEntry, FileKind};

/// Absolute paths only: execd would resolve a relative one against its own cwd.
pub(crate) fn check_path(path: &str) -> Result<(), AdapterError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(AdapterError::permanent(format!(
            "path must be absolute: {path:?}"
        )));
    }
    Ok(())
}

/// `mode` as execd writes it: octal digits read as a decimal number (0o644 → 644).
pub(crate) fn mode_to_execd(mode: u32) -> u32 {
    format!("{:o}", mode & 0o7777).parse().unwrap_or(644)
}

/// The reverse of [`mode_to_execd`].
pub(crate) fn mode_from_execd(mode: u32) -> u32 {
    u32::from_str_radix(&mode.to_string(), 8).unwrap_or(mode)
}

/// Uploads `body` to `path`; the body is streamed, never held whole.
pub(crate) async fn upload(
    c: &Client,
    target: &Target,
    path: &str,
    mode: Option<u32>,
    body: ByteStream,
) -> Result<(), AdapterError> {
    check_path(path)?;
    let meta = serde_json::json!({
        "path": path,
        // execd's default is 755; files get 644 unless asked otherwise.
        "mode": mode_to_execd(mode.unwrap_or(0o644)),
    });
    let form = Multipart::new().file_part(
        "metadata",
        "metadata.json",
        "application/json",
        &meta.to_string(),
    );
    let rb = target
        .request(c, Method::POST, "/files/upload")
        .header(reqwest::header::CONTENT_TYPE, form.content_type())
        .body(form.streamed("file", path, body));
    let resp = c.send(rb, "upload file").await?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(execd_error_at(c, "upload file", Some(path), resp).await)
    }
}

/// Downloads `path`, optionally a byte range of it.
pub(crate) async fn download(
    c: &Client,
    target: &Target,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, AdapterError> {
    check_path(path)?;
    let mut rb = target
        .request(c, Method::GET, "/files/download")
        .query(&[("path", path)]);
    if let Some(r) = range {
        let end = r.end.map(|e| e.to_string()).unwrap_or_default();
        rb = rb.header(reqwest::header::RANGE, format!("bytes={}-{end}", r.start));
    }
    let resp = c.send(rb, "download file").await?;
    let status = resp.status();
    if !status.is_success() {
        return Err(execd_error_at(c, "download file", Some(path), resp).await);
    }
    let total_size = crate::files::total_size(&resp);
    // A server that ignored Range sent the whole file: cut the range out ourselves.
    let cut = match range {
        Some(r) if status == reqwest::StatusCode::OK => Some(r),
        _ => None,
    };
    let client = c.clone();
    let whole = resp
        .bytes_stream()
        .map(move |chunk| chunk.map_err(|e| client.transport_error("download file", e)));
    let body = crate::files::cut_to_range(whole, cut);
    Ok(Download { total_size, body })
}

#[derive(Debug, Deserialize)]
struct FileInfo {
    path: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    mode: u32,
    #[serde(default)]
    modified_at: Option<DateTime<Utc>>,
}

impl From<FileInfo> for FileEntry {
    fn from(f: FileInfo) -> Self {
        let kind = match f.kind.as_deref() {
            Some("file") => FileKind::File,
            Some("directory") | Some("dir") => FileKind::Dir,
            Some("symlink") => FileKind::Symlink,
            _ => FileKind::Other,
        };
        FileEntry {
            path: f.path,
            kind,
            size: f.size,
            mode: mode_from_execd(f.mode),
            modified_at: f.modified_at,
        }
    }
}

/// Lists `path` to `depth` levels.
pub(crate) async fn list(
    c: &Client,
    target: &Target,
    path: &str,
    depth: u32,
) -> Result<Vec<FileEntry>, AdapterError> {
    check_path(path)?;
    let rb = target
        .request(c, Method::GET, "/directories/list")
        .query(&[("path", path), ("depth", &depth.max(1).to_string())])
        .timeout(c.request_timeout());
    let resp = c.send(rb, "list files").await?;
    if !resp.status().is_success() {
        return Err(execd_error_at(c, "list files", Some(path), resp).await);
    }
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| c.transport_error("list files", e))?;
    let infos: Vec<FileInfo> = serde_json::from_slice(&bytes).map_err(|e| {
        AdapterError::Transient(Reason::caused_by(
            format!("list files: unexpected answer: {e}"),
            e,
        ))
    })?;
    Ok(infos.into_iter().map(FileEntry::from).collect())
}

/// Removes a file, or a directory if it is empty (execd's directory delete is recursive, so
/// emptiness is checked first).
pub(crate) async fn delete(c: &Client, target: &Target, path: &str) -> Result<(), AdapterError> {
    check_path(path)?;
    if path.trim_end_matches('/').is_empty() {
        return Err(AdapterError::permanent("refusing to delete /"));
    }
    let is_dir = stat(c, target, path, "delete file").await?.kind.as_deref() == Some("directory");
    let rb = if is_dir {
        if !list(c, target, path, 1).await?.is_empty() {
            return Err(AdapterError::permanent(format!(
                "directory not empty: {path}"
            )));
        }
        target.request(c, Method::DELETE, "/directories")
    } else {
        target.request(c, Method::DELETE, "/files")
    };
    let resp = c
        .send(
            rb.query(&[("path", path)]).timeout(c.request_timeout()),
            "delete file",
        )
        .await?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(execd_error_at(c, "delete file", Some(path), resp).await)
    }
}

/// What is at `path` (`GET /files/info`): a missing path is [`AdapterError::PathNotFound`].
async fn stat(c: &Client, target: &Target, path: &str, op: &str) -> Result<FileInfo, AdapterError> {
    let rb = target
        .request(c, Method::GET, "/files/info")
        .query(&[("path", path)])
        .timeout(c.request_timeout());
    let resp = c.send(rb, op).await?;
    if !resp.status().is_success() {
        return Err(execd_error_at(c, op, Some(path), resp).await);
    }
    let bytes = resp.bytes().await.map_err(|e| c.transport_error(op, e))?;
    let info: std::collections::BTreeMap<String, FileInfo> = serde_json::from_slice(&bytes)
        .map_err(|e| {
            AdapterError::Transient(Reason::caused_by(
                format!("{op}: unexpected answer: {e}"),
                e,
            ))
        })?;
    info.into_values()
        .next()
        .ok_or_else(|| AdapterError::transient(format!("{op}: execd answered no entry for {path}")))
}

/// `mkdir -p` with execd's own call (`POST /directories`, no process started), after a
/// `GET /files/info` that tells an existing directory (`false`) from anything else there.
/// Recorded on execd (1.1): `/files/info` is an `lstat` (a symlink is `symlink`), a `POST` on
/// a symlink to a directory answers 200 and changes nothing, one on a dangling symlink 500
/// `file exists`; a mode of 0 is not applied (the directory is 755) and the setuid, setgid and
/// sticky bits are dropped, so the first is refused here and `/v1` never sends the others.
pub(crate) async fn make_dir(
    c: &Client,
    target: &Target,
    path: &str,
    mode: Option<u32>,
) -> Result<bool, AdapterError> {
    const OP: &str = "make directory";
    check_path(path)?;
    if mode == Some(0) {
        return Err(AdapterError::invalid_field(
            "mode",
            "execd cannot make a directory with mode 0",
        ));
    }
    let symlink = match stat(c, target, path, OP).await {
        Ok(i) if i.kind.as_deref() == Some("directory") => return Ok(false),
        Ok(i) if i.kind.as_deref() == Some("symlink") => true,
        Ok(_) => return Err(AdapterError::bad_path(path, PathProblem::NotADirectoryHere)),
        Err(AdapterError::PathNotFound(_)) => false,
        Err(e) => return Err(e),
    };
    let mut body = serde_json::Map::new();
    body.insert(
        path.to_owned(),
        serde_json::json!({ "mode": mode_to_execd(mode.unwrap_or(0o755)) }),
    );
    let rb = target
        .request(c, Method::POST, "/directories")
        .json(&body)
        .timeout(c.request_timeout());
    let resp = c.send(rb, OP).await?;
    if resp.status().is_success() {
        // Through a symlink: it led to a directory, which was left as it was.
        return Ok(!symlink);
    }
    match execd_error_at(c, OP, Some(path), resp).await {
        // A symlink to a file (`not a directory`) or to nothing (`file exists`).
        AdapterError::BadPath(_) if symlink => {
            Err(AdapterError::bad_path(path, PathProblem::NotADirectoryHere))
        }
        AdapterError::Permanent(r) | AdapterError::Transient(r)
            if symlink && r.message().contains("file exists") =>
        {
            Err(AdapterError::bad_path(path, PathProblem::NotADirectoryHere))
        }
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_as_execd_writes_them() {
        assert_eq!(mode_to_execd(0o644), 644);
        assert_eq!(mode_to_execd(0o4755), 4755);
        assert_eq!(mode_from_execd(755), 0o755);
        assert_eq!(mode_from_execd(mode_to_execd(0o600)), 0o600);
    }
}
