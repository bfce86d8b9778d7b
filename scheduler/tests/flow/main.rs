//! Placement, workers and sweeps together in one process, on the memory store, the memory
//! bus and the fake adapter: the at-least-once paths (a lost admission, a repeated create,
//! a backend that fails) driven by what the bus and the store say, never by fixed sleeps.
//! The multi-process end-to-end suite (`cli/tests/e2e`) keeps the crash and cross-process
//! cases.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_adapters::fake::{created_count, read_ledger};
use differently_adapters::pools::PoolSet;
use differently_bus::memory::MemoryBus;
use differently_bus::{Announcer, Bus, BusExt};
use differently_bus_schema::{Naming, StatusChanged, WorkOp};
use differently_core::faults::Faults;
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_core::tenancy::{Org, OrgStatus, Project};
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec};
use differently_core::{SandboxStatus, SandboxStatus::*};
use differently_scheduler::{Scheduler, SchedulerConfig};
use differently_store::memory::MemoryStore;
use differently_store::{Actor, Admission, Admitted, Store};
use differently_workers::{AdapterSource, WorkerConfig, WorkerGroup};
use futures::StreamExt;
use tokio::sync::watch;

/// Every wait is bounded by this: a condition that does not come fails the test.
const WAIT: Duration = Duration::from_secs(20);

