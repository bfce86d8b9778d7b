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
use differently_bus::testing::NatsServer;
use differently_bus::{Announcer, Bus, BusExt};
use differently_bus_schema::{Naming, StatusChanged, WorkOp};
use differently_core::faults::Faults;
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_core::tenancy::{Org, OrgStatus, Project};
use differently_core::{CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec};
use differently_core::{SandboxStatus, SandboxStatus::*};
use differently_scheduler::{Scheduler, SchedulerConfig};
use differently_store::memory::MemoryStore;
use differently_store::testing::TestDb;
use differently_store::{Actor, Admission, Admitted, Store};
use differently_workers::{AdapterSource, WorkerConfig, WorkerGroup};
use futures::StreamExt;
use tokio::sync::watch;

mod operations;
mod placement;
mod undelivered;
mod waiting_reason;

/// Every wait is bounded by this: a condition that does not come fails the test.
const WAIT: Duration = Duration::from_secs(20);

/// One control plane in this process, with a fake pool `fake` whose ledger is a file (and
/// possibly more fake pools, see [`plane_on`]).
struct Plane {
    store: Arc<dyn Store>,
    announcer: Announcer,
    pools: PoolSet,
    org: OrgId,
    project: ProjectId,
    ledger: PathBuf,
    _dir: tempfile::TempDir,
    _real: Option<(TestDb, NatsServer)>,
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
    plane_on(Parts::Memory, &[("fake", settings)], workers).await
}

/// What a [`plane_tuned`] changes from the defaults of [`plane_on`].
struct Tuning {
    /// Concurrency cap of every fake pool.
    max_concurrent: Option<u32>,
    /// The scheduler's back-off of a waiting candidate.
    waiting_backoff: Duration,
    /// How often the leader repairs (re-sends creates whose work may have been lost).
    repair_interval: Duration,
    /// How often placement tries its queue without being woken.
    tick: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            max_concurrent: None,
            waiting_backoff: Duration::from_millis(200),
            repair_interval: Duration::from_millis(200),
            tick: Duration::from_millis(50),
        }
    }
}

/// What the store and the bus of a [`plane_on`] are.
#[derive(Clone, Copy, PartialEq)]
enum Parts {
    /// The memory store and bus.
    Memory,
    /// A fresh Postgres database and a nats-server of its own.
    Real,
}

/// Starts the scheduler and one worker group per fake pool `(name, settings)` (the first
/// pool's ledger is [`Plane::ledger`]; each pool has its own).
async fn plane_on(
    parts: Parts,
    fakes: &[(&str, serde_json::Value)],
    workers: WorkerConfig,
) -> Plane {
    plane_tuned(parts, fakes, workers, Tuning::default()).await
}

/// [`plane_on`] with some of its defaults changed.
async fn plane_tuned(
    parts: Parts,
    fakes: &[(&str, serde_json::Value)],
    workers: WorkerConfig,
    tuning: Tuning,
) -> Plane {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, bus, real): (Arc<dyn Store>, Arc<dyn Bus>, _) = match parts {
        Parts::Memory => (
            Arc::new(MemoryStore::new()),
            Arc::new(MemoryBus::new()),
            None,
        ),
        Parts::Real => {
            let db = TestDb::new().await;
            let nats = NatsServer::start();
            let bus = differently_bus::jetstream::connect(&nats.url(), 1)
                .await
                .expect("connect to the test nats-server");
            (Arc::new(db.store()), Arc::new(bus), Some((db, nats)))
        }
    };
    let naming = Naming::default();
    bus.ensure_streams(&naming).await.expect("streams");
    let announcer = Announcer::new(bus, naming);
    let now = Utc::now();
    let system = Actor::System("test");
    let mut records = Vec::new();
    for (name, settings) in fakes {
        let ledger = dir.path().join(format!("{name}.jsonl"));
        let mut all = serde_json::json!({ "ledger": ledger });
        if let (Some(all), Some(extra)) = (all.as_object_mut(), settings.as_object()) {
            all.extend(extra.clone());
        }
        let record = PoolRecord {
            name: (*name).into(),
            kind: "fake".into(),
            trust: Trust::Private,
            region: None,
            max_concurrent: tuning.max_concurrent,
            isolation: None,
            cost_per_cpu_hour: 0.0,
            typical_create_seconds: None,
            settings: all,
            source: PoolSource::Config,
            created_at: now,
            updated_at: now,
        };
        store.upsert_pool(&record, &system).await.expect("pool");
        records.push(record);
    }
    let (pools, bad) = PoolSet::from_records(records);
    assert!(bad.is_empty(), "the fake pools build");
    let mut health = Vec::new();
    for (name, _) in fakes {
        let pool = pools.get(name).expect("pool built");
        health.push(pool.probe("test").await);
    }
    pools.apply_local(&health);

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
            tick: tuning.tick,
            repair_interval: tuning.repair_interval,
            waiting_backoff: tuning.waiting_backoff,
            ..SchedulerConfig::default()
        },
    };
    tokio::spawn(scheduler.run(rx.clone()));
    let installation = store.installation_id().await.expect("installation");
    for (name, _) in fakes {
        let pool = pools.get(name).expect("pool built");
        let group = WorkerGroup {
            pool: (*name).into(),
            adapter: AdapterSource::live(pools.clone(), pool.adapter.clone()),
            store: store.clone(),
            announcer: announcer.clone(),
            installation: installation.clone(),
            config: workers.clone(),
            faults: Faults::default(),
        };
        tokio::spawn(group.run(rx.clone()));
    }
    let ledger = dir.path().join(format!("{}.jsonl", fakes[0].0));
    Plane {
        store,
        announcer,
        pools,
        org: org.id,
        project: project.id,
        ledger,
        _dir: dir,
        _real: real,
        stop,
    }
}

