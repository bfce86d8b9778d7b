//! Files: `upload_file` (multipart form with `path` and `file`) and `download_file`
//! (`{"path"}`, the bytes whole). Relative paths are under the devbox user's home.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::devboxes::running_home;
use super::{error, Inner};
use crate::support::http::{json_resp, Req};

fn resolve(home: &Path, path: &str) -> PathBuf {
    if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        home.join(path)
    }
}

/// One part of a multipart form: its field name and body.
struct Part<'a> {
    name: String,
    body: &'a [u8],
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// Splits `body` at `boundary` (RFC 7578): each part's headers, a blank line, its bytes.
fn parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delim = format!("--{boundary}");
    let mut at = find(body, delim.as_bytes(), 0)? + delim.len();
    let mut out = Vec::new();
    loop {
        if body.get(at..at + 2) == Some(b"--") {
            return Some(out);
        }
        at += 2; // CRLF after the delimiter
        let head_end = find(body, b"\r\n\r\n", at)?;
        let head = String::from_utf8_lossy(&body[at..head_end]).to_string();
        let start = head_end + 4;
        let next = find(body, format!("\r\n{delim}").as_bytes(), start)?;
        let name = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))
            .and_then(|l| l.split("name=\"").nth(1))
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_owned();
        out.push(Part {
            name,
            body: &body[start..next],
        });
        at = next + 2 + delim.len();
    }
}

/// `POST /v1/devboxes/{id}/upload_file`.
pub(super) async fn upload(inner: &Arc<Inner>, id: &str, r: &Req) -> Response {
    let home = match running_home(inner, id) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let boundary = r
        .header("content-type")
        .filter(|c| c.starts_with("multipart/form-data"))
        .and_then(|c| c.split("boundary=").nth(1))
        .map(|b| b.trim_matches('"').to_owned());
    let Some(boundary) = boundary else {
        return error(400, "the body must be multipart/form-data");
    };
    let Some(parts) = parts(&r.body, &boundary) else {
        return error(400, "malformed multipart body");
    };
    let path = parts
        .iter()
        .find(|p| p.name == "path")
        .map(|p| String::from_utf8_lossy(p.body).to_string());
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return error(400, "path: required");
    };
    let Some(file) = parts.iter().find(|p| p.name == "file") else {
        return error(400, "file: required");
    };
    let target = resolve(&home, &path);
    if target.is_dir() {
        return error(400, &format!("{path} is a directory"));
    }
    if !target.parent().is_some_and(Path::is_dir) {
        return error(400, &format!("the directory of {path} does not exist"));
    }
    match tokio::fs::write(&target, file.body).await {
        Ok(()) => json_resp(200, json!({})),
        Err(e) => error(400, &format!("{path}: {e}")),
    }
}

/// `POST /v1/devboxes/{id}/download_file {path}`.
pub(super) async fn download(inner: &Arc<Inner>, id: &str, r: &Req) -> Response {
    let home = match running_home(inner, id) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let body = r.json();
    let Some(path) = body.get("path").and_then(Value::as_str) else {
        return error(400, "path: required");
    };
    let target = resolve(&home, path);
    if target.is_dir() {
        return error(400, &format!("{path} is a directory"));
    }
    match tokio::fs::read(&target).await {
        Ok(bytes) => ([("content-type", "application/octet-stream")], bytes).into_response(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            error(404, &format!("file {path} not found"))
        }
        Err(e) => error(400, &format!("{path}: {e}")),
    }
}
