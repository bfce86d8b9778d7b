//! Warm pools end to end in one process: the leader's refill and retirement, the workers'
//! warm creates, deletes and claims, and the reconciler, on the memory store and bus and the
//! fake adapter (its ledger file says what the "backend" saw). Waits are on conditions with
//! generous deadlines, never fixed sleeps that a busy machine could outrun.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use differently_adapters::fake::{created_count, live_instances, read_ledger, LedgerOp};
use differently_adapters::pools::PoolSet;
use differently_bus::memory::MemoryBus;
use differently_bus::{Announcer, Bus};
use differently_bus_schema::{Naming, WorkOp};
use differently_core::faults::Faults;
use differently_core::pool::{PoolRecord, PoolSource, Trust};
use differently_core::tenancy::{Org, OrgStatus, Project};
use differently_core::warm::{WarmClass, WarmClasses};
use differently_core::{
    CreateSandboxRequest, OrgId, ProjectId, Sandbox, SandboxId, SandboxSpec, SandboxStatus,
};
use differently_scheduler::{Scheduler, SchedulerConfig};
use differently_store::memory::MemoryStore;
use differently_store::warm::{WarmCount, WarmInstance, WarmState};
use differently_store::{Actor, Admission, Admitted, DirectPlacement, PoolSlot, Store};
use differently_workers::{AdapterSource, WorkerConfig, WorkerGroup};
use tokio::sync::watch;

/// Every wait is bounded by this.
const WAIT: Duration = Duration::from_secs(30);

const POOL: &str = "fake";

struct Plane {
    store: Arc<dyn Store>,
    announcer: Announcer,
    pools: PoolSet,
    org: OrgId,
    project: ProjectId,
    ledger: PathBuf,
    _dir: tempfile::TempDir,
    /// Stops the workers.
    stop: watch::Sender<bool>,
    /// Stops the current scheduler (see [`Plane::replace_leader`]).
    leader: watch::Sender<bool>,
}

impl Drop for Plane {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let _ = self.leader.send(true);
    }
}

/// A plane with one fake pool offering warm instances, capped at `max_concurrent`, and its
/// leader running.
async fn plane(max_concurrent: Option<u32>) -> Plane {
    let mut p = plane_without_leader(max_concurrent).await;
    p.replace_leader().await;
    p
}

/// [`plane`] with no scheduler yet, for a test that must set rows up before any placement
/// or repair pass can see them (start one with [`Plane::replace_leader`]).
async fn plane_without_leader(max_concurrent: Option<u32>) -> Plane {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let bus: Arc<dyn Bus> = Arc::new(MemoryBus::new());
    let naming = Naming::default();
    bus.ensure_streams(&naming).await.expect("streams");
    let announcer = Announcer::new(bus, naming);
    let now = Utc::now();
    let system = Actor::System("test");
    let ledger = dir.path().join("fake.jsonl");
    let record = PoolRecord {
        name: POOL.into(),
        kind: "fake".into(),
        trust: Trust::Private,
        region: None,
        max_concurrent,
        isolation: None,
        cost_per_cpu_hour: 0.0,
        typical_create_seconds: None,
        settings: serde_json::json!({"ledger": ledger, "capabilities": ["exec", "warm"]}),
        source: PoolSource::Config,
        created_at: now,
        updated_at: now,
    };
    store.upsert_pool(&record, &system).await.expect("pool");
    let (pools, bad) = PoolSet::from_records(vec![record]);
    assert!(bad.is_empty(), "the fake pool builds");
    let pool = pools.get(POOL).expect("pool built");
    pools.apply_local(&[pool.probe("test").await]);
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
    let installation = store.installation_id().await.expect("installation");
    let group = WorkerGroup {
        pool: POOL.into(),
        adapter: AdapterSource::live(pools.clone(), pool.adapter.clone()),
        store: store.clone(),
        announcer: announcer.clone(),
        installation,
        config: WorkerConfig::default(),
        faults: Faults::default(),
    };
    tokio::spawn(group.run(rx));
    let (leader, _) = watch::channel(true);
    Plane {
        store,
        announcer,
        pools,
        org: org.id,
        project: project.id,
        ledger,
        _dir: dir,
        stop,
        leader,
    }
}

impl Plane {
    /// Stops the running scheduler (it steps down and frees the lock) and starts another,
    /// as a leader change does: the new one has none of the old one's memory.
    async fn replace_leader(&mut self) {
        let _ = self.leader.send(true);
        let (tx, rx) = watch::channel(false);
        self.leader = tx;
        let scheduler = Scheduler {
            store: self.store.clone(),
            announcer: self.announcer.clone(),
            pools: self.pools.clone(),
            config: SchedulerConfig {
                tick: Duration::from_millis(50),
                repair_interval: Duration::from_millis(200),
                waiting_backoff: Duration::from_millis(200),
                reconcile_interval: Duration::from_millis(200),
                standby_poll: Duration::from_millis(100),
                ..SchedulerConfig::default()
            },
        };
        tokio::spawn(scheduler.run(rx));
    }

