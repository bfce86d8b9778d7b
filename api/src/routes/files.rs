//! Files: `PUT`/`GET`/`DELETE /v1/sandboxes/{id}/files?path=/abs`, `GET …/files/list` and
//! `POST …/files/directories` (`mkdir -p`, without starting a process where the backend
//! can: see [`differently_adapters::Adapter::make_dir`]).
//! Straight to the adapter, streamed both ways (the upload body is never held in memory),
//! counted as activity. Paths must be absolute, without `..` or NUL; adapters refuse paths
//! that leave the sandbox through symlinks. Uploads over the limit (`DIFFERENTLY_MAX_UPLOAD_BYTES`,
//! default 1 GiB) are refused with 413, by `Content-Length` up front or while streaming.
//! Downloads honour a single `Range: bytes=…` (206, or 416 past the end). Every adapter call
//! is metered by the pool's adapter (`upload`, `download` until its body ends, `list_files`,
//! `delete_file`, `make_dir`).

use std::path::Component;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use differently_adapters::{AdapterError, ByteRange};
use differently_core::tenancy::Scope;
use differently_core::{ErrorCode, FieldError};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::Principal;
use crate::data_plane::call_events::CallEvents;
use crate::data_plane::{DataCall, Target};
use crate::error::{ApiError, ApiResult};
use crate::requests::body::parse_json;
use crate::requests::page::bad_query;
use crate::requests::query::StrictQuery;
use crate::AppState;

/// Default upload limit: 1 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;
/// Longest accepted path.
const MAX_PATH_LEN: usize = 4096;
/// Deepest listing.
pub const MAX_DEPTH: u32 = 16;

/// The upload limit: `DIFFERENTLY_MAX_UPLOAD_BYTES` if set to a number, else the default.
pub fn max_upload_bytes() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("DIFFERENTLY_MAX_UPLOAD_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MAX_UPLOAD_BYTES)
    })
}

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/files",
            get(download).put(upload).delete(delete),
        )
        .route("/v1/sandboxes/{id}/files/list", get(list))
        .route("/v1/sandboxes/{id}/files/directories", post(make_directory))
}

/// Checks a sandbox path: absolute, no `..`, no NUL, bounded length.
pub fn validate_path(path: &str) -> Result<(), FieldError> {
    if path.len() > MAX_PATH_LEN {
        return Err(FieldError::new("path", "is too long"));
    }
    if !path.starts_with('/') {
        return Err(FieldError::new("path", "must be absolute"));
    }
    if path.contains('\0') {
        return Err(FieldError::new("path", "may not contain NUL"));
    }
    if std::path::Path::new(path)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(FieldError::new("path", "may not contain `..`"));
    }
    Ok(())
}

/// Whether `path` (absolute, as [`validate_path`] lets it through) names the root directory:
/// `/`, `//`, `/.`, `/./`.
fn is_root(path: &str) -> bool {
    std::path::Path::new(path)
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::CurDir))
}

fn path_of(q: Option<&str>) -> ApiResult<String> {
    let p = q.ok_or_else(|| bad_query("path", "required"))?;
    validate_path(p).map_err(|e| ApiError::field(ErrorCode::InvalidArgument, e))?;
    Ok(p.to_owned())
}

