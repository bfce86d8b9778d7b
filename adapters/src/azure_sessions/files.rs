//! Files of a session. Azure's files API moves bytes (multipart up, raw down) but only inside
//! the session's data directory (`/mnt/data`), by plain names, without modes; Differently's
//! paths are anywhere in the sandbox. So bytes travel through the files API as a staged file
//! in the data directory, and a short script moves it into place (upload) or copies the file
//! there (download); listings and removals are scripts alone. The scripts' exit codes are the
//! adapter's own (`shell::MISSING`, …).

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;

use super::{shell, AzureSessionsAdapter, Ran};
use crate::error::PathProblem;
use crate::{AdapterError, ByteRange, Download, FileEntry, FileKind};

/// Azure's upload limit ("The file upload limit is 128 MB").
pub(crate) const UPLOAD_LIMIT: usize = 128 << 20;

/// A staged file's name: letters, digits and `-` only (the files API refuses many others).
fn staged_name() -> String {
    format!("differently-staged-{}", crate::kit::paths::unique())
}

/// A failed script's error, for the codes every file script shares.
fn script_error(op: &str, path: &str, ran: &Ran) -> AdapterError {
    match ran.exit_code {
        shell::MISSING => AdapterError::PathNotFound(path.to_owned()),
        shell::IS_DIR => AdapterError::bad_path(path, PathProblem::IsADirectory),
        shell::NOT_DIR => AdapterError::bad_path(path, PathProblem::NotADirectory),
        code => AdapterError::permanent(format!(
            "{op} {path}: the session's shell answered exit {code}: {}",
            ran.stderr.trim_end()
        )),
    }
}

pub(super) async fn upload(
    a: &AzureSessionsAdapter,
    id: &str,
    path: &str,
    mode: Option<u32>,
    bytes: Bytes,
) -> Result<(), AdapterError> {
    let name = staged_name();
    a.client.upload(id, &name, bytes).await?;
    let staged = format!("{}/{name}", a.settings.data_dir);
    let ran = a
        .script(id, "upload", shell::place_script(&staged, path, mode))
        .await?;
    match ran.exit_code {
        0 => Ok(()),
        _ => Err(script_error("upload", path, &ran)),
    }
}

pub(super) async fn download(
    a: &AzureSessionsAdapter,
    id: &str,
    path: &str,
    range: Option<ByteRange>,
) -> Result<Download, AdapterError> {
    let name = staged_name();
    let staged = format!("{}/{name}", a.settings.data_dir);
    let ran = a
        .script(id, "download", shell::stage_script(path, &staged))
        .await?;
    if ran.exit_code != 0 {
        return Err(script_error("download", path, &ran));
    }
    let resp = a.client.content(id, &name).await?;
    let total_size = resp.content_length();
    let client = a.client.clone();
    let whole = resp
        .bytes_stream()
        .map(move |chunk| chunk.map_err(|e| client.transport_error("download", e)));
    // The staged copy is removed once the body has been read to its end (a reader that
    // stops early leaves it in the data directory, which ends with the session).
    let (client, id, staged_name) = (a.client.clone(), id.to_owned(), name);
    let cleanup = futures::stream::once(async move {
        if let Err(e) = client.delete_file(&id, &staged_name).await {
            tracing::warn!(error = %e, "azure_sessions: removing a staged download failed");
        }
        None
    })
    .filter_map(futures::future::ready);
    let body = crate::files::cut_to_range(whole.chain(cleanup), range);
    Ok(Download { total_size, body })
}

/// One `find -printf '%y %s %m %T@ %p\0'` record.
fn entry(record: &str) -> Option<FileEntry> {
    let mut parts = record.splitn(5, ' ');
    let kind = match parts.next()? {
        "f" => FileKind::File,
        "d" => FileKind::Dir,
        "l" => FileKind::Symlink,
        _ => FileKind::Other,
    };
    let size = parts.next()?.parse().ok()?;
    let mode = u32::from_str_radix(parts.next()?, 8).ok()?;
    let modified_at = parts
        .next()?
        .parse::<f64>()
        .ok()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.trunc() as i64, 0));
    let path = parts.next()?.to_owned();
    Some(FileEntry {
        path,
        kind,
        size,
        mode,
        modified_at,
    })
}

pub(super) async fn list(
    a: &AzureSessionsAdapter,
    id: &str,
    path: &str,
    depth: u32,
) -> Result<Vec<FileEntry>, AdapterError> {
    let ran = a
        .script(id, "list files", shell::list_script(path, depth))
        .await?;
    if ran.exit_code != 0 {
        return Err(script_error("list files", path, &ran));
    }
    if ran.stdout_cut {
        return Err(AdapterError::permanent(format!(
            "list files {path}: the listing is longer than outputMaxLength; list a smaller directory or fewer levels"
        )));
    }
    Ok(ran
        .stdout
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(entry)
        .collect())
}

pub(super) async fn remove(
    a: &AzureSessionsAdapter,
    id: &str,
    path: &str,
) -> Result<(), AdapterError> {
    let ran = a
        .script(id, "delete file", shell::remove_script(path))
        .await?;
    match ran.exit_code {
        0 => Ok(()),
        shell::NOT_EMPTY => Err(AdapterError::permanent(format!(
            "delete file {path}: the directory is not empty"
        ))),
        _ => Err(script_error("delete file", path, &ran)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_records_read() {
        let e = entry("f 100000 640 1733480000.5 /tmp/a b/data.bin").unwrap();
        assert_eq!(
            (e.kind, e.size, e.mode, e.path.as_str()),
            (FileKind::File, 100_000, 0o640, "/tmp/a b/data.bin")
        );
        assert_eq!(e.modified_at.map(|t| t.timestamp()), Some(1_733_480_000));
        assert_eq!(
            entry("d 4096 755 1.0 /x").map(|e| e.kind),
            Some(FileKind::Dir)
        );
        assert!(entry("garbage").is_none());
    }
}
