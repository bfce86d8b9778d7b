//! envd's plain HTTP `/files`: `GET` downloads one file, `POST` uploads one (octet-stream,
//! or a multipart part with the `path` query) or several (multipart parts without `path`,
//! each to its `filename`). Paths resolve against the user's home as envd's do; `username`
//! picks the user. Each file is one `/v1` file call, so its scopes, limits and audit apply.
//! A call carries `X-Access-Token`, or is a signed URL (`signature=`, see `signed`), which
//! is how a browser or plain HTTP client reaches a file without headers.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::RawQuery;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use crate::facade::opensandbox::files::MAX_UPLOAD_BYTES;
use crate::facade::opensandbox::inner::{q, read_all};
use crate::facade::opensandbox::multipart;

use super::connect::ConnectError;
use super::envd::{check_port, ctx, ctx_of, named_sandbox, Ctx, EnvdError};
use super::signed::{Operation, SignError, SignedRequest};
use super::{token, Facade};

struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    expiration: Option<String>,
}

fn query(raw: Option<&str>) -> FilesQuery {
    let mut q = FilesQuery {
        path: None,
        username: None,
        signature: None,
        expiration: None,
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match &*k {
            "path" => q.path = Some(v.into_owned()),
            "username" => q.username = Some(v.into_owned()),
            "signature" => q.signature = Some(v.into_owned()),
            "signature_expiration" => q.expiration = Some(v.into_owned()),
            _ => {}
        }
    }
    q
}

/// The caller and the `path` query of a `/files` request: by its `X-Access-Token`, or, when
/// it has none and carries a `signature`, by the signature (envd's order).
fn start(
    f: &Facade,
    h: &HeaderMap,
    raw: Option<&str>,
    op: Operation,
) -> Result<(Ctx, Option<String>), EnvdError> {
    let q = query(raw);
    let has_token = h
        .get(token::HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| !t.trim().is_empty());
    let Some(sig) = q.signature.as_deref().filter(|_| !has_token) else {
        let c = ctx(f, h, q.username.as_deref())?;
        return Ok((c, q.path));
    };
    check_port(h)?;
    let req = SignedRequest {
        path: q.path.as_deref().unwrap_or(""),
        user: q.username.as_deref().unwrap_or(""),
        signature: sig,
        expiration: q.expiration.as_deref(),
        op,
    };
    let now = chrono::Utc::now().timestamp();
    let (sandbox, key_id) = f
        .seen
        .verify(&req, named_sandbox(h), now)
        .map_err(|e| match e {
            SignError::BadExpiration => ConnectError::field("signature_expiration", e),
            e => ConnectError::new("unauthenticated", e.to_string()),
        })?;
    let c = ctx_of(h, q.username.as_deref(), sandbox, key_id)?;
    Ok((c, q.path))
}

/// `GET /files?path=&username=`: the file's bytes.
pub async fn download(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let (c, path) = match start(&f, &headers, raw.as_deref(), Operation::Read) {
        Ok(x) => x,
        Err(e) => return e.rest(),
    };
    let Some(path) = path else {
        return EnvdError::from(ConnectError::field("path", "required")).rest();
    };
    let path = c.resolve(&path);
    let uri = format!("/v1/sandboxes/{}/files?path={}", q(&c.sandbox), q(&path));
    let resp = match f
        .v1
        .call(&c.caller, Method::GET, &uri, &[], Body::empty())
        .await
    {
        Ok(r) => r,
        Err(e) => return EnvdError::from(ConnectError::new("internal", e.message)).rest(),
    };
    let status = resp.status();
    if !status.is_success() {
        let bytes = read_all(resp).await.unwrap_or_default();
        return match EnvdError::from_v1(&c.sandbox, status, &bytes) {
            EnvdError::Rpc(e) if e.code == "not_found" => EnvdError::Rpc(ConnectError::new(
                "not_found",
                format!("path '{path}' does not exist"),
            ))
            .rest(),
            e => e.rest(),
        };
    }
    let mut out = Response::new(resp.into_body());
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    out
}

/// One file written through `/v1`.
async fn put(f: &Facade, c: &Ctx, path: &str, body: Body) -> Result<Value, EnvdError> {
    let uri = format!("/v1/sandboxes/{}/files?path={}", q(&c.sandbox), q(path));
    let resp =
        f.v1.call(&c.caller, Method::PUT, &uri, &[], body)
            .await
            .map_err(|e| EnvdError::from(ConnectError::new("internal", e.message)))?;
    let status = resp.status();
    if !status.is_success() {
        let bytes = read_all(resp).await.unwrap_or_default();
        return Err(EnvdError::from_v1(&c.sandbox, status, &bytes));
    }
    let name = path.rsplit('/').next().unwrap_or_default();
    Ok(json!({ "name": name, "type": "file", "path": path }))
}

/// `POST /files?path=&username=`: `[{name, type, path}]`, one per file, in order.
pub async fn upload(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
    body: Body,
) -> Response {
    let (c, path) = match start(&f, &headers, raw.as_deref(), Operation::Write) {
        Ok(x) => x,
        Err(e) => return e.rest(),
    };
    if headers
        .keys()
        .any(|k| k.as_str().starts_with("x-metadata-"))
    {
        return EnvdError::from(ConnectError::unimplemented(
            "file metadata",
            "X-Metadata-* headers are not kept",
        ))
        .rest();
    }
    if headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return EnvdError::from(ConnectError::unimplemented(
            "compressed uploads",
            "send the file without Content-Encoding",
        ))
        .rest();
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let result = match multipart::boundary(ct) {
        None => match path {
            // A raw body goes to /v1 as it streams in.
            Some(p) => put(&f, &c, &c.resolve(&p), body).await.map(|e| vec![e]),
            None => Err(ConnectError::field("path", "required for an octet-stream upload").into()),
        },
        Some(boundary) => upload_parts(&f, &c, path.as_deref(), body, &boundary).await,
    };
    match result {
        Ok(entries) => (StatusCode::OK, Json(Value::Array(entries))).into_response(),
        Err(e) => e.rest(),
    }
}

async fn upload_parts(
    f: &Facade,
    c: &Ctx,
    path: Option<&str>,
    body: Body,
    boundary: &str,
) -> Result<Vec<Value>, EnvdError> {
    let bytes = axum::body::to_bytes(body, MAX_UPLOAD_BYTES)
        .await
        .map_err(|_| {
            ConnectError::new(
                "resource_exhausted",
                format!(
                    "multipart uploads through the facade are at most {MAX_UPLOAD_BYTES} bytes"
                ),
            )
        })?;
    let parts = multipart::parse(&bytes, boundary).map_err(|e| ConnectError::field("body", e))?;
    let files: Vec<_> = parts.into_iter().filter(|p| p.name == "file").collect();
    if files.is_empty() {
        return Err(ConnectError::field("file", "no multipart part named file").into());
    }
    if path.is_some() && files.len() > 1 {
        return Err(ConnectError::field("path", "names one file; several parts need none").into());
    }
    let mut out = Vec::with_capacity(files.len());
    for part in files {
        let dest = match (path, part.filename.as_deref()) {
            (Some(p), _) => p.to_owned(),
            (None, Some(name)) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(ConnectError::field("filename", "a part without path needs one").into())
            }
        };
        out.push(put(f, c, &c.resolve(&dest), Body::from(part.data)).await?);
    }
    Ok(out)
}
