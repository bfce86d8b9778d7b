//! Daytona's control plane (`/sandbox`, `/snapshots`): the wire types and one function per
//! call, with no policy (waiting, idempotency and state mapping are the adapter's).

use std::collections::BTreeMap;

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::client::{Client, Side};
use crate::kit::paths::segment;
use crate::AdapterError;

/// A sandbox as Daytona answers it (list items and full objects; fields we do not read are
/// ignored, so answers carrying more than the spec says still parse).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Sandbox {
    pub id: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub error_reason: Option<String>,
}

/// `POST /sandbox`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateBody {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Only without a snapshot: Daytona refuses resources with one (400, seen live).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<u64>,
    /// 0: never stop on idleness (Differently owns the lifecycle; kept by Daytona, seen live).
    pub auto_stop_interval: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub network_block_all: bool,
}

/// `GET /sandbox`: the paginated shape of the spec, or the bare list older servers answer.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ListAnswer {
    Page {
        items: Vec<Sandbox>,
        #[serde(default, rename = "nextCursor")]
        next_cursor: Option<String>,
    },
    Bare(Vec<Sandbox>),
}

/// Every sandbox carrying all of `labels` (Daytona's JSON-object labels filter), every page.
pub(crate) async fn list_by_labels(
    c: &Client,
    labels: &BTreeMap<&str, &str>,
) -> Result<Vec<Sandbox>, AdapterError> {
    let filter = serde_json::to_string(labels).unwrap_or_default();
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    // Bounded, so a server that repeats its cursor cannot loop us forever.
    for _ in 0..1000 {
        let mut q: Vec<(&str, String)> =
            vec![("labels", filter.clone()), ("limit", "200".to_owned())];
        if let Some(cur) = &cursor {
            q.push(("cursor", cur.clone()));
        }
        let ans: ListAnswer = c
            .json(
                Side::Api,
                c.api(Method::GET, "/sandbox").query(&q),
                "list sandboxes",
            )
            .await?;
        match ans {
            ListAnswer::Bare(items) => {
                out.extend(items);
                return Ok(out);
            }
            ListAnswer::Page { items, next_cursor } => {
                out.extend(items);
                match next_cursor.filter(|n| !n.is_empty()) {
                    Some(n) if Some(&n) != cursor.as_ref() => cursor = Some(n),
                    _ => return Ok(out),
                }
            }
        }
    }
    Ok(out)
}

/// `GET /sandbox/{id}`.
pub(crate) async fn get(c: &Client, id: &str) -> Result<Sandbox, AdapterError> {
    let path = format!("/sandbox/{}", segment(id));
    c.json(Side::Api, c.api(Method::GET, &path), "get sandbox")
        .await
}

/// `POST /sandbox`; `None` when the name is taken (409: another create of the same sandbox
/// got there first, so the caller looks it up).
pub(crate) async fn create(c: &Client, body: &CreateBody) -> Result<Option<Sandbox>, AdapterError> {
    let op = "create sandbox";
    let http = c.http(Side::Api);
    match http
        .call(c.api(Method::POST, "/sandbox").json(body), op)
        .await?
    {
        Ok(resp) => http.decode(op, resp).await.map(Some),
        Err(a) if a.status == reqwest::StatusCode::CONFLICT => Ok(None),
        Err(a) => Err(http.map_answer(op, &a)),
    }
}

/// `DELETE /sandbox/{id}` (answers while Daytona still deletes).
pub(crate) async fn delete(c: &Client, id: &str) -> Result<(), AdapterError> {
    let path = format!("/sandbox/{}", segment(id));
    c.send_ok(Side::Api, c.api(Method::DELETE, &path), "delete sandbox")
        .await
        .map(drop)
}

/// `POST /sandbox/{id}/{action}`: `start` (also resumes a paused one), `stop`, `pause`.
pub(crate) async fn action(c: &Client, id: &str, action: &str) -> Result<Sandbox, AdapterError> {
    let path = format!("/sandbox/{}/{action}", segment(id));
    c.json(
        Side::Api,
        c.api(Method::POST, &path),
        &format!("{action} sandbox"),
    )
    .await
}

/// A snapshot as Daytona answers it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Snapshot {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub error_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SnapshotPage {
    #[serde(default)]
    items: Vec<Snapshot>,
}

/// `POST /sandbox/{id}/snapshot {name}`: asynchronous (9-22 s until `active`, seen live).
pub(crate) async fn take_snapshot(c: &Client, id: &str, name: &str) -> Result<(), AdapterError> {
    let path = format!("/sandbox/{}/snapshot", segment(id));
    c.send_ok(
        Side::Api,
        c.api(Method::POST, &path)
            .json(&serde_json::json!({ "name": name })),
        "snapshot sandbox",
    )
    .await
    .map(drop)
}

/// The snapshot named exactly `name` (`GET /snapshots?name=` filters, possibly by prefix).
pub(crate) async fn snapshot_by_name(
    c: &Client,
    name: &str,
) -> Result<Option<Snapshot>, AdapterError> {
    let page: SnapshotPage = c
        .json(
            Side::Api,
            c.api(Method::GET, "/snapshots")
                .query(&[("name", name), ("limit", "200")]),
            "find snapshot",
        )
        .await?;
    Ok(page.items.into_iter().find(|s| s.name == name))
}

/// `DELETE /snapshots/{id}` (by id, not name: seen live).
pub(crate) async fn delete_snapshot(c: &Client, id: &str) -> Result<(), AdapterError> {
    let path = format!("/snapshots/{}", segment(id));
    c.send_ok(Side::Api, c.api(Method::DELETE, &path), "delete snapshot")
        .await
        .map(drop)
}

/// A signed preview URL.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct SignedPreview {
    pub url: String,
}

/// `GET /sandbox/{id}/ports/{port}/signed-preview-url?expiresInSeconds=`: the token is in the
/// URL, so it opens without any header (seen live).
pub(crate) async fn signed_preview(
    c: &Client,
    id: &str,
    port: u16,
    seconds: u64,
) -> Result<SignedPreview, AdapterError> {
    let path = format!("/sandbox/{}/ports/{port}/signed-preview-url", segment(id));
    c.json(
        Side::Api,
        c.api(Method::GET, &path)
            .query(&[("expiresInSeconds", seconds.to_string())]),
        "signed preview URL",
    )
    .await
}

/// `GET /sandbox?limit=1`: the key works and the API answers.
pub(crate) async fn ping(c: &Client) -> Result<(), AdapterError> {
    c.send_ok(
        Side::Api,
        c.api(Method::GET, "/sandbox").query(&[("limit", "1")]),
        "health",
    )
    .await
    .map(drop)
}
