//! OpenSandbox's lifecycle API (`/opensandbox/v1/...`), each route one or two `/v1` calls.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::error::{OsbError, OsbResult};
use super::inner::{q, Caller};
use super::mapping::{self, created_of, is_gone, sandbox_of, snapshot_of, Asked};
use super::token::{self, Claims};
use super::{Facade, PREFIX};
use crate::requests::body::JsonError;

/// The execd port the SDKs ask for.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar port the SDKs look up (and, in the basic flow, never call).
pub const EGRESS_PORT: u16 = 18080;

fn parse_json(body: &Bytes) -> OsbResult<Value> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    crate::requests::body::read_value(body).map_err(|e| match e {
        JsonError::DuplicateKey { path } => OsbError::field(&path, "duplicate key"),
        other => OsbError::field("body", format!("not valid JSON: {other}")),
    })
}

/// A `/v1` sandbox, 404 when it is gone for OpenSandbox clients.
pub async fn live_sandbox(f: &Facade, caller: &Caller, id: &str) -> OsbResult<Value> {
    let (_, sbx) =
        f.v1.json(
            caller,
            Method::GET,
            &format!("/v1/sandboxes/{}", q(id)),
            None,
        )
        .await?;
    let status = sbx["status"].as_str().unwrap_or("");
    if is_gone(status) {
        return Err(OsbError::new(
            StatusCode::NOT_FOUND,
            "DIFFERENTLY::SANDBOX_NOT_FOUND",
            format!("sandbox {id} not found (it is {status})"),
        ));
    }
    Ok(sbx)
}

/// `GET /health`.
pub async fn health() -> Json<Value> {
    Json(json!({ "status": "healthy" }))
}

/// `GET /version`.
pub async fn version() -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "server": "differently",
        "compatibleWith": "opensandbox-server 1.1.1",
    }))
}

