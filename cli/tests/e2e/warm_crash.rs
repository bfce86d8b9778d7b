//! Warm pools under crashes and concurrency (#42), in the production topology: separate api,
//! scheduler and worker processes of the real binary on a real Postgres and nats-server.
//! The witnesses are the backends' own records: the `fake` backend's cross-process ledger,
//! and, for a backend whose claim needs a call, the adapters' fake OpenSandbox server (its
//! request record and its own ledger). After each crash the class returns to its size, no
//! instance served two sandboxes, nothing leaked, and the fault suite's invariants hold
//! (`checks::fault_invariants`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use differently_adapters::fake::{created_count, read_ledger, LedgerOp, LedgerOutcome};
use differently_core::{SandboxId, SandboxStatus};
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{eventually, free_port, wait_pool_healthy, Cluster, Opts};
use crate::tenancy::tenant;

#[path = "warm_crash/checks.rs"]
mod checks;

use checks::{
    count, counts, fake_live, fault_invariants, osb_live, osb_pool, ready_ids, renewals_of, rows,
    set_classes, settle_backend, start_osb, wait_counts, warm_rows, Sampler, OSB, WARM_CAPS,
};

/// Generous bound for anything that waits on the cluster (2 shared cores).
const WITHIN: Duration = Duration::from_secs(90);

/// Waits until the API at `base` answers `/readyz` with 200.
async fn wait_readyz(c: &Cluster, base: &str) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{base} never ready\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until sandbox `id` has `status`, asking with `key` (its tenant's: the bootstrap key
/// does not see another org's sandboxes) through the API's wait route.
async fn wait_as(c: &Cluster, key: &str, id: &str, status: &str) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let (s, b) = c
            .call(
                key,
                Method::GET,
                &format!("/v1/sandboxes/{id}/wait?status={status}&timeoutSeconds=20"),
                None,
            )
            .await;
        if s == 200 && b["status"] == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} is not {status} after {WITHIN:?}: {s} {b}\n{}",
            c.logs()
        );
        if s != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One class `default` of `size`, matching default creates.
fn class(size: u32, rate: f64) -> Value {
    json!([{ "name": "default", "size": size, "refillPerSecond": rate }])
}

/// Sandbox ids the ledger shows each backend instance answering for: an instance (backend
/// ref) with two ids served two sandboxes.
fn ids_per_instance(c: &Cluster) -> HashMap<String, BTreeSet<String>> {
    let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
    for e in c.ledger() {
        if let (Some(id), Some(b)) = (&e.sandbox_id, &e.backend_ref) {
            out.entry(b.clone()).or_default().insert(id.to_string());
        }
    }
    out
}

