//! execd's file routes at `/opensandbox/execd/{id}/files|directories/...`, onto `/v1`'s files
//! routes (mkdir on `POST …/files/directories`); the few execd has and `/v1` does not
//! (rm -r, mv, chmod) run as a `/v1` exec of the plain tool (audited as that exec).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::error::{OsbError, OsbResult};
use super::execd::execd_caller;
use super::inner::{q, read_all, Caller};
use super::multipart;
use super::Facade;

/// The largest upload the facade buffers (execd's multipart is parsed whole).
pub const MAX_UPLOAD_BYTES: usize = 256 << 20;

fn query_pairs(raw: &Option<String>) -> Vec<(String, String)> {
    form_urlencoded::parse(raw.as_deref().unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn first(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

fn missing(key: &str) -> OsbError {
    OsbError::new(
        StatusCode::BAD_REQUEST,
        "MISSING_QUERY",
        format!("{key} is required"),
    )
}

/// execd's mode (octal digits written as a decimal integer) as `/v1`'s octal string.
fn mode_digits(v: &Value) -> OsbResult<Option<String>> {
    match v {
        Value::Null => Ok(None),
        Value::Number(n) => {
            let d = n
                .as_u64()
                .map(|d| d.to_string())
                .filter(|d| d.len() <= 4 && d.bytes().all(|b| (b'0'..=b'7').contains(&b)))
                .ok_or_else(|| OsbError::field("mode", "octal digits, e.g. 644"))?;
            Ok(Some(d))
        }
        _ => Err(OsbError::field("mode", "must be an integer such as 644")),
    }
}

fn no_owner(meta: &Value) -> OsbResult<()> {
    for k in ["owner", "group"] {
        if !meta[k].is_null() {
            return Err(OsbError::unsupported_field(
                k,
                "file ownership cannot be set",
            ));
        }
    }
    Ok(())
}

/// `POST /files/upload`: pairs of `metadata` (JSON `{path, owner, group, mode}`) and `file`
/// parts, matched by index; the destination is `metadata.path`, never the filename.
pub async fn upload(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let boundary = multipart::boundary(ct).ok_or_else(|| {
        OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_FILE",
            "expected multipart/form-data",
        )
    })?;
    let bytes = axum::body::to_bytes(body, MAX_UPLOAD_BYTES)
        .await
        .map_err(|_| {
            OsbError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "INVALID_FILE",
                format!("uploads through the facade are at most {MAX_UPLOAD_BYTES} bytes"),
            )
        })?;
    let parts = multipart::parse(&bytes, &boundary)
        .map_err(|e| OsbError::new(StatusCode::BAD_REQUEST, "INVALID_FILE", e))?;
    let metas: Vec<_> = parts.iter().filter(|p| p.name == "metadata").collect();
    let files: Vec<_> = parts.iter().filter(|p| p.name == "file").collect();
    if metas.is_empty() || metas.iter().any(|m| m.filename.is_none()) {
        return Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_FILE_METADATA",
            "metadata file is missing",
        ));
    }
    if metas.len() != files.len() {
        return Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_FILE",
            "each metadata part needs one file part",
        ));
    }
    for (m, file) in metas.iter().zip(files) {
        let meta: Value = crate::requests::body::read_value(&m.data)
            .map_err(|e| OsbError::json("INVALID_FILE_METADATA", e))?;
        let path = meta["path"].as_str().ok_or_else(|| {
            OsbError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_FILE_METADATA",
                "metadata.path is required",
            )
        })?;
        no_owner(&meta)?;
        let mode = mode_digits(&meta["mode"])?.unwrap_or_else(|| "755".into());
        let uri = format!(
            "/v1/sandboxes/{}/files?path={}&mode={mode}",
            q(&id),
            q(path)
        );
        let resp =
            f.v1.call(
                &caller,
                Method::PUT,
                &uri,
                &[(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                )],
                Body::from(file.data.clone()),
            )
            .await?;
        let st = resp.status();
        if !st.is_success() {
            let h = resp.headers().clone();
            let b = read_all(resp).await?;
            return Err(OsbError::from_v1_answer(st, &h, &b, &caller));
        }
    }
    Ok(StatusCode::OK)
}

