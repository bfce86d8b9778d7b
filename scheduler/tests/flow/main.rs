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

/// Begins operation `kind` on `s` the way the API does and publishes its work `times` times
/// (each a distinct message, as a repair re-send is); returns the operation record.
async fn operate(
    p: &Plane,
    s: &Sandbox,
    kind: WorkOp,
    times: usize,
) -> differently_store::lifecycle::OpRecord {
    operate_with(p, s, kind, true, serde_json::json!({}), times).await
}

/// [`operate`] with the operation's exclusivity and arguments.
async fn operate_with(
    p: &Plane,
    s: &Sandbox,
    kind: WorkOp,
    exclusive: bool,
    args: serde_json::Value,
    times: usize,
) -> differently_store::lifecycle::OpRecord {
    use differently_store::lifecycle::{OpBegun, OpRecord};
    let record = OpRecord::new(
        s,
        kind.as_str(),
        exclusive,
        args,
        "key:key_test".into(),
        Utc::now(),
    );
    let OpBegun::New(record) = p.store.begin_op(&record).await.expect("begin") else {
        panic!("another operation is pending on {}", s.id);
    };
    for n in 0..times {
        p.announcer
            .op(s, "fake", kind, record.id.as_str(), &format!(":{n}"))
            .await
            .expect("publish the operation");
    }
    record
}

/// Waits until operation `id` is no longer pending; returns it.
async fn finished(
    p: &Plane,
    id: &differently_core::ids::OpId,
) -> differently_store::lifecycle::OpRecord {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let op = p.store.get_op(id).await.expect("read").expect("op exists");
        if op.state != differently_store::lifecycle::OpState::Pending {
            return op;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "operation {id} still pending"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker executes a pause and a resume as operations: the row moves, the operation is
/// recorded done, and an operation delivered three times (a lost ack, a repair re-send)
/// settles once: one `paused` event, one outcome. Deliveries of one operation are executed
/// one at a time in a process (a late duplicate once re-paused the backend after the resume,
/// and the reconciler then followed it); across processes the contract's idempotent
/// lifecycle calls and the record's state settle them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_operations_settle_once_however_often_they_are_delivered() {
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "lifecycle.pause"]}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let pause = operate(&p, &running, WorkOp::Pause, 3).await;
    let paused = p.reaches(&s.id, Paused).await;
    assert_eq!(
        finished(&p, &pause.id).await.state,
        differently_store::lifecycle::OpState::Done
    );
    let resume = operate(&p, &paused, WorkOp::Resume, 1).await;
    let resumed_at = {
        // The running event after the pause: wait for the second `running`.
        let mut events = p.statuses(&s.id).await;
        let mut runs = 0;
        tokio::time::timeout(WAIT, async {
            while let Some(st) = events.next().await {
                if st == Running {
                    runs += 1;
                    if runs == 2 {
                        break;
                    }
                }
            }
        })
        .await
        .expect("running again");
        p.row(&s.id).await
    };
    assert_eq!(resumed_at.status, Running);
    assert_eq!(
        finished(&p, &resume.id).await.state,
        differently_store::lifecycle::OpState::Done
    );
    let mut events = p.statuses(&s.id).await;
    let mut seen = Vec::new();
    while let Ok(Some(st)) = tokio::time::timeout(Duration::from_millis(300), events.next()).await {
        seen.push(st);
    }
    assert_eq!(
        seen.iter().filter(|st| **st == Paused).count(),
        1,
        "three deliveries of one pause moved the row once: {seen:?}"
    );
    let ledger = read_ledger(&p.ledger).unwrap_or_default();
    let pauses: Vec<_> = ledger
        .iter()
        .filter(|e| {
            e.sandbox_id.as_ref() == Some(&s.id)
                && e.op == differently_adapters::fake::LedgerOp::Pause
        })
        .collect();
    assert!(
        (1..=3).contains(&pauses.len()),
        "one to three backend pauses, never more than deliveries: {pauses:?}"
    );
}

