//! The fake execd's files: multipart upload, download (with ranges), file info and directory
//! listings, on host paths.

use std::path::Path;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::support::http::{lock, Req};

use super::{json_resp, Inner, Variant};

pub(super) fn file_not_found(p: &str) -> Response {
    json_resp(
        404,
        json!({"code": "FILE_NOT_FOUND", "message": format!("file not found: {p}")}),
    )
}
/// Minimal multipart/form-data parser: (name, filename, content) per part.
/// (name, filename, content)
type Part = (String, Option<String>, Vec<u8>);
fn multipart(content_type: &str, body: &[u8]) -> Option<Vec<Part>> {
    let boundary = content_type.split("boundary=").nth(1)?.trim_matches('"');
    let delim = format!("--{boundary}").into_bytes();
    let mut parts = Vec::new();
    let mut pos = find(body, &delim, 0)? + delim.len();
    loop {
        if body[pos..].starts_with(b"--") {
            break;
        }
        pos += 2; // CRLF
        let head_end = find(body, b"\r\n\r\n", pos)?;
        let head = String::from_utf8_lossy(&body[pos..head_end]).into_owned();
        let start = head_end + 4;
        let next = find(body, &delim, start)?;
        let content = body[start..next - 2].to_vec();
        let disp = head
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition"))?
            .to_owned();
        let attr = |name: &str| {
            disp.split(';')
                .map(str::trim)
                .find_map(|p| p.strip_prefix(&format!("{name}=")))
                .map(|v| v.trim_matches('"').to_owned())
        };
        parts.push((attr("name")?, attr("filename"), content));
        pos = next + delim.len();
    }
    Some(parts)
}
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}
pub(super) async fn upload(inner: &Inner, r: &Req) -> Response {
    let ct = r
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(parts) = multipart(ct, &r.body) else {
        return json_resp(
            400,
            json!({"code": "INVALID_FILE", "message": "bad multipart body"}),
        );
    };
    let metas: Vec<_> = parts.iter().filter(|p| p.0 == "metadata").collect();
    let files: Vec<_> = parts.iter().filter(|p| p.0 == "file").collect();
    if metas.is_empty() || metas.len() != files.len() {
        return json_resp(
            400,
            json!({"code": "INVALID_FILE_METADATA", "message": "metadata file is missing"}),
        );
    }
    for (meta, file) in metas.iter().zip(files) {
        if inner.variant == Variant::Real && meta.1.is_none() {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "metadata file is missing"}),
            );
        }
        let Ok(m) = serde_json::from_slice::<Value>(&meta.2) else {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "bad json"}),
            );
        };
        let Some(path) = m["path"].as_str() else {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE_METADATA", "message": "path required"}),
            );
        };
        let mode = m["mode"].as_u64().unwrap_or(755);
        let mode = u32::from_str_radix(&mode.to_string(), 8).unwrap_or(0o755);
        if let Some(parent) = Path::new(path).parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = std::fs::write(path, &file.2) {
            return json_resp(
                500,
                json!({"code": "RUNTIME_ERROR", "message": e.to_string()}),
            );
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    }
    StatusCode::OK.into_response()
}
pub(super) async fn download(inner: &Inner, r: &Req) -> Response {
    let p = r.q("path").unwrap_or("");
    let Ok(data) = std::fs::read(p) else {
        return file_not_found(p);
    };
    let total = data.len() as u64;
    let range = r.headers.get("range").and_then(|v| v.to_str().ok());
    if r.q("offset").is_some() || r.q("limit").is_some() {
        if range.is_some() {
            return json_resp(
                400,
                json!({"code": "INVALID_REQUEST_BODY",
                       "message": "line-based reading (offset/limit) and byte range (Range header) are mutually exclusive"}),
            );
        }
        return download_lines(&data, r);
    }
    // Recorded: byte reads name the file's basename (line reads do not).
    let name = Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let disposition = format!("attachment; filename=\"{name}\"");
    let ignore = lock(&inner.knobs).ignore_range;
    if let (Some(range), false) = (range, ignore) {
        let spec = range.strip_prefix("bytes=").unwrap_or("");
        let (a, b) = spec.split_once('-').unwrap_or(("", ""));
        let start: u64 = a.parse().unwrap_or(u64::MAX);
        let end: u64 = if b.is_empty() {
            total.saturating_sub(1)
        } else {
            b.parse::<u64>().unwrap_or(0).min(total.saturating_sub(1))
        };
        if start >= total || start > end {
            // Recorded: Go's http.ServeContent wording, as text.
            return Response::builder()
                .status(416)
                .header("content-type", "text/plain; charset=utf-8")
                .header("content-range", format!("bytes */{total}"))
                .header("content-disposition", &disposition)
                .body(Body::from("invalid range: failed to overlap\n"))
                .unwrap();
        }
        return Response::builder()
            .status(206)
            .header("content-type", "application/octet-stream")
            .header("content-range", format!("bytes {start}-{end}/{total}"))
            .header("content-disposition", &disposition)
            .body(Body::from(data[start as usize..=end as usize].to_vec()))
            .unwrap();
    }
    Response::builder()
        .status(200)
        .header("content-type", "application/octet-stream")
        .header("accept-ranges", "bytes")
        .header("content-disposition", disposition)
        .header("content-length", total)
        .body(Body::from(data))
        .unwrap()
}
/// `offset`/`limit` (1-based lines): the lines joined by `\n`, no trailing newline (recorded).
fn download_lines(data: &[u8], r: &Req) -> Response {
    let offset: usize = r
        .q("offset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(1)
        .max(1);
    let limit: Option<usize> = r.q("limit").and_then(|l| l.parse().ok());
    let text = String::from_utf8_lossy(data);
    let lines = text
        .split('\n')
        .skip(offset - 1)
        .take(limit.unwrap_or(usize::MAX));
    let out = lines.collect::<Vec<_>>().join("\n");
    Response::builder()
        .status(200)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from(out))
        .unwrap()
}
pub(super) fn file_info(p: &Path) -> Option<Value> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::symlink_metadata(p).ok()?;
    let kind = if m.file_type().is_symlink() {
        "symlink"
    } else if m.is_dir() {
        "directory"
    } else if m.is_file() {
        "file"
    } else {
        "other"
    };
    let modified: DateTime<Utc> = m
        .modified()
        .ok()
        .map(DateTime::from)
        .unwrap_or_else(Utc::now);
    // Recorded: the nine permission bits only, and a directory's size as the filesystem's.
    let mode: u64 = format!("{:o}", m.permissions().mode() & 0o777)
        .parse()
        .unwrap_or(0);
    Some(json!({
        "path": p.to_string_lossy(), "type": kind, "size": if m.is_dir() { 4096 } else { m.len() },
        "modified_at": modified.to_rfc3339(), "created_at": modified.to_rfc3339(),
        "owner": "root", "group": "root", "mode": mode,
    }))
}
pub(super) fn list_dir(r: &Req) -> Response {
    let p = r.q("path").unwrap_or("");
    let depth: u32 = r.q("depth").and_then(|d| d.parse().ok()).unwrap_or(1);
    match std::fs::symlink_metadata(p) {
        Err(_) => return file_not_found(p),
        Ok(m) if m.file_type().is_symlink() => {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE", "message": "path is a symlink"}),
            )
        }
        Ok(m) if !m.is_dir() => {
            return json_resp(
                400,
                json!({"code": "INVALID_FILE", "message": "not a directory"}),
            )
        }
        _ => {}
    }
    fn walk(dir: &Path, depth: u32, out: &mut Vec<Value>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for e in entries {
            if let Some(i) = file_info(&e) {
                let is_dir = i["type"] == "directory";
                out.push(i);
                if is_dir && depth > 1 {
                    walk(&e, depth - 1, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(p), depth.max(1), &mut out);
    json_resp(200, Value::Array(out))
}
