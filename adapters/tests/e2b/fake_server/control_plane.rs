//! The fake's control plane: creating, reading, listing, pausing, resuming, killing and
//! snapshotting sandboxes, as the E2B API answers them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::support::http::{json_resp, lock, pct_decode, Req};

use super::envd::envd_version;
use super::{detail, err, next_id, Inner, Sbx, Snap};

pub(super) fn api(inner: &Arc<Inner>, r: Req) -> Response {
    let segs: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    match (r.method.as_str(), segs.as_slice()) {
        ("POST", ["sandboxes"]) => create(inner, &r),
        ("GET", ["v2", "sandboxes"]) => list(inner, &r),
        ("GET", ["sandboxes", id]) => match lock(&inner.sandboxes).get(*id) {
            Some(s) => json_resp(200, detail(s, true, &envd_version(inner))),
            None => err(
                404,
                &format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
            ),
        },
        ("DELETE", ["sandboxes", id]) => match lock(&inner.sandboxes).remove(*id) {
            Some(_) => StatusCode::NO_CONTENT.into_response(),
            None => err(404, &format!("sandbox \"{id}\" not found")),
        },
        ("POST", ["sandboxes", id, "pause"]) => {
            let mut all = lock(&inner.sandboxes);
            match all.get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) if s.state == "paused" => {
                    err(409, &format!("Sandbox \"{id}\" is already paused"))
                }
                Some(s) => {
                    s.state = "paused".to_owned();
                    StatusCode::NO_CONTENT.into_response()
                }
            }
        }
        ("POST", ["sandboxes", id, "connect"]) => {
            let timeout = r.json()["timeout"].as_u64().unwrap_or(0);
            let boot = lock(&inner.knobs).envd_boot_polls;
            let mut all = lock(&inner.sandboxes);
            match all.get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) => {
                    let status = if s.state == "paused" {
                        s.state = "running".to_owned();
                        s.boot_polls_left = boot;
                        201
                    } else {
                        200
                    };
                    s.timeout = s.timeout.max(timeout);
                    json_resp(status, detail(s, true, &envd_version(inner)))
                }
            }
        }
        ("POST", ["sandboxes", id, "timeout"]) => {
            let t = r.json()["timeout"].as_u64().unwrap_or(0);
            let max = lock(&inner.knobs).max_timeout;
            if t > max {
                return err(400, "Timeout cannot be greater than 1 hours");
            }
            match lock(&inner.sandboxes).get_mut(*id) {
                None => err(404, &format!("sandbox \"{id}\" not found")),
                Some(s) => {
                    s.timeout = t;
                    lock(&inner.record).timeouts.push(((*id).to_owned(), t));
                    StatusCode::NO_CONTENT.into_response()
                }
            }
        }
        ("POST", ["sandboxes", id, "snapshots"]) => {
            let name = r.json()["name"].as_str().unwrap_or_default().to_owned();
            let Some(sbx) = lock(&inner.sandboxes).get(*id).cloned() else {
                return err(404, &format!("sandbox \"{id}\" not found"));
            };
            let snap_id = format!("team-fake/{name}:default");
            lock(&inner.record).snapshot_builds += 1;
            lock(&inner.snapshots).insert(
                snap_id.clone(),
                Snap {
                    id: snap_id.clone(),
                    name: name.clone(),
                    sandbox: sbx.id,
                    env: sbx.env,
                },
            );
            json_resp(
                201,
                json!({"snapshotID": snap_id, "names": [format!("team-fake/{name}:default")]}),
            )
        }
        ("GET", ["snapshots"]) => {
            let sandbox = r.q("sandboxID");
            let name = r.q("name");
            let out: Vec<Value> = lock(&inner.snapshots)
                .values()
                .filter(|s| sandbox.is_none_or(|x| x == s.sandbox))
                .filter(|s| name.is_none_or(|n| n == s.name || n == s.id))
                .map(|s| json!({"snapshotID": s.id, "names": [s.id]}))
                .collect();
            json_resp(200, Value::Array(out))
        }
        ("DELETE", ["templates", id]) => {
            let mut snaps = lock(&inner.snapshots);
            let key = snaps
                .values()
                .find(|s| s.name == *id || s.id == *id)
                .map(|s| s.id.clone());
            match key {
                Some(k) => {
                    snaps.remove(&k);
                    StatusCode::NO_CONTENT.into_response()
                }
                None => err(404, &format!("template '{id}' not found")),
            }
        }
        _ => err(404, "not found"),
    }
}
fn create(inner: &Arc<Inner>, r: &Req) -> Response {
    let b = r.json();
    lock(&inner.record).create_bodies.push(b.clone());
    let Some(template) = b["templateID"].as_str().map(str::to_owned) else {
        return err(
            400,
            "request body has an error: doesn't match schema: templateID is required",
        );
    };
    let (max_running, max_timeout, boot) = {
        let k = lock(&inner.knobs);
        (k.max_running, k.max_timeout, k.envd_boot_polls)
    };
    let timeout = b["timeout"].as_u64().unwrap_or(15);
    if timeout > max_timeout {
        return err(400, "Timeout cannot be greater than 1 hours");
    }
    let mut env: BTreeMap<String, String> =
        serde_json::from_value(b["envVars"].clone()).unwrap_or_default();
    if template != "base" {
        match lock(&inner.snapshots).get(&template) {
            Some(snap) => {
                for (k, v) in &snap.env {
                    env.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            None => return err(404, &format!("template '{template}' not found")),
        }
    }
    let mut all = lock(&inner.sandboxes);
    if all.values().filter(|s| s.state == "running").count() >= max_running {
        return err(
            429,
            &format!("You have reached the maximum number of concurrent E2B sandboxes ({max_running}). If you need more, please contact us at 'https://e2b.dev/docs/getting-help'"),
        );
    }
    let id = next_id(inner, "i");
    let s = Sbx {
        id: id.clone(),
        template,
        state: "running".to_owned(),
        metadata: serde_json::from_value(b["metadata"].clone()).unwrap_or_default(),
        env,
        token: format!("envd-token-{id}"),
        timeout,
        allow_public_traffic: b["network"]["allowPublicTraffic"].as_bool(),
        boot_polls_left: boot,
    };
    let mut answer = json!({
        "templateID": s.template, "sandboxID": id, "clientID": "6532622b",
        "envdVersion": envd_version(inner), "domain": null,
    });
    if b["secure"].as_bool() == Some(true) {
        answer["envdAccessToken"] = json!(s.token);
    }
    all.insert(id, s);
    json_resp(201, answer)
}
fn list(inner: &Arc<Inner>, r: &Req) -> Response {
    let (page_size, ignore) = {
        let k = lock(&inner.knobs);
        (k.page_size, k.ignore_metadata_filter)
    };
    let filter: Vec<(String, String)> = r
        .q("metadata")
        .map(|m| {
            m.split('&')
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (pct_decode(k), pct_decode(v)))
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<&str> = r
        .q("state")
        .map(|s| s.split(',').collect())
        .unwrap_or_default();
    let limit = r
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .min(page_size);
    let start = r
        .q("nextToken")
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(0);
    let version = envd_version(inner);
    let all: Vec<Value> = lock(&inner.sandboxes)
        .values()
        .filter(|s| states.is_empty() || states.contains(&s.state.as_str()))
        .filter(|s| ignore || filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .map(|s| detail(s, false, &version))
        .collect();
    let page: Vec<Value> = all.iter().skip(start).take(limit).cloned().collect();
    let mut resp = json_resp(200, Value::Array(page));
    if start + limit < all.len() {
        resp.headers_mut()
            .insert("x-next-token", (start + limit).to_string().parse().unwrap());
    }
    resp
}
