//! The fake's snapshots: created from a sandbox, ready after a few polls, listed, deleted.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use serde_json::{json, Value};

use crate::support::http::{lock, Req};

use super::sandboxes::page_of;
use super::{json_resp, next_id, FakeRuntime, Inner, Snap, Variant};

/// Recorded: `SNAPSHOT::NOT_FOUND` (a snapshot-service code, not runtime-prefixed).
pub(super) fn snapshot_not_found(inner: &Inner, sid: &str) -> Response {
    match inner.variant {
        Variant::Real => json_resp(
            404,
            json!({"code": "SNAPSHOT::NOT_FOUND", "message": format!("Snapshot {sid} not found")}),
        ),
        Variant::Spec => inner.err(404, "SNAPSHOT_NOT_FOUND", "snapshot not found"),
    }
}
/// Recorded: a delete while Creating is `409 SNAPSHOT::INVALID_STATE`; while a restored
/// sandbox still uses the image it is `409 SNAPSHOT::DELETE_CONFLICT` and the snapshot is left
/// `Deleting`; otherwise 204.
pub(super) fn delete_snapshot(inner: &Inner, sid: &str) -> Response {
    advance_snapshots(inner);
    let in_use = lock(&inner.sandboxes)
        .values()
        .any(|s| s.snapshot_id.as_deref() == Some(sid));
    let mut snaps = lock(&inner.snapshots);
    let Some(snap) = snaps.get_mut(sid) else {
        drop(snaps);
        return snapshot_not_found(inner, sid);
    };
    if snap.state == "Creating" {
        let code = match inner.variant {
            Variant::Real => "SNAPSHOT::INVALID_STATE",
            Variant::Spec => "SNAPSHOT::DELETE_CONFLICT",
        };
        return json_resp(
            409,
            json!({"code": code, "message": format!("Snapshot {sid} is still being created and cannot be deleted")}),
        );
    }
    if in_use && inner.variant == Variant::Real {
        snap.state = "Deleting".to_owned();
        snap.since = Utc::now();
        return json_resp(
            409,
            json!({"code": "SNAPSHOT::DELETE_CONFLICT", "message": "snapshot image cannot be deleted due to a conflict"}),
        );
    }
    snaps.remove(sid);
    StatusCode::NO_CONTENT.into_response()
}
pub(super) fn snap_json(s: &Snap) -> Value {
    let (reason, message) = match s.state.as_str() {
        "Creating" => ("snapshot_accepted", "Snapshot creation accepted."),
        "Ready" => (
            "snapshot_runtime_ready",
            "Docker snapshot image created successfully.",
        ),
        _ => ("snapshot_deleting", "Snapshot deletion in progress."),
    };
    let mut v = json!({"id": s.id, "sandboxId": s.sandbox_id,
                       "status": {"state": s.state, "reason": reason, "message": message,
                                  "lastTransitionAt": s.since.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)},
                       "createdAt": s.created_at.to_rfc3339()});
    if let Some(n) = &s.name {
        v["name"] = json!(n);
    }
    v
}
pub(super) fn advance_snapshots(inner: &Inner) {
    for s in lock(&inner.snapshots).values_mut() {
        if s.state == "Creating" {
            if s.polls_left > 0 {
                s.polls_left -= 1;
            } else {
                s.state = "Ready".to_owned();
                s.since = Utc::now();
            }
        }
    }
}
pub(super) fn create_snapshot(inner: &Inner, id: &str, r: &Req) -> Response {
    let found = lock(&inner.sandboxes)
        .get(id)
        .map(|s| (s.state.clone(), s.created_metadata.clone()));
    let metadata = found.as_ref().map(|f| f.1.clone()).unwrap_or_default();
    match found.map(|f| f.0) {
        None => return inner.err(404, "SANDBOX_NOT_FOUND", "sandbox not found"),
        Some(s) if s != "Running" => {
            return inner.err(409, "SANDBOX_NOT_RUNNING", &format!("sandbox is {s}"))
        }
        _ => {}
    }
    if inner.runtime == FakeRuntime::Kubernetes && !lock(&inner.knobs).registry {
        return inner.err(
            400,
            "REGISTRY_NOT_CONFIGURED",
            "RegistryNotConfigured: no snapshot registry",
        );
    }
    let v: Value = serde_json::from_slice(&r.body).unwrap_or(json!({}));
    lock(&inner.record).snapshot_bodies.push(v.clone());
    if let Some(mode) = v
        .get("mode")
        .filter(|_| lock(&inner.knobs).version.snapshot_modes())
    {
        if mode != "rootfsOnly" {
            return inner.invalid("mode", "Input should be 'rootfsOnly'", mode.clone());
        }
        if inner.runtime != FakeRuntime::Fastsandbox {
            return inner.err(
                400,
                "INVALID_PARAMETER",
                "rootfsOnly snapshots need a Fast Sandbox runtime",
            );
        }
    }
    let sid = next_id(inner, "snap");
    let s = Snap {
        id: sid.clone(),
        sandbox_id: id.to_owned(),
        metadata,
        since: Utc::now(),
        name: v["name"].as_str().map(str::to_owned),
        state: "Creating".to_owned(),
        polls_left: 1,
        created_at: Utc::now(),
    };
    let body = snap_json(&s);
    lock(&inner.snapshots).insert(sid.clone(), s);
    let mut resp = json_resp(202, body);
    resp.headers_mut().insert(
        "location",
        HeaderValue::from_str(&format!("/v1/snapshots/{sid}")).unwrap(),
    );
    resp
}
pub(super) fn list_snapshots(inner: &Inner, r: &Req) -> Response {
    advance_snapshots(inner);
    let sandbox = r.q("sandboxId");
    let page: usize = r.q("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
    let size: usize = r
        .q("pageSize")
        .and_then(|p| p.parse().ok())
        .unwrap_or(20)
        .clamp(1, 200);
    let items: Vec<Value> = lock(&inner.snapshots)
        .values()
        .filter(|s| sandbox.is_none_or(|id| s.sandbox_id == id))
        .map(snap_json)
        .collect();
    page_of(items, page, size)
}
