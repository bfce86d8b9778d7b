//! Files on a devbox. Runloop moves bytes (`upload_file`, multipart; `download_file`, whole,
//! no ranges) but has no listing, delete, directory or mode call, and a failed read of a
//! missing file is not told apart from a missing devbox; those are answered by short scripts
//! run on the devbox, whose exit codes say what happened (`script.rs`).

use std::time::Duration;

use reqwest::Method;

use super::exec::{self, Ran};
use super::script::{self, code};
use crate::http::HttpClient;
use crate::kit::listing::{self, Fields};
use crate::kit::multipart::Multipart;
use crate::kit::paths::segment;
use crate::{AdapterError, ByteStream, FileEntry, PathProblem};

/// A script's failure for `path` by its exit code; other codes are the script's error.
fn answer(path: &str, what: &str, ran: Ran) -> Result<Ran, AdapterError> {
    match ran.exit_code {
        0 => Ok(ran),
        code::MISSING => Err(AdapterError::PathNotFound(path.to_owned())),
        code::IS_DIR => Err(AdapterError::bad_path(path, PathProblem::IsADirectory)),
        code::NOT_DIR => Err(AdapterError::bad_path(path, PathProblem::NotADirectory)),
        code::NOT_EMPTY => Err(AdapterError::permanent(format!(
            "{what} {path}: the directory is not empty"
        ))),
        n => Err(AdapterError::permanent(format!(
            "{what} {path}: exit {n}: {}",
            ran.stderr.trim()
        ))),
    }
}

/// Runs file script `text` about `path`.
async fn run(
    c: &HttpClient,
    devbox: &str,
    path: &str,
    what: &str,
    text: &str,
    timeout: Duration,
) -> Result<Ran, AdapterError> {
    let ran = exec::script(c, devbox, text, timeout).await?;
    answer(path, what, ran)
}

/// `POST /v1/devboxes/{id}/upload_file`: multipart fields `path` and `file`, the body
/// streamed as it comes.
pub(crate) async fn put(
    c: &HttpClient,
    devbox: &str,
    path: &str,
    body: ByteStream,
) -> Result<(), AdapterError> {
    let form = Multipart::new().field("path", path);
    let rb = c
        .api(
            Method::POST,
            &format!("/v1/devboxes/{}/upload_file", segment(devbox)),
        )
        .header("Content-Type", form.content_type())
        .body(form.streamed("file", path, body));
    c.send_ok(rb, "upload").await.map(drop)
}

/// Writes `path`: its directory made first, the bytes uploaded, then its mode set.
pub(crate) async fn upload(
    c: &HttpClient,
    devbox: &str,
    path: &str,
    mode: Option<u32>,
    body: ByteStream,
    timeout: Duration,
) -> Result<(), AdapterError> {
    if path.contains('\n') || path.contains('\r') {
        return Err(AdapterError::invalid_field(
            "path",
            "a path with a line break cannot be uploaded to Runloop",
        ));
    }
    let prepare = script::prepare_upload(path);
    run(c, devbox, path, "upload", &prepare, timeout).await?;
    put(c, devbox, path, body).await?;
    if let Some(mode) = mode {
        run(
            c,
            devbox,
            path,
            "upload",
            &script::chmod(path, mode),
            timeout,
        )
        .await?;
    }
    Ok(())
}

/// `POST /v1/devboxes/{id}/download_file {path}`: the whole file as it streams.
pub(crate) async fn get(
    c: &HttpClient,
    devbox: &str,
    path: &str,
) -> Result<reqwest::Response, AdapterError> {
    let rb = c
        .api(
            Method::POST,
            &format!("/v1/devboxes/{}/download_file", segment(devbox)),
        )
        .header("Accept", "application/octet-stream")
        .json(&serde_json::json!({ "path": path }))
        .timeout(Duration::from_secs(600));
    c.send_ok(rb, "download").await
}

/// Why a download failed, told apart on the devbox: a missing path or a directory, else the
/// API's own error.
pub(crate) async fn explain(
    c: &HttpClient,
    devbox: &str,
    path: &str,
    api_error: AdapterError,
    timeout: Duration,
) -> AdapterError {
    match exec::script(c, devbox, &script::kind(path), timeout).await {
        Ok(ran) if ran.exit_code == code::MISSING => AdapterError::PathNotFound(path.to_owned()),
        Ok(ran) if ran.stdout.trim() == "d" => {
            AdapterError::bad_path(path, PathProblem::IsADirectory)
        }
        // The devbox lives and the file is there: the 404 was not about either.
        Ok(_) if api_error == AdapterError::NotFound => AdapterError::transient(format!(
            "download {path}: Runloop answered 404 for a file that exists"
        )),
        _ => api_error,
    }
}

/// Lists `dir` `depth` levels deep.
pub(crate) async fn list(
    c: &HttpClient,
    devbox: &str,
    dir: &str,
    depth: u32,
    timeout: Duration,
) -> Result<Vec<FileEntry>, AdapterError> {
    let ran = run(c, devbox, dir, "list", &script::list(dir, depth), timeout).await?;
    Ok(ran
        .stdout
        .split('\0')
        .filter(|r| !r.is_empty())
        .filter_map(|r| listing::record(r, '\t', Fields::SizeMode))
        .collect())
}

/// Removes a file, link or empty directory.
pub(crate) async fn delete(
    c: &HttpClient,
    devbox: &str,
    path: &str,
    timeout: Duration,
) -> Result<(), AdapterError> {
    run(c, devbox, path, "delete", &script::delete(path), timeout)
        .await
        .map(drop)
}
