//! The fake's lifecycle API: its routes (with what the played version changes), and
//! creating, reading, listing, pausing and resuming, renewing and deleting sandboxes, their
//! metadata, diagnostics and endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::fake_versions::{execd_token, BodyKind};
use crate::support::http::{lock, pct_decode, Req};

use super::execd::execd_entry;
use super::snapshots::{
    advance_snapshots, create_snapshot, delete_snapshot, list_snapshots, snap_json,
    snapshot_not_found,
};
use super::{auth, bad_gateway, json_resp, next_id, FakeRuntime, Inner, Sbx, Variant, KEY_HEADER};

pub(super) async fn api(inner: &Arc<Inner>, r: Req) -> Response {
    let path = match r.path.strip_prefix("/v1") {
        Some(p) => p.to_owned(),
        None if inner.variant == Variant::Real => r.path.clone(),
        None => return json_resp(404, json!({"detail": "Not Found"})),
    };
    if path == "/health" && inner.variant == Variant::Real {
        return json_resp(200, json!({"status": "healthy"}));
    }
    // Recorded: no key needed, beside `/v1` rather than under it.
    if r.path == "/version" && inner.variant == Variant::Real {
        lock(&inner.record).version_asks += 1;
        let v = lock(&inner.knobs).version;
        return json_resp(200, json!({"version": v.answer()}));
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();

    // The server proxy: unauthenticated on the real single-tenant server.
    if segs.len() >= 4 && segs[0] == "sandboxes" && segs[2] == "proxy" {
        if inner.variant == Variant::Spec {
            if let Some(resp) = auth(inner, &r) {
                return resp;
            }
        }
        // Recorded on Docker with nothing listening: a published port (8080) is reached
        // through docker-proxy, which accepts and closes; any other goes through execd's own
        // port proxy, whose 502 is passed through.
        if segs[3] == "8080" && inner.variant == Variant::Real {
            return json_resp(
                502,
                json!({"code": "BACKEND_RESPONSE_FAILED",
                       "message": "The backend sandbox dropped the connection or sent an invalid response: Server disconnected without sending a response."}),
            );
        }
        if segs[3] != "44772" && inner.variant == Variant::Real {
            return bad_gateway();
        }
        if segs[3] != "44772" {
            return json_resp(
                502,
                json!({"code": "BACKEND_CONNECTION_FAILED", "message": "connection refused"}),
            );
        }
        let rest = format!("/{}", segs[4..].join("/"));
        let id = segs[1].to_owned();
        // 1.3: the proxy (maintenance mode) adds the sandbox's token itself.
        lock(&inner.record).execd_proxied += 1;
        return execd_entry(inner, &id, &rest, r).await;
    }

    if lock(&inner.knobs).unavailable {
        return inner.err(503, "SERVICE_UNAVAILABLE", "no healthy upstream");
    }
    if let Some(resp) = auth(inner, &r) {
        return resp;
    }
    if let Some(to) = lock(&inner.knobs).redirect_to.take() {
        return Response::builder()
            .status(307)
            .header("location", to)
            .body(Body::empty())
            .unwrap();
    }
    let delay = lock(&inner.knobs).delay_ms;
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    {
        let mut k = lock(&inner.knobs);
        if let Some(i) = k
            .fail_next
            .iter()
            .position(|(p, _)| path.contains(p.as_str()))
        {
            let (_, status) = k.fail_next.remove(i).unwrap();
            drop(k);
            // Echo the key, as a careless server might: the adapter must scrub it.
            let echoed = r
                .headers
                .get(KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            return inner.err(
                status,
                "INTERNAL_ERROR",
                &format!("injected failure (key {echoed})"),
            );
        }
    }

    if let Some(resp) = versioned(inner, &r, &segs) {
        return resp;
    }
    let m = &r.method;
    match (m.clone(), segs.as_slice()) {
        (Method::POST, ["sandboxes"]) => create(inner, &r),
        // The SDK's telemetry; recorded 204.
        (Method::POST, ["metrics", "events"]) => StatusCode::NO_CONTENT.into_response(),
        (Method::PATCH, ["sandboxes", id, "metadata"]) => patch_metadata(inner, id, &r),
        (Method::GET, ["sandboxes", id, "diagnostics", kind @ ("logs" | "events")]) => {
            diagnostics(inner, id, kind, &r)
        }
        (Method::GET, ["sandboxes"]) => list(inner, &r),
        (Method::GET, ["sandboxes", id]) => get(inner, id),
        (Method::DELETE, ["sandboxes", id]) => {
            let removed = lock(&inner.sandboxes).remove(*id);
            inner.ledger_line(
                "delete",
                removed.as_ref().map(|s| &s.metadata),
                id,
                if removed.is_some() {
                    "deleted"
                } else {
                    "missing"
                },
            );
            if removed.is_some() {
                StatusCode::NO_CONTENT.into_response()
            } else {
                inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found")
            }
        }
        (Method::POST, ["sandboxes", id, "pause"]) => transition(inner, id, "Running", "Paused"),
        (Method::POST, ["sandboxes", id, "resume"]) => transition(inner, id, "Paused", "Running"),
        (Method::POST, ["sandboxes", id, "renew-expiration"]) => renew(inner, id, &r),
        (Method::GET, ["sandboxes", id, "endpoints", port]) => endpoint(inner, id, port, &r),
        (Method::POST, ["sandboxes", id, "snapshots"]) => create_snapshot(inner, id, &r),
        (Method::GET, ["snapshots"]) => list_snapshots(inner, &r),
        (Method::GET, ["snapshots", sid]) => {
            advance_snapshots(inner);
            match lock(&inner.snapshots).get(*sid) {
                Some(s) => json_resp(200, snap_json(s)),
                None => snapshot_not_found(inner, sid),
            }
        }
        (Method::DELETE, ["snapshots", sid]) => delete_snapshot(inner, sid),
        _ => json_resp(404, json!({"detail": "Not Found"})),
    }
}
/// What the played version does before the route's own handler: a removed route's 404,
/// a body's unknown field (1.2+), a throttled create's 429.
fn versioned(inner: &Inner, r: &Req, segs: &[&str]) -> Option<Response> {
    let version = lock(&inner.knobs).version;
    if version.removed(segs) {
        lock(&inner.record).removed_route_hits += 1;
        return Some(json_resp(404, json!({"detail": "Not Found"})));
    }
    let kind = match (&r.method, segs) {
        (&Method::POST, ["sandboxes"]) => BodyKind::CreateSandbox,
        (&Method::POST, ["sandboxes", _, "snapshots"]) => BodyKind::CreateSnapshot,
        (&Method::POST, ["sandboxes", _, "renew-expiration"]) => BodyKind::Renew,
        _ => return None,
    };
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    if let Some(detail) = version.refuse_unknown(kind, &body) {
        lock(&inner.record).unknown_field_refusals += 1;
        return Some(json_resp(422, detail));
    }
    if kind == BodyKind::CreateSandbox {
        if let Some(wait) = lock(&inner.knobs).throttle_creates.pop_front() {
            lock(&inner.record).throttled += 1;
            let mut resp = inner.err(429, "RATE_LIMITED", "too many sandbox creates; retry later");
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_str(&wait).unwrap());
            return Some(resp);
        }
    }
    None
}
/// Diagnostics as recorded on Docker: no `scope` is the legacy `text/plain` answer with
/// `Deprecation: true`; a supported scope a JSON descriptor with the content inline; any other
/// scope `400 DIAGNOSTICS_SCOPE_UNSUPPORTED`. The content stands in for the container's.
fn diagnostics(inner: &Inner, id: &str, kind: &str, r: &Req) -> Response {
    if !lock(&inner.sandboxes).contains_key(id) {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    }
    let content = match kind {
        "logs" => format!(
            "{} starting OpenSandbox Execd daemon (fake)\n",
            Utc::now().to_rfc3339()
        ),
        _ => format!("Container:  fake (sandbox-{id})\nStatus:     running"),
    };
    let supported: &[&str] = if kind == "logs" {
        &["container", "all"]
    } else {
        &["runtime", "all"]
    };
    match r.q("scope") {
        None => Response::builder()
            .status(200)
            .header("content-type", "text/plain; charset=utf-8")
            .header("deprecation", "true")
            .body(Body::from(content))
            .unwrap(),
        Some(scope) if supported.contains(&scope) => json_resp(
            200,
            json!({"sandboxId": id, "kind": kind, "scope": scope, "delivery": "inline",
                   "contentType": "text/plain; charset=utf-8", "contentLength": content.len(),
                   "content": content, "truncated": false}),
        ),
        Some(scope) => json_resp(
            400,
            json!({"code": "DIAGNOSTICS_SCOPE_UNSUPPORTED",
                   "message": format!("Unsupported {kind} diagnostics scope '{scope}'. Supported scopes: {}.", supported.join(", "))}),
        ),
    }
}
/// JSON merge patch of the metadata (a `null` removes the key); answers the full sandbox.
fn patch_metadata(inner: &Inner, id: &str, r: &Req) -> Response {
    let Ok(Value::Object(patch)) = serde_json::from_slice::<Value>(&r.body) else {
        return inner.invalid("body", "Input should be a valid dictionary", Value::Null);
    };
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    };
    for (k, v) in patch {
        match v.as_str() {
            Some(v) => {
                s.metadata.insert(k, v.to_owned());
            }
            None => {
                s.metadata.remove(&k);
            }
        }
    }
    json_resp(200, sandbox_json(s, true))
}
fn valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    v.len() <= 63
        && (v.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))))
}
fn sandbox_json(s: &Sbx, full: bool) -> Value {
    let mut v = json!({
        "id": s.id,
        "status": {"state": s.state, "reason": s.reason, "message": s.message,
                   "lastTransitionAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)},
        "metadata": s.metadata,
        "entrypoint": ["tail", "-f", "/dev/null"],
        "createdAt": s.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
    });
    if let Some(e) = s.expires_at {
        v["expiresAt"] = json!(e.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    }
    if full {
        if let Some(i) = &s.image {
            v["image"] = json!({"uri": i});
        }
        if let Some(sn) = &s.snapshot_id {
            v["snapshotId"] = json!(sn);
        }
    }
    v
}
fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
        return inner.invalid("body", "JSON decode error", Value::Null);
    };
    lock(&inner.record).create_bodies.push(body.clone());
    let image = body["image"]["uri"].as_str().map(str::to_owned);
    let snapshot = body["snapshotId"].as_str().map(str::to_owned);
    let template = body["templateId"].as_str().map(str::to_owned);
    let sources = [image.is_some(), snapshot.is_some(), template.is_some()]
        .iter()
        .filter(|b| **b)
        .count();
    if sources != 1 {
        return inner.invalid_model(
            "image",
            "Exactly one of image or snapshotId must be provided.",
            &body,
        );
    }
    if image.is_some() && body["entrypoint"].as_array().is_none_or(|a| a.is_empty()) {
        return inner.invalid_model(
            "entrypoint",
            "Entrypoint is required when image is provided.",
            &body,
        );
    }
    if let Some(t) = body["timeout"].as_u64() {
        if t < 60 {
            return inner.out_of_bounds(["body", "timeout"], "ge", 60, json!(t));
        }
    }
    if template.is_some() {
        if inner.runtime != FakeRuntime::Fastsandbox {
            return inner.err(400, "INVALID_PARAMETER", "templateId needs Fast Sandbox");
        }
        for f in ["env", "resourceLimits", "entrypoint", "secureAccess"] {
            if !body[f].is_null() {
                return inner.invalid(f, "not allowed in template mode", Value::Null);
            }
        }
        if body["timeout"].is_null() {
            return inner.invalid("timeout", "required in template mode", Value::Null);
        }
    }
    if body["resourceLimits"]["cpu"].as_str() == Some("0") {
        return match inner.variant {
            Variant::Real => json_resp(
                422,
                json!({"detail": [{"type": "value_error", "loc": ["body", "resourceLimits", "cpu"],
                                    "msg": "cpu must be positive", "input": "0"}]}),
            ),
            Variant::Spec => {
                inner.invalid("resourceLimits.cpu", "cpu must be positive", json!("0"))
            }
        };
    }
    if inner.variant == Variant::Spec && body["resourceLimits"].is_null() && template.is_none() {
        return inner.invalid("resourceLimits", "required", Value::Null);
    }
    let metadata: BTreeMap<String, String> =
        serde_json::from_value(body["metadata"].clone()).unwrap_or_default();
    for (k, v) in &metadata {
        if k.starts_with("opensandbox.io/") || !valid_label_value(v) || k.is_empty() {
            let code = match inner.variant {
                Variant::Real => "SANDBOX::INVALID_METADATA_LABEL",
                Variant::Spec => "INVALID_METADATA_LABEL",
            };
            return json_resp(
                400,
                json!({"code": code, "message": format!("invalid metadata label {k}")}),
            );
        }
    }
    let mut inherited = None;
    if let Some(sn) = &snapshot {
        let found = lock(&inner.snapshots)
            .get(sn)
            .map(|s| (s.state == "Ready", s.metadata.clone()));
        match found {
            Some((true, m)) => inherited = Some(m),
            Some((false, _)) if inner.variant == Variant::Real => {
                return json_resp(
                    409,
                    json!({"code": "SNAPSHOT::NOT_READY", "message": format!("Snapshot {sn} is not ready")}),
                )
            }
            _ => return snapshot_not_found(inner, sn),
        }
    }
    let bad_image = image
        .as_ref()
        .is_some_and(|i| lock(&inner.knobs).bad_images.contains(i));
    let sync_docker = inner.variant == Variant::Real && inner.runtime == FakeRuntime::Docker;
    if bad_image && sync_docker {
        let i = image.clone().unwrap_or_default();
        return inner.err(
            500,
            "SANDBOX_IMAGE_PULL_FAILED",
            // The shape server 1.1.1's Docker runtime answered with no registry reachable
            // (seen live on 2026-12-06): the Docker API URL, the registry it dialled and the
            // host's resolver address (here a documentation address) inside the message.
            &format!(
                "Failed to pull image {i}: 500 Server Error for \
                 http+docker://localhost/v1.41/images/create?tag=1&fromImage={i}: Internal \
                 Server Error (\"Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup \
                 registry-1.docker.io on 192.0.2.53:53: no such host\")"
            ),
        );
    }
    let fail_with = bad_image.then(|| match inner.runtime {
        FakeRuntime::Kubernetes => (
            "POD_READY_TIMEOUT".to_owned(),
            "Pod did not become ready within 60 seconds".to_owned(),
        ),
        _ => (
            "IMAGE_PULL_FAILED".to_owned(),
            format!("Failed to pull image {}", image.clone().unwrap_or_default()),
        ),
    });
    let id = next_id(inner, "");
    let (state, reason, polls) = if sync_docker {
        ("Running", "CONTAINER_RUNNING", 0)
    } else {
        ("Pending", "SANDBOX_SCHEDULED", 2)
    };
    let v_metadata = !metadata.is_empty();
    let s = Sbx {
        id: id.clone(),
        state: state.to_owned(),
        reason: reason.to_owned(),
        message: String::new(),
        created_metadata: metadata.clone(),
        // Recorded: a restored sandbox reports the source's create-time metadata.
        metadata: match (&inherited, inner.variant) {
            (Some(m), Variant::Real) if metadata.is_empty() => m.clone(),
            _ => metadata,
        },
        image,
        snapshot_id: snapshot,
        expires_at: body["timeout"]
            .as_i64()
            .map(|t| Utc::now() + chrono::Duration::seconds(t)),
        created_at: Utc::now(),
        env: serde_json::from_value(body["env"].clone()).unwrap_or_default(),
        polls_left: polls,
        fail_with,
    };
    let mut v = sandbox_json(&s, false);
    // Recorded: the create answer echoes only the metadata the request gave.
    if !v_metadata && inner.variant == Variant::Real {
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
        }
    }
    {
        // One lock for the insert and its ledger line, so the ledger's order is the map's.
        let mut all = lock(&inner.sandboxes);
        inner.ledger_line("create", Some(&s.metadata), &id, "created");
        all.insert(id.clone(), s);
    }
    let mut resp = json_resp(202, v);
    if inner.variant == Variant::Spec {
        resp.headers_mut().insert(
            "location",
            HeaderValue::from_str(&format!("/v1/sandboxes/{id}")).unwrap(),
        );
    }
    resp
}
fn get(inner: &Inner, id: &str) -> Response {
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", &format!("sandbox {id} not found"));
    };
    if s.polls_left > 0 {
        s.polls_left -= 1;
    } else {
        match s.state.as_str() {
            "Pending" | "Resuming" => match s.fail_with.take() {
                Some((reason, message)) => {
                    s.state = "Failed".to_owned();
                    s.reason = reason;
                    s.message = message;
                }
                None => s.state = "Running".to_owned(),
            },
            "Pausing" => s.state = "Paused".to_owned(),
            _ => {}
        }
    }
    json_resp(200, sandbox_json(s, true))
}
fn list(inner: &Inner, r: &Req) -> Response {
    let states = r.qs("state");
    let mut filter = BTreeMap::new();
    if let Some(m) = r.q("metadata") {
        for pair in m.split('&') {
            let Some((k, v)) = pair.split_once('=') else {
                return json_resp(
                    400,
                    json!({"code": "INVALID_METADATA_FORMAT", "message": "metadata must be k=v pairs"}),
                );
            };
            filter.insert(pct_decode(k), pct_decode(v));
        }
    }
    let page: usize = r.q("page").and_then(|p| p.parse().ok()).unwrap_or(1);
    if page == 0 {
        return inner.out_of_bounds(["query", "page"], "ge", 1, json!(r.q("page")));
    }
    let size: usize = r.q("pageSize").and_then(|p| p.parse().ok()).unwrap_or(20);
    if size == 0 {
        return inner.out_of_bounds(["query", "pageSize"], "ge", 1, json!(r.q("pageSize")));
    }
    if size > 200 {
        return inner.out_of_bounds(["query", "pageSize"], "le", 200, json!(r.q("pageSize")));
    }
    let all = lock(&inner.sandboxes);
    let mut matching: Vec<&Sbx> = all
        .values()
        .filter(|s| states.is_empty() || states.contains(&s.state.as_str()))
        .filter(|s| filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    // Recorded: newest first.
    matching.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let items: Vec<Value> = matching
        .into_iter()
        .map(|s| sandbox_json(s, true))
        .collect();
    drop(all);
    page_of(items, page, size)
}
pub(super) fn page_of(items: Vec<Value>, page: usize, size: usize) -> Response {
    let total = items.len();
    let pages = total.div_ceil(size);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * size)
        .take(size)
        .collect();
    json_resp(
        200,
        json!({"items": slice, "pagination": {"page": page, "pageSize": size, "totalItems": total,
               "totalPages": pages, "hasNextPage": page < pages}}),
    )
}
fn transition(inner: &Inner, id: &str, from: &str, to: &str) -> Response {
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    };
    if s.state != from {
        let code = if from == "Running" {
            "SANDBOX_NOT_RUNNING"
        } else {
            "SANDBOX_NOT_PAUSED"
        };
        return inner.err(409, code, &format!("sandbox is {}", s.state));
    }
    let immediate = inner.variant == Variant::Real && inner.runtime == FakeRuntime::Docker;
    if immediate {
        s.state = to.to_owned();
    } else {
        s.state = if to == "Paused" {
            "Pausing"
        } else {
            "Resuming"
        }
        .to_owned();
        s.polls_left = 1;
    }
    // Recorded: 202 with an empty body and no content-type.
    StatusCode::ACCEPTED.into_response()
}
fn renew(inner: &Inner, id: &str, r: &Req) -> Response {
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let Some(at) = v["expiresAt"]
        .as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.with_timezone(&Utc))
    else {
        return inner.invalid("expiresAt", "invalid datetime", Value::Null);
    };
    let mut all = lock(&inner.sandboxes);
    let Some(s) = all.get_mut(id) else {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    };
    let too_early = at <= Utc::now()
        || (inner.variant == Variant::Spec && s.expires_at.is_some_and(|cur| at <= cur));
    if too_early {
        return inner.err(400, "INVALID_EXPIRATION", "expiresAt must be in the future");
    }
    s.expires_at = Some(at);
    lock(&inner.record).renewals.push(at.to_rfc3339());
    json_resp(200, json!({"expiresAt": at.to_rfc3339()}))
}
fn endpoint(inner: &Inner, id: &str, port: &str, r: &Req) -> Response {
    if !lock(&inner.sandboxes).contains_key(id) {
        return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found");
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return inner.err(400, "INVALID_PORT", "Port must be between 1 and 65535.");
    }
    let proxy = r.q("use_server_proxy") == Some("true");
    let expires = r.q("expires");
    if proxy && expires.is_some() {
        return json_resp(
            400,
            json!({"code": "SANDBOX::INVALID_PARAMETER", "message": "expires cannot be combined with use_server_proxy"}),
        );
    }
    let (mut headers, version, key_version) = {
        let k = lock(&inner.knobs);
        (k.endpoint_headers.clone(), k.version, k.execd_key_version)
    };
    if version.execd_tokens() && port == "44772" && !proxy && expires.is_none() {
        headers.insert(
            "X-EXECD-ACCESS-TOKEN".to_owned(),
            execd_token(key_version, id),
        );
    }
    let endpoint = if let Some(exp) = expires {
        if inner.runtime == FakeRuntime::Docker {
            return match inner.variant {
                Variant::Real => json_resp(
                    400,
                    json!({"code": "SANDBOX::API_NOT_SUPPORTED",
                           "message": "Signed routes (expires parameter) are not supported when runtime.type='docker'."}),
                ),
                Variant::Spec => inner.err(
                    400,
                    "INVALID_PARAMETER",
                    "signed endpoints need the gateway",
                ),
            };
        }
        format!("gateway.example.test/{id}/{port}/{exp}/c2lnbmF0dXJl")
    } else if proxy {
        format!("{}/v1/sandboxes/{id}/proxy/{port}", inner.api_addr)
    } else if port == "44772" {
        format!("{}/{id}/proxy/44772", inner.execd_addr)
    } else if inner.runtime == FakeRuntime::Fastsandbox {
        format!("gateway.example.test/scope-{id}-{port}")
    } else {
        format!("172.17.0.2:{port}")
    };
    let mut v = json!({ "endpoint": endpoint });
    if !headers.is_empty() {
        v["headers"] = json!(headers);
    }
    json_resp(200, v)
}
