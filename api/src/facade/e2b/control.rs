//! E2B's control plane under `/e2b`: the v2 routes current SDKs use and the v1 routes older
//! ones use, each one or more `/v1` calls under the caller's `X-API-KEY`.
//!
//! Create and connect answer only once the sandbox runs (the SDK sends envd calls right after
//! the answer and never polls): they wait on `/v1`'s wait for at most [`START_WAIT`], inside
//! the SDK's 60 s request timeout. A sandbox that has not started by then (queued behind a
//! quota or full pools) is deleted and answered 503 with `Should-Retry: false`, saying so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use differently_core::sandbox::MAX_TTL_SECONDS;

use crate::facade::opensandbox::inner::{q, Caller};

use super::error::{E2bError, E2bResult};
use super::mapping;
use super::Facade;

/// How long create and connect wait for the sandbox to run.
pub const START_WAIT: Duration = Duration::from_secs(50);
/// E2B's documented lifetime when create names none.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 300;

/// The caller of a control-plane request and its key id (for its envd tokens).
pub fn caller(h: &HeaderMap) -> E2bResult<(Caller, String)> {
    let key = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .or_else(|| {
            h.get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
        })
        .ok_or_else(E2bError::missing_key)?;
    // An `e2b_` alias (older SDKs insist on that shape) is its key, spelled in hex.
    let key = match super::alias::from_alias(key) {
        Some(k) => k,
        None => key.to_owned(),
    };
    let key_id = crate::auth::parse_key(&key)
        .map(|p| p.key_id.to_owned())
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::UNAUTHORIZED,
                "invalid API key: use a Differently API key (dly_…) or its e2b_ alias \
                 (`differently key e2b-alias`) as E2B_API_KEY",
            )
        })?;
    Ok((Caller::Key(key), key_id))
}

/// A `/v1` JSON call with its error mapped for the control plane.
pub(super) async fn call(
    f: &Facade,
    c: &Caller,
    method: Method,
    uri: &str,
    body: Option<&Value>,
    extra: &[(header::HeaderName, HeaderValue)],
) -> E2bResult<(StatusCode, Value)> {
    f.json(c, method, uri, body, extra)
        .await
        .map_err(|e| match e {
            super::InnerError::Answer(status, bytes) => E2bError::from_v1(status, &bytes),
            super::InnerError::Facade(e) => E2bError::from_osb(e),
        })
}

/// The caller's sandbox `id` while it has not ended; 404 otherwise.
pub(super) async fn live(f: &Facade, c: &Caller, id: &str) -> E2bResult<Value> {
    let (_, sbx) = call(
        f,
        c,
        Method::GET,
        &format!("/v1/sandboxes/{}", q(id)),
        None,
        &[],
    )
    .await
    .map_err(|e| {
        if e.status == StatusCode::NOT_FOUND {
            E2bError::sandbox_not_found(id)
        } else {
            e
        }
    })?;
    match mapping::state_of(sbx["status"].as_str().unwrap_or("")) {
        Some(_) => Ok(sbx),
        None => Err(E2bError::sandbox_not_found(id)),
    }
}

/// Waits until `sbx` runs: the running sandbox, or the error the SDK gets.
async fn until_running(f: &Facade, c: &Caller, sbx: Value, started: Instant) -> E2bResult<Value> {
    let id = sbx["id"].as_str().unwrap_or_default().to_owned();
    let mut sbx = sbx;
    loop {
        match sbx["status"].as_str().unwrap_or("") {
            "running" => return Ok(sbx),
            "queued" | "provisioning" => {}
            other => {
                return Err(E2bError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("sandbox {id} did not start: it is {other}{}", reason(&sbx)),
                )
                .no_retry())
            }
        }
        let left = START_WAIT.saturating_sub(started.elapsed()).as_secs();
        if left == 0 {
            break;
        }
        let uri = format!(
            "/v1/sandboxes/{}/wait?status=running&timeoutSeconds={}",
            q(&id),
            left.min(300)
        );
        sbx = call(f, c, Method::GET, &uri, None, &[]).await?.1;
        if sbx["status"] != "running" && started.elapsed() >= START_WAIT {
            break;
        }
    }
    // E2B has no "queued": the SDK would send envd calls to a sandbox that does not run.
    let _ = call(
        f,
        c,
        Method::DELETE,
        &format!("/v1/sandboxes/{}", q(&id)),
        None,
        &[],
    )
    .await;
    Err(E2bError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "sandbox {id} did not start within {} s ({}{}); the E2B API cannot answer before \
             it runs, so it was deleted: retry when the organization's quota or the pools have \
             room",
            START_WAIT.as_secs(),
            sbx["status"].as_str().unwrap_or("waiting"),
            reason(&sbx)
        ),
    )
    .no_retry())
}