/// Records a snapshot of `running` and starts taking it, as the API does.
async fn take_snapshot(
    p: &Plane,
    running: &Sandbox,
) -> (
    differently_store::lifecycle::SnapshotRecord,
    differently_store::lifecycle::OpRecord,
) {
    use differently_store::lifecycle::{SnapshotRecord, SnapshotStatus};
    let now = Utc::now();
    let snap = SnapshotRecord {
        id: differently_core::ids::SnapshotId::new(),
        org_id: running.org_id.clone(),
        project_id: running.project_id.clone(),
        sandbox_id: running.id.clone(),
        pool: "fake".into(),
        name: None,
        status: SnapshotStatus::Creating,
        status_reason: None,
        backend_ref: None,
        created_at: now,
        updated_at: now,
    };
    p.store.insert_snapshot(&snap).await.expect("snapshot row");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let record = operate_with(p, running, WorkOp::Snapshot, true, args, 1).await;
    (snap, record)
}

/// A snapshot the backend is still writing stays `creating` (so a fork of it is refused
/// until then) and its operation pending; the worker asks again until the backend says
/// ready, and only then is it `ready` and the operation done. (Against a real OpenSandbox
/// the worker marked it ready on the first answer, and an immediate fork failed for good
/// with `SNAPSHOT::NOT_READY`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_ready_only_when_the_backend_says_so() {
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"], "snapshotReadyAfter": 3}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let (snap, record) = take_snapshot(&p, &running).await;

    // Seen not ready at least once: still creating, operation pending, backend ref known.
    let deadline = tokio::time::Instant::now() + WAIT;
    let seen_creating = loop {
        let row = p
            .store
            .get_snapshot(&snap.id)
            .await
            .expect("read")
            .expect("row");
        if row.backend_ref.is_some() {
            break row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never asked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        seen_creating.status,
        SnapshotStatus::Creating,
        "{seen_creating:?}"
    );
    let done = finished(&p, &record.id).await;
    assert_eq!(done.state, OpState::Done, "{done:?}");
    let ready = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    assert_eq!(ready.status, SnapshotStatus::Ready);
    let asked = read_ledger(&p.ledger)
        .unwrap_or_default()
        .iter()
        .filter(|e| e.op == differently_adapters::fake::LedgerOp::Snapshot)
        .count();
    assert_eq!(asked, 4, "three answers not ready, then ready");
}