/// `POST /v1/metrics/events`: the SDKs' telemetry, accepted and dropped (nothing leaves).
pub async fn metrics_events() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `POST /v1/sandboxes` → 202 (queued sandboxes answer `Pending` at once; the SDK then
/// waits on `/ping`, which answers 409 until the sandbox runs).
pub async fn create(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Bytes,
) -> OsbResult<Response> {
    let caller = Caller::from_headers(&headers);
    let req = parse_json(&body)?;
    let v1_body = mapping::create_body(&req)?;
    let mut extra = vec![(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )];
    if let Some(k) = headers.get("idempotency-key") {
        extra.push((
            header::HeaderName::from_static("idempotency-key"),
            k.clone(),
        ));
    }
    let resp =
        f.v1.call(
            &caller,
            Method::POST,
            "/v1/sandboxes",
            &extra,
            v1_body.to_string().into(),
        )
        .await?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = super::inner::read_all(resp).await?;
    if !status.is_success() {
        return Err(
            OsbError::from_v1_answer(status, &headers, &bytes, &caller).named_for(Asked::Create)
        );
    }
    let sbx: Value =
        serde_json::from_slice(&bytes).map_err(|e| OsbError::internal(format!("create: {e}")))?;
    Ok((StatusCode::ACCEPTED, Json(created_of(&sbx))).into_response())
}

/// `GET /v1/sandboxes/{id}`.
pub async fn get(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    Ok(Json(sandbox_of(&live_sandbox(&f, &caller, &id).await?)))
}

/// The most sandboxes one list reads from `/v1` (pagination is computed over them).
const LIST_SCAN_MAX: usize = 10_000;

/// `GET /v1/sandboxes?state=&state=&metadata=k%3Dv%26k2%3Dv2&page=&pageSize=`.
pub async fn list(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    let mut states: Vec<&'static str> = Vec::new();
    let mut any_state = false;
    let mut labels: Vec<(String, String)> = Vec::new();
    let (mut page, mut page_size) = (1u64, 20u64);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "state" => {
                any_state = true;
                let s = mapping::statuses_of(&v)
                    .ok_or_else(|| OsbError::field("state", format!("unknown state `{v}`")))?;
                states.extend_from_slice(s);
            }
            "metadata" => {
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    if mk.is_empty() {
                        return Err(OsbError::new(
                            StatusCode::BAD_REQUEST,
                            "INVALID_METADATA_FORMAT",
                            "metadata: expected a URL-encoded k=v&k2=v2 string",
                        ));
                    }
                    labels.push((mk.into_owned(), mv.into_owned()));
                }
            }
            "page" => {
                page = v
                    .parse()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| OsbError::field("page", "must be an integer >= 1"))?
            }
            "pageSize" => {
                page_size = v
                    .parse()
                    .ok()
                    .filter(|p| (1..=200).contains(p))
                    .ok_or_else(|| OsbError::field("pageSize", "must be an integer 1..200"))?
            }
            other => return Err(OsbError::field(other, "unknown query parameter")),
        }
    }
    // One `/v1` status and the first label narrow the scan in the store; the rest is
    // filtered here.
    let mut base = String::from("/v1/sandboxes?limit=1000");
    if states.len() == 1 {
        base.push_str(&format!("&status={}", states[0]));
    }
    if let Some((k, v)) = labels.first() {
        base.push_str(&format!("&label={}", q(&format!("{k}={v}"))));
    }
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let uri = match &cursor {
            Some(c) => format!("{base}&cursor={}", q(c)),
            None => base.clone(),
        };
        let (_, page_v) = f.v1.json(&caller, Method::GET, &uri, None).await?;
        for s in page_v["items"].as_array().into_iter().flatten() {
            let status = s["status"].as_str().unwrap_or("");
            let state_ok = if any_state {
                states.contains(&status)
            } else {
                !is_gone(status)
            };
            let labels_ok = labels
                .iter()
                .all(|(k, v)| s["labels"][k].as_str() == Some(v.as_str()));
            if state_ok && labels_ok {
                items.push(sandbox_of(s));
            }
        }
        cursor = page_v["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() || items.len() >= LIST_SCAN_MAX {
            break;
        }
    }
    let total = items.len() as u64;
    let total_pages = total.div_ceil(page_size);
    let start = ((page - 1) * page_size).min(total) as usize;
    let end = (start + page_size as usize).min(items.len());
    Ok(Json(json!({
        "items": items[start..end],
        "pagination": {
            "page": page,
            "pageSize": page_size,
            "totalItems": total,
            "totalPages": total_pages,
            "hasNextPage": page < total_pages,
        }
    })))
}