fn file_error(e: AdapterError) -> ApiError {
    match e {
        AdapterError::PathNotFound(p) => ApiError::new(
            ErrorCode::NotFound,
            format!("no such file or directory: {p}"),
        ),
        other => other.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutQuery {
    path: Option<String>,
    mode: Option<String>,
}

async fn upload(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<PutQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    principal.require(Scope::FilesWrite)?;
    let path = path_of(q.path.as_deref())?;
    let mode = match q.mode.as_deref() {
        None => None,
        Some(m) => Some(
            octal_mode(m).ok_or_else(|| bad_query("mode", "octal permission bits, e.g. 644"))?,
        ),
    };
    let limit = max_upload_bytes();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let detail = json!({ "path": path });
    let call = DataCall::new(&state, &principal, &id, "files", "file.upload", detail);
    let (Target { pool, at, .. }, record) = call.open().await?;
    let events = CallEvents::new(&state, &principal, &record, &at.sandbox_id);
    let seen = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicBool::new(false));
    let (seen2, over2) = (seen.clone(), over.clone());
    let stream = body
        .into_data_stream()
        .map(move |chunk| match chunk {
            Ok(b) => {
                let total = seen2.fetch_add(b.len() as u64, Ordering::Relaxed) + b.len() as u64;
                if total > limit {
                    over2.store(true, Ordering::Relaxed);
                    Err(AdapterError::permanent("upload over the limit"))
                } else {
                    Ok(b)
                }
            }
            Err(e) => Err(AdapterError::permanent(format!("upload body: {e}"))),
        })
        .boxed();
    match pool.adapter.upload(&at, &path, mode, stream).await {
        Ok(()) => {
            if let Some(e) = events {
                e.file_written(&path, seen.load(Ordering::Relaxed));
            }
            Ok(StatusCode::NO_CONTENT)
        }
        Err(_) if over.load(Ordering::Relaxed) => Err(too_large(limit)),
        Err(e) => Err(file_error(e)),
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("uploads are limited to {limit} bytes"),
    )
    .with_details(json!({ "limitBytes": limit }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathQuery {
    path: Option<String>,
}

/// A parsed `Range` header: `bytes=a-b`, `bytes=a-` or `bytes=-n` (the last n bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RangeSpec {
    From(u64, Option<u64>),
    Suffix(u64),
}

/// Parses a single byte range; anything else (several ranges, other units) is ignored and
/// the whole file is served, as RFC 9110 allows.
fn parse_range(h: &str) -> Option<RangeSpec> {
    let spec = h.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return b.parse().ok().map(RangeSpec::Suffix);
    }
    let start = a.parse().ok()?;
    let end = if b.is_empty() {
        None
    } else {
        Some(b.parse().ok()?)
    };
    if end.is_some_and(|e| e < start) {
        return None;
    }
    Some(RangeSpec::From(start, end))
}

async fn download(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<PathQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    principal.require(Scope::FilesRead)?;
    let path = path_of(q.path.as_deref())?;
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range);
    let detail = json!({ "path": path });
    let call = DataCall::new(&state, &principal, &id, "files", "file.download", detail);
    let (Target { pool, at, .. }, _) = call.open().await?;
    let byte_range = match range {
        None => None,
        Some(RangeSpec::From(start, end)) => Some(ByteRange { start, end }),
        Some(RangeSpec::Suffix(n)) => {
            // The size is needed first: a listing of a file is its own entry.
            let entries = pool
                .adapter
                .list_files(&at, &path, 0)
                .await
                .map_err(file_error)?;
            let size = entries.first().map_or(0, |e| e.size);
            Some(ByteRange {
                start: size.saturating_sub(n),
                end: None,
            })
        }
    };
    // The pool's adapter meters this until the body has been sent (or the client went away).
    let dl = pool
        .adapter
        .download(&at, &path, byte_range)
        .await
        .map_err(file_error)?;
    let body = Body::from_stream(dl.body);
    let mut resp = match (byte_range, dl.total_size) {
        (Some(r), Some(total)) => {
            if r.start >= total && !(total == 0 && r.start == 0) {
                let mut resp = ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("range starts at {} but the file has {total} bytes", r.start),
                )
                .into_response();
                *resp.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{total}")) {
                    resp.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return Ok(resp);
            }
            let end = r.end.map_or(total - 1, |e| e.min(total - 1));
            let mut resp = (StatusCode::PARTIAL_CONTENT, body).into_response();
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {}-{end}/{total}", r.start)) {
                h.insert(header::CONTENT_RANGE, v);
            }
            h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - r.start + 1));
            resp
        }
        (_, total) => {
            let mut resp = (StatusCode::OK, body).into_response();
            if let Some(total) = total.filter(|_| byte_range.is_none()) {
                resp.headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(total));
            }
            resp
        }
    };
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    Ok(resp)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    path: Option<String>,
    depth: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<ListQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    principal.require(Scope::FilesRead)?;
    let path = path_of(q.path.as_deref().or(Some("/")))?;
    let depth = match q.depth.as_deref() {
        None => 1,
        Some(d) => d
            .parse::<u32>()
            .ok()
            .filter(|d| (1..=MAX_DEPTH).contains(d))
            .ok_or_else(|| bad_query("depth", format!("must be between 1 and {MAX_DEPTH}")))?,
    };
    let call = DataCall::new(
        &state,
        &principal,
        &id,
        "files",
        "file.list",
        json!({ "path": path }),
    );
    let (Target { pool, at, .. }, _) = call.open().await?;
    let items = pool
        .adapter
        .list_files(&at, &path, depth)
        .await
        .map_err(file_error)?;
    Ok(Json(json!({ "items": items })))
}

