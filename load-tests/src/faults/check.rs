//! The invariant checker of FAULTS.md (I1–I7), from what the fake backend's ledger, Postgres
//! and the audit chain can show, plus a quota probe sampled during the run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::str::FromStr;

use chrono::{DateTime, Utc};
use differently_adapters::fake::{LedgerOp, LedgerOutcome};
use differently_core::SandboxStatus;
use serde::Serialize;
use sqlx::{PgPool, Row};

use crate::faults::topology::Topology;
use crate::faults::workload::{Client, Outcome};
use crate::invariants::replay_active_peaks;
use crate::LoadError;

/// Statuses that count toward `maxActive` (`SandboxStatus::counts_active`).
const ACTIVE: &str = "('provisioning','running','paused','stopped','terminating')";

/// One invariant's verdict.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// `I1` … `I7`.
    pub id: &'static str,
    /// What it checks, and from what.
    pub what: &'static str,
    /// Held.
    pub ok: bool,
    /// How many things were checked.
    pub checked: usize,
    /// Violations (first few).
    pub violations: Vec<String>,
    /// How many violations in all.
    pub violation_count: usize,
}

fn verdict(id: &'static str, what: &'static str, checked: usize, v: Vec<String>) -> Verdict {
    Verdict {
        id,
        what,
        ok: v.is_empty(),
        checked,
        violation_count: v.len(),
        violations: v.into_iter().take(8).collect(),
    }
}

/// Samples the active count per organization every 100 ms while the run lasts (I3).
pub struct QuotaProbe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<(u64, BTreeMap<String, i64>)>>,
}