/// A snapshot delete the backend refuses for a while (OpenSandbox's 409 DELETE_CONFLICT
/// while a fork of it runs) is not given up after `max_deliveries`: the snapshot stays
/// `deleting` saying why, and the delete is retried until the backend confirms, when the
/// record goes. (Against a real OpenSandbox, the worker gave up after 3 tries in 3 s and the
/// snapshot stayed `deleting` with nothing re-sending it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_snapshot_delete_is_retried_until_the_backend_confirms() {
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let workers = WorkerConfig {
        max_deliveries: 1,
        ..WorkerConfig::default()
    };
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"], "refuseSnapshotDeletes": 2}),
        workers,
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let (mut snap, take) = take_snapshot(&p, &running).await;
    assert_eq!(finished(&p, &take.id).await.state, OpState::Done);

    // Delete it, as the API does: `deleting`, then the (non-exclusive) operation.
    snap = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    snap.status = SnapshotStatus::Deleting;
    p.store.update_snapshot(&snap).await.expect("deleting");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let delete = operate_with(&p, &running, WorkOp::DeleteSnapshot, false, args, 1).await;

    // While refused: still deleting, and it says why.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = p.store.get_snapshot(&snap.id).await.expect("read");
        if let Some(row) = row.filter(|r| r.status_reason.is_some()) {
            assert_eq!(row.status, SnapshotStatus::Deleting);
            assert!(
                row.status_reason
                    .as_deref()
                    .is_some_and(|r| r.contains("in use")),
                "{row:?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = finished(&p, &delete.id).await;
    assert_eq!(done.state, OpState::Done, "{done:?}");
    assert!(
        p.store
            .get_snapshot(&snap.id)
            .await
            .expect("read")
            .is_none(),
        "the record goes once the backend confirms"
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

/// Found by the dashboard: a sandbox whose admission tried direct placement while its org was
/// at quota got its waiting reason from the store at once, and the leader, seeing the same
/// reason again, never stored an explanation: `GET …/placement` answered 404. The leader now
/// stores one the first time it explains a candidate, whatever the row already says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_admission_refused_by_the_quota_is_still_explained() {
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
    let req: CreateSandboxRequest =
        serde_json::from_value(serde_json::json!({ "resources": { "cpu": 1 } })).expect("request");
    let row = Sandbox::queued(
        p.org.clone(),
        p.project.clone(),
        SandboxSpec::build(&req).expect("spec"),
        None,
        Utc::now(),
    );
    let admitted = p
        .store
        .admit(Admission {
            sandbox: row,
            request_hash: "h".into(),
            defaults: Default::default(),
            actor: Actor::Key("key_test".into()),
            request_id: None,
            direct: Some(differently_store::DirectPlacement {
                pool: differently_store::PoolSlot {
                    name: "fake".into(),
                    max_concurrent: None,
                },
                explanation: serde_json::json!({"decision": "placed", "pool": "fake"}),
                warm_class: None,
                claim_call: false,
            }),
        })
        .await
        .expect("admit");
    let (Admitted::New(second) | Admitted::Replayed(second)) = admitted;
    // The store refused the direct activation: queued, with its reason, and no explanation.
    assert_eq!(second.status, Queued, "{second:?}");
    let reason = second.status_reason.clone().expect("a waiting reason");
    assert!(reason.starts_with("waiting: org cpu quota"), "{reason}");
    assert!(p
        .store
        .get_placement(&second.id)
        .await
        .expect("read")
        .is_none());
    p.announcer.admitted(&second, "").await.expect("announce");
    let deadline = tokio::time::Instant::now() + WAIT;
    let doc = loop {
        if let Some(doc) = p.store.get_placement(&second.id).await.expect("placement") {
            break doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never explained why it waits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(doc["decision"], "waiting", "{doc}");
    assert_eq!(doc["wall"], "org", "{doc}");
    assert_eq!(doc["reason"].as_str(), Some(reason.as_str()), "{doc}");
}

/// A pool whose backend refuses creates for capacity (a provider at its plan limit), on a
/// real Postgres and nats-server: the sandbox goes back to placement at once (no redelivery
/// to the full pool), the full pool gets no new placements for a while (here and in the
/// fleet-wide health view), and the sandbox runs on the next ranked pool, created once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_for_capacity_falls_back_to_the_next_ranked_pool() {
    let fakes = [
        // Ranked first: private-first ties break by name.
        ("fake", serde_json::json!({ "capacityFull": true })),
        ("spare", serde_json::json!({})),
    ];
    let p = plane_on(Parts::Real, &fakes, WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({})).await;
    let row = p.reaches(&s.id, Running).await;
    assert_eq!(row.pool.as_deref(), Some("spare"), "{row:?}");
    assert_eq!(
        row.attempts, 2,
        "placed on the full pool first, then on the next one: {row:?}"
    );
    let spare_ledger = p._dir.path().join("spare.jsonl");
    let spare = created_count(&read_ledger(&spare_ledger).unwrap_or_default(), &s.id);
    assert_eq!(spare, 1, "one instance on the pool with room");
    assert_eq!(p.creates(&s.id), 0, "nothing was made on the full pool");

    // The refusal is visible: in this process's pool view and in the stored health view
    // the other processes read.
    let full = p.pools.get("fake").expect("pool fake");
    let until = full
        .capacity_refused_until(Utc::now())
        .expect("the full pool is refused for a while");
    assert!(
        until > Utc::now() + chrono::Duration::seconds(20),
        "{until}"
    );
    assert!(!full.view().healthy);
    let health = p.store.pool_health().await.expect("health");
    let fake = health
        .iter()
        .find(|h| h.name == "fake")
        .expect("fake's health");
    assert!(!fake.healthy, "{fake:?}");
    assert!(
        fake.error
            .as_deref()
            .is_some_and(|e| e.starts_with("insufficient capacity")),
        "{fake:?}"
    );
    // The decision that placed it says why the first pool was passed over.
    let explained = p
        .store
        .get_placement(&s.id)
        .await
        .expect("read placement")
        .expect("explanation stored");
    let text = explained.to_string();
    assert!(
        text.contains("spare") && text.contains("unhealthy"),
        "{text}"
    );

    // A probe of the full pool while refused keeps it unhealthy for the fleet.
    let probe = full.probe("test").await;
    assert!(!probe.healthy, "{probe:?}");
}

/// The only pool has no room: the sandbox is not failed for it; it waits in the queue (the
/// placement explains the full pool as unhealthy) and is not sent back to the full pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_refused_for_capacity_with_nowhere_else_waits_instead_of_failing() {
    let fakes = [("fake", serde_json::json!({ "capacityFull": true }))];
    let p = plane_on(Parts::Memory, &fakes, WorkerConfig::default()).await;
    let s = p.admit(serde_json::json!({})).await;
    p.reaches(&s.id, Provisioning).await;
    let row = p.reaches(&s.id, Queued).await;
    assert_eq!(row.attempts, 1, "{row:?}");
    let reason = row.status_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("insufficient capacity") || reason.contains("fake (unhealthy)"),
        "{row:?}"
    );
    // Well past the requeue delay: placement keeps it waiting, it never fails.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let row = p.row(&s.id).await;
    assert_eq!(row.status, Queued, "{row:?}");
    assert_eq!(
        row.attempts, 1,
        "not placed on the full pool again: {row:?}"
    );
}

/// Found by the e2e fairness test under CI load: a candidate the policy left waiting for a
/// full pool was parked without walling the pool, so a later candidate of an org with more
/// active CPU, decided after the slot view was re-read, took a slot freed before the release
/// event reached the leader, ahead of the fair order. Here the slot is freed in the store
/// without any event: B (waiting, no active CPU) must still get it before A (active CPU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_before_its_release_event_goes_to_the_fair_choice() {
    let p = plane_tuned(
        Parts::Memory,
        &[("fake", serde_json::json!({}))],
        WorkerConfig::default(),
        Tuning {
            max_concurrent: Some(2),
            // Long: A arrives well inside B's back-off, so only the wall keeps A out.
            waiting_backoff: Duration::from_secs(2),
            ..Tuning::default()
        },
    )
    .await;
    let (freed, kept) = (
        p.admit(serde_json::json!({})).await,
        p.admit(serde_json::json!({})).await,
    );
    p.reaches(&freed.id, Running).await;
    p.reaches(&kept.id, Running).await;
    let (b_org, b_project) = p.another_org("small").await;
    let b = p
        .admit_quietly_in(&b_org, &b_project, serde_json::json!({}))
        .await;
    p.announcer.admitted(&b, "").await.expect("announce");
    p.row_until(&b.id, "waited for the full pool", |r| {
        r.status == Queued && r.status_reason.is_some()
    })
    .await;
    // One of A's sandboxes ends in the store only: the leader hears of no release. A keeps
    // one CPU active, B has none: the freed slot is B's.
    p.end_in_store(&freed.id, "test: freed without an event")
        .await;
    // A arrives once the leader's slot view (re-read every tick) has seen the free slot, as a
    // candidate decided late in a long pass does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = p.admit(serde_json::json!({})).await;
    let b_row = p
        .row_until(&b.id, "got the freed slot", |r| r.status != Queued)
        .await;
    assert!(
        matches!(b_row.status, Provisioning | Running),
        "B took the slot: {b_row:?}"
    );
    let a_row = p.row(&a.id).await;
    assert_eq!(
        a_row.status, Queued,
        "A, with more active CPU and arriving later, waits: {a_row:?}"
    );
}

