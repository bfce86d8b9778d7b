//! What the warm crash tests share: warm classes and counts read from Postgres, a sampler of
//! a class's `creating + ready`, an OpenSandbox pool on the adapters' fake server (a backend
//! whose claim needs a call), and the fault suite's invariants (FAULTS.md I4-I7 and the
//! quota counters) extended to warm instances: the backend's live set is exactly the running
//! rows plus the ready warm rows.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use differently_adapters::fake::live_instances;
use differently_core::SandboxId;
use differently_store::prelude::*;
use differently_store::warm::{WarmInstance, WarmState};
use differently_store::UsageStore;
use reqwest::Method;
use serde_json::{json, Value};
use sqlx::Row;

use crate::fake_opensandbox::{FakeRuntime, FakeServer, Variant};
use crate::harness::Cluster;

/// Lines added to the harness's `fake` pool settings: it offers warm instances (no claim
/// call, `claim_call` is false for the fake).
pub const WARM_CAPS: &str = r#"capabilities = ["exec", "warm"]"#;

/// The OpenSandbox pool's name and the key its fake server accepts.
pub const OSB: &str = "osb";
const OSB_KEY: &str = "osb_e2e_warm_crash_5e4d3c2b1a";

/// `PUT /v1/admin/pools/{pool}/warm` with `classes`, asserting 200.
pub async fn set_classes(c: &Cluster, pool: &str, classes: Value) {
    let (s, b) = c
        .call(
            &c.key,
            Method::PUT,
            &format!("/v1/admin/pools/{pool}/warm"),
            Some(json!({ "classes": classes })),
        )
        .await;
    assert_eq!(s, 200, "set the warm classes of {pool}: {b}");
}

/// One class's rows per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub creating: u32,
    pub ready: u32,
    pub retiring: u32,
}

/// The class's counts as stored now.
pub async fn counts(c: &Cluster, pool: &str, class: &str) -> Counts {
    let all =
        c.db.store()
            .warm_counts(pool)
            .await
            .expect("read warm counts");
    all.into_iter()
        .find(|n| n.class == class)
        .map(|n| Counts {
            creating: n.creating,
            ready: n.ready,
            retiring: n.retiring,
        })
        .unwrap_or_default()
}