/// `GET /files/download?path=` [`Range`] [`offset`&`limit` line mode].
pub async fn download(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<Response> {
    let caller = execd_caller(&f, &headers, &id)?;
    let pairs = query_pairs(&raw);
    let path = first(&pairs, "path").ok_or_else(|| missing("path"))?;
    let offset = first(&pairs, "offset");
    let limit = first(&pairs, "limit");
    let mut extra = vec![];
    if let Some(r) = headers.get(header::RANGE) {
        if offset.is_some() || limit.is_some() {
            return Err(OsbError::field(
                "Range",
                "cannot be combined with offset/limit",
            ));
        }
        extra.push((header::RANGE, r.clone()));
    }
    let uri = format!("/v1/sandboxes/{}/files?path={}", q(&id), q(&path));
    let resp =
        f.v1.call(&caller, Method::GET, &uri, &extra, Body::empty())
            .await?;
    let st = resp.status();
    if !st.is_success() {
        let h = resp.headers().clone();
        let b = read_all(resp).await?;
        let mut e = OsbError::from_v1_answer(st, &h, &b, &caller);
        if st == StatusCode::RANGE_NOT_SATISFIABLE {
            e.code = "INVALID_RANGE".into();
        }
        return Err(e);
    }
    if offset.is_some() || limit.is_some() {
        let parse = |v: Option<String>, name: &str| -> OsbResult<Option<usize>> {
            v.map(|s| {
                s.parse::<usize>()
                    .map_err(|_| OsbError::field(name, "must be an integer"))
            })
            .transpose()
        };
        let start = parse(offset, "offset")?.unwrap_or(1).max(1) - 1;
        let n = parse(limit, "limit")?.unwrap_or(usize::MAX);
        let bytes = read_all(resp).await?;
        let text = String::from_utf8_lossy(&bytes);
        let out: Vec<&str> = text.split_inclusive('\n').skip(start).take(n).collect();
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            out.concat(),
        )
            .into_response());
    }
    let (mut parts, body) = resp.into_parts();
    let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename={name}")) {
        parts.headers.insert(header::CONTENT_DISPOSITION, v);
    }
    parts
        .headers
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    parts.headers.remove("x-request-id");
    Ok(Response::from_parts(parts, body))
}

/// execd's `FileInfo` of a `/v1` listing entry.
fn file_info(e: &Value) -> Value {
    let kind = match e["type"].as_str().unwrap_or("other") {
        "dir" => "directory",
        "file" => "file",
        "symlink" => "symlink",
        _ => "other",
    };
    let mode = e["mode"]
        .as_u64()
        .map(|m| format!("{m:o}").parse::<u64>().unwrap_or(0))
        .unwrap_or(0);
    let at = e["modifiedAt"].clone();
    json!({
        "path": e["path"], "type": kind, "size": e["size"], "mode": mode,
        "modified_at": at, "created_at": at, "owner": "", "group": "",
    })
}