impl Plane {
    /// Takes a running sandbox through terminating to terminated in the store alone (no
    /// event announced), returning the ended row.
    async fn end_in_store(&self, id: &SandboxId, reason: &str) -> Sandbox {
        let mut row = None;
        for to in [Terminating, Terminated] {
            row = Some(
                self.store
                    .transition(
                        differently_store::Transition {
                            id: id.clone(),
                            from: vec![Running, Terminating],
                            to,
                            reason: Some(reason.into()),
                            actor: Actor::System("test"),
                        },
                        Utc::now(),
                    )
                    .await
                    .expect("end in the store"),
            );
        }
        row.expect("two transitions")
    }

    /// Admits a sandbox the way the API does, without announcing it.
    async fn admit_quietly(&self, req: serde_json::Value) -> Sandbox {
        self.admit_quietly_in(&self.org, &self.project, req).await
    }

    /// [`Plane::admit_quietly`] placed on a pool in the admission itself when `direct` says so
    /// (as an API process does when nothing waits).
    async fn admit_with(
        &self,
        req: serde_json::Value,
        direct: Option<differently_store::DirectPlacement>,
    ) -> Sandbox {
        self.admit_in(&self.org, &self.project, req, direct).await
    }

    /// [`Plane::admit_quietly`] in another org's project.
    async fn admit_quietly_in(
        &self,
        org: &OrgId,
        project: &ProjectId,
        req: serde_json::Value,
    ) -> Sandbox {
        self.admit_in(org, project, req, None).await
    }

    async fn admit_in(
        &self,
        org: &OrgId,
        project: &ProjectId,
        req: serde_json::Value,
        direct: Option<differently_store::DirectPlacement>,
    ) -> Sandbox {
        let req: CreateSandboxRequest = serde_json::from_value(req).expect("request");
        let spec = SandboxSpec::build(&req).expect("spec");
        let row = Sandbox::queued(org.clone(), project.clone(), spec, None, Utc::now());
        let admitted = self
            .store
            .admit(Admission {
                sandbox: row,
                request_hash: "h".into(),
                defaults: Default::default(),
                actor: Actor::Key("key_test".into()),
                request_id: None,
                direct,
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

    /// A second tenant: a new org with one project.
    async fn another_org(&self, name: &str) -> (OrgId, ProjectId) {
        let now = Utc::now();
        let org = Org {
            id: OrgId::new(),
            name: name.into(),
            status: OrgStatus::Active,
            created_at: now,
        };
        let project = Project {
            id: ProjectId::new(),
            org_id: org.id.clone(),
            name: "web".into(),
            created_at: now,
        };
        let system = Actor::System("test");
        self.store.create_org(&org, &system).await.expect("org");
        self.store
            .create_project(&project, &system)
            .await
            .expect("project");
        (org.id, project.id)
    }

    /// Waits until `id`'s stored row satisfies `done`, and returns it.
    async fn row_until(
        &self,
        id: &SandboxId,
        what: &str,
        done: impl Fn(&Sandbox) -> bool,
    ) -> Sandbox {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let row = self.row(id).await;
            if done(&row) {
                return row;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{id} never {what}: {row:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The public events of `id` from the start of the public stream, until one of type
    /// `until` has arrived (or [`WAIT`] ends it: a failure naming what came).
    async fn public_until(
        &self,
        id: &SandboxId,
        until: &str,
    ) -> Vec<differently_bus_schema::PublicEvent> {
        let naming = self.announcer.naming();
        let filter = naming.public_filter(&self.org, Some(&self.project), Some(id));
        let mut stream = self
            .announcer
            .bus()
            .events(&naming.public_stream().name, &filter, Some(0))
            .await
            .expect("public events");
        let mut seen = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            while let Some(Ok(ev)) = stream.next().await {
                let e = differently_bus_schema::PublicEvent::decode(&ev.payload).expect("decodes");
                let done = e.event_type().as_str() == until;
                seen.push(e);
                if done {
                    return true;
                }
            }
            false
        })
        .await;
        let types: Vec<String> = seen.iter().map(|e| e.event_type().to_string()).collect();
        assert!(
            matches!(found, Ok(true)),
            "no {until} for {id}; got {types:?}"
        );
        seen
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
