//! The fake's sandbox API: creating, reading, listing, starting, stopping, archiving and
//! deleting sandboxes (with the states they pass through), snapshots and preview links.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::Method;
use axum::response::Response;
use serde_json::{json, Value};

use crate::support::http::{json_resp, lock, pct_decode, Req};

use super::{api_error, next_id, Inner, Knobs, Sbx, Snap};

fn sandbox_json(s: &Sbx) -> Value {
    json!({
        "id": s.id, "organizationId": "org-1", "name": s.name, "user": "daytona",
        "snapshot": s.snapshot, "env": s.env, "labels": s.labels, "public": false,
        "networkBlockAll": false, "target": "us", "cpu": s.cpu, "gpu": 0, "memory": s.memory,
        "disk": s.disk, "state": s.state, "desiredState": "started",
        "errorReason": s.error_reason, "toolboxProxyUrl": "http://toolbox.invalid/toolbox",
        "autoStopInterval": 0, "createdAt": "2026-10-29T10:00:00Z",
        // Fields a newer server adds; the adapter must not mind them.
        "sandboxClass": "container", "daemonVersion": "0.190.0",
    })
}
/// Moves a transition in progress one poll on.
fn advance(s: &mut Sbx, knobs: &Knobs) {
    if let Some((end, left)) = s.pending.take() {
        if left <= 1 {
            if end == "started" {
                s.boot_502_left = knobs.toolbox_boot_502;
            }
            s.state = end;
        } else {
            s.pending = Some((end, left - 1));
        }
    }
}
fn begin(s: &mut Sbx, during: &str, end: &str, polls: u32) {
    s.state = during.to_owned();
    s.pending = Some((end.to_owned(), polls.max(1)));
}
pub(super) async fn api(inner: &Arc<Inner>, r: &Req) -> Response {
    let Some(rest) = r.path.strip_prefix("/api") else {
        return api_error(404, &format!("Cannot {} {}", r.method, r.path));
    };
    let seg: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(pct_decode)
        .collect();
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    let knobs = lock(&inner.knobs);
    let mut sbxs = lock(&inner.sandboxes);
    let find = |sbxs: &BTreeMap<String, Sbx>, key: &str| -> Option<String> {
        sbxs.values()
            .find(|s| (s.id == key || s.name == key) && s.state != "destroyed")
            .map(|s| s.id.clone())
    };
    match (r.method.clone(), seg.as_slice()) {
        (Method::GET, ["sandbox"]) => {
            for s in sbxs.values_mut() {
                advance(s, &knobs);
            }
            let filter: BTreeMap<String, String> = match r.q("labels") {
                Some(l) => match serde_json::from_str(l) {
                    Ok(f) => f,
                    Err(_) => return api_error(400, "labels must be a JSON object"),
                },
                None => BTreeMap::new(),
            };
            let limit: usize = r.q("limit").and_then(|l| l.parse().ok()).unwrap_or(100);
            if !(1..=200).contains(&limit) {
                return api_error(400, "limit must not be greater than 200");
            }
            let page = limit.min(knobs.page_size);
            let matching: Vec<&Sbx> = sbxs
                .values()
                .filter(|s| s.state != "destroyed")
                .filter(|s| filter.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
                .collect();
            let start: usize = r.q("cursor").and_then(|c| c.parse().ok()).unwrap_or(0);
            let items: Vec<Value> = matching
                .iter()
                .skip(start)
                .take(page)
                .map(|s| sandbox_json(s))
                .collect();
            let next = (start + page < matching.len()).then(|| (start + page).to_string());
            json_resp(200, json!({"items": items, "nextCursor": next}))
        }
        (Method::POST, ["sandbox"]) => {
            let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                return api_error(400, "invalid JSON");
            };
            lock(&inner.record).create_bodies.push(b.clone());
            let snapshot = b["snapshot"].as_str().map(str::to_owned);
            let sized = ["cpu", "memory", "disk"].iter().any(|k| !b[*k].is_null());
            if snapshot.is_some() && sized {
                return api_error(
                    400,
                    "Cannot specify Sandbox resources when using a snapshot",
                );
            }
            if let Some(name) = snapshot
                .as_deref()
                .filter(|n| n.starts_with("differently-"))
            {
                let snaps = lock(&inner.snapshots);
                match snaps.values().find(|s| s.name == name) {
                    Some(s) if s.state == "active" => {}
                    Some(_) => return api_error(400, &format!("Snapshot {name} is not active")),
                    None => return api_error(404, &format!("Snapshot {name} not found")),
                }
            }
            let live = sbxs.values().filter(|s| s.state != "destroyed").count();
            if knobs.max_sandboxes.is_some_and(|m| live >= m) {
                return api_error(
                    429,
                    "Sandbox limit exceeded for your plan. Maximum allowed: 1",
                );
            }
            let name = b["name"].as_str().unwrap_or_default().to_owned();
            if !name.is_empty() && find(&sbxs, &name).is_some() {
                return api_error(409, &format!("Sandbox with name {name} already exists"));
            }
            let id = next_id(inner);
            let labels: BTreeMap<String, String> =
                serde_json::from_value(b["labels"].clone()).unwrap_or_default();
            let env: BTreeMap<String, String> =
                serde_json::from_value(b["env"].clone()).unwrap_or_default();
            let mut s = Sbx {
                id: id.clone(),
                name: if name.is_empty() { id.clone() } else { name },
                state: String::new(),
                pending: None,
                labels,
                env,
                snapshot,
                cpu: b["cpu"].as_u64().unwrap_or(1),
                memory: b["memory"].as_u64().unwrap_or(1),
                disk: b["disk"].as_u64().unwrap_or(3),
                error_reason: None,
                boot_502_left: 0,
            };
            let end = if knobs.build_fails {
                s.error_reason = Some("failed to pull image".to_owned());
                "build_failed"
            } else {
                "started"
            };
            begin(&mut s, "creating", end, knobs.creating_polls);
            let out = sandbox_json(&s);
            sbxs.insert(id, s);
            json_resp(200, out)
        }
        (method, ["sandbox", key, rest @ ..]) => {
            let Some(id) = find(&sbxs, key) else {
                return api_error(404, &format!("Sandbox with ID or name {key} not found"));
            };
            let polls = knobs.transition_polls;
            let s = sbxs.get_mut(&id).unwrap();
            match (method, rest) {
                (Method::GET, []) => {
                    advance(s, &knobs);
                    json_resp(200, sandbox_json(s))
                }
                (Method::DELETE, []) => {
                    if s.pending.is_some() && s.state != "destroying" {
                        return api_error(409, "Sandbox state change in progress");
                    }
                    begin(s, "destroying", "destroyed", polls);
                    json_resp(200, sandbox_json(s))
                }
                (Method::POST, ["start"]) => match s.state.as_str() {
                    "stopped" | "archived" => {
                        begin(s, "starting", "started", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    "paused" => {
                        begin(s, "resuming", "started", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    st => api_error(400, &format!("Sandbox is not stopped (state: {st})")),
                },
                (Method::POST, ["stop"]) => match s.state.as_str() {
                    "started" | "paused" => {
                        begin(s, "stopping", "stopped", polls);
                        json_resp(200, sandbox_json(s))
                    }
                    st => api_error(400, &format!("Sandbox is not started (state: {st})")),
                },
                (Method::POST, ["pause"]) => {
                    if !knobs.vm {
                        return api_error(400, "Pause is only supported for linux-vm sandboxes");
                    }
                    match s.state.as_str() {
                        "started" => {
                            begin(s, "pausing", "paused", polls);
                            json_resp(200, sandbox_json(s))
                        }
                        st => api_error(400, &format!("Sandbox is not started (state: {st})")),
                    }
                }
                (Method::POST, ["snapshot"]) => {
                    let Ok(b) = serde_json::from_slice::<Value>(&r.body) else {
                        return api_error(400, "invalid JSON");
                    };
                    let Some(name) = b["name"].as_str().filter(|n| !n.is_empty()) else {
                        return api_error(400, "name should not be empty");
                    };
                    if s.state != "started" {
                        return api_error(
                            409,
                            &format!("Sandbox is not started (state: {})", s.state),
                        );
                    }
                    let mut snaps = lock(&inner.snapshots);
                    if snaps.values().any(|x| x.name == name) {
                        return api_error(409, &format!("Snapshot {name} already exists"));
                    }
                    let sid = next_id(inner);
                    snaps.insert(
                        sid.clone(),
                        Snap {
                            id: sid,
                            name: name.to_owned(),
                            state: "pending".to_owned(),
                            polls_left: knobs.snapshot_polls,
                        },
                    );
                    begin(s, "snapshotting", "started", 1);
                    s.pending = Some(("started".to_owned(), 1));
                    json_resp(200, sandbox_json(s))
                }
                (Method::GET, ["ports", port, "signed-preview-url"]) => {
                    let Ok(port) = port.parse::<u16>() else {
                        return api_error(400, "port must be a number");
                    };
                    let secs = r
                        .q("expiresInSeconds")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(60);
                    lock(&inner.record).preview_expiries.push(secs);
                    let token = format!("tok{}", next_id(inner).replace('-', ""));
                    json_resp(
                        200,
                        json!({"sandboxId": s.id, "port": port, "token": token,
                               "url": format!("http://{}/{port}-{token}/", inner.preview_addr)}),
                    )
                }
                _ => api_error(404, &format!("Cannot {} {}", r.method, r.path)),
            }
        }
        (Method::GET, ["snapshots"]) => {
            let mut snaps = lock(&inner.snapshots);
            for s in snaps.values_mut() {
                if s.state == "pending" {
                    s.polls_left = s.polls_left.saturating_sub(1);
                    if s.polls_left == 0 {
                        s.state = "active".to_owned();
                    }
                }
            }
            // The name filter matches part of a name, not only whole names.
            let needle = r.q("name").unwrap_or("");
            let items: Vec<Value> = snaps
                .values()
                .filter(|s| s.name.contains(needle))
                .map(|s| {
                    json!({"id": s.id, "name": s.name, "state": s.state, "general": false,
                           "size": null, "entrypoint": null, "cpu": 1, "gpu": 0, "mem": 1,
                           "disk": 3, "errorReason": null, "createdAt": "2026-10-29T10:00:00Z",
                           "updatedAt": "2026-10-29T10:00:00Z", "lastUsedAt": null})
                })
                .collect();
            let total = items.len();
            json_resp(
                200,
                json!({"items": items, "total": total, "page": 1, "totalPages": 1}),
            )
        }
        (Method::DELETE, ["snapshots", id]) => {
            // By id only: a name is not found (seen live).
            match lock(&inner.snapshots).remove(*id) {
                Some(_) => json_resp(200, json!({})),
                None => api_error(404, &format!("Snapshot {id} not found")),
            }
        }
        _ => api_error(404, &format!("Cannot {} {}", r.method, r.path)),
    }
}