/// The end of a sandbox, announced as the worker announces it, wakes placement at once:
/// the leader reads only final status changes (`Naming::final_event_filter`), and this one
/// must reach it. Placement's tick and the waiting back-off are an hour, so nothing else
/// places the queued sandbox within the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_end_wakes_placement_for_the_sandbox_waiting_on_its_room() {
    let p = plane_tuned(
        Parts::Real,
        &[("fake", serde_json::json!({}))],
        WorkerConfig::default(),
        Tuning {
            max_concurrent: Some(1),
            waiting_backoff: Duration::from_secs(3600),
            tick: Duration::from_secs(3600),
            ..Tuning::default()
        },
    )
    .await;
    let first = p.admit(serde_json::json!({})).await;
    p.reaches(&first.id, Running).await;
    let waiting = p.admit(serde_json::json!({})).await;
    p.row_until(&waiting.id, "waited for the full pool", |r| {
        r.status == Queued && r.status_reason.is_some()
    })
    .await;
    let ended = p.end_in_store(&first.id, "test: ended").await;
    p.announcer.status(&ended).await.expect("announce the end");
    let row = p
        .row_until(&waiting.id, "placed into the freed room", |r| {
            r.status != Queued
        })
        .await;
    assert!(matches!(row.status, Provisioning | Running), "{row:?}");
}

