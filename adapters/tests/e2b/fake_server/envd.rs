//! The fake envd: its routes, and files (stat, listing, download with ranges, upload) on host
//! paths.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::support::http::{json_resp, lock, Req};

use super::process::start;
use super::{connect_err, err, Inner, B64};

pub(super) fn envd_version(inner: &Inner) -> String {
    lock(&inner.knobs).envd_version.clone()
}
/// Which sandbox and port an envd request is for, as E2B's edge decides it: the routing
/// headers when present, else a `Host` of `<port>-<sandboxId>.<domain>`.
fn route(inner: &Inner, r: &Req) -> Option<(String, String)> {
    if let Some(id) = r.header("e2b-sandbox-id") {
        lock(&inner.record).header_routed += 1;
        let port = r.header("e2b-sandbox-port").unwrap_or("");
        return Some((id.to_owned(), port.to_owned()));
    }
    let host = r.header("host")?;
    let label = host.split('.').next()?;
    let (port, id) = label.split_once('-')?;
    lock(&inner.record).host_routed += 1;
    Some((id.to_owned(), port.to_owned()))
}
pub(super) async fn envd(inner: &Arc<Inner>, r: Req) -> Response {
    // The key in any header at all, whatever the pool's auth header is.
    let key = lock(&inner.key).clone();
    if r.headers.contains_key("x-api-key")
        || r.headers
            .values()
            .any(|v| v.to_str().is_ok_and(|v| v.contains(key.as_str())))
    {
        lock(&inner.record).key_seen_on_envd += 1;
    }
    let Some((id, port)) = route(inner, &r) else {
        return err(400, "missing sandbox id header");
    };
    if port != "49983" {
        return err(502, "The sandbox port is not open");
    }
    let sbx = {
        let mut all = lock(&inner.sandboxes);
        match all.get_mut(&id) {
            Some(s) if s.state == "running" => {
                if r.path == "/health" && s.boot_polls_left > 0 {
                    s.boot_polls_left -= 1;
                    return err(502, "The sandbox is starting");
                }
                s.clone()
            }
            Some(_) => return err(502, "The sandbox is paused"),
            None => {
                return json_resp(
                    502,
                    json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502}),
                )
            }
        }
    };
    if r.path == "/health" {
        return StatusCode::NO_CONTENT.into_response();
    }
    if r.header("x-access-token") != Some(sbx.token.as_str()) {
        lock(&inner.record).bad_tokens += 1;
        return err(
            401,
            "unauthorized access, please provide a valid access token",
        );
    }
    if let Some(user) = r
        .header("authorization")
        .and_then(|a| a.strip_prefix("Basic "))
        .and_then(|b| B64.decode(b).ok())
    {
        let user = String::from_utf8_lossy(&user)
            .trim_end_matches(':')
            .to_owned();
        lock(&inner.record).users.push(user);
    }
    match (r.method.as_str(), r.path.as_str()) {
        ("POST", "/process.Process/Start") => start(inner, &sbx, &r),
        ("POST", "/process.Process/SendInput") => {
            let b = r.json();
            let pid = b["process"]["pid"].as_u64().unwrap_or(0) as u32;
            let data = B64
                .decode(b["input"]["stdin"].as_str().unwrap_or_default())
                .unwrap_or_default();
            let stdin = lock(&inner.procs)
                .get_mut(&pid)
                .and_then(|p| p.stdin.take());
            match stdin {
                Some(mut w) => {
                    let _ = w.write_all(&data).await;
                    if let Some(p) = lock(&inner.procs).get_mut(&pid) {
                        p.stdin = Some(w);
                    }
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("POST", "/process.Process/CloseStdin") => {
            let pid = r.json()["process"]["pid"].as_u64().unwrap_or(0) as u32;
            match lock(&inner.procs).get_mut(&pid) {
                Some(p) => {
                    p.stdin = None;
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("POST", "/process.Process/SendSignal") => {
            lock(&inner.record).signals += 1;
            let pid = r.json()["process"]["pid"].as_u64().unwrap_or(0) as u32;
            let kill = lock(&inner.procs)
                .get_mut(&pid)
                .and_then(|p| Some((p.kill.take()?, p.line.clone())));
            match kill {
                Some((k, line)) => {
                    lock(&inner.record).signalled.push(line);
                    let _ = k.send(());
                    json_resp(200, json!({}))
                }
                None => connect_err(
                    404,
                    "not_found",
                    &format!("process with pid {pid} not found"),
                ),
            }
        }
        ("GET", "/files") => download(&r, lock(&inner.knobs).ignore_range),
        ("POST", "/files") => upload(&r),
        ("POST", "/filesystem.Filesystem/ListDir") => {
            let b = r.json();
            let path = b["path"].as_str().unwrap_or_default();
            let depth = b["depth"].as_u64().unwrap_or(1).max(1);
            let p = std::path::Path::new(path);
            if !p.exists() {
                return connect_err(404, "not_found", &format!("path not found: {path}"));
            }
            if !p.is_dir() {
                return connect_err(
                    400,
                    "invalid_argument",
                    &format!("path is not a directory: {path}"),
                );
            }
            let mut entries = Vec::new();
            walk(p, depth, &mut entries);
            json_resp(200, json!({ "entries": entries }))
        }
        ("POST", "/filesystem.Filesystem/Stat") => {
            let path = r.json()["path"].as_str().unwrap_or_default().to_owned();
            match std::fs::symlink_metadata(&path) {
                Ok(m) => json_resp(
                    200,
                    json!({"entry": entry_info(std::path::Path::new(&path), &m)}),
                ),
                Err(_) => connect_err(
                    404,
                    "not_found",
                    &format!("no such file or directory: {path}"),
                ),
            }
        }
        ("POST", "/filesystem.Filesystem/Remove") => {
            let path = r.json()["path"].as_str().unwrap_or_default().to_owned();
            let p = std::path::Path::new(&path);
            let res = if p.is_dir() {
                std::fs::remove_dir_all(p)
            } else {
                std::fs::remove_file(p)
            };
            match res {
                Ok(()) => json_resp(200, json!({})),
                Err(_) => connect_err(
                    404,
                    "not_found",
                    &format!("no such file or directory: {path}"),
                ),
            }
        }
        _ => connect_err(404, "unimplemented", "no such procedure"),
    }
}
/// `EntryInfo` in protobuf JSON: zero values omitted, `size` an int64 string, enum names.
fn entry_info(path: &std::path::Path, m: &std::fs::Metadata) -> Value {
    use std::os::unix::fs::PermissionsExt;
    let (kind, mode_bits) = if m.file_type().is_symlink() {
        ("FILE_TYPE_SYMLINK", 1u32 << 27)
    } else if m.is_dir() {
        ("FILE_TYPE_DIRECTORY", 1u32 << 31)
    } else {
        ("FILE_TYPE_FILE", 0)
    };
    let modified: chrono::DateTime<chrono::Utc> = m
        .modified()
        .map(Into::into)
        .unwrap_or_else(|_| chrono::Utc::now());
    let mut v = json!({
        "name": path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        "type": kind,
        "path": path.to_string_lossy(),
        "mode": mode_bits | (m.permissions().mode() & 0o7777),
        "permissions": "-rw-r--r--",
        "owner": "user", "group": "user",
        "modifiedTime": modified.to_rfc3339(),
    });
    if m.len() > 0 && !m.is_dir() {
        v["size"] = json!(m.len().to_string());
    }
    v
}
fn walk(dir: &std::path::Path, depth: u64, out: &mut Vec<Value>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.push(entry_info(&p, &m));
        if m.is_dir() && depth > 1 {
            walk(&p, depth - 1, out);
        }
    }
}
fn download(r: &Req, ignore_range: bool) -> Response {
    let path = r.q("path").unwrap_or_default();
    let p = std::path::Path::new(path);
    if p.is_dir() {
        return err(400, &format!("path '{path}' is a directory"));
    }
    let Ok(data) = std::fs::read(p) else {
        return err(404, &format!("path '{path}' does not exist"));
    };
    let range = r
        .header("range")
        .and_then(|h| h.strip_prefix("bytes="))
        .and_then(|h| h.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().ok()));
    let total = data.len();
    match range {
        Some((start, end)) if !data.is_empty() && !ignore_range => {
            if start >= total {
                return (
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    [("content-range", format!("bytes */{total}"))],
                )
                    .into_response();
            }
            let end = end.unwrap_or(total - 1).min(total - 1);
            (
                StatusCode::PARTIAL_CONTENT,
                [
                    ("content-type", "application/octet-stream".to_owned()),
                    ("content-range", format!("bytes {start}-{end}/{total}")),
                ],
                data[start..=end].to_vec(),
            )
                .into_response()
        }
        _ => (
            StatusCode::OK,
            [("content-type", "application/octet-stream")],
            data,
        )
            .into_response(),
    }
}
fn upload(r: &Req) -> Response {
    let path = r.q("path").unwrap_or_default().to_owned();
    if r.header("content-type") != Some("application/octet-stream") {
        return err(400, "unsupported content type");
    }
    let p = std::path::Path::new(&path);
    if p.is_dir() {
        return err(400, &format!("path '{path}' is a directory"));
    }
    if let Some(parent) = p.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match std::fs::write(p, &r.body) {
        Ok(()) => json_resp(
            200,
            json!([{"path": path, "name": p.file_name().map(|n| n.to_string_lossy().into_owned()), "type": "file"}]),
        ),
        Err(e) => err(500, &format!("error writing file '{path}': {e}")),
    }
}