    /// Stops the scheduler and starts none.
    fn stop_leader(&self) {
        let _ = self.leader.send(true);
    }

    async fn set(&self, classes: Vec<WarmClass>) {
        self.store
            .set_warm_classes(POOL, &WarmClasses { classes }, &Actor::System("test"))
            .await
            .expect("classes set");
    }

    async fn counts(&self) -> Vec<WarmCount> {
        self.store.warm_counts(POOL).await.expect("counts")
    }

    async fn rows(&self) -> Vec<WarmInstance> {
        self.store.warm_instances(POOL).await.expect("rows")
    }

    /// Waits until the warm rows satisfy `done`; returns them.
    async fn rows_until(
        &self,
        what: &str,
        done: impl Fn(&[WarmInstance]) -> bool,
    ) -> Vec<WarmInstance> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let rows = self.rows().await;
            if done(&rows) {
                return rows;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never {what}: {rows:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until exactly `n` rows are ready and none is creating or retiring.
    async fn settled_ready(&self, n: usize) -> Vec<WarmInstance> {
        self.rows_until(&format!("{n} ready"), |rows| {
            rows.len() == n && rows.iter().all(|r| r.state == WarmState::Ready)
        })
        .await
    }

    fn ledger(&self) -> Vec<differently_adapters::fake::LedgerEntry> {
        read_ledger(&self.ledger).unwrap_or_default()
    }

    /// Backend creates that made an instance, of any id.
    fn creates(&self) -> usize {
        self.ledger()
            .iter()
            .filter(|e| {
                e.op == LedgerOp::Create
                    && e.outcome == differently_adapters::fake::LedgerOutcome::Created
            })
            .count()
    }

    fn live(&self) -> Vec<SandboxId> {
        live_instances(&self.ledger())
            .into_iter()
            .map(|l| l.sandbox_id)
            .collect()
    }

    async fn admit(&self, direct: Option<DirectPlacement>) -> Sandbox {
        let req: CreateSandboxRequest = serde_json::from_value(serde_json::json!({})).expect("req");
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
                direct,
            })
            .await
            .expect("admit");
        match admitted {
            Admitted::New(s) | Admitted::Replayed(s) => s,
        }
    }

