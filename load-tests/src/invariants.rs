//! The end-of-run invariant check, from Postgres (rows and the audit log) and the fake
//! backend's ledger: no sandbox lost, no duplicate backend instance, quotas never exceeded,
//! every delete finished.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use differently_adapters::fake::{live_instances, read_ledger, LedgerOp, LedgerOutcome};
use differently_core::SandboxStatus;
use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::LoadError;

/// What the generator expects to find.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// Every sandbox the API accepted (202).
    pub accepted: Vec<String>,
    /// Those whose delete was accepted (202): must be `terminated` with no backend instance.
    pub deleted: Vec<String>,
    /// `quota.max_active` per organization.
    pub max_active: u32,
}

/// One invariant's outcome.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Held.
    pub ok: bool,
    /// How many violations.
    pub violations: usize,
    /// A few of them.
    pub examples: Vec<String>,
}

impl Check {
    fn from(examples_all: Vec<String>) -> Check {
        Check {
            ok: examples_all.is_empty(),
            violations: examples_all.len(),
            examples: examples_all.into_iter().take(5).collect(),
        }
    }
}

/// The whole check.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvariantReport {
    /// Every check held.
    pub ok: bool,
    /// Sandboxes the generator expected to find.
    pub sandboxes_expected: usize,
    /// Rows in Postgres.
    pub rows_in_postgres: usize,
    /// Lines in the fake ledger.
    pub ledger_lines: usize,
    /// Rows still in queued/provisioning/terminating when the settle bound ran out.
    pub unsettled_rows: usize,
    /// Accepted sandboxes that are missing, or not where they should be (running unless
    /// deleted), or running without a backend instance.
    pub no_sandbox_lost: Check,
    /// Sandboxes with more than one `created` line in the ledger.
    pub no_duplicate_instance: Check,
    /// Backend instances alive without a running row (leaks).
    pub no_orphan_instance: Check,
    /// Replay of the audit log per organization against `quota.max_active`.
    pub quota_never_exceeded: Check,
    /// Highest concurrent active count seen per organization in the replay.
    pub max_active_seen: BTreeMap<String, u64>,
    /// The configured limit.
    pub max_active_limit: u32,
    /// Deleted sandboxes that are not `terminated`, or still have a backend instance.
    pub every_delete_finished: Check,
}