fn reason(sbx: &Value) -> String {
    sbx["statusReason"]
        .as_str()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

/// `POST /v2/sandboxes` and `POST /sandboxes` (E2B's `NewSandbox`). Unknown fields are
/// ignored (each SDK release adds some); fields Differently cannot honour are refused.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    /// Any JSON, checked by [`seconds`] so a bad value is refused naming `timeout`.
    timeout: Option<Value>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    auto_pause: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Value>,
    mcp: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Value>,
    auto_resume: Option<Value>,
}

fn refuse_unsupported(b: &NewSandbox) -> E2bResult<()> {
    if b.auto_pause == Some(true) {
        return Err(E2bError::field(
            "autoPause",
            "pausing on timeout is not supported by the Differently E2B facade (the sandbox \
             is deleted at its timeout)",
        ));
    }
    if b.allow_internet_access == Some(false) {
        return Err(E2bError::field(
            "allow_internet_access",
            "egress is the pool's operator policy in Differently; a sandbox cannot narrow it",
        ));
    }
    for (name, v) in [
        ("network", &b.network),
        ("mcp", &b.mcp),
        ("iam", &b.iam),
        ("volumeMounts", &b.volume_mounts),
        ("autoResume", &b.auto_resume),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(E2bError::field(
                name,
                "not supported by the Differently E2B facade",
            ));
        }
    }
    Ok(())
}

/// A `timeout` (seconds) of a request as `/v1` bounds a TTL, from `min` (0 where E2B allows
/// it: a connect that extends nothing); refused naming the facade's field, not the parser's.
fn seconds(v: Option<&Value>, min: u64) -> E2bResult<Option<u64>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|s| (min..=MAX_TTL_SECONDS).contains(s))
            .map(Some)
            .ok_or_else(|| {
                E2bError::field(
                    "timeout",
                    format!("must be between {min} and {MAX_TTL_SECONDS}"),
                )
            }),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> E2bResult<T> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    crate::requests::body::read(body).map_err(E2bError::json)
}

fn with_status(status: StatusCode, v: Value) -> Response {
    (status, Json(v)).into_response()
}

/// Create, answered 201 once the sandbox runs.
pub async fn create(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    body: Bytes,
) -> E2bResult<Response> {
    let started = Instant::now();
    let (c, key_id) = caller(&headers)?;
    let b: NewSandbox = parse(&body)?;
    refuse_unsupported(&b)?;
    let timeout = seconds(b.timeout.as_ref(), 1)?;
    let mut v1 = json!({
        "ttlSeconds": timeout.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
        "labels": mapping::labels_of(&b.metadata.unwrap_or_default())?,
        "env": b.env_vars.unwrap_or_default(),
    });
    match b.template_id.as_deref() {
        None | Some(mapping::DEFAULT_TEMPLATE) => {}
        // A snapshot id restores that snapshot, once it is ready.
        Some(t) if super::snapshots::is_snapshot(t) => {
            super::snapshots::until_ready(&f, &c, t, started, START_WAIT).await?;
            v1["fromSnapshot"] = json!(t);
        }
        Some(t) => v1["template"] = json!(t),
    }
    let extra: Vec<_> = headers
        .get("idempotency-key")
        .map(|v| {
            (
                header::HeaderName::from_static("idempotency-key"),
                v.clone(),
            )
        })
        .into_iter()
        .collect();
    let (_, sbx) = f
        .json(&c, Method::POST, "/v1/sandboxes", Some(&v1), &extra)
        .await
        .map_err(create_error)?;
    let sbx = until_running(&f, &c, sbx, started).await?;
    let id = sbx["id"].as_str().unwrap_or_default();
    super::home::Homes::begin(&f, c.clone(), id);
    let token = f.token(id, &key_id);
    Ok(with_status(
        StatusCode::CREATED,
        mapping::created(&sbx, &token, &f.traffic_token(id, &key_id), &f.domain),
    ))
}