async fn delete(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    StrictQuery(q): StrictQuery<PathQuery>,
) -> ApiResult<StatusCode> {
    principal.require(Scope::FilesWrite)?;
    let path = path_of(q.path.as_deref())?;
    if is_root(&path) {
        // Never a request that can succeed, whatever the sandbox holds: refused here, naming
        // the field, rather than by each adapter in its own words.
        return Err(ApiError::field(
            ErrorCode::ValidationFailed,
            FieldError::new("path", "the root directory cannot be deleted"),
        ));
    }
    let call = DataCall::new(
        &state,
        &principal,
        &id,
        "files",
        "file.delete",
        json!({ "path": path }),
    );
    let (Target { pool, at, .. }, _) = call.open().await?;
    pool.adapter
        .delete_file(&at, &path)
        .await
        .map_err(file_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Body of `POST /v1/sandboxes/{id}/files/directories`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MakeDirectory {
    /// Absolute path of the directory; missing parents are made too (mode 755).
    path: String,
    /// Octal permission bits of the directory when it is made, `0`-`777`, e.g. `750`
    /// (default `755`). No setuid, setgid or sticky bit: not every backend can set them.
    mode: Option<String>,
}

/// Answer of `POST …/files/directories`: 201 when the directory was made, 200 when one was
/// already there (left as it was).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Directory {
    path: String,
    created: bool,
}

/// Octal permission bits as the API takes them (`644`, `0750`).
fn octal_mode(m: &str) -> Option<u32> {
    u32::from_str_radix(m, 8).ok().filter(|m| *m <= 0o7777)
}

async fn make_directory(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    principal.require(Scope::FilesWrite)?;
    let req: MakeDirectory = parse_json(&body)?;
    validate_path(&req.path).map_err(|e| ApiError::field(ErrorCode::InvalidArgument, e))?;
    let mode = match req.mode.as_deref() {
        None => None,
        Some(m) => Some(octal_mode(m).filter(|m| *m <= 0o777).ok_or_else(|| {
            ApiError::field(
                ErrorCode::InvalidArgument,
                FieldError::new("mode", "octal permission bits 0-777, e.g. 755"),
            )
        })?),
    };
    let call = DataCall::new(
        &state,
        &principal,
        &id,
        "files",
        "file.mkdir",
        json!({ "path": req.path }),
    );
    let (Target { pool, at, .. }, _) = call.open().await?;
    let created = pool
        .adapter
        .make_dir(&at, &req.path, mode)
        .await
        .map_err(file_error)?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let answer = Directory {
        path: req.path,
        created,
    };
    Ok((status, Json(answer)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9"), Some(RangeSpec::From(0, Some(9))));
        assert_eq!(parse_range("bytes=5-"), Some(RangeSpec::From(5, None)));
        assert_eq!(parse_range("bytes=-3"), Some(RangeSpec::Suffix(3)));
        assert_eq!(parse_range("bytes=9-1"), None);
        assert_eq!(parse_range("bytes=0-1,4-5"), None);
        assert_eq!(parse_range("items=0-1"), None);
    }

    #[test]
    fn paths() {
        assert!(validate_path("/a/b").is_ok());
        for bad in ["a", "/a/../b", "/..", "/a\0"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
    }
}