/// Waits up to `within` until the class's counts satisfy `ok`; fails with them and the logs.
pub async fn wait_counts(
    c: &Cluster,
    pool: &str,
    class: &str,
    within: Duration,
    what: &str,
    ok: impl Fn(Counts) -> bool,
) -> Counts {
    let deadline = Instant::now() + within;
    loop {
        let n = counts(c, pool, class).await;
        if ok(n) {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "{pool}/{class} never {what} within {within:?}: {n:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pool's warm rows as stored now.
pub async fn warm_rows(c: &Cluster, pool: &str) -> Vec<WarmInstance> {
    c.db.store()
        .warm_instances(pool)
        .await
        .expect("read warm instances")
}

/// Ids of the pool's ready warm instances.
pub async fn ready_ids(c: &Cluster, pool: &str) -> Vec<SandboxId> {
    warm_rows(c, pool)
        .await
        .into_iter()
        .filter(|r| r.state == WarmState::Ready)
        .map(|r| r.id)
        .collect()
}

/// Samples a class's `creating + ready` every 20 ms (from its own connection) and keeps the
/// highest seen, to bound the refill's overshoot over `size`.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU32>,
    samples: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub fn start(c: &Cluster, pool: &str, class: &str) -> Sampler {
        let (stop, max, samples) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU32::new(0)),
            Arc::new(AtomicU32::new(0)),
        );
        let store = c.db.store();
        let (pool, class) = (pool.to_owned(), class.to_owned());
        let (s2, m2, n2) = (stop.clone(), max.clone(), samples.clone());
        let task = tokio::spawn(async move {
            while !s2.load(Ordering::Relaxed) {
                if let Ok(all) = store.warm_counts(&pool).await {
                    if let Some(n) = all.iter().find(|n| n.class == class) {
                        m2.fetch_max(n.creating + n.ready, Ordering::Relaxed);
                    }
                    n2.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Sampler {
            stop,
            max,
            samples,
            task,
        }
    }

    /// Stops sampling: (highest `creating + ready` seen, samples taken).
    pub async fn stop(self) -> (u32, u32) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        (
            self.max.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }
}

/// The fake backend's live instances by sandbox id (the id an instance is tagged with).
pub fn fake_live(c: &Cluster) -> BTreeMap<String, String> {
    live_instances(&c.ledger())
        .into_iter()
        .map(|l| (l.sandbox_id.to_string(), l.backend_ref))
        .collect()
}

/// The fake OpenSandbox server's sandboxes by the sandbox id in their metadata.
pub fn osb_live(osb: &FakeServer) -> BTreeMap<String, String> {
    osb.sandboxes()
        .into_iter()
        .map(|s| {
            let sid = s
                .metadata
                .get("differently-sandbox-id")
                .cloned()
                .unwrap_or_else(|| format!("untagged:{}", s.id));
            (sid, s.id)
        })
        .collect()
}

/// Starts the adapters' fake OpenSandbox server (the real 1.1.1 server's behaviour), with its
/// creates and deletes written as ledger lines to `osb-ledger.jsonl` in the cluster's dir.
pub async fn start_osb(c: &Cluster) -> FakeServer {
    let osb = FakeServer::start(Variant::Real, FakeRuntime::Docker, OSB_KEY).await;
    let ledger = std::fs::File::create(c.dir.path().join("osb-ledger.jsonl")).unwrap();
    osb.set_ledger(ledger);
    osb
}

/// Registers pool [`OSB`] (the real `opensandbox` adapter on `osb`) through the admin API,
/// denies the harness's `fake` pool, and waits until the pool is healthy and every API
/// process in `apis` has taken it up (so creates are placed on it).
pub async fn osb_pool(c: &Cluster, osb: &FakeServer, apis: &[&str]) {
    let key_path = c.dir.path().join("opensandbox.key");
    std::fs::write(&key_path, OSB_KEY).unwrap();
    let (s, p) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({
                "name": OSB, "kind": "opensandbox", "trust": "private",
                "costPerCpuHour": 1.0,
                "settings": {
                    "apiURL": osb.api_url(),
                    "trust": "private",
                    "apiKeyFile": key_path,
                    "timeouts": {"requestSeconds": 5, "pollMillis": 20},
                },
            })),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    c.deny_fake_pool().await;
    c.wait_pool_health(OSB, true, Duration::from_secs(60)).await;
    for api in apis {
        let seen = crate::harness::eventually(Duration::from_secs(30), || {
            c.pool_changes(api, OSB, Some(true)) >= 1
        })
        .await;
        assert!(seen, "{api} never took up {OSB} healthy\n{}", c.logs());
    }
}

/// `POST`s to the fake OpenSandbox server's renew route for backend instance `backend_ref`.
pub fn renewals_of(osb: &FakeServer, backend_ref: &str) -> usize {
    let tail = format!("/sandboxes/{backend_ref}/renew-expiration");
    osb.record()
        .requests
        .iter()
        .filter(|r| r.starts_with("POST ") && r.ends_with(&tail))
        .count()
}

/// Waits up to `within` until the backend's live set (`live`) is exactly the running rows
/// and the ready warm rows of `pools` (ids and backend refs), failing with the difference.
pub async fn settle_backend(
    c: &Cluster,
    pools: &[&str],
    within: Duration,
    live: impl Fn() -> BTreeMap<String, String>,
) {
    let deadline = Instant::now() + within;
    loop {
        let problems = backend_problems(c, pools, &live()).await;
        if problems.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the backend's live set never matched the rows within {within:?}: {problems:#?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// I5 with warm instances: every live instance is a running row's (same backend ref) or a
/// ready warm row's; every running row and every ready warm row has its instance.
async fn backend_problems(
    c: &Cluster,
    pools: &[&str],
    live: &BTreeMap<String, String>,
) -> Vec<String> {
    let rows = rows(c).await;
    let mut warm: HashMap<String, WarmInstance> = HashMap::new();
    for p in pools {
        for r in warm_rows(c, p).await {
            warm.insert(r.id.to_string(), r);
        }
    }
    let mut out = Vec::new();
    for (id, backend_ref) in live {
        let as_row = rows
            .get(id)
            .is_some_and(|(st, b)| st == "running" && b.as_deref() == Some(backend_ref.as_str()));
        let as_warm = warm.get(id).is_some_and(|w| {
            w.state == WarmState::Ready && w.backend_ref.as_deref() == Some(backend_ref.as_str())
        });
        if !(as_row || as_warm) {
            out.push(format!(
                "{id}: instance {backend_ref} alive; row {:?}, warm {:?}",
                rows.get(id),
                warm.get(id).map(|w| (w.state, w.backend_ref.clone()))
            ));
        }
    }
    for (id, (st, _)) in &rows {
        if st == "running" && !live.contains_key(id) {
            out.push(format!("{id}: running without an instance"));
        }
    }
    for (id, w) in &warm {
        if w.state != WarmState::Ready || !live.contains_key(id) {
            out.push(format!(
                "{id}: warm row {:?} without a live instance or not settled",
                w.state
            ));
        }
    }
    out
}

/// Every sandbox row: id → (status, backend_ref).
pub async fn rows(c: &Cluster) -> BTreeMap<String, (String, Option<String>)> {
    let pool = sqlx::PgPool::connect(c.db.url()).await.expect("connect");
    let rows = sqlx::query("SELECT id, status, backend_ref FROM sandboxes")
        .fetch_all(&pool)
        .await
        .expect("read sandboxes");
    pool.close().await;
    rows.into_iter()
        .map(|r| {
            (
                r.get::<String, _>("id"),
                (r.get::<String, _>("status"), r.get("backend_ref")),
            )
        })
        .collect()
}

/// Status a `sandbox.*` audit record leaves the sandbox in, as the fault suite's checker
/// reads it, except for a warm claim: its one `sandbox.activate` record (`cause: "warm"`)
/// says both activation and start, and its `status` is the row's (`running`, or
/// `provisioning` until a claim call).
fn status_after(action: &str, warm_status: Option<&str>) -> Option<String> {
    match action.strip_prefix("sandbox.")? {
        "admit" | "requeue" => Some("queued".into()),
        "activate" => Some(warm_status.unwrap_or("provisioning").to_owned()),
        other => other
            .parse::<differently_core::SandboxStatus>()
            .ok()
            .map(|_| other.to_owned()),
    }
}

/// One audited change of a sandbox.
#[derive(Debug, Clone)]
pub struct Audited {
    pub action: String,
    /// Status the sandbox is in after it.
    pub status: String,
    /// A warm claim (`cause: "warm"`).
    pub warm: bool,
}

/// The fault suite's invariants that hold after any crash once things settled: the quota
/// counters equal the rows (a recount corrects nothing), the audit chains verify and each
/// sandbox's last audited status is its row's (I4), nothing is left queued, provisioning or
/// terminating (I6), and no sandbox was activated twice without a requeue between nor
/// changed after `terminated` (I7). Returns each sandbox's audited changes, for more checks.
pub async fn fault_invariants(c: &Cluster) -> BTreeMap<String, Vec<Audited>> {
    let drift = c.db.store().reconcile_usage().await.expect("recount usage");
    assert!(
        drift.is_empty(),
        "quota counters drifted from the rows: {drift:?}"
    );
    let (s, report) = c
        .call(&c.key, Method::GET, "/v1/admin/audit/verify", None)
        .await;
    assert!(
        s == 200 && report["ok"] == true,
        "the audit chains do not verify: {s} {report}"
    );
    let rows = rows(c).await;
    let pool = sqlx::PgPool::connect(c.db.url()).await.expect("connect");
    let audit = sqlx::query(
        "SELECT resource, action, detail->>'cause' AS cause, detail->>'status' AS status
         FROM audit_events WHERE action LIKE 'sandbox.%' ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .expect("read the audit log");
    pool.close().await;
    let mut trail: BTreeMap<String, Vec<Audited>> = BTreeMap::new();
    for r in audit {
        let (res, action): (String, String) = (r.get("resource"), r.get("action"));
        let cause: Option<String> = r.get("cause");
        let warm = action == "sandbox.activate" && cause.as_deref() == Some("warm");
        let status: Option<String> = r.get("status");
        let claimed = if warm { status.as_deref() } else { None };
        if let Some(status) = status_after(&action, claimed) {
            trail.entry(res).or_default().push(Audited {
                action,
                status,
                warm,
            });
        }
    }
    let mut bad = Vec::new();
    for (id, (st, _)) in &rows {
        if matches!(st.as_str(), "queued" | "provisioning" | "terminating") {
            bad.push(format!("{id}: still {st}"));
        }
        let last = trail.get(id).and_then(|t| t.last()).map(|a| &a.status);
        if last != Some(st) {
            bad.push(format!("{id}: row {st}, last audited {last:?}"));
        }
    }
    for (id, changes) in &trail {
        let (mut provisioning, mut ended) = (false, false);
        for a in changes {
            if ended {
                bad.push(format!("{id}: {} after terminated", a.action));
            }
            match a.action.as_str() {
                "sandbox.activate" if provisioning => {
                    bad.push(format!("{id}: activated twice without a requeue"))
                }
                "sandbox.activate" => provisioning = a.status == "provisioning",
                "sandbox.requeue" | "sandbox.running" | "sandbox.failed" => provisioning = false,
                "sandbox.terminated" => ended = true,
                _ => {}
            }
        }
    }
    assert!(bad.is_empty(), "fault-suite invariants broken: {bad:#?}");
    trail
}

/// How many of `changes` are `action`.
pub fn count(changes: &[Audited], action: &str) -> usize {
    changes.iter().filter(|a| a.action == action).count()
}