impl QuotaProbe {
    /// Starts sampling `pool`.
    pub fn start(pool: PgPool) -> QuotaProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new((0u64, BTreeMap::new())));
        let (s2, seen2) = (stop.clone(), seen.clone());
        let task = tokio::spawn(async move {
            let q = format!(
                "SELECT org_id, count(*) AS n FROM sandboxes WHERE status IN {ACTIVE} GROUP BY org_id"
            );
            while !s2.load(Ordering::Relaxed) {
                // A sample that fails (the nemesis killed the session) is just not taken.
                if let Ok(rows) = sqlx::query(&q).fetch_all(&pool).await {
                    let mut g = seen2.lock().unwrap_or_else(|p| p.into_inner());
                    g.0 += 1;
                    for r in rows {
                        let org: String = r.try_get("org_id").unwrap_or_default();
                        let n: i64 = r.try_get("n").unwrap_or_default();
                        let e = g.1.entry(org).or_insert(0);
                        *e = (*e).max(n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        QuotaProbe { stop, task, seen }
    }

    /// Stops sampling; returns (samples taken, peak per org).
    pub async fn stop(self) -> (u64, BTreeMap<String, i64>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        g.clone()
    }
}

/// Waits (bounded) until no row is queued, provisioning or terminating; returns how many
/// still are, and how long it took.
pub async fn quiesce(pool: &PgPool, within: Duration) -> (i64, Duration) {
    let t = std::time::Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sandboxes WHERE status IN ('queued','provisioning','terminating')",
        )
        .fetch_one(pool)
        .await
        .unwrap_or(-1);
        if n == 0 || t.elapsed() > within {
            return (n, t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Status a `sandbox.*` audit action leaves the sandbox in (`None`: not a transition).
/// `recorded` is the record's `detail.status`: a warm claim's one `sandbox.activate` is also
/// its start, and says `running` (or `provisioning` until its claim call).
fn status_after<'a>(action: &'a str, recorded: Option<&'a str>) -> Option<&'a str> {
    match action.strip_prefix("sandbox.")? {
        "admit" | "requeue" => Some("queued"),
        "activate" => Some(recorded.unwrap_or("provisioning")),
        other => SandboxStatus::from_str(other).ok().map(|_| other),
    }
}

/// Runs every check. `probe` is what [`QuotaProbe::stop`] returned.
pub async fn check_all(
    t: &Topology,
    out: &Outcome,
    probe: &(u64, BTreeMap<String, i64>),
    unsettled: i64,
) -> Result<Vec<Verdict>, LoadError> {
    let pool = t.db.pool();
    let limit = i64::from(t.opts.max_active);
    let rows = sqlx::query("SELECT id, org_id, status, backend_ref, status_reason_text FROM (SELECT id, org_id, status, backend_ref, doc->>'statusReason' AS status_reason_text FROM sandboxes) s")
        .fetch_all(&pool)
        .await
        .map_err(|e| LoadError::db("reading sandboxes", e))?;
    let mut db: HashMap<String, (String, String, Option<String>, Option<String>)> = HashMap::new();
    for r in rows {
        let id: String = r.try_get("id").map_err(|e| LoadError::db("id", e))?;
        let org: String = r
            .try_get("org_id")
            .map_err(|e| LoadError::db("org_id", e))?;
        let st: String = r
            .try_get("status")
            .map_err(|e| LoadError::db("status", e))?;
        let b: Option<String> = r
            .try_get("backend_ref")
            .map_err(|e| LoadError::db("backend_ref", e))?;
        let why: Option<String> = r
            .try_get("status_reason_text")
            .map_err(|e| LoadError::db("statusReason", e))?;
        db.insert(id, (org, st, b, why));
    }
    let ledger = t
        .ledger()
        .map_err(|e| LoadError::io("reading the backends' ledgers", e))?;
    // Live instances over every backend; a sandbox with instances on two backends is an
    // orphan on one of them (I5).
    let mut live: HashMap<String, String> = HashMap::new();
    let mut doubly_live = Vec::new();
    for (pool, l) in t
        .live_instances()
        .map_err(|e| LoadError::io("reading the backends' ledgers", e))?
    {
        let id = l.sandbox_id.to_string();
        if let Some(other) = live.insert(id.clone(), l.backend_ref.clone()) {
            doubly_live.push(format!(
                "{id}: live on two backends ({other}, and {} on {pool})",
                l.backend_ref
            ));
        }
    }
    let deleted: HashSet<&String> = out.deleted.iter().collect();
    let maybe: HashSet<&String> = out.maybe_deleted.iter().collect();

    // I1: every admitted sandbox (202, or an unknown resolved by replaying its key) has a row
    // and is where it should be: running on the instance the backend has, or terminated if
    // its delete was accepted; nothing stayed unresolved; replays returned the same id.
    let mut i1 = Vec::new();
    for (id, (tenant, key)) in &out.accepted {
        let Some((_, st, b, why)) = db.get(id) else {
            i1.push(format!("{id} (tenant {tenant}, key {key}): no row"));
            continue;
        };
        let want_gone = deleted.contains(id);
        let either = maybe.contains(id);
        let ok = if want_gone {
            st == "terminated"
        } else if either {
            st == "terminated" || (st == "running" && live.get(id) == b.as_ref())
        } else {
            st == "running" && live.get(id) == b.as_ref()
        };
        if !ok {
            i1.push(format!(
                "{id}: {st} (reason {why:?}), backend {:?}, row ref {b:?}, delete accepted {want_gone}",
                live.get(id)
            ));
        }
    }
    for (tenant, key) in &out.unresolved {
        i1.push(format!("create {key} (tenant {tenant}) never resolved"));
    }
    i1.extend(out.replay_mismatches.iter().cloned());

    // I2: at most one backend instance per sandbox per placement attempt: `created` lines
    // ≤ 1 + the sandbox's requeues (a requeue after a provisioning timeout starts a new
    // attempt, and a create that hung through it may still land; I5 checks it was removed).
    let requeues: HashMap<String, usize> = sqlx::query(
        "SELECT resource, count(*) AS n FROM audit_events WHERE action = 'sandbox.requeue'
         GROUP BY resource",
    )
    .fetch_all(&pool)
    .await
    .map_err(|e| LoadError::db("counting requeues", e))?
    .into_iter()
    .filter_map(|r| {
        let id: String = r.try_get("resource").ok()?;
        let n: i64 = r.try_get("n").ok()?;
        Some((id, usize::try_from(n).unwrap_or(0)))
    })
    .collect();
    let mut created: HashMap<String, usize> = HashMap::new();
    for e in &ledger {
        if e.op == LedgerOp::Create && e.outcome == LedgerOutcome::Created {
            if let Some(s) = &e.sandbox_id {
                *created.entry(s.to_string()).or_default() += 1;
            }
        }
    }
    let i2: Vec<String> = created
        .iter()
        .filter(|(id, n)| **n > 1 + requeues.get(*id).copied().unwrap_or(0))
        .map(|(id, n)| {
            format!(
                "{id}: {n} backend instances created, {} requeues",
                requeues.get(id).copied().unwrap_or(0)
            )
        })
        .collect();

    // I3: the quota never exceeded — sampled during the run, replayed from the audit log,
    // and as the backend's own high-water mark of live instances per organization.
    let mut i3 = Vec::new();
    for (org, n) in &probe.1 {
        if *n > limit {
            i3.push(format!("probe: {org} had {n} active > {limit}"));
        }
    }
    let peaks = replay_active_peaks(&pool).await?;
    for (org, p) in &peaks {
        if i64::try_from(*p).unwrap_or(i64::MAX) > limit {
            i3.push(format!(
                "audit replay: {org} peaked at {p} active > {limit}"
            ));
        }
    }
    let org_of: HashMap<&String, &String> = db.iter().map(|(id, r)| (id, &r.0)).collect();
    let mut cur: HashMap<String, i64> = HashMap::new();
    let mut high: BTreeMap<String, i64> = BTreeMap::new();
    for e in &ledger {
        let Some(s) = e.sandbox_id.as_ref().map(|s| s.to_string()) else {
            continue;
        };
        let Some(org) = org_of.get(&s) else { continue };
        let d = match (e.op, e.outcome) {
            (LedgerOp::Create, LedgerOutcome::Created) => 1,
            (LedgerOp::Delete, LedgerOutcome::Deleted) => -1,
            _ => 0,
        };
        if d != 0 {
            let c = cur.entry((*org).clone()).or_insert(0);
            *c += d;
            let h = high.entry((*org).clone()).or_insert(0);
            *h = (*h).max(*c);
        }
    }
    for (org, h) in &high {
        if *h > limit {
            i3.push(format!("backend: {org} had {h} live instances > {limit}"));
        }
    }

    // I4: the audit chains verify (live, through the API, and offline from an export with
    // the one shared key), and every sandbox's last audited status is its row's status.
    let mut i4 = Vec::new();
    let client = Client::new(&t.url(), Duration::from_secs(60))?;
    let (s, body) = client.get(&t.key, "/v1/admin/audit/verify").await?;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let records = report["records"].as_u64().unwrap_or(0);
    if s != 200 || report["ok"] != true {
        i4.push(format!(
            "GET /v1/admin/audit/verify: HTTP {s}: {}",
            truncate(&body)
        ));
    }
    let (s, export) = client.get(&t.key, "/v1/admin/audit/export").await?;
    if s != 200 {
        i4.push(format!("GET /v1/admin/audit/export: HTTP {s}"));
    } else {
        let file = t.dir.path().join("audit-export.jsonl");
        std::fs::write(&file, &export).map_err(|e| LoadError::io("writing the export", e))?;
        let o = std::process::Command::new(&t.opts.binary)
            .args(["audit", "verify"])
            .arg(&file)
            .env("DIFFERENTLY_AUDIT_KEY", &t.audit_key)
            .output()
            .map_err(|e| LoadError::io("running differently audit verify", e))?;
        if !o.status.success() {
            i4.push(format!(
                "differently audit verify: {}",
                truncate(&String::from_utf8_lossy(&o.stderr))
            ));
        }
    }
    let audit = sqlx::query(
        "SELECT resource, action, at, detail->>'status' AS status FROM audit_events
         WHERE action LIKE 'sandbox.%' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .map_err(|e| LoadError::db("reading the audit log", e))?;
    let mut last: HashMap<String, String> = HashMap::new();
    let mut trail: HashMap<String, Vec<(String, DateTime<Utc>)>> = HashMap::new();
    for r in audit {
        let res: String = r
            .try_get("resource")
            .map_err(|e| LoadError::db("resource", e))?;
        let action: String = r
            .try_get("action")
            .map_err(|e| LoadError::db("action", e))?;
        let at: DateTime<Utc> = r.try_get("at").map_err(|e| LoadError::db("at", e))?;
        let recorded: Option<String> = r
            .try_get("status")
            .map_err(|e| LoadError::db("status", e))?;
        if let Some(st) = status_after(&action, recorded.as_deref()) {
            last.insert(res.clone(), st.to_owned());
            trail.entry(res).or_default().push((action, at));
        }
    }
    for (id, (_, st, _, _)) in &db {
        match last.get(id) {
            Some(a) if a == st => {}
            other => i4.push(format!("{id}: row is {st}, last audited status {other:?}")),
        }
    }

    // I5: deletes finished, and the backend's live set is exactly the rows holding an
    // instance (running / paused / stopped): no orphan, no leak.
    let mut i5 = doubly_live;
    for id in &out.deleted {
        match db.get(id) {
            Some((_, st, _, _)) if st == "terminated" => {}
            other => i5.push(format!(
                "{id}: delete accepted, row {:?}",
                other.map(|r| &r.1)
            )),
        }
        if live.contains_key(id) {
            i5.push(format!(
                "{id}: delete accepted, backend instance still live"
            ));
        }
    }
    for (id, r) in &live {
        match db.get(id) {
            Some((_, st, b, _))
                if matches!(st.as_str(), "running" | "paused" | "stopped")
                    && b.as_ref() == Some(r) => {}
            other => i5.push(format!(
                "{id}: backend instance {r} alive, row {:?}",
                other.map(|x| (&x.1, &x.2))
            )),
        }
    }
    for (id, (_, st, _, _)) in &db {
        if matches!(st.as_str(), "running" | "paused" | "stopped") && !live.contains_key(id) {
            i5.push(format!("{id}: row {st} but no backend instance"));
        }
    }

    // I6: liveness after heal — nothing left queued, provisioning or terminating after the
    // quiesce bound.
    let mut i6 = Vec::new();
    if unsettled != 0 {
        for (id, (_, st, _, why)) in &db {
            if matches!(st.as_str(), "queued" | "provisioning" | "terminating") {
                i6.push(format!("{id}: still {st} after quiesce ({why:?})"));
            }
        }
        if i6.is_empty() {
            i6.push(format!("{unsettled} rows unsettled (count failed)"));
        }
    }

    // I7 (what the ledger and audit can show of fencing): no sandbox activated twice without
    // a requeue in between (a zombie leader's second activation), no transition recorded
    // after `terminated`, and no backend instance created for a sandbox after it was
    // recorded terminated. The fake does not see fencing tokens, so a stale mutation that
    // the store refused cannot be told from one never sent.
    let mut i7 = Vec::new();
    let mut terminated_at: HashMap<&String, DateTime<Utc>> = HashMap::new();
    for (id, tr) in &trail {
        let mut provisioning = false;
        let mut ended = false;
        for (action, at) in tr {
            if ended {
                i7.push(format!("{id}: {action} recorded after terminated"));
            }
            match action.as_str() {
                "sandbox.activate" if provisioning => {
                    i7.push(format!("{id}: activated twice without a requeue"))
                }
                "sandbox.activate" => provisioning = true,
                "sandbox.requeue" | "sandbox.running" | "sandbox.failed" => provisioning = false,
                "sandbox.terminated" => {
                    ended = true;
                    terminated_at.insert(id, *at);
                }
                _ => {}
            }
        }
    }
    for e in &ledger {
        if let (LedgerOp::Create, LedgerOutcome::Created, Some(s)) =
            (e.op, e.outcome, &e.sandbox_id)
        {
            let s = s.to_string();
            if let Some(at) = terminated_at.get(&s) {
                if e.at > *at + chrono::Duration::milliseconds(50) && live.contains_key(&s) {
                    i7.push(format!(
                        "{s}: instance created after terminated and left alive"
                    ));
                }
            }
        }
    }

    Ok(vec![
        verdict(
            "I1",
            "no admitted sandbox lost (rows + ledger + replayed keys)",
            out.accepted.len() + out.unresolved.len(),
            i1,
        ),
        verdict(
            "I2",
            "no duplicate backend instance: ledger created lines <= 1 + requeues",
            created.len(),
            i2,
        ),
        verdict(
            "I3",
            "quota never exceeded (100 ms probe, audit replay, backend high-water)",
            usize::try_from(probe.0).unwrap_or(0) + peaks.len() + high.len(),
            i3,
        ),
        verdict(
            "I4",
            "audit chain verifies (API + offline export, shared key); last audit = row",
            usize::try_from(records).unwrap_or(0),
            i4,
        ),
        verdict(
            "I5",
            "deletes finished; backend live set = rows holding an instance",
            out.deleted.len() + live.len(),
            i5,
        ),
        verdict(
            "I6",
            "nothing queued/provisioning/terminating after heal + quiesce",
            db.len(),
            i6,
        ),
        verdict(
            "I7",
            "no double activation, nothing after terminated (audit + ledger)",
            trail.len(),
            i7,
        ),
    ])
}

fn truncate(s: &str) -> String {
    s.chars().take(400).collect()
}
