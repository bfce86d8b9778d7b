//! Files of a session. Azure's files API moves bytes (multipart up, raw down) but only inside
//! the session's data directory (`/mnt/data`), by plain names, without modes; Differently's
//! paths are anywhere in the sandbox. So bytes travel through the files API as a staged file
//! in the data directory, and a short script moves it into place (upload) or copies the file
//! there (download); listings and removals are scripts alone. The scripts' exit codes are the
//! adapter's own (`shell::MISSING`, …).

use bytes::Bytes;
use futures::StreamExt;

use super::{shell, AzureSessionsAdapter, Ran};
use crate::error::PathProblem;
use crate::kit::listing::{self, Fields};
use crate::{AdapterError, ByteRange, Download, FileEntry};

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
        .filter_map(|r| listing::record(r, ' ', Fields::SizeMode))
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
