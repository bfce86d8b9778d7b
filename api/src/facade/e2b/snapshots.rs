//! E2B snapshots on `/v1` snapshots: `create_snapshot` (`POST /sandboxes/{id}/snapshots`),
//! `list_snapshots` (`GET /snapshots`), `delete_snapshot` (`DELETE /templates/{id}`), and the
//! restore, `Sandbox.create(template=<snapshot id>)` ([`is_snapshot`], [`until_ready`]).
//!
//! An E2B snapshot id is the `/v1` snapshot id (`snp_…`), so restoring needs no lookup, and
//! its `names` are the `/v1` snapshot's `name` when it has one. Snapshots keep the
//! filesystem only (no `/v1` backend snapshots memory): `memory: true` is refused, an absent
//! `memory` (E2B's "full" default) is taken as filesystem-only, as documented.
//!
//! E2B answers create once the snapshot exists; `/v1` answers 202 and finishes in the pool's
//! worker, so create waits for `ready` for at most [`SNAPSHOT_WAIT`] (inside the SDK's 60 s
//! request timeout). One still being written then is handed out early: a create from it
//! waits for it in turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use differently_core::ids::SnapshotId;

use crate::facade::opensandbox::inner::{q, Caller};

use super::control::{call, caller, live};
use super::error::{E2bError, E2bResult};
use super::Facade;

/// How long create waits for the snapshot to be ready before handing out its id.
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(50);
/// The longest pause between two looks at a snapshot being taken.
const POLL_MAX: Duration = Duration::from_secs(1);

/// Whether an E2B template id names a `/v1` snapshot (a create restores it).
pub fn is_snapshot(template: &str) -> bool {
    SnapshotId::parse(template).is_ok()
}

/// The E2B `SnapshotInfo` of a `/v1` snapshot.
fn info(snap: &Value) -> Value {
    let names: Vec<Value> = snap["name"]
        .as_str()
        .map(|n| json!(n))
        .into_iter()
        .collect();
    json!({ "snapshotID": snap["id"], "names": names })
}

/// The caller's snapshot `id` as `/v1` reads it; 404 naming it otherwise.
async fn read(f: &Facade, c: &Caller, id: &str) -> E2bResult<Value> {
    let uri = format!("/v1/snapshots/{}", q(id));
    match call(f, c, Method::GET, &uri, None, &[]).await {
        Ok((_, snap)) => Ok(snap),
        Err(e) if e.status == StatusCode::NOT_FOUND => Err(not_found(id)),
        Err(e) => Err(e),
    }
}

fn not_found(id: &str) -> E2bError {
    E2bError::new(StatusCode::NOT_FOUND, format!("snapshot {id} not found"))
}

/// Looks at snapshot `snap` until it is no longer `creating` or `deadline` passes; its
/// last reading. Pauses grow from 100 ms to [`POLL_MAX`]: there is no `/v1` wait for it.
async fn settle(
    f: &Facade,
    c: &Caller,
    mut snap: Value,
    started: Instant,
    deadline: Duration,
) -> E2bResult<Value> {
    let id = snap["id"].as_str().unwrap_or_default().to_owned();
    let mut pause = Duration::from_millis(100);
    while snap["status"] == "creating" {
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(POLL_MAX);
        snap = read(f, c, &id).await?;
    }
    Ok(snap)
}

/// Before a create from snapshot `id`: waits (within `deadline` of `started`) while it is
/// still being taken, so a snapshot handed out early restores once ready. One being deleted
/// is gone for E2B, as in the list and on delete (`delete_snapshot` said `True`, and `/v1`
/// may still be deleting it): 404. Other states are left to `/v1`'s create, which says why
/// it cannot restore them.
pub async fn until_ready(
    f: &Facade,
    c: &Caller,
    id: &str,
    started: Instant,
    deadline: Duration,
) -> E2bResult<()> {
    let snap = read(f, c, id).await?;
    if snap["status"] == "deleting" {
        return Err(not_found(id));
    }
    settle(f, c, snap, started, deadline).await?;
    Ok(())
}

/// Body of `POST /sandboxes/{id}/snapshots`; other fields are ignored.
#[derive(Debug, Default, Deserialize)]
struct NewSnapshot {
    name: Option<String>,
    memory: Option<bool>,
}

