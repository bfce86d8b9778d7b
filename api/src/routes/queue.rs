//! `GET /v1/admin/queue`: the fair queue per organization as the store holds it (queued rows
//! are the truth the placement leader rebuilds its queue from): how many wait, since when,
//! and behind which wall (the `wall` of each one's stored placement explanation: its org's
//! quota, its project's, or full pools). Read-only, for operators and the dashboard.
//!
//! `GET /v1/admin/metrics/summary`: this process's admission, activation and queue-depth
//! metrics as JSON, for the dashboard's charts, so a browser never needs the unauthenticated
//! metrics listener.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use differently_core::{SandboxId, SandboxStatus};
use differently_store::SandboxFilter;
use serde::Serialize;

use crate::auth::access::forbidden;
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::AppState;

/// Queued rows read per answer; a deeper queue is reported with `truncated: true`.
pub const MAX_ROWS: u32 = 10_000;
/// Placement explanations read per answer (to name each row's wall); rows beyond it are
/// counted under `unknown`.
pub const MAX_EXPLANATIONS: usize = 500;
const PAGE: u32 = 1000;

/// Routes of this module.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/admin/queue", get(queue))
        .route("/v1/admin/metrics/summary", get(metrics_summary))
}

/// The whole queue.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    pub generated_at: DateTime<Utc>,
    /// Queued sandboxes counted (all of them unless `truncated`).
    pub total: u64,
    pub truncated: bool,
    /// Deepest first.
    pub orgs: Vec<OrgQueue>,
}

/// One organization's waiting sandboxes.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgQueue {
    pub org_id: String,
    #[schema(required)]
    pub org_name: Option<String>,
    pub depth: u64,
    pub oldest_queued_at: DateTime<Utc>,
    pub oldest_sandbox_id: String,
    /// How many wait behind each wall: `org`, `project`, `pool`, or `unknown` (no
    /// explanation recorded yet, or beyond [`MAX_EXPLANATIONS`]).
    pub walls: BTreeMap<String, u64>,
    /// The most common `statusReason`s, most frequent first (at most 5).
    pub reasons: Vec<ReasonCount>,
}

/// A status reason and how many rows carry it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReasonCount {
    pub reason: String,
    pub count: u64,
}

fn require_admin(p: &Principal) -> ApiResult<()> {
    if p.is_admin() {
        Ok(())
    } else {
        Err(forbidden(
            "read the queue of every organization (admin scope needed)",
        ))
    }
}

#[derive(Default)]
struct Acc {
    depth: u64,
    oldest: Option<(DateTime<Utc>, SandboxId)>,
    walls: BTreeMap<String, u64>,
    reasons: BTreeMap<String, u64>,
}

async fn queue(State(state): State<AppState>, p: Principal) -> ApiResult<Json<QueueReport>> {
    require_admin(&p)?;
    let mut per_org: BTreeMap<String, Acc> = BTreeMap::new();
    let mut after = None;
    let mut total = 0u64;
    let mut explained = 0usize;
    let mut truncated = false;
    loop {
        let rows = state
            .store
            .list_sandboxes(&SandboxFilter {
                status: Some(SandboxStatus::Queued),
                after: after.clone(),
                limit: PAGE,
                ..SandboxFilter::default()
            })
            .await?;
        let last = rows.last().map(|r| r.id.clone());
        for row in &rows {
            total += 1;
            let acc = per_org.entry(row.org_id.to_string()).or_default();
            acc.depth += 1;
            if acc.oldest.as_ref().is_none_or(|(t, _)| row.created_at < *t) {
                acc.oldest = Some((row.created_at, row.id.clone()));
            }
            let wall = if explained < MAX_EXPLANATIONS {
                explained += 1;
                state
                    .store
                    .get_placement(&row.id)
                    .await?
                    .and_then(|doc| doc.get("wall").and_then(|w| w.as_str()).map(str::to_owned))
            } else {
                None
            };
            let wall = wall.or_else(|| {
                row.status_reason
                    .as_deref()
                    .and_then(wall_of_reason)
                    .map(str::to_owned)
            });
            *acc.walls
                .entry(wall.unwrap_or_else(|| "unknown".into()))
                .or_default() += 1;
            if let Some(reason) = &row.status_reason {
                *acc.reasons.entry(reason.clone()).or_default() += 1;
            }
        }
        if rows.len() < PAGE as usize {
            break;
        }
        if total >= u64::from(MAX_ROWS) {
            truncated = true;
            break;
        }
        after = last;
    }
    let mut orgs = Vec::with_capacity(per_org.len());
    for (org_id, acc) in per_org {
        let Some((oldest_at, oldest_id)) = acc.oldest else {
            continue;
        };
        let org_name = match differently_core::OrgId::parse(&org_id) {
            Ok(id) => state.store.get_org(&id).await?.map(|o| o.name),
            Err(_) => None,
        };
        let mut reasons: Vec<ReasonCount> = acc
            .reasons
            .into_iter()
            .map(|(reason, count)| ReasonCount { reason, count })
            .collect();
        reasons.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
        reasons.truncate(5);
        orgs.push(OrgQueue {
            org_id,
            org_name,
            depth: acc.depth,
            oldest_queued_at: oldest_at,
            oldest_sandbox_id: oldest_id.to_string(),
            walls: acc.walls,
            reasons,
        });
    }
    orgs.sort_by(|a, b| {
        b.depth
            .cmp(&a.depth)
            .then(a.oldest_queued_at.cmp(&b.oldest_queued_at))
    });
    Ok(Json(QueueReport {
        generated_at: Utc::now(),
        total,
        truncated,
        orgs,
    }))
}