/// `DELETE /v1/sandboxes/{id}` → 204; 404 once it is gone.
pub async fn delete(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> OsbResult<StatusCode> {
    let caller = Caller::from_headers(&headers);
    live_sandbox(&f, &caller, &id).await?;
    f.v1.json(
        &caller,
        Method::DELETE,
        &format!("/v1/sandboxes/{}", q(&id)),
        None,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn transition(
    f: &Facade,
    headers: &HeaderMap,
    id: &str,
    verb: &str,
) -> OsbResult<StatusCode> {
    let caller = Caller::from_headers(headers);
    // A killed sandbox is 404 whatever its pool can do (`/v1` checks the capability first).
    live_sandbox(f, &caller, id).await?;
    f.v1.json(
        &caller,
        Method::POST,
        &format!("/v1/sandboxes/{}/{verb}", q(id)),
        None,
    )
    .await?;
    Ok(StatusCode::ACCEPTED)
}

/// `POST /v1/sandboxes/{id}/pause` → 202.
pub async fn pause(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> OsbResult<StatusCode> {
    transition(&f, &headers, &id, "pause").await
}

/// `POST /v1/sandboxes/{id}/resume` → 202.
pub async fn resume(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> OsbResult<StatusCode> {
    transition(&f, &headers, &id, "resume").await
}

/// `POST /v1/sandboxes/{id}/renew-expiration` `{expiresAt}` → 200 `{expiresAt}`: the TTL
/// becomes the seconds from now to `expiresAt` (`/v1` renews from now).
pub async fn renew(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    let req = parse_json(&body)?;
    let at = req["expiresAt"]
        .as_str()
        .ok_or_else(|| OsbError::field("expiresAt", "required RFC 3339 timestamp"))?;
    let at = chrono::DateTime::parse_from_rfc3339(at)
        .map_err(|e| OsbError::field("expiresAt", format!("not an RFC 3339 timestamp: {e}")))?;
    let ms = (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds();
    if ms <= 0 {
        return Err(OsbError::new(
            StatusCode::BAD_REQUEST,
            "DIFFERENTLY::INVALID_EXPIRATION",
            "expiresAt must be in the future",
        ));
    }
    let ttl = (ms as u64).div_ceil(1000);
    let max = differently_core::sandbox::MAX_TTL_SECONDS;
    if ttl > max {
        return Err(OsbError::field(
            "expiresAt",
            format!(
                "must be at most {max} seconds ({} days) from now",
                max / 86_400
            ),
        ));
    }
    live_sandbox(&f, &caller, &id).await?;
    let (_, sbx) =
        f.v1.json(
            &caller,
            Method::PATCH,
            &format!("/v1/sandboxes/{}", q(&id)),
            Some(&json!({ "ttlSeconds": ttl })),
        )
        .await
        .map_err(|e| e.named_for(Asked::Renew))?;
    Ok(Json(json!({ "expiresAt": sbx["expiresAt"] })))
}

/// The `host[:port]` clients reached this server at (endpoints carry no scheme).
fn host_of(headers: &HeaderMap) -> OsbResult<String> {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .map(str::to_owned)
        .ok_or_else(|| OsbError::field("Host", "the request has no usable Host header"))
}

/// `GET /v1/sandboxes/{id}/endpoints/{port}`: execd is served by this facade
/// (`{host}/opensandbox/execd/{id}` with the sandbox's token in `headers`, the same answer
/// with or without `use_server_proxy`, valid at once even while the sandbox is queued);
/// the egress port answers a well-formed endpoint that serves nothing; any other port is
/// exposed through `/v1` (`POST /v1/sandboxes/{id}/ports`).
pub async fn endpoint(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path((id, port)): Path<(String, String)>,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| OsbError::field("port", "must be 1..65535"))?;
    live_sandbox(&f, &caller, &id).await?;
    let host = host_of(&headers)?;
    match port {
        EXECD_PORT => {
            let key_id = match &caller {
                Caller::Key(k) => crate::auth::parse_key(k)
                    .map(|p| p.key_id.to_owned())
                    .ok_or_else(OsbError::invalid_key)?,
                _ => return Err(OsbError::invalid_key()),
            };
            let token = f.sealer.seal(&Claims {
                sandbox_id: id.clone(),
                key_id,
                expires_unix: chrono::Utc::now().timestamp() + token::LIFETIME_SECONDS,
            });
            Ok(Json(json!({
                "endpoint": format!("{host}{PREFIX}/execd/{id}"),
                "headers": { token::HEADER: token },
            })))
        }
        EGRESS_PORT => Ok(Json(json!({
            "endpoint": format!("{host}{PREFIX}/egress/{id}"),
        }))),
        other => {
            let (_, exposed) =
                f.v1.json(
                    &caller,
                    Method::POST,
                    &format!("/v1/sandboxes/{}/ports", q(&id)),
                    Some(&json!({ "port": other })),
                )
                .await?;
            let url = exposed["url"].as_str().unwrap_or_default();
            let bare = url
                .strip_prefix("https://")
                .or_else(|| url.strip_prefix("http://"))
                .unwrap_or(url)
                .trim_end_matches('/');
            Ok(Json(json!({ "endpoint": bare })))
        }
    }
}

/// `POST /v1/sandboxes/{id}/snapshots` `{name?}` → 202 Snapshot (+ `Location`).
pub async fn create_snapshot(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> OsbResult<Response> {
    let caller = Caller::from_headers(&headers);
    let req = parse_json(&body)?;
    let mut v1 = json!({});
    if let Some(n) = req.get("name").filter(|n| !n.is_null()) {
        v1["name"] = n.clone();
    }
    let (_, snp) =
        f.v1.json(
            &caller,
            Method::POST,
            &format!("/v1/sandboxes/{}/snapshots", q(&id)),
            Some(&v1),
        )
        .await?;
    let out = snapshot_of(&snp);
    let mut resp = (StatusCode::ACCEPTED, Json(out)).into_response();
    if let Some(sid) = snp["id"].as_str() {
        if let Ok(v) = HeaderValue::from_str(&format!("{PREFIX}/v1/snapshots/{sid}")) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
    }
    Ok(resp)
}

/// `GET /v1/snapshots?sandboxId=&state=&page=&pageSize=`.
pub async fn list_snapshots(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    let (mut sandbox, mut states, mut page, mut page_size) = (None, Vec::new(), 1u64, 20u64);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "sandboxId" => sandbox = Some(v.into_owned()),
            "state" => states.push(v.to_ascii_lowercase()),
            "page" => {
                page = v
                    .parse()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| OsbError::field("page", "must be an integer >= 1"))?
            }
            "pageSize" => {
                page_size = v
                    .parse()
                    .ok()
                    .filter(|p| (1..=200).contains(p))
                    .ok_or_else(|| OsbError::field("pageSize", "must be an integer 1..200"))?
            }
            other => return Err(OsbError::field(other, "unknown query parameter")),
        }
    }
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut uri = String::from("/v1/snapshots?limit=1000");
        if let Some(c) = &cursor {
            uri.push_str(&format!("&cursor={}", q(c)));
        }
        let (_, pg) = f.v1.json(&caller, Method::GET, &uri, None).await?;
        for s in pg["items"].as_array().into_iter().flatten() {
            let sbx_ok = sandbox
                .as_deref()
                .is_none_or(|id| s["sandboxId"].as_str() == Some(id));
            let st_ok = states.is_empty()
                || states.contains(&s["status"].as_str().unwrap_or("").to_owned());
            if sbx_ok && st_ok {
                items.push(snapshot_of(s));
            }
        }
        cursor = pg["nextCursor"].as_str().map(str::to_owned);
        if cursor.is_none() || items.len() >= LIST_SCAN_MAX {
            break;
        }
    }
    let total = items.len() as u64;
    let total_pages = total.div_ceil(page_size);
    let start = ((page - 1) * page_size).min(total) as usize;
    let end = (start + page_size as usize).min(items.len());
    Ok(Json(json!({
        "items": items[start..end],
        "pagination": {"page": page, "pageSize": page_size, "totalItems": total,
            "totalPages": total_pages, "hasNextPage": page < total_pages}
    })))
}

/// `GET /v1/snapshots/{sid}`.
pub async fn get_snapshot(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(sid): Path<String>,
) -> OsbResult<Json<Value>> {
    let caller = Caller::from_headers(&headers);
    let (_, snp) =
        f.v1.json(
            &caller,
            Method::GET,
            &format!("/v1/snapshots/{}", q(&sid)),
            None,
        )
        .await
        .map_err(snapshot_not_found)?;
    Ok(Json(snapshot_of(&snp)))
}

/// `DELETE /v1/snapshots/{sid}` → 204.
pub async fn delete_snapshot(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(sid): Path<String>,
) -> OsbResult<StatusCode> {
    let caller = Caller::from_headers(&headers);
    f.v1.json(
        &caller,
        Method::DELETE,
        &format!("/v1/snapshots/{}", q(&sid)),
        None,
    )
    .await
    .map_err(snapshot_not_found)?;
    Ok(StatusCode::NO_CONTENT)
}

fn snapshot_not_found(mut e: OsbError) -> OsbError {
    if e.status == StatusCode::NOT_FOUND {
        e.code = "DIFFERENTLY::SNAPSHOT_NOT_FOUND".into();
    }
    e
}