/// The SDK's error for a `/v1` create refusal. An organization-wide key has no project to
/// create in, and E2B's API has no field to name one: the message says which key to use
/// instead of naming `/v1`'s `projectId`, which an E2B program cannot send.
fn create_error(e: super::InnerError) -> E2bError {
    let e = match e {
        super::InnerError::Answer(status, body) => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if v["error"]["details"]["field"] == "projectId" {
                return E2bError::new(StatusCode::BAD_REQUEST, ORG_WIDE_KEY);
            }
            E2bError::from_v1(status, &body)
        }
        super::InnerError::Facade(e) => E2bError::from_osb(e),
    };
    match e.status.as_u16() {
        // A repeat would queue or refuse the same way; only 500s are worth one.
        429 | 502..=504 => e.no_retry(),
        _ => e,
    }
}

/// Create's answer to an organization-wide key (one bound to no project).
pub const ORG_WIDE_KEY: &str = "this API key is organization-wide, and the E2B API cannot say \
     which project a sandbox belongs to: use a key bound to a project as E2B_API_KEY \
     (`differently key create NAME --project PROJECT_ID --scope sandboxes:write …`)";

#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    /// Any JSON, checked by [`seconds`].
    timeout: Option<Value>,
}

/// Connect (and the deprecated resume): 200 for a running sandbox, whose life `timeout` only
/// extends; 201 for a paused one now resumed, which ends `timeout` seconds from now (300 when
/// absent, E2B's default) as E2B's timeout counts only while a sandbox runs (`pause` kept it
/// for as long as `/v1` allows).
pub async fn connect(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> E2bResult<Response> {
    let started = Instant::now();
    let (c, key_id) = caller(&headers)?;
    let b: ConnectBody = parse(&body)?;
    let timeout = seconds(b.timeout.as_ref(), 0)?;
    let mut sbx = live(&f, &c, &id).await?;
    let was_paused = mapping::state_of(sbx["status"].as_str().unwrap_or("")) == Some("paused");
    if was_paused {
        // Checked before the resume: `/v1` cannot end a sandbox 0 s from now.
        seconds(b.timeout.as_ref(), 1)?;
        let action = if sbx["status"] == "stopped" {
            "start"
        } else {
            "resume"
        };
        let uri = format!("/v1/sandboxes/{}/{action}", q(&id));
        sbx = call(&f, &c, Method::POST, &uri, None, &[]).await?.1;
    }
    let sbx = until_running(&f, &c, sbx, started).await?;
    if was_paused {
        let ttl = timeout.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        set_ttl(&f, &c, &id, ttl).await?;
    } else if let Some(t) = timeout {
        extend(&f, &c, &id, &sbx, t).await?;
    }
    let token = f.token(&id, &key_id);
    let status = if was_paused {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let traffic = f.traffic_token(&id, &key_id);
    Ok(with_status(
        status,
        mapping::created(&sbx, &token, &traffic, &f.domain),
    ))
}

/// Sets the sandbox's end `seconds` from now if that is later than its current end.
async fn extend(f: &Facade, c: &Caller, id: &str, sbx: &Value, seconds: u64) -> E2bResult<()> {
    let now = chrono::Utc::now();
    let current = sbx["expiresAt"]
        .as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|t| (t.with_timezone(&chrono::Utc) - now).num_seconds());
    if seconds == 0 || current.is_some_and(|left| left >= seconds as i64) {
        return Ok(());
    }
    set_ttl(f, c, id, seconds).await.map(drop)
}

/// Sets the sandbox's end `seconds` from now (`/v1`'s TTL renew); the sandbox as it then is.
async fn set_ttl(f: &Facade, c: &Caller, id: &str, seconds: u64) -> E2bResult<Value> {
    let uri = format!("/v1/sandboxes/{}", q(id));
    let body = json!({ "ttlSeconds": seconds });
    Ok(call(f, c, Method::PATCH, &uri, Some(&body), &[]).await?.1)
}

/// `GET /sandboxes/{id}`: 200 `SandboxDetail`, 404 once it has ended.
pub async fn get(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let (c, key_id) = caller(&headers)?;
    let sbx = live(&f, &c, &id).await?;
    let token = f.token(&id, &key_id);
    let detail =
        mapping::detail(&sbx, &token, &f.domain).ok_or_else(|| E2bError::sandbox_not_found(&id))?;
    Ok(with_status(StatusCode::OK, detail))
}

/// `GET /v2/sandboxes` (and the v1 `GET /sandboxes`): `metadata` (itself an encoded
/// `k=v&…` query) becomes label filters, `state` is filtered here, `nextToken` is `/v1`'s
/// cursor, given back in `X-Next-Token`. A page may hold fewer than `limit` sandboxes (ended
/// ones are left out); the SDK keeps paging while the header is there.
pub async fn list(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let (c, _) = caller(&headers)?;
    let mut uri = String::from("/v1/sandboxes?");
    let mut states: Option<Vec<String>> = None;
    let mut limit = 100u64;
    for (k, v) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
        match &*k {
            "metadata" => {
                // The SDK percent-encodes each key and value before encoding the pairs.
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    let (mk, mv) = (mapping::unescape(&mk)?, mapping::unescape(&mv)?);
                    let (lk, lv) = mapping::label_of(&mk, &mv)?;
                    uri.push_str(&format!("label={}&", q(&format!("{lk}={lv}"))));
                }
            }
            "state" => {
                states = Some(v.split(',').map(|s| s.trim().to_owned()).collect());
            }
            "limit" => {
                limit = v
                    .parse::<u64>()
                    .ok()
                    .filter(|l| (1..=1000).contains(l))
                    .ok_or_else(|| E2bError::field("limit", "must be between 1 and 1000"))?;
            }
            "nextToken" if !v.is_empty() => uri.push_str(&format!("cursor={}&", q(&v))),
            _ => {}
        }
    }
    if let Some(bad) = states
        .iter()
        .flatten()
        .find(|s| !matches!(s.as_str(), "running" | "paused"))
    {
        return Err(E2bError::field("state", format!("unknown state {bad:?}")));
    }
    uri.push_str(&format!("limit={limit}"));
    let (_, page) = call(&f, &c, Method::GET, &uri, None, &[]).await?;
    let items: Vec<Value> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(mapping::listed)
        .filter(|s| {
            states
                .as_ref()
                .is_none_or(|st| st.iter().any(|x| s["state"] == x.as_str()))
        })
        .collect();
    Ok(paged(items, &page))
}