/// One control plane in this process, with a fake pool `fake` whose ledger is a file.
struct Plane {
    store: Arc<dyn Store>,
    announcer: Announcer,
    org: OrgId,
    project: ProjectId,
    ledger: PathBuf,
    _dir: tempfile::TempDir,
    stop: watch::Sender<bool>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Starts the scheduler and one worker group for pool `fake` with `settings` (merged over a
/// ledger file) and `workers` tunables.
async fn plane(settings: serde_json::Value, workers: WorkerConfig) -> Plane {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = dir.path().join("ledger.jsonl");
    let mut all = serde_json::json!({ "ledger": ledger });
    if let (Some(all), Some(extra)) = (all.as_object_mut(), settings.as_object()) {
        all.extend(extra.clone());
    }
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let bus: Arc<dyn Bus> = Arc::new(MemoryBus::new());
    let naming = Naming::default();
    bus.ensure_streams(&naming).await.expect("streams");
    let announcer = Announcer::new(bus, naming);
    let now = Utc::now();
    let record = PoolRecord {
        name: "fake".into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent: None,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: None,
        settings: all,
        source: PoolSource::Config,
        created_at: now,
        updated_at: now,
    };
    let system = Actor::System("test");
    store.upsert_pool(&record, &system).await.expect("pool");
    let (pools, bad) = PoolSet::from_records(vec![record]);
    assert!(bad.is_empty(), "the fake pool builds");
    let pool = pools.get("fake").expect("pool fake");
    let health = pool.probe("test").await;
    pools.apply_local(&[health]);

    let org = Org {
        id: OrgId::new(),
        name: "acme".into(),
        status: OrgStatus::Active,
        created_at: now,
    };
    let project = Project {
        id: ProjectId::new(),
        org_id: org.id.clone(),
        name: "web".into(),
        created_at: now,
    };
    store.create_org(&org, &system).await.expect("org");
    store
        .create_project(&project, &system)
        .await
        .expect("project");

    let (stop, rx) = watch::channel(false);
    let scheduler = Scheduler {
        store: store.clone(),
        announcer: announcer.clone(),
        pools: pools.clone(),
        config: SchedulerConfig {
            tick: Duration::from_millis(50),
            repair_interval: Duration::from_millis(200),
            waiting_backoff: Duration::from_millis(200),
            ..SchedulerConfig::default()
        },
    };
    tokio::spawn(scheduler.run(rx.clone()));
    let group = WorkerGroup {
        pool: "fake".into(),
        adapter: AdapterSource::live(pools.clone(), pool.adapter.clone()),
        store: store.clone(),
        announcer: announcer.clone(),
        installation: store.installation_id().await.expect("installation"),
        config: workers,
        faults: Faults::default(),
    };
    tokio::spawn(group.run(rx));
    Plane {
        store,
        announcer,
        org: org.id,
        project: project.id,
        ledger,
        _dir: dir,
        stop,
    }
}

impl Plane {
    /// Admits a sandbox the way the API does, without announcing it.
    async fn admit_quietly(&self, req: serde_json::Value) -> Sandbox {
        let req: CreateSandboxRequest = serde_json::from_value(req).expect("request");
        let spec = SandboxSpec::build(&req).expect("spec");
        let row = Sandbox::queued(
            self.org.clone(),
            self.project.clone(),
            spec,
            None,
            Utc::now(),
        );
        let admitted = self
            .store
            .admit(Admission {
                sandbox: row,
                request_hash: "h".into(),
                defaults: Default::default(),
                actor: Actor::Key("key_test".into()),
                request_id: None,
                direct: None,
            })
            .await
            .expect("admit");
        match admitted {
            Admitted::New(s) | Admitted::Replayed(s) => s,
        }
    }

    /// Admits and announces, as the API does.
    async fn admit(&self, req: serde_json::Value) -> Sandbox {
        let s = self.admit_quietly(req).await;
        self.announcer.admitted(&s, "").await.expect("announce");
        s
    }

    /// Status events of `id` from the start of the stream.
    async fn statuses(&self, id: &SandboxId) -> futures::stream::BoxStream<'static, SandboxStatus> {
        let naming = self.announcer.naming();
        let filter = naming.event_filter(&self.org, Some(&self.project), Some(id));
        self.announcer
            .bus()
            .events_typed::<StatusChanged>(&naming.events_stream().name, &filter, Some(0))
            .await
            .expect("events")
            .filter_map(|e| async move { e.ok().map(|e| e.env.body.status) })
            .boxed()
    }

    /// Waits for `id` to reach `want` (by its events), then returns the stored row.
    async fn reaches(&self, id: &SandboxId, want: SandboxStatus) -> Sandbox {
        let mut seen = Vec::new();
        let mut events = self.statuses(id).await;
        let found = tokio::time::timeout(WAIT, async {
            while let Some(s) = events.next().await {
                seen.push(s);
                if s == want {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(
            matches!(found, Ok(true)),
            "{id} never became {want}; statuses seen: {seen:?}"
        );
        self.row(id).await
    }

    async fn row(&self, id: &SandboxId) -> Sandbox {
        self.store
            .get_sandbox(id)
            .await
            .expect("read")
            .expect("row exists")
    }

    fn creates(&self, id: &SandboxId) -> usize {
        created_count(&read_ledger(&self.ledger).unwrap_or_default(), id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_sandbox_is_placed_and_created_once() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({})).await;
    let row = p.reaches(&s.id, Running).await;
    assert_eq!(row.pool.as_deref(), Some("fake"));
    assert!(row.backend_ref.is_some(), "{row:?}");
    assert_eq!(p.creates(&s.id), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_whose_message_was_lost_is_placed_from_the_store() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let s = p.admit_quietly(serde_json::json!({})).await;
    let row = p.reaches(&s.id, Running).await;
    assert_eq!(p.creates(&s.id), 1, "{row:?}");
}

/// At-least-once delivery: a create delivered again after the sandbox runs (a repair
/// re-send, a redelivery) creates nothing more. One worker at a time, so the delete sent
/// after the duplicate is handled after it: once the sandbox is terminated, the duplicate
/// has been handled too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_delivered_twice_makes_one_instance() {
    let workers = WorkerConfig {
        concurrency: 1,
        ..WorkerConfig::default()
    };
    let p = plane(serde_json::json!({}), workers).await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    p.announcer
        .work(&running, WorkOp::Create, ":again")
        .await
        .expect("duplicate create");
    let terminating = p
        .store
        .transition(
            differently_store::Transition {
                id: s.id.clone(),
                from: vec![Running],
                to: Terminating,
                reason: Some("deleted".into()),
                actor: Actor::Key("key_test".into()),
            },
            Utc::now(),
        )
        .await
        .expect("terminating");
    p.announcer
        .work(&terminating, WorkOp::Delete, "")
        .await
        .expect("delete");
    p.reaches(&s.id, Terminated).await;
    assert_eq!(p.creates(&s.id), 1, "the duplicate create made nothing");
}

/// A backend whose first creates fail transiently: the worker retries (redelivery) and the
/// sandbox runs; nothing is created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_create_failures_are_retried_to_one_instance() {
    let p = plane(
        serde_json::json!({"failCreates": 2}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    p.reaches(&s.id, Running).await;
    assert_eq!(p.creates(&s.id), 1);
}

/// A backend that is down: every create fails, the activation is given back to placement
/// after `max_deliveries`, and after `max_attempts` the sandbox fails with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_whose_backend_never_answers_fails_with_a_reason() {
    let workers = WorkerConfig {
        max_deliveries: 1,
        max_attempts: 2,
        ..WorkerConfig::default()
    };
    let p = plane(serde_json::json!({"failCreates": 1000}), workers).await;
    let s = p.admit(serde_json::json!({})).await;
    let row = p.reaches(&s.id, Failed).await;
    assert!(row.status_reason.is_some(), "{row:?}");
    assert_eq!(p.creates(&s.id), 0);
    assert_eq!(row.attempts, 2, "{row:?}");
}

/// The TTL sweep ends a sandbox whose time is up and its instance is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_sandbox_is_terminated_by_the_ttl_sweep() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({"ttlSeconds": 1})).await;
    p.reaches(&s.id, Running).await;
    let ended = p.reaches(&s.id, Terminated).await;
    assert!(ended.ended_at.is_some(), "{ended:?}");
    let entries = read_ledger(&p.ledger).unwrap_or_default();
    assert!(
        entries.iter().any(|e| e.sandbox_id.as_ref() == Some(&s.id)
            && e.op == differently_adapters::fake::LedgerOp::Delete),
        "the instance was deleted: {entries:?}"
    );
}

/// A sandbox the policy would place but its org's quota keeps waiting: its explanation says
/// waiting, behind the org's wall, with the row's own reason — never `placed` on a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_waiting_on_its_org_quota_is_explained_as_waiting() {
    let p = plane(serde_json::json!({}), WorkerConfig::default()).await;
    let quota = differently_core::tenancy::Quota {
        max_cpu: Some(2),
        ..Default::default()
    };
    p.store
        .put_quota(
            &differently_store::QuotaScope::Org(p.org.clone()),
            &quota,
            &Actor::System("test"),
        )
        .await
        .expect("quota");
    let first = p
        .admit(serde_json::json!({ "resources": { "cpu": 2 } }))
        .await;
    p.reaches(&first.id, Running).await;
    let second = p
        .admit(serde_json::json!({ "resources": { "cpu": 1 } }))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let (row, doc) = loop {
        let row = p.row(&second.id).await;
        let doc = p.store.get_placement(&second.id).await.expect("placement");
        if let (Some(reason), Some(doc)) = (&row.status_reason, doc) {
            if reason.starts_with("waiting: org cpu quota") {
                break (row, doc);
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never waited on the org quota: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(row.status, Queued, "{row:?}");
    assert_eq!(doc["decision"], "waiting", "{doc}");
    assert_eq!(doc["wall"], "org", "{doc}");
    assert_eq!(
        doc["reason"].as_str(),
        row.status_reason.as_deref(),
        "{doc}"
    );
    assert!(doc.get("pool").is_none(), "{doc}");
}