async fn list_v1(
    f: &Facade,
    caller: &Caller,
    id: &str,
    path: &str,
    depth: u32,
) -> OsbResult<Vec<Value>> {
    let uri = format!(
        "/v1/sandboxes/{}/files/list?path={}&depth={depth}",
        q(id),
        q(path)
    );
    let (_, v) = f.v1.json(caller, Method::GET, &uri, None).await?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// `GET /directories/list?path=&depth=`.
pub async fn list(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    let pairs = query_pairs(&raw);
    let path = first(&pairs, "path").ok_or_else(|| missing("path"))?;
    let depth = match first(&pairs, "depth") {
        None => 1,
        Some(d) => d
            .parse::<u32>()
            .map_err(|_| OsbError::field("depth", "must be an integer"))?
            .clamp(1, crate::routes::files::MAX_DEPTH),
    };
    let items = list_v1(&f, &caller, &id, &path, depth).await?;
    Ok(Json(Value::Array(items.iter().map(file_info).collect())))
}

/// `GET /files/info?path=&path=` → `{path: FileInfo}` (each from its parent's listing).
pub async fn info(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    let paths: Vec<String> = query_pairs(&raw)
        .into_iter()
        .filter(|(k, _)| k == "path")
        .map(|(_, v)| v)
        .collect();
    if paths.is_empty() {
        return Err(missing("path"));
    }
    let mut out = serde_json::Map::new();
    for p in paths {
        let trimmed = p.trim_end_matches('/');
        let info = if trimmed.is_empty() {
            json!({"path": "/", "type": "directory", "size": 0, "mode": 755, "owner": "", "group": "",
                "modified_at": null, "created_at": null})
        } else {
            let parent = match trimmed.rfind('/') {
                Some(0) => "/",
                Some(i) => &trimmed[..i],
                None => return Err(OsbError::field("path", "must be absolute")),
            };
            let items = list_v1(&f, &caller, &id, parent, 1).await?;
            let found = items
                .iter()
                .find(|e| e["path"].as_str() == Some(trimmed))
                .ok_or_else(|| {
                    OsbError::new(
                        StatusCode::NOT_FOUND,
                        "FILE_NOT_FOUND",
                        format!("no such file: {p}"),
                    )
                })?;
            file_info(found)
        };
        out.insert(p, info);
    }
    Ok(Json(Value::Object(out)))
}

/// Glob match with `*`, `?` and `**` (`*` stays within a path segment).
pub fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) if p.get(1) == Some(&b'*') => {
                let rest = &p[2..];
                let rest = rest.strip_prefix(b"/").unwrap_or(rest);
                (0..=t.len()).any(|i| go(rest, &t[i..]))
            }
            (Some(b'*'), _) => (0..=t.len())
                .take_while(|i| *i == 0 || t[i - 1] != b'/')
                .any(|i| go(&p[1..], &t[i..])),
            (Some(b'?'), Some(c)) if *c != b'/' => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// `GET /files/search?path=&pattern=`: the files under `path` (16 levels) whose name, or
/// path below `path` when the pattern has a `/`, matches.
pub async fn search(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<Json<Value>> {
    let caller = execd_caller(&f, &headers, &id)?;
    let pairs = query_pairs(&raw);
    let path = first(&pairs, "path").ok_or_else(|| missing("path"))?;
    let pattern = first(&pairs, "pattern").unwrap_or_else(|| "**".into());
    let items = list_v1(&f, &caller, &id, &path, crate::routes::files::MAX_DEPTH).await?;
    let base = path.trim_end_matches('/');
    let hits = items
        .iter()
        .filter(|e| e["type"].as_str() != Some("dir"))
        .filter(|e| {
            let p = e["path"].as_str().unwrap_or_default();
            let rel = p.strip_prefix(base).unwrap_or(p).trim_start_matches('/');
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if pattern.contains('/') || pattern.contains("**") {
                glob(&pattern, rel)
            } else {
                glob(&pattern, name)
            }
        })
        .map(file_info)
        .collect();
    Ok(Json(Value::Array(hits)))
}

/// `DELETE /files?path=&path=` (files only).
pub async fn delete_files(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let paths: Vec<String> = query_pairs(&raw)
        .into_iter()
        .filter(|(k, _)| k == "path")
        .map(|(_, v)| v)
        .collect();
    if paths.is_empty() {
        return Err(missing("path"));
    }
    for p in paths {
        let uri = format!("/v1/sandboxes/{}/files?path={}", q(&id), q(&p));
        f.v1.json(&caller, Method::DELETE, &uri, None).await?;
    }
    Ok(StatusCode::OK)
}

/// One tool run as a `/v1` exec; a non-zero exit is a 400 with its stderr.
async fn tool(f: &Facade, caller: &Caller, id: &str, argv: Vec<String>) -> OsbResult<()> {
    let (_, r) =
        f.v1.json(
            caller,
            Method::POST,
            &format!("/v1/sandboxes/{}/exec", q(id)),
            Some(&json!({ "command": argv, "timeoutSeconds": 60 })),
        )
        .await?;
    match r["exitCode"].as_i64() {
        Some(0) => Ok(()),
        _ => Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "RUNTIME_ERROR",
            r["stderr"].as_str().unwrap_or("failed").trim().to_owned(),
        )),
    }
}

fn json_body(body: &Bytes) -> OsbResult<Value> {
    crate::requests::body::read_value(body).map_err(|e| OsbError::json("INVALID_REQUEST_BODY", e))
}