/// The wall a waiting reason names, for a row with no stored explanation (one admitted
/// while its quota was already full waits without a placement pass): the core writes every
/// waiting reason as `waiting: <org|project|pool> …` (`tenancy::Quota::blocks`,
/// `accounting`), the level first.
pub fn wall_of_reason(reason: &str) -> Option<&'static str> {
    let level = reason.strip_prefix("waiting: ")?.split(' ').next()?;
    differently_core::accounting::Wall::ALL
        .into_iter()
        .map(|w| w.as_str())
        .find(|w| *w == level)
}

/// Renders this process's metrics as Prometheus text; set by the binary when it installs
/// its metrics recorder.
type Render = Box<dyn Fn() -> String + Send + Sync>;
static SOURCE: OnceLock<Render> = OnceLock::new();

/// Gives the summary route this process's metrics (the binary calls it once, with the
/// recorder's renderer). A second call is ignored: there is one recorder per process.
pub fn set_metrics_source(render: impl Fn() -> String + Send + Sync + 'static) {
    let _ = SOURCE.set(Box::new(render));
}

/// The counters the dashboard charts, summed from the Prometheus text.
#[derive(Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSummary {
    pub generated_at: DateTime<Utc>,
    /// False when this process keeps no metrics (no recorder installed); the rest is empty.
    pub enabled: bool,
    /// `differently_admissions_total` per `outcome`.
    pub admissions: BTreeMap<String, f64>,
    /// `differently_activations_total` per `pool`.
    pub activations: BTreeMap<String, f64>,
    /// `differently_queue_depth` per `org` (as the scheduler last set it).
    pub queue_depth: BTreeMap<String, f64>,
}

/// The value of `label` in a Prometheus series' label set (`{a="x",b="y"}`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("{name}=\"");
    let start = labels.find(&pat)? + pat.len();
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// Picks the summary's series out of Prometheus text; unknown lines are ignored.
pub fn summarize(text: &str) -> MetricsSummary {
    let mut out = MetricsSummary {
        generated_at: Utc::now(),
        enabled: true,
        ..MetricsSummary::default()
    };
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.find('{') {
            Some(i) => (&series[..i], &series[i..]),
            None => (series, ""),
        };
        let (map, key) = match name {
            "differently_admissions_total" => (&mut out.admissions, "outcome"),
            "differently_activations_total" => (&mut out.activations, "pool"),
            "differently_queue_depth" => (&mut out.queue_depth, "org"),
            _ => continue,
        };
        let k = label(labels, key).unwrap_or("").to_owned();
        *map.entry(k).or_default() += value;
    }
    out
}

async fn metrics_summary(p: Principal) -> ApiResult<Json<MetricsSummary>> {
    require_admin(&p)?;
    Ok(Json(match SOURCE.get() {
        Some(render) => summarize(&render()),
        None => MetricsSummary {
            generated_at: Utc::now(),
            ..MetricsSummary::default()
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_reason_names_its_wall() {
        assert_eq!(wall_of_reason("waiting: org active quota 1/1"), Some("org"));
        assert_eq!(
            wall_of_reason("waiting: project cpu quota 2/2"),
            Some("project")
        );
        assert_eq!(wall_of_reason("waiting: pool p full 1/1"), Some("pool"));
        assert_eq!(wall_of_reason("waiting: x"), None);
        assert_eq!(wall_of_reason("backend unavailable"), None);
    }

    #[test]
    fn the_summary_sums_the_charted_series_and_skips_the_rest() {
        let text = "# TYPE differently_admissions_total counter\n\
            differently_admissions_total{outcome=\"admitted\"} 7\n\
            differently_admissions_total{outcome=\"rejected\"} 2\n\
            differently_activations_total{pool=\"local\"} 5\n\
            differently_activations_total{pool=\"e2b\"} 1\n\
            differently_queue_depth{org=\"org_1\"} 3\n\
            differently_queue_depth{org=\"other\"} 0\n\
            differently_adapter_calls_total{pool=\"local\",op=\"create\",outcome=\"ok\"} 9\n\
            garbage line\n";
        let s = summarize(text);
        assert!(s.enabled);
        assert_eq!(s.admissions["admitted"], 7.0);
        assert_eq!(s.admissions["rejected"], 2.0);
        assert_eq!(s.activations.values().sum::<f64>(), 6.0);
        assert_eq!(s.queue_depth["org_1"], 3.0);
        assert_eq!(s.queue_depth.len(), 2);
    }
}