/// Two API processes claim from one class concurrently: 3N creates from three orgs split
/// across both APIs take exactly the N ready instances, each once; the rest go cold and run;
/// the class refills; after every delete only the class's ready set is left on the backend.
///
/// The scheduler (the refill leader) is stopped for the burst, so no instance refilled
/// meanwhile can be claimed and the count of warm answers is exactly N; it is started again
/// to refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apis_claiming_concurrently_never_share_an_instance() {
    const N: usize = 8;
    let mut c = Cluster::new(Opts {
        more_pools: WARM_CAPS.into(),
        ..Opts::default()
    })
    .await;
    let api2 = format!("http://127.0.0.1:{}", free_port());
    c.spawn("api1", "api", &[]);
    c.spawn(
        "api2",
        "api",
        &[("DIFFERENTLY_LISTEN", api2.trim_start_matches("http://"))],
    );
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    wait_readyz(&c, &api2).await;
    let tenants = [
        tenant(&c, "warm-a").await,
        tenant(&c, "warm-b").await,
        tenant(&c, "warm-c").await,
    ];
    // Each tenant's key is known to both APIs before the burst (their auth caches are
    // warm), so neither API starts the race late.
    for t in &tenants {
        for base in [c.url(), api2.clone()] {
            let r = reqwest::Client::new()
                .get(format!("{base}/v1/sandboxes"))
                .bearer_auth(&t.key)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{base}");
        }
    }
    set_classes(&c, "fake", class(N as u32, 50.0)).await;
    wait_counts(&c, "fake", "default", WITHIN, "full", |n| {
        n.ready == N as u32 && n.creating == 0
    })
    .await;
    // Both APIs must see the pool healthy before the scheduler goes: an API that does not
    // yet (its first health news still to come) queues its creates, and a queued sandbox of
    // an org keeps the org's later creates from claiming in admission (they would overtake it).
    for base in [c.url(), api2.clone()] {
        if let Err(pools) = wait_pool_healthy(&base, &c.key, "fake", WITHIN).await {
            panic!("{base} never saw fake healthy: {pools}\n{}", c.logs());
        }
    }
    c.kill9("scheduler");
    let warm: BTreeSet<String> = ready_ids(&c, "fake")
        .await
        .iter()
        .map(|i| i.to_string())
        .collect();
    assert_eq!(warm.len(), N);

    // The burst: 3N creates at once, alternating APIs and orgs.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let bases = [c.url(), api2.clone()];
    let answers = futures::future::join_all((0..3 * N).map(|i| {
        let (http, t, base) = (http.clone(), &tenants[i % 3], &bases[i % 2]);
        async move {
            let r = http
                .post(format!("{base}/v1/sandboxes"))
                .bearer_auth(&t.key)
                .json(&json!({ "projectId": t.project }))
                .send()
                .await
                .expect("create");
            let status = r.status().as_u16();
            (i, status, r.json::<Value>().await.expect("json"))
        }
    }))
    .await;
    let mut ids = BTreeMap::new(); // id -> (create index, answered status)
    for (i, status, body) in &answers {
        assert_eq!(*status, 202, "create {i}: {body}\n{}", c.logs());
        let id = body["id"].as_str().expect("id").to_owned();
        let st = body["status"].as_str().unwrap_or_default().to_owned();
        assert!(
            ids.insert(id.clone(), (*i, st)).is_none(),
            "{id} answered twice"
        );
    }
    assert_eq!(ids.len(), 3 * N, "every create got its own sandbox id");
    let hits: BTreeSet<String> = ids
        .iter()
        .filter(|(_, (_, st))| st == "running")
        .map(|(id, _)| id.clone())
        .collect();
    if hits != warm {
        let answered: Vec<String> = answers
            .iter()
            .map(|(i, _, b)| format!("{i}: {} {} {}", b["id"], b["status"], b["statusReason"]))
            .collect();
        panic!(
            "exactly the N ready instances answered warm (running at once, under their ids)\n\
             hits {hits:?}\nwarm {warm:?}\nanswers:\n{}\nready now: {:?}\n{}",
            answered.join("\n"),
            ready_ids(&c, "fake").await,
            c.logs()
        );
    }
    for (id, (_, st)) in ids.iter().filter(|(id, _)| !warm.contains(*id)) {
        assert_eq!(st, "provisioning", "{id} went cold");
    }
    let per_api: Vec<usize> = (0..2)
        .map(|a| hits.iter().filter(|id| ids[*id].0 % 2 == a).count())
        .collect();
    eprintln!("warm answers per API: {per_api:?}");
    for (id, (i, _)) in &ids {
        wait_as(&c, &tenants[i % 3].key, id, "running").await;
    }

    // Each sandbox has its own instance, created once; no instance answered for two.
    let ledger = c.ledger();
    for id in ids.keys() {
        let id = SandboxId::parse(id).unwrap();
        assert_eq!(created_count(&ledger, &id), 1, "{id}: {ledger:?}");
    }
    let db = rows(&c).await;
    let refs: BTreeSet<_> = ids
        .keys()
        .map(|id| db[id].1.clone().expect("ref"))
        .collect();
    assert_eq!(
        refs.len(),
        3 * N,
        "two running rows share a backend instance"
    );
    // One command in each, through alternating APIs: each reaches its own instance only.
    for (n, (id, (i, _))) in ids.iter().enumerate() {
        let t = &tenants[i % 3];
        let r = http
            .post(format!("{}/v1/sandboxes/{id}/exec", bases[n % 2]))
            .bearer_auth(&t.key)
            .json(&json!({ "command": ["echo", id] }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let out: Value = r.json().await.unwrap();
        assert_eq!(out["stdout"], format!("{id}\n"), "{out}");
    }
    for (backend_ref, sandboxes) in ids_per_instance(&c) {
        assert_eq!(
            sandboxes.len(),
            1,
            "instance {backend_ref} served {sandboxes:?}"
        );
    }
    let execs: Vec<_> = c
        .ledger()
        .into_iter()
        .filter(|e| e.op == LedgerOp::Exec && e.outcome == LedgerOutcome::Ok)
        .collect();
    assert_eq!(execs.len(), 3 * N, "{execs:?}");
    for e in &execs {
        let id = e.sandbox_id.as_ref().unwrap().to_string();
        assert_eq!(
            e.backend_ref, db[&id].1,
            "{id}'s exec reached another instance"
        );
    }

    // The refill leader comes back: the class is refilled with new instances, never with
    // claimed ones.
    c.spawn("scheduler2", "scheduler", &[]);
    wait_counts(&c, "fake", "default", WITHIN, "refilled", |n| {
        n.ready == N as u32 && n.creating == 0
    })
    .await;
    for r in warm_rows(&c, "fake").await {
        assert!(
            !ids.contains_key(r.id.as_str()),
            "{} returned to the class",
            r.id
        );
    }

    // Everything deleted: the backend keeps only the class's ready set.
    for (id, (i, _)) in &ids {
        let t = &tenants[i % 3];
        let (s, b) = c
            .call(&t.key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert!(matches!(s, 200 | 202), "delete {id}: {s} {b}");
    }
    for (id, (i, _)) in &ids {
        wait_as(&c, &tenants[i % 3].key, id, "terminated").await;
    }
    settle_backend(&c, &["fake"], WITHIN, || fake_live(&c)).await;
    assert_eq!(fake_live(&c).len(), N, "only the class's ready set is left");
    let trail = fault_invariants(&c).await;
    // A cold create is activated, then runs; a claim is one record saying both.
    for id in ids.keys() {
        let t = &trail[id];
        let (activated, ran) = (count(t, "sandbox.activate"), count(t, "sandbox.running"));
        let warm_claims = t.iter().filter(|a| a.warm).count();
        if warm.contains(id) {
            assert_eq!((activated, warm_claims, ran), (1, 1, 0), "{id}: {t:?}");
        } else {
            assert_eq!((activated, warm_claims, ran), (1, 0, 1), "{id}: {t:?}");
        }
    }
}

/// The refill leader is killed while the class is being refilled (creates under way, the
/// class not yet full): the standby takes over from the table and the class reaches its
/// size. `creating + ready` never exceeds `size`: the refill reads the rows each pass and a
/// `kill -9`ed leader leaves no second one running, so the bound on overshoot is 0. Claims
/// after the takeover are refilled by the new leader, a shrink retires the surplus, and the
/// backend is left with exactly the ready set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refill_leader_killed_mid_refill_standby_refills_without_overshoot() {
    const SIZE: u32 = 6;
    let mut c = Cluster::new(Opts {
        // Each backend create takes 1.5 s, so creates are under way when the leader dies.
        latency_ms: 1500,
        more_pools: WARM_CAPS.into(),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.spawn("sched1", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let led = eventually(WITHIN, || c.log("sched1").contains("scheduler: leading")).await;
    assert!(led, "sched1 never led\n{}", c.logs());
    c.spawn("sched2", "scheduler", &[]);
    let standby = eventually(WITHIN, || {
        c.log("sched2").contains("scheduler: standing by")
    })
    .await;
    assert!(standby, "sched2 never stood by\n{}", c.logs());

    let sampler = Sampler::start(&c, "fake", "default");
    // One create begun per second: the refill takes about six seconds.
    set_classes(&c, "fake", class(SIZE, 1.0)).await;
    let at_kill = wait_counts(&c, "fake", "default", WITHIN, "mid-refill", |n| {
        n.creating >= 1 && n.creating + n.ready < SIZE
    })
    .await;
    c.kill9("sched1");
    eprintln!("refill leader killed at {at_kill:?}");
    let took_over = eventually(WITHIN, || c.log("sched2").contains("taking over")).await;
    assert!(took_over, "sched2 never took over\n{}", c.logs());
    wait_counts(
        &c,
        "fake",
        "default",
        WITHIN,
        "refilled by the standby",
        |n| n.ready == SIZE && n.creating == 0 && n.retiring == 0,
    )
    .await;

    // Claims under the new leader are refilled by it.
    let warm: BTreeSet<String> = ready_ids(&c, "fake")
        .await
        .iter()
        .map(|i| i.to_string())
        .collect();
    let mut claimed = Vec::new();
    for _ in 0..3 {
        let (s, b) = c.create(json!({})).await;
        assert_eq!((s, b["status"].as_str()), (202, Some("running")), "{b}");
        let id = b["id"].as_str().unwrap().to_owned();
        assert!(
            warm.contains(&id),
            "{id} is not a ready instance of {warm:?}"
        );
        claimed.push(SandboxId::parse(&id).unwrap());
    }
    wait_counts(
        &c,
        "fake",
        "default",
        WITHIN,
        "refilled after claims",
        |n| n.ready == SIZE && n.creating == 0,
    )
    .await;

    // A shrink retires the surplus; the workers delete it.
    set_classes(&c, "fake", class(2, 1.0)).await;
    wait_counts(&c, "fake", "default", WITHIN, "shrunk to 2", |n| {
        n == checks::Counts {
            creating: 0,
            ready: 2,
            retiring: 0,
        }
    })
    .await;
    let (max, samples) = sampler.stop().await;
    assert!(samples > 10, "the sampler took {samples} samples");
    assert!(
        max <= SIZE,
        "creating + ready reached {max}, over the size {SIZE}"
    );
    eprintln!("highest creating + ready: {max} (size {SIZE}, {samples} samples)");

    for id in &claimed {
        let (s, b) = c.delete(id).await;
        assert!(matches!(s, 200 | 202), "{b}");
        c.wait_status(id, SandboxStatus::Terminated, WITHIN).await;
    }
    settle_backend(&c, &["fake"], WITHIN, || fake_live(&c)).await;
    assert_eq!(fake_live(&c).len(), 2, "only the class's ready set is left");
    // No warm id was ever created twice on the backend.
    let mut created: HashMap<String, usize> = HashMap::new();
    for e in c.ledger() {
        if e.op == LedgerOp::Create && e.outcome == LedgerOutcome::Created {
            *created
                .entry(e.sandbox_id.unwrap().to_string())
                .or_default() += 1;
        }
    }
    assert!(created.values().all(|n| *n == 1), "{created:?}");
    eprintln!("instances created in all: {}", created.len());
    fault_invariants(&c).await;
}

/// Creates a sandbox with a TTL far from the class's expiry (`maxAgeSeconds` 3600 + 600), so
/// the claim call's renew is visible on the instance.
const TENANT_TTL: i64 = 7200;

/// The instance's expiry on the fake OpenSandbox server was moved to the tenant's TTL (plus
/// the adapter's backstop margin), away from the warm class's.
fn expiry_is_the_tenants(osb: &crate::fake_opensandbox::FakeServer, backend_ref: &str) {
    let sbx = osb.sandbox(backend_ref).expect("the instance lives");
    let left = sbx.expires_at.expect("an expiry") - chrono::Utc::now();
    assert!(
        left > chrono::Duration::seconds(TENANT_TTL - 60),
        "{backend_ref} expires in {left}, not the tenant's TTL"
    );
}

/// A provisioning sandbox's backend ref (it claimed a warm instance) once it is stored.
async fn claimed_row(c: &Cluster) -> (String, String, String) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let rows = rows(c).await;
        if let Some((id, (st, b))) = rows.into_iter().next() {
            return (id, st, b.unwrap_or_default());
        }
        assert!(
            Instant::now() < deadline,
            "the admission was never committed\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The same crash on a backend whose claim needs no call (the fake): the claim's commit made
/// the sandbox `running` on the instance, so nothing the killed API did not send is needed.
/// Another API serves it at once, its command reaches that instance, and it ends with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_killed_after_a_claim_without_a_call_the_sandbox_runs_on_it() {
    let mut c = Cluster::new(Opts {
        more_pools: WARM_CAPS.into(),
        ..Opts::default()
    })
    .await;
    c.spawn(
        "api1",
        "api",
        &[("DIFFERENTLY_FAULT_PAUSE", "api.after_admit_commit:120000")],
    );
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    set_classes(&c, "fake", class(2, 10.0)).await;
    wait_counts(&c, "fake", "default", WITHIN, "full", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let warm = warm_rows(&c, "fake").await;
    let pending = {
        let req = c.req(Method::POST, "/v1/sandboxes").json(&json!({}));
        tokio::spawn(async move { req.send().await })
    };
    let (id, status, backend_ref) = claimed_row(&c).await;
    let instance = warm
        .iter()
        .find(|w| w.id.as_str() == id)
        .unwrap_or_else(|| panic!("{id} is not one of the ready instances {warm:?}"));
    assert_eq!(
        status, "running",
        "a claim with no call runs from its commit"
    );
    assert_eq!(Some(backend_ref.clone()), instance.backend_ref);
    c.kill9("api1");
    assert!(pending.await.unwrap().is_err(), "the killed API answered");

    c.spawn("api2", "api", &[]);
    c.wait_ready().await;
    let id = SandboxId::parse(&id).unwrap();
    assert_eq!(c.get(&id).await["status"], "running");
    let (s, out) = c
        .call(
            &c.key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({ "command": ["echo", "claimed"] })),
        )
        .await;
    assert_eq!(
        (s, out["stdout"].as_str()),
        (200, Some("claimed\n")),
        "{out}"
    );
    let ledger = c.ledger();
    assert_eq!(created_count(&ledger, &id), 1, "{ledger:?}");
    assert!(
        ledger.iter().any(|e| e.op == LedgerOp::Exec
            && e.sandbox_id.as_ref() == Some(&id)
            && e.backend_ref.as_deref() == Some(backend_ref.as_str())),
        "the command did not reach the claimed instance: {ledger:?}"
    );
    wait_counts(&c, "fake", "default", WITHIN, "refilled", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let (s, b) = c.delete(&id).await;
    assert!(matches!(s, 200 | 202), "{b}");
    c.wait_status(&id, SandboxStatus::Terminated, WITHIN).await;
    settle_backend(&c, &["fake"], WITHIN, || fake_live(&c)).await;
    assert!(!fake_live(&c).contains_key(id.as_str()));
    let trail = fault_invariants(&c).await;
    let t = &trail[id.as_str()];
    let claims = t.iter().filter(|a| a.warm && a.status == "running").count();
    assert_eq!((claims, count(t, "sandbox.running")), (1, 0), "{id}: {t:?}");
}

/// An API killed between the commit of a create that claimed a warm instance and its publish
/// (the claim needs a call: the row is `provisioning` with the instance's ref). The client
/// has no answer, the create work was never sent, and yet the sandbox runs on that instance:
/// the leader's sweep re-sends the create, a worker makes the claim call. One instance, one
/// sandbox; the class refills and nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_killed_after_a_claims_commit_the_sandbox_still_runs_on_it() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn(
        "api1",
        "api",
        &[("DIFFERENTLY_FAULT_PAUSE", "api.after_admit_commit:120000")],
    );
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let osb = start_osb(&c).await;
    osb_pool(&c, &osb, &["api1"]).await;
    set_classes(&c, OSB, class(2, 10.0)).await;
    wait_counts(&c, OSB, "default", WITHIN, "full", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let warm = warm_rows(&c, OSB).await;

    let pending = {
        let req = c
            .req(Method::POST, "/v1/sandboxes")
            .json(&json!({ "ttlSeconds": TENANT_TTL }));
        tokio::spawn(async move { req.send().await })
    };
    let (id, status, backend_ref) = claimed_row(&c).await;
    let instance = warm
        .iter()
        .find(|w| w.id.as_str() == id)
        .unwrap_or_else(|| panic!("{id} is not one of the ready instances {warm:?}"));
    assert_eq!(
        status, "provisioning",
        "a claim with a call waits for the worker"
    );
    assert_eq!(Some(backend_ref.clone()), instance.backend_ref);
    c.kill9("api1");
    assert!(pending.await.unwrap().is_err(), "the killed API answered");
    assert_eq!(
        renewals_of(&osb, &backend_ref),
        0,
        "no claim call before the publish"
    );

    c.spawn("api2", "api", &[]);
    c.wait_ready().await;
    let id = SandboxId::parse(&id).unwrap();
    c.wait_status(&id, SandboxStatus::Running, WITHIN).await;
    assert!(
        c.log("scheduler")
            .lines()
            .any(|l| l.contains(id.as_str()) && l.contains("create_resent")),
        "the sweep did not re-send the lost create\n{}",
        c.log("scheduler")
    );
    assert!(renewals_of(&osb, &backend_ref) >= 1, "no claim call");
    expiry_is_the_tenants(&osb, &backend_ref);
    let live = osb_live(&osb);
    assert_eq!(live.get(id.as_str()), Some(&backend_ref), "{live:?}");
    let ledger = read_ledger(&c.dir.path().join("osb-ledger.jsonl")).unwrap();
    assert_eq!(created_count(&ledger, &id), 1, "{ledger:?}");

    wait_counts(&c, OSB, "default", WITHIN, "refilled", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let (s, b) = c.delete(&id).await;
    assert!(matches!(s, 200 | 202), "{b}");
    c.wait_status(&id, SandboxStatus::Terminated, WITHIN).await;
    settle_backend(&c, &[OSB], WITHIN, || osb_live(&osb)).await;
    assert!(!osb_live(&osb).contains_key(id.as_str()));
    let trail = fault_invariants(&c).await;
    let t = &trail[id.as_str()];
    let claims = t
        .iter()
        .filter(|a| a.warm && a.status == "provisioning")
        .count();
    assert_eq!((claims, count(t, "sandbox.running")), (1, 1), "{id}: {t:?}");
}

/// A worker killed right after a claim call reached the backend, before it recorded the
/// sandbox running. The work is redelivered to a second worker, which makes the (idempotent)
/// call again and records it: the sandbox runs exactly once, on the instance it claimed,
/// whose expiry is the tenant's; no second instance, nothing leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_after_a_claim_call_a_second_worker_finishes_it_once() {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn(
        "worker1",
        "worker",
        &[("DIFFERENTLY_FAULT_PAUSE", "worker.after_claim_call:120000")],
    );
    c.wait_ready().await;
    let osb = start_osb(&c).await;
    osb_pool(&c, &osb, &["api"]).await;
    set_classes(&c, OSB, class(2, 10.0)).await;
    wait_counts(&c, OSB, "default", WITHIN, "full", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let warm = warm_rows(&c, OSB).await;

    let (s, b) = c.create(json!({ "ttlSeconds": TENANT_TTL })).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (202, Some("provisioning")),
        "{b}"
    );
    let id = SandboxId::parse(b["id"].as_str().unwrap()).unwrap();
    let backend_ref = warm
        .iter()
        .find(|w| w.id == id)
        .and_then(|w| w.backend_ref.clone())
        .unwrap_or_else(|| panic!("{id} is not one of the ready instances {warm:?}"));
    let called = eventually(WITHIN, || renewals_of(&osb, &backend_ref) == 1).await;
    assert!(
        called,
        "the claim call never reached the backend\n{}",
        c.logs()
    );
    let paused = eventually(WITHIN, || {
        c.log("worker1")
            .contains("fault point: pausing after a claim call")
    })
    .await;
    assert!(paused, "{}", c.logs());
    assert_eq!(c.get(&id).await["status"], "provisioning");
    c.kill9("worker1");

    c.spawn("worker2", "worker", &[]);
    c.wait_status(&id, SandboxStatus::Running, WITHIN).await;
    let calls = renewals_of(&osb, &backend_ref);
    assert!(calls >= 1, "no claim call");
    eprintln!("claim calls on {backend_ref}: {calls}");
    expiry_is_the_tenants(&osb, &backend_ref);
    assert!(
        c.log("worker2")
            .lines()
            .any(|l| l.contains(id.as_str()) && l.contains("warm instance claimed")),
        "worker2 did not finish the claim\n{}",
        c.logs()
    );
    let live = osb_live(&osb);
    assert_eq!(live.get(id.as_str()), Some(&backend_ref), "{live:?}");
    let ledger = read_ledger(&c.dir.path().join("osb-ledger.jsonl")).unwrap();
    assert_eq!(created_count(&ledger, &id), 1, "{ledger:?}");
    assert_eq!(
        counts(&c, OSB, "default").await.retiring,
        0,
        "the claimed instance was retired"
    );

    wait_counts(&c, OSB, "default", WITHIN, "refilled", |n| {
        n.ready == 2 && n.creating == 0
    })
    .await;
    let (s, b) = c.delete(&id).await;
    assert!(matches!(s, 200 | 202), "{b}");
    c.wait_status(&id, SandboxStatus::Terminated, WITHIN).await;
    settle_backend(&c, &[OSB], WITHIN, || osb_live(&osb)).await;
    let trail = fault_invariants(&c).await;
    // Claimed (provisioning, a claim call to make) once, recorded running once.
    let t = &trail[id.as_str()];
    let claims = t
        .iter()
        .filter(|a| a.warm && a.status == "provisioning")
        .count();
    let ran = count(t, "sandbox.running");
    assert_eq!((claims, ran), (1, 1), "{id}: {t:?}");
}