    /// Nothing changes for `quiet`: the rows stay as `check` says throughout.
    async fn stays(&self, quiet: Duration, what: &str, check: impl Fn(&[WarmInstance]) -> bool) {
        let until = tokio::time::Instant::now() + quiet;
        while tokio::time::Instant::now() < until {
            let rows = self.rows().await;
            assert!(check(&rows), "{what}: {rows:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn class(name: &str, size: u32, rate: f64) -> WarmClass {
    WarmClass {
        name: name.into(),
        size,
        max_size: None,
        refill_per_second: rate,
        max_age_seconds: 3600,
        template: None,
        resources: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refill_reaches_size_and_stops_and_the_reconciler_leaves_warm_instances_alone() {
    let p = plane(None).await;
    p.set(vec![class("small", 3, 50.0)]).await;
    let rows = p.settled_ready(3).await;
    // Several reconcile passes (every 200 ms) and refill passes: nothing more is made, and
    // no warm instance is taken for an orphan.
    p.stays(Duration::from_millis(1500), "three ready, no more", |r| {
        r.len() == 3 && r.iter().all(|w| w.state == WarmState::Ready)
    })
    .await;
    assert_eq!(p.creates(), 3, "one backend create per instance");
    let mut live = p.live();
    live.sort();
    let mut ids: Vec<SandboxId> = rows.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    assert_eq!(
        live, ids,
        "every instance is tagged with its warm id and alive"
    );
    assert_eq!(
        p.counts().await,
        vec![WarmCount {
            class: "small".into(),
            creating: 0,
            ready: 3,
            retiring: 0
        }]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refill_keeps_to_the_class_rate() {
    let p = plane(None).await;
    let started = tokio::time::Instant::now();
    p.set(vec![class("slow", 50, 2.0)]).await;
    // Four refills at 2/s take at least 1.5 s after the first second's burst of two.
    p.rows_until("four begun", |r| r.len() >= 4).await;
    let took = started.elapsed();
    let begun = p.rows().await.len();
    // At 2 per second with a burst of 2: at most 2 + 2·t (+1 for the pass in flight).
    let bound = 3.0 + 2.0 * took.as_secs_f64();
    assert!(
        (begun as f64) <= bound,
        "{begun} begun in {took:?}: more than the rate allows ({bound})"
    );
    assert!(
        took >= Duration::from_millis(900),
        "four refills at 2/s came after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrunk_class_retires_its_overshoot_and_a_removed_class_drains() {
    let p = plane(None).await;
    p.set(vec![class("small", 4, 50.0)]).await;
    let four = p.settled_ready(4).await;
    let mut shrunk = class("small", 2, 50.0);
    shrunk.max_size = Some(2);
    p.set(vec![shrunk]).await;
    let two = p.settled_ready(2).await;
    // The oldest two went; the backend deleted them.
    let mut by_age = four.clone();
    by_age.sort_by_key(|r| r.created_at);
    for gone in &by_age[..2] {
        assert!(
            !two.iter().any(|r| r.id == gone.id),
            "the oldest are retired"
        );
    }
    assert_eq!(p.live().len(), 2, "the retired instances are deleted");
    assert_eq!(p.creates(), 4, "shrinking makes nothing new");

    p.set(vec![]).await;
    p.settled_ready(0).await;
    assert!(p.live().is_empty(), "a removed class leaves no instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_past_its_max_age_is_replaced() {
    let p = plane(None).await;
    // An instance made two minutes ago, before its class existed (so no pass touched it).
    let old = SandboxId::new();
    let then = Utc::now() - chrono::Duration::seconds(120);
    p.store
        .warm_begin(POOL, "aged", &old, then)
        .await
        .expect("begin");
    p.store
        .warm_ready(&old, "fake-old", then)
        .await
        .expect("ready");
    let mut aged = class("aged", 1, 50.0);
    aged.max_age_seconds = 60;
    p.set(vec![aged]).await;
    let rows = p
        .rows_until("the old one replaced", |r| {
            r.len() == 1 && r[0].id != old && r[0].state == WarmState::Ready
        })
        .await;
    assert_ne!(rows[0].id, old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_cap_bounds_live_sandboxes_and_warm_instances_together() {
    let p = plane(Some(3)).await;
    let s = p.admit(None).await;
    p.announcer.admitted(&s, "").await.expect("announce");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = p
            .store
            .get_sandbox(&s.id)
            .await
            .expect("read")
            .expect("row");
        if row.status == SandboxStatus::Running {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ran: {row:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.set(vec![class("small", 5, 50.0)]).await;
    p.settled_ready(2).await;
    p.stays(
        Duration::from_millis(1500),
        "one live + two warm = the cap of 3",
        |r| r.len() == 2,
    )
    .await;
}

/// Placement counts live sandboxes only: tenants that fill a capped pool which warm
/// instances also hold take the capacity back, the oldest ready instances retired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_placed_over_warm_capacity_take_it_back() {
    let p = plane(Some(3)).await;
    p.set(vec![class("small", 3, 50.0)]).await;
    p.settled_ready(3).await;
    let s = p.admit(None).await;
    p.announcer.admitted(&s, "").await.expect("announce");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = p
            .store
            .get_sandbox(&s.id)
            .await
            .expect("read")
            .expect("row");
        if row.status == SandboxStatus::Running {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ran: {row:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One live + two warm = the cap; the third instance is retired and deleted.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let rows = p.rows().await;
        if rows.len() == 2 && rows.iter().all(|r| r.state == WarmState::Ready) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the warm rows never fit under the cap: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.stays(
        Duration::from_millis(1500),
        "one live + two warm = the cap of 3",
        |r| r.len() == 2,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refill_waits_while_a_tenant_waits_for_the_pools_capacity() {
    // The leader starts only once the sandbox carries its reason: a placement or repair pass
    // in between would place it (the pool has room), and nothing would wait any more.
    let mut p = plane_without_leader(Some(10)).await;
    // A queued sandbox that placement found waiting for this pool (not announced, and not
    // due for an hour, so placement leaves it be).
    let waiting = p.admit(None).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    p.store
        .set_queued_reason(
            &waiting.id,
            &differently_core::wait_reason::capacity([("fake", "full 10/10")]),
            later,
        )
        .await
        .expect("reason");
    p.set(vec![class("small", 2, 50.0)]).await;
    p.replace_leader().await;
    p.stays(
        Duration::from_millis(1500),
        "no refill while a tenant waits",
        |r| r.is_empty(),
    )
    .await;
    let still = p
        .store
        .get_sandbox(&waiting.id)
        .await
        .expect("read")
        .expect("the waiting sandbox");
    assert_eq!(still.status, SandboxStatus::Queued, "it still waits");
    // It waits for something else now: the pool's room goes to warm instances again.
    p.store
        .set_queued_reason(&waiting.id, "waiting: org active quota 1/1", later)
        .await
        .expect("reason");
    p.settled_ready(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_carries_on_from_the_table() {
    let mut p = plane(None).await;
    p.set(vec![class("small", 2, 50.0)]).await;
    let first = p.settled_ready(2).await;
    p.stop_leader();
    p.set(vec![class("small", 4, 50.0)]).await;
    p.replace_leader().await;
    let four = p.settled_ready(4).await;
    for r in &first {
        assert!(four.iter().any(|f| f.id == r.id), "kept {r:?}");
    }
    assert_eq!(p.creates(), 4, "nothing made twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_instance_that_vanished_is_replaced() {
    let p = plane(None).await;
    p.set(vec![class("small", 2, 50.0)]).await;
    let rows = p.settled_ready(2).await;
    let lost = rows[0].id.clone();
    let adapter = p.pools.get(POOL).expect("pool").adapter.clone();
    adapter
        .delete(&lost)
        .await
        .expect("deleted behind our back");
    let now = p
        .rows_until("the lost one replaced", |r| {
            r.len() == 2
                && !r.iter().any(|w| w.id == lost)
                && r.iter().all(|w| w.state == WarmState::Ready)
        })
        .await;
    assert!(now.iter().any(|w| w.id == rows[1].id), "the other is kept");
    assert_eq!(p.creates(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_creates_and_deletes_are_idempotent_under_redelivery() {
    let p = plane(None).await;
    // Declared but empty (maxSize leaves room), so the leader neither refills nor retires.
    let mut quiet = class("small", 0, 50.0);
    quiet.max_size = Some(5);
    p.set(vec![quiet]).await;
    let id = SandboxId::new();
    p.store
        .warm_begin(POOL, "small", &id, Utc::now())
        .await
        .expect("begin");
    for attempt in ["", "-again", "-third"] {
        p.announcer
            .warm_work(POOL, &id, WorkOp::WarmCreate, "small", attempt)
            .await
            .expect("publish");
    }
    p.rows_until("ready", |r| r.len() == 1 && r[0].state == WarmState::Ready)
        .await;
    // Every delivery has been handled once the create lines stop growing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        created_count(&p.ledger(), &id),
        1,
        "one instance for three deliveries"
    );

    p.store
        .warm_retire(std::slice::from_ref(&id))
        .await
        .expect("retire");
    for attempt in ["-d1", "-d2"] {
        p.announcer
            .warm_work(POOL, &id, WorkOp::WarmDelete, "small", attempt)
            .await
            .expect("publish");
    }
    p.rows_until("gone", |r| r.is_empty()).await;
    assert!(p.live().is_empty(), "deleted");
    // A create that comes after the row is gone makes nothing.
    p.announcer
        .warm_work(POOL, &id, WorkOp::WarmCreate, "small", "-late")
        .await
        .expect("publish");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(created_count(&p.ledger(), &id), 1);
    assert!(p.live().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_runs_the_sandbox_once_whatever_the_redeliveries() {
    let p = plane(None).await;
    let mut quiet = class("small", 0, 50.0);
    quiet.max_size = Some(5);
    p.set(vec![quiet]).await;
    let id = SandboxId::new();
    p.store
        .warm_begin(POOL, "small", &id, Utc::now())
        .await
        .expect("begin");
    p.announcer
        .warm_work(POOL, &id, WorkOp::WarmCreate, "small", "")
        .await
        .expect("publish");
    p.rows_until("ready", |r| r.len() == 1 && r[0].state == WarmState::Ready)
        .await;
    // Claimed by an admission as a pool whose backend needs a claim call: provisioning.
    let claimed = p
        .admit(Some(DirectPlacement {
            pool: PoolSlot {
                name: POOL.into(),
                max_concurrent: None,
            },
            explanation: serde_json::json!({"decision": "placed", "pool": POOL}),
            warm_class: Some("small".into()),
            claim_call: true,
        }))
        .await;
    assert_eq!(claimed.id, id, "the sandbox takes the instance's id");
    assert_eq!(claimed.status, SandboxStatus::Provisioning);
    for attempt in ["", "-again"] {
        p.announcer
            .work(&claimed, WorkOp::Claim, attempt)
            .await
            .expect("publish");
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let running = loop {
        let row = p.store.get_sandbox(&id).await.expect("read").expect("row");
        if row.status == SandboxStatus::Running {
            break row;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ran: {row:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        running.backend_ref.as_deref(),
        Some(format!("fake-{id}-1").as_str())
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        created_count(&p.ledger(), &id),
        1,
        "the claim creates nothing"
    );
    assert!(p.rows().await.is_empty(), "the warm row is gone");
    let row = p.store.get_sandbox(&id).await.expect("read").expect("row");
    assert_eq!(row.status, SandboxStatus::Running);
}