/// `create_snapshot`: 201 `{snapshotID, names}` once the snapshot is ready (or
/// [`SNAPSHOT_WAIT`] has passed); 404 for a sandbox the caller cannot see.
pub async fn create(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> E2bResult<Response> {
    let started = Instant::now();
    let (c, _) = caller(&headers)?;
    let b: NewSnapshot = if body.iter().all(u8::is_ascii_whitespace) {
        NewSnapshot::default()
    } else {
        crate::requests::body::read(&body).map_err(E2bError::json)?
    };
    if b.memory == Some(true) {
        return Err(E2bError::field(
            "memory",
            "Differently snapshots keep the filesystem only (no backend snapshots memory): \
             take it with mode=\"filesystem\"",
        ));
    }
    live(&f, &c, &id).await?;
    let v1 = match &b.name {
        Some(n) => json!({ "name": n }),
        None => json!({}),
    };
    let uri = format!("/v1/sandboxes/{}/snapshots", q(&id));
    let (_, snap) = call(&f, &c, Method::POST, &uri, Some(&v1), &[])
        .await
        .map_err(|e| match e.status.as_u16() {
            404 => E2bError::sandbox_not_found(&id),
            // A repeat would take a second snapshot.
            429 | 502..=504 => e.no_retry(),
            _ => e,
        })?;
    let snap = settle(&f, &c, snap, started, SNAPSHOT_WAIT).await?;
    if snap["status"] == "failed" {
        let why = snap["statusReason"].as_str().unwrap_or("no reason given");
        return Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("snapshot {} of sandbox {id} failed: {why}", snap["id"]),
        )
        .no_retry());
    }
    Ok((StatusCode::CREATED, Json(info(&snap))).into_response())
}

/// `list_snapshots`: `GET /snapshots?sandboxID=&name=&limit=&nextToken=`, the caller's
/// snapshots (of one sandbox with `sandboxID`), ready or being taken, with `name` matched
/// exactly; `nextToken` is `/v1`'s cursor, given back in `X-Next-Token`. A sandbox the
/// caller cannot see has none.
pub async fn list(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let (c, _) = caller(&headers)?;
    let (mut sandbox, mut name, mut limit, mut cursor) = (None, None, None, None);
    for (k, v) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
        let v = Some(v.into_owned()).filter(|v| !v.is_empty());
        match &*k {
            "sandboxID" => sandbox = v,
            "name" => name = v,
            "limit" => limit = v,
            "nextToken" => cursor = v,
            _ => {}
        }
    }
    let mut uri = match &sandbox {
        Some(s) => format!("/v1/sandboxes/{}/snapshots?", q(s)),
        None => "/v1/snapshots?".to_owned(),
    };
    if let Some(l) = &limit {
        uri.push_str(&format!("limit={}&", q(l)));
    }
    if let Some(t) = &cursor {
        uri.push_str(&format!("cursor={}&", q(t)));
    }
    let page = match call(
        &f,
        &c,
        Method::GET,
        uri.trim_end_matches(['?', '&']),
        None,
        &[],
    )
    .await
    {
        Ok((_, page)) => page,
        Err(e) if sandbox.is_some() && e.status == StatusCode::NOT_FOUND => json!({}),
        Err(e) => return Err(e),
    };
    let items: Vec<Value> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| matches!(s["status"].as_str(), Some("ready" | "creating")))
        .filter(|s| name.is_none() || s["name"].as_str() == name.as_deref())
        .map(info)
        .collect();
    Ok(super::control::paged(items, &page))
}

/// `delete_snapshot` (`DELETE /templates/{id}`): 204 once deleted, 202 when the backend
/// deletes it later (`/v1` retries, e.g. while a sandbox restored from it still holds it),
/// 404 (the SDK's `False`) for anything that is not one of the caller's snapshots, templates
/// included (the facade does not manage templates), and for one already being deleted.
pub async fn delete(
    Extension(f): Extension<Arc<Facade>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (c, _) = caller(&headers)?;
    if !is_snapshot(&id) {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("{id} is not a snapshot; templates are not managed through the E2B facade"),
        ));
    }
    // One already being deleted is gone for E2B (as in the list): `/v1` goes on deleting it.
    if read(&f, &c, &id).await?["status"] == "deleting" {
        return Err(not_found(&id));
    }
    let uri = format!("/v1/snapshots/{}", q(&id));
    match call(&f, &c, Method::DELETE, &uri, None, &[]).await {
        Ok((status, _)) => Ok(status),
        Err(e) if e.status == StatusCode::NOT_FOUND => Err(not_found(&id)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_are_told_from_template_names() {
        assert!(is_snapshot(&SnapshotId::new().to_string()));
        for t in [
            "base",
            "code-interpreter-v1",
            "snp_",
            "snp_not-a-ulid",
            "team/snp:tag",
        ] {
            assert!(!is_snapshot(t), "{t}");
        }
    }

    #[test]
    fn info_names_the_snapshot_by_its_name_when_it_has_one() {
        let named = json!({"id": "snp_1", "name": "mine", "status": "ready"});
        assert_eq!(
            info(&named),
            json!({"snapshotID": "snp_1", "names": ["mine"]})
        );
        let unnamed = json!({"id": "snp_2", "name": null});
        assert_eq!(info(&unnamed), json!({"snapshotID": "snp_2", "names": []}));
    }
}