/// A 200 list answer of `items`, with `/v1`'s `nextCursor` of `page` as E2B's `X-Next-Token`.
pub(super) fn paged(items: Vec<Value>, page: &Value) -> Response {
    let mut resp = with_status(StatusCode::OK, Value::Array(items));
    if let Some(next) = page["nextCursor"].as_str().filter(|s| !s.is_empty()) {
        if let Ok(v) = HeaderValue::from_str(next) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    resp
}

/// `DELETE /sandboxes/{id}`: 204; 404 (the SDK's `False`) once it has ended.
pub async fn kill(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (c, _) = caller(&headers)?;
    live(&f, &c, &id).await?;
    let uri = format!("/v1/sandboxes/{}", q(&id));
    call(&f, &c, Method::DELETE, &uri, None, &[]).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    /// Any JSON, checked by [`seconds`].
    timeout: Option<Value>,
}

/// `POST /sandboxes/{id}/timeout {timeout}`: the sandbox ends `timeout` seconds from now.
pub async fn set_timeout(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> E2bResult<StatusCode> {
    let (c, _) = caller(&headers)?;
    let b: TimeoutBody = parse(&body)?;
    let timeout =
        seconds(b.timeout.as_ref(), 1)?.ok_or_else(|| E2bError::field("timeout", "required"))?;
    live(&f, &c, &id).await?;
    set_ttl(&f, &c, &id, timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: 204, 409 when already paused (the SDK's `False`).
///
/// E2B's timeout counts only while a sandbox runs, and keeps a paused one until it is killed
/// (for up to 30 days), while `/v1`'s TTL runs in every state. So the sandbox's TTL is first
/// set to the longest `/v1` allows (30 days), then it is paused; connect (the resume) sets it
/// back to the timeout the SDK passes. The TTL is raised before the pause so that no moment
/// exists in which a paused sandbox can reach its old end; should the pause fail, a sandbox
/// still running gets the end it had.
pub async fn pause(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (c, _) = caller(&headers)?;
    let sbx = live(&f, &c, &id).await?;
    if mapping::state_of(sbx["status"].as_str().unwrap_or("")) == Some("paused") {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    set_ttl(&f, &c, &id, MAX_TTL_SECONDS).await?;
    let uri = format!("/v1/sandboxes/{}/pause", q(&id));
    if let Err(e) = call(&f, &c, Method::POST, &uri, None, &[]).await {
        restore_end(&f, &c, &id, &sbx).await;
        return Err(e);
    }
    Ok(StatusCode::NO_CONTENT)
}

/// After a failed pause: gives `before`'s end back to the sandbox if it still runs (a
/// concurrent pause that succeeded keeps the long end). Best effort, logged.
async fn restore_end(f: &Facade, c: &Caller, id: &str, before: &Value) {
    let now = chrono::Utc::now();
    let left = before["expiresAt"]
        .as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|t| (t.with_timezone(&chrono::Utc) - now).num_seconds().max(1));
    let Some(left) = left.and_then(|l| u64::try_from(l).ok()) else {
        return;
    };
    let running = match live(f, c, id).await {
        Ok(sbx) => mapping::state_of(sbx["status"].as_str().unwrap_or("")) == Some("running"),
        Err(_) => false,
    };
    if running {
        if let Err(e) = set_ttl(f, c, id, left).await {
            tracing::warn!(sandbox = id, error = %e.message,
                "e2b facade: a failed pause left the sandbox's longest end in place");
        }
    }
}

/// `GET /sandboxes/{id}/metrics`: `[]` (no backend reports E2B's metrics through `/v1`).
pub async fn metrics(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<Response> {
    let (c, _) = caller(&headers)?;
    live(&f, &c, &id).await?;
    Ok(with_status(StatusCode::OK, json!([])))
}

/// The routes of E2B's API (its `spec/openapi.yml` and the official SDKs' clients) that the
/// facade does not serve, as `(method, path)`; `{}` is one path segment. Such a call answers
/// 501, which both SDKs raise with the facade's message: a 404 would be turned by them into
/// "Sandbox … not found" for a sandbox that runs.
const E2B_ROUTES: &[(&str, &str)] = &[
    ("GET", "/health"),
    ("GET", "/teams"),
    ("GET", "/teams/{}/metrics"),
    ("GET", "/teams/{}/metrics/max"),
    ("GET", "/sandboxes/metrics"),
    ("GET", "/sandboxes/{}/logs"),
    ("GET", "/v2/sandboxes/{}/logs"),
    ("POST", "/sandboxes/{}/fork"),
    ("PUT", "/sandboxes/{}/network"),
    ("POST", "/sandboxes/{}/refreshes"),
    ("GET", "/default-templates"),
    ("GET", "/templates"),
    ("POST", "/templates"),
    ("GET", "/v2/templates"),
    ("POST", "/v2/templates"),
    ("POST", "/v3/templates"),
    ("GET", "/templates/{}"),
    ("POST", "/templates/{}"),
    ("PATCH", "/templates/{}"),
    ("PATCH", "/v2/templates/{}"),
    ("GET", "/templates/{}/files/{}"),
    ("POST", "/templates/{}/builds/{}"),
    ("POST", "/v2/templates/{}/builds/{}"),
    ("GET", "/templates/{}/builds/{}/status"),
    ("GET", "/templates/{}/builds/{}/logs"),
    ("POST", "/templates/tags"),
    ("DELETE", "/templates/tags"),
    ("GET", "/templates/{}/tags"),
    ("GET", "/templates/{}/tags/count"),
    ("GET", "/templates/{}/tags/exists"),
    ("GET", "/templates/{}/tags/groups"),
    ("GET", "/templates/{}/tags/{}/assignments"),
    ("GET", "/templates/aliases/{}"),
    ("GET", "/volumes"),
    ("POST", "/volumes"),
    ("GET", "/volumes/{}"),
    ("DELETE", "/volumes/{}"),
    ("GET", "/secrets"),
    ("POST", "/secrets"),
    ("GET", "/secrets/{}"),
    ("POST", "/secrets/{}"),
    ("DELETE", "/secrets/{}"),
    ("GET", "/api-keys"),
    ("POST", "/api-keys"),
    ("PATCH", "/api-keys/{}"),
    ("DELETE", "/api-keys/{}"),
    ("POST", "/access-tokens"),
    ("DELETE", "/access-tokens/{}"),
    ("GET", "/nodes"),
    ("GET", "/nodes/{}"),
    ("POST", "/nodes/{}"),
];

/// Whether `method` `path` (under the control plane's prefix) is a route of E2B's API.
pub fn is_e2b_route(method: &Method, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    E2B_ROUTES.iter().any(|(m, pattern)| {
        let want: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
        *m == method.as_str()
            && want.len() == segments.len()
            && want
                .iter()
                .zip(&segments)
                .all(|(w, s)| if *w == "{}" { !s.is_empty() } else { w == s })
    })
}

/// Any other control-plane route: 501 for a route E2B's API has (so the SDK shows the
/// message), 404 for one it does not.
pub async fn not_served(method: Method, uri: axum::http::Uri) -> E2bError {
    let path = uri.path();
    let status = match path.strip_prefix(super::PREFIX) {
        Some(rest) if is_e2b_route(&method, rest) => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::NOT_FOUND,
    };
    E2bError::new(
        status,
        format!("{method} {path} is not served by the Differently E2B facade"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_out_of_bounds_names_timeout_not_the_parser() {
        let bad = |v: Value, min| seconds(Some(&v), min).unwrap_err();
        for (v, min) in [
            (json!(-5), 1),
            (json!(0), 1),
            (json!(MAX_TTL_SECONDS + 1), 1),
            (json!(1.5), 1),
            (json!("60"), 1),
            (json!(-1), 0),
        ] {
            let e = bad(v.clone(), min);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{v}");
            assert_eq!(
                e.message,
                format!("timeout: must be between {min} and 2592000"),
                "{v}"
            );
        }
        assert_eq!(seconds(Some(&json!(0)), 0).unwrap(), Some(0));
        assert_eq!(seconds(Some(&json!(300)), 1).unwrap(), Some(300));
        assert_eq!(seconds(Some(&Value::Null), 1).unwrap(), None);
        assert_eq!(seconds(None, 1).unwrap(), None);
        // The whole body: the SDK's negative timeout reaches `seconds`, not serde's u64.
        let b: NewSandbox = parse(&Bytes::from_static(br#"{"timeout": -5}"#)).unwrap();
        assert!(seconds(b.timeout.as_ref(), 1).is_err());
    }

    #[test]
    fn e2b_routes_not_served_are_501_and_other_paths_404() {
        for (m, path) in [
            (Method::PUT, "/sandboxes/sbx_1/network"),
            (Method::POST, "/sandboxes/sbx_1/fork"),
            (Method::GET, "/sandboxes/metrics"),
            (Method::GET, "/sandboxes/sbx_1/logs"),
            (Method::GET, "/v2/sandboxes/sbx_1/logs"),
            (Method::POST, "/sandboxes/sbx_1/refreshes"),
            (Method::GET, "/templates/base"),
            (Method::GET, "/templates/t/tags/v1/assignments"),
            (Method::DELETE, "/volumes/v"),
        ] {
            assert!(is_e2b_route(&m, path), "{m} {path}");
        }
        for (m, path) in [
            (Method::GET, "/sandboxes/sbx_1/network"),
            (Method::POST, "/sandboxes//fork"),
            (Method::GET, "/nope"),
            (Method::GET, "/sandboxes/sbx_1/fork/x"),
        ] {
            assert!(!is_e2b_route(&m, path), "{m} {path}");
        }
    }

    #[tokio::test]
    async fn not_served_says_so_with_the_status_the_sdks_show() {
        let uri = |p: &str| p.parse::<axum::http::Uri>().unwrap();
        let e = not_served(Method::PUT, uri("/e2b/sandboxes/sbx_1/network")).await;
        assert_eq!(e.status, StatusCode::NOT_IMPLEMENTED);
        assert_eq!(
            e.message,
            "PUT /e2b/sandboxes/sbx_1/network is not served by the Differently E2B facade"
        );
        let e = not_served(Method::GET, uri("/e2b/no/such/route")).await;
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert!(e
            .message
            .ends_with("is not served by the Differently E2B facade"));
    }

    #[test]
    fn an_org_wide_key_is_told_which_key_to_use() {
        let body = br#"{"error":{"code":"validation_failed","message":"projectId: required for an organization-wide key","details":{"field":"projectId"}}}"#;
        let e = create_error(super::super::InnerError::Answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            Bytes::from_static(body),
        ));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.message, ORG_WIDE_KEY);
        assert!(e.message.contains("--project"), "{}", e.message);
        let quota = br#"{"error":{"code":"quota_exceeded","message":"full"}}"#;
        let e = create_error(super::super::InnerError::Answer(
            StatusCode::TOO_MANY_REQUESTS,
            Bytes::from_static(quota),
        ));
        assert_eq!(
            (e.status, e.should_retry),
            (StatusCode::TOO_MANY_REQUESTS, Some(false))
        );
    }
}