/// `POST /directories` `{path: {mode, owner?, group?}}` (mkdir -p), on `/v1`'s directory
/// call: a directory already there keeps its mode, as with `mkdir -p -m`.
pub async fn make_dirs(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req = json_body(&body)?;
    let m = req
        .as_object()
        .ok_or_else(|| OsbError::field("body", "must be {path: {mode}}"))?;
    for (path, perm) in m {
        crate::routes::files::validate_path(path).map_err(|e| OsbError::checked("path", e))?;
        no_owner(perm)?;
        // As execd reads it: the special bits dropped, 0 (or none) not applied (755).
        let mode = mode_digits(&perm["mode"])?
            .and_then(|d| u32::from_str_radix(&d, 8).ok())
            .map(|m| m & 0o777)
            .filter(|m| *m != 0)
            .unwrap_or(0o755);
        let uri = format!("/v1/sandboxes/{}/files/directories", q(&id));
        let body = json!({ "path": path, "mode": format!("{mode:o}") });
        f.v1.json(&caller, Method::POST, &uri, Some(&body)).await?;
    }
    Ok(StatusCode::OK)
}

/// `DELETE /directories?path=` (rm -rf).
pub async fn remove_dirs(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let paths: Vec<String> = query_pairs(&raw)
        .into_iter()
        .filter(|(k, _)| k == "path")
        .map(|(_, v)| v)
        .collect();
    if paths.is_empty() {
        return Err(missing("path"));
    }
    for p in paths {
        crate::routes::files::validate_path(&p).map_err(|e| OsbError::checked("path", e))?;
        if p.trim_end_matches('/').is_empty() {
            return Err(OsbError::field("path", "will not remove /"));
        }
        tool(
            &f,
            &caller,
            &id,
            vec!["rm".into(), "-rf".into(), "--".into(), p],
        )
        .await?;
    }
    Ok(StatusCode::OK)
}

/// `POST /files/mv` `[{src, dest}]`.
pub async fn move_files(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req = json_body(&body)?;
    for item in req
        .as_array()
        .ok_or_else(|| OsbError::field("body", "must be [{src, dest}]"))?
    {
        let (Some(src), Some(dest)) = (item["src"].as_str(), item["dest"].as_str()) else {
            return Err(OsbError::field("src", "src and dest are required"));
        };
        for (field, p) in [("src", src), ("dest", dest)] {
            crate::routes::files::validate_path(p).map_err(|e| OsbError::checked(field, e))?;
        }
        tool(
            &f,
            &caller,
            &id,
            vec!["mv".into(), "--".into(), src.into(), dest.into()],
        )
        .await?;
    }
    Ok(StatusCode::OK)
}

/// `POST /files/permissions` `{path: {mode, owner?, group?}}` (chmod).
pub async fn permissions(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<StatusCode> {
    let caller = execd_caller(&f, &headers, &id)?;
    let req = json_body(&body)?;
    let m = req
        .as_object()
        .ok_or_else(|| OsbError::field("body", "must be {path: {mode}}"))?;
    for (path, perm) in m {
        crate::routes::files::validate_path(path).map_err(|e| OsbError::checked("path", e))?;
        no_owner(perm)?;
        if let Some(mode) = mode_digits(&perm["mode"])? {
            tool(
                &f,
                &caller,
                &id,
                vec!["chmod".into(), mode, "--".into(), path.clone()],
            )
            .await?;
        }
    }
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_execd() {
        assert!(glob("*.txt", "a.txt"));
        assert!(!glob("*.txt", "d/a.txt"));
        assert!(glob("**/*.txt", "d/e/a.txt"));
        assert!(glob("**", "x/y"));
        assert!(glob("a?c", "abc"));
    }

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(mode_digits(&json!(644)).unwrap().as_deref(), Some("644"));
        assert!(mode_digits(&json!(999)).is_err());
        let info =
            file_info(&json!({"path":"/a","type":"dir","size":1,"mode":493,"modifiedAt":"t"}));
        assert_eq!(info["mode"], 755);
        assert_eq!(info["type"], "directory");
        assert_eq!(info["owner"], "");
    }
}