/// A placement and a snapshot's life are public events: `placement.decided` (pool, attempt,
/// cause `quota`) when the leader activates the sandbox, `snapshot.created` once the backend
/// says it is ready and `snapshot.deleted` once it confirms the delete, both attributed like
/// the operation that asked (its key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_and_a_snapshots_life_are_public_events() {
    use differently_bus_schema::EventData;
    use differently_store::lifecycle::{OpState, SnapshotStatus};
    let p = plane(
        serde_json::json!({"capabilities": ["exec", "snapshots"]}),
        WorkerConfig::default(),
    )
    .await;
    let s = p.admit(serde_json::json!({})).await;
    let running = p.reaches(&s.id, Running).await;
    let placed = p.public_until(&s.id, "placement.decided").await;
    let decided = placed.last().expect("the event");
    let EventData::PlacementDecided(d) = &decided.data else {
        panic!("{decided:?}");
    };
    assert_eq!((d.pool.as_str(), d.attempt), ("fake", 1), "{decided:?}");
    assert_eq!(decided.cause, differently_bus_schema::Cause::Quota);
    assert_eq!(
        placed
            .iter()
            .filter(|e| e.event_type().as_str() == "placement.decided")
            .count(),
        1,
        "one placement, one event"
    );

    let (mut snap, take) = take_snapshot(&p, &running).await;
    assert_eq!(finished(&p, &take.id).await.state, OpState::Done);
    let created = p.public_until(&s.id, "snapshot.created").await;
    let created = created.last().expect("the event");
    let EventData::SnapshotCreated(c) = &created.data else {
        panic!("{created:?}");
    };
    assert_eq!(c.snapshot_id, snap.id.to_string());
    assert_eq!(
        created.cause,
        differently_bus_schema::Cause::User,
        "{created:?}"
    );

    snap = p
        .store
        .get_snapshot(&snap.id)
        .await
        .expect("read")
        .expect("row");
    snap.status = SnapshotStatus::Deleting;
    p.store.update_snapshot(&snap).await.expect("deleting");
    let args = serde_json::json!({ "snapshotId": snap.id });
    let delete = operate_with(&p, &running, WorkOp::DeleteSnapshot, false, args, 1).await;
    assert_eq!(finished(&p, &delete.id).await.state, OpState::Done);
    let deleted = p.public_until(&s.id, "snapshot.deleted").await;
    let EventData::SnapshotDeleted(d) = &deleted.last().expect("the event").data else {
        panic!("{deleted:?}");
    };
    assert_eq!(d.snapshot_id, snap.id.to_string());
}