/// Waits (bounded) until no row is in flight (queued, provisioning, terminating).
pub async fn settle(pool: &PgPool, within: Duration) -> Result<usize, LoadError> {
    let deadline = Instant::now() + within;
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE status IN ('queued','provisioning','terminating')",
        )
        .fetch_one(pool)
        .await
        .map_err(|e| LoadError::db("counting rows in flight", e))?;
        if n == 0 || Instant::now() > deadline {
            return Ok(usize::try_from(n).unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Status after an audit action (`sandbox.admit`, `sandbox.activate`, …). `recorded` is the
/// record's `detail.status`, which a warm claim's one `sandbox.activate` carries: it says
/// activation and start at once (`running`, or `provisioning` until its claim call).
fn status_after(action: &str, recorded: Option<&str>) -> Option<SandboxStatus> {
    match action.strip_prefix("sandbox.")? {
        "admit" | "requeue" => Some(SandboxStatus::Queued),
        "activate" => Some(
            recorded
                .and_then(|s| SandboxStatus::from_str(s).ok())
                .unwrap_or(SandboxStatus::Provisioning),
        ),
        "running" => Some(SandboxStatus::Running),
        other => SandboxStatus::from_str(other).ok(),
    }
}

/// Replays the audit log per organization in sequence order and returns the peak number of
/// sandboxes counting as active (provisioning, running, paused, stopped, terminating).
pub async fn replay_active_peaks(pool: &PgPool) -> Result<BTreeMap<String, u64>, LoadError> {
    let rows = sqlx::query(
        "SELECT org_id, resource, action, detail->>'status' AS status FROM audit_events
         WHERE action LIKE 'sandbox.%' AND org_id IS NOT NULL ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| LoadError::db("reading the audit log", e))?;
    let mut status: HashMap<String, SandboxStatus> = HashMap::new();
    let mut active: HashMap<String, u64> = HashMap::new();
    let mut peak: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows {
        let org: String = r
            .try_get("org_id")
            .map_err(|e| LoadError::db("org_id", e))?;
        let res: String = r
            .try_get("resource")
            .map_err(|e| LoadError::db("resource", e))?;
        let action: String = r
            .try_get("action")
            .map_err(|e| LoadError::db("action", e))?;
        let recorded: Option<String> = r
            .try_get("status")
            .map_err(|e| LoadError::db("status", e))?;
        let Some(next) = status_after(&action, recorded.as_deref()) else {
            continue;
        };
        let was = status
            .insert(res, next)
            .is_some_and(SandboxStatus::counts_active);
        let now = next.counts_active();
        let a = active.entry(org.clone()).or_insert(0);
        match (was, now) {
            (false, true) => *a += 1,
            (true, false) => *a = a.saturating_sub(1),
            _ => {}
        }
        let p = peak.entry(org).or_insert(0);
        *p = (*p).max(*a);
    }
    Ok(peak)
}

/// Runs every check. Call after [`settle`].
pub async fn check(
    pool: &PgPool,
    ledger: &Path,
    exp: &Expectations,
    unsettled_rows: usize,
) -> Result<InvariantReport, LoadError> {
    let rows = sqlx::query("SELECT id, status, backend_ref FROM sandboxes")
        .fetch_all(pool)
        .await
        .map_err(|e| LoadError::db("reading sandboxes", e))?;
    let mut db: HashMap<String, (String, Option<String>)> = HashMap::with_capacity(rows.len());
    for r in rows {
        let id: String = r.try_get("id").map_err(|e| LoadError::db("id", e))?;
        let status: String = r
            .try_get("status")
            .map_err(|e| LoadError::db("status", e))?;
        let backend_ref: Option<String> = r
            .try_get("backend_ref")
            .map_err(|e| LoadError::db("backend_ref", e))?;
        db.insert(id, (status, backend_ref));
    }
    let entries = read_ledger(ledger)
        .map_err(|e| LoadError::io(format!("reading {}", ledger.display()), e))?;
    let mut created: HashMap<String, usize> = HashMap::new();
    for e in &entries {
        if e.op == LedgerOp::Create && e.outcome == LedgerOutcome::Created {
            if let Some(s) = &e.sandbox_id {
                *created.entry(s.to_string()).or_default() += 1;
            }
        }
    }
    let live: HashMap<String, String> = live_instances(&entries)
        .into_iter()
        .map(|l| (l.sandbox_id.to_string(), l.backend_ref))
        .collect();
    let deleted: HashSet<&String> = exp.deleted.iter().collect();

    let mut lost = Vec::new();
    let mut unfinished_deletes = Vec::new();
    for id in &exp.accepted {
        let Some((status, backend_ref)) = db.get(id) else {
            lost.push(format!("{id}: not in Postgres"));
            continue;
        };
        if deleted.contains(id) {
            if status != "terminated" {
                unfinished_deletes.push(format!("{id}: {status}"));
            } else if live.contains_key(id) {
                unfinished_deletes.push(format!("{id}: terminated but its backend instance lives"));
            }
        } else if status != "running" {
            lost.push(format!("{id}: {status}, expected running"));
        } else if live.get(id) != backend_ref.as_ref() {
            lost.push(format!(
                "{id}: running on {backend_ref:?} but the backend has {:?}",
                live.get(id)
            ));
        }
    }
    let mut duplicates: Vec<String> = created
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| format!("{id}: {n} instances created"))
        .collect();
    duplicates.sort();
    let mut orphans: Vec<String> = live
        .keys()
        .filter(|id| db.get(*id).is_none_or(|(s, _)| s != "running"))
        .map(|id| format!("{id}: instance alive, row {:?}", db.get(id).map(|r| &r.0)))
        .collect();
    orphans.sort();
    let peaks = replay_active_peaks(pool).await?;
    let quota: Vec<String> = peaks
        .iter()
        .filter(|(_, p)| **p > u64::from(exp.max_active))
        .map(|(org, p)| format!("{org}: {p} active > {}", exp.max_active))
        .collect();

    let mut report = InvariantReport {
        ok: false,
        sandboxes_expected: exp.accepted.len(),
        rows_in_postgres: db.len(),
        ledger_lines: entries.len(),
        unsettled_rows,
        no_sandbox_lost: Check::from(lost),
        no_duplicate_instance: Check::from(duplicates),
        no_orphan_instance: Check::from(orphans),
        quota_never_exceeded: Check::from(quota),
        max_active_seen: peaks,
        max_active_limit: exp.max_active,
        every_delete_finished: Check::from(unfinished_deletes),
    };
    report.ok = report.no_sandbox_lost.ok
        && report.no_duplicate_instance.ok
        && report.no_orphan_instance.ok
        && report.quota_never_exceeded.ok
        && report.every_delete_finished.ok;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_actions_map_to_statuses() {
        assert_eq!(
            status_after("sandbox.admit", None),
            Some(SandboxStatus::Queued)
        );
        assert_eq!(
            status_after("sandbox.activate", None),
            Some(SandboxStatus::Provisioning)
        );
        // A warm claim's activation is also its start.
        assert_eq!(
            status_after("sandbox.activate", Some("running")),
            Some(SandboxStatus::Running)
        );
        assert_eq!(
            status_after("sandbox.running", None),
            Some(SandboxStatus::Running)
        );
        assert_eq!(
            status_after("sandbox.terminated", None),
            Some(SandboxStatus::Terminated)
        );
        assert_eq!(status_after("sandbox.bogus", None), None);
        assert_eq!(status_after("key.create", None), None);
    }
}
