//! Hybrid placement end to end: a private pool (the real `opensandbox` adapter against the
//! adapters' fake OpenSandbox server) and an external Daytona pool (the real `daytona`
//! adapter against the fake Daytona of `adapters/tests/daytona`), all on loopback and in
//! region `us`. Work stays private by default; goes to Daytona only
//! when every policy level allows it and the global policy names the pool; `restricted`
//! data never leaves; a private outage does not spill over until policy says so; the
//! placement explanation says why each time. With a second external pool (E2B, the real
//! `e2b` adapter against the fake E2B of `adapters/tests/e2b`): each external pool gets work
//! only once the global policy names it, and then the strategy chooses between them.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::fake_daytona::FakeDaytona;
use crate::fake_e2b::FakeServer as FakeE2b;
use crate::fake_opensandbox::{FakeRuntime, FakeServer as FakeOpenSandbox, Variant};
use crate::harness::{eventually, Cluster, Opts};
use crate::hybrid::{create, placed_on, put_policy, wait_health, wait_running, waits_for, why};
use crate::tenancy::{tenant, Tenant};

const KEY: &str = "dtn_e2e_hybrid_0a1b2c3d4e5f";
const OSB_KEY: &str = "osb_e2e_hybrid_6a5b4c3d2e1f";

/// Registers `priv-us`, the private pool of region `us`: an `opensandbox` pool (the real
/// adapter) on the adapters' fake OpenSandbox server, through the API as an operator would.
async fn private_pool(c: &Cluster, osb: &FakeOpenSandbox, dir: &tempfile::TempDir) {
    let key_path = dir.path().join("opensandbox.key");
    std::fs::write(&key_path, OSB_KEY).unwrap();
    let (s, p) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({
                "name": "priv-us", "kind": "opensandbox", "trust": "private", "region": "us",
                "costPerCpuHour": 1.0,
                "settings": {
                    "apiURL": osb.api_url(),
                    "trust": "private",
                    "apiKeyFile": key_path,
                    "timeouts": {"requestSeconds": 2, "pollMillis": 20},
                },
            })),
        )
        .await;
    assert_eq!(s, 201, "{p}");
}

/// The `[[pools]]` entry of an external Daytona pool (region `us`) on `fake`, its key in a
/// file under `dir`.
fn daytona_pool(fake: &FakeDaytona, dir: &tempfile::TempDir) -> String {
    let key_path = dir.path().join("daytona.key");
    writeln!(std::fs::File::create(&key_path).unwrap(), "{KEY}").unwrap();
    format!(
        r#"
[[pools]]
name = "daytona-us"
kind = "daytona"
region = "us"
cost_per_cpu_hour = 0.01

[pools.settings]
apiURL = "{api}"
toolboxURL = "{toolbox}"
apiKeyFile = "{key}"
timeouts = {{ pollMillis = 20, readySeconds = 20 }}
"#,
        api = fake.api_url(),
        toolbox = fake.toolbox_url(),
        key = key_path.display(),
    )
}

/// Lets `t` place work on `daytona-us` at every policy level.
async fn allow_daytona(c: &Cluster, t: &Tenant) {
    put_policy(
        c,
        "/v1/admin/policies/global",
        json!({"allowExternal": true, "externalPools": ["daytona-us"]}),
    )
    .await;
    put_policy(
        c,
        &format!("/v1/orgs/{}/policy", t.org),
        json!({"allowExternal": true}),
    )
    .await;
    put_policy(
        c,
        &format!("/v1/projects/{}/policy", t.project),
        json!({"allowExternal": true}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_goes_to_daytona_only_when_policy_allows_and_never_restricted_data() {
    let fake = FakeDaytona::start(KEY).await;
    let keydir = tempfile::tempdir().unwrap();
    let more = daytona_pool(&fake, &keydir);
    let c = Cluster::started(Opts {
        more_pools: more,
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "org-a").await;
    // The private pool of region `us`, registered through the API so it can fail later.
    let osb = FakeOpenSandbox::start(Variant::Real, FakeRuntime::Docker, OSB_KEY).await;
    private_pool(&c, &osb, &keydir).await;
    let (_, d) = c
        .call(&c.key, Method::GET, "/v1/admin/pools/daytona-us", None)
        .await;
    assert_eq!(d["trust"], "external", "a provider is forced external: {d}");
    wait_health(&c, "priv-us", true).await;

    // 1. No policy allows external placement: private, even when Daytona is cheaper.
    let (id, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "priv-us");
    assert!(
        osb.sandboxes()
            .iter()
            .any(|s| s.state == "Running" && s.metadata.get("differently-sandbox-id") == Some(&id)),
        "the private pool's OpenSandbox server runs it: {:?}",
        osb.sandboxes()
    );
    let d = why(&c, &a, &id, "daytona-us").await;
    assert_eq!(d["eligible"], false, "{d}");
    let (s, e) = create(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "external required, nothing allows it: {e}");

    // 2. Global and org allow it and name the pool; the project does not: still private.
    put_policy(
        &c,
        "/v1/admin/policies/global",
        json!({"allowExternal": true, "externalPools": ["daytona-us"]}),
    )
    .await;
    put_policy(
        &c,
        &format!("/v1/orgs/{}/policy", a.org),
        json!({"allowExternal": true}),
    )
    .await;
    let (s, e) = create(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "the project level has not allowed it: {e}");

    // 3. Every level allows it: private-first still keeps work private by default…
    put_policy(
        &c,
        &format!("/v1/projects/{}/policy", a.project),
        json!({"allowExternal": true}),
    )
    .await;
    let (id, pool) = placed_on(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(pool, "priv-us", "private-first");
    let d = why(&c, &a, &id, "daytona-us").await;
    assert_eq!(d["eligible"], true, "{d}");
    // …and it goes to Daytona when asked for (or when cheapest wins).
    let (ext, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(pool, "daytona-us");
    let instances = fake.sandboxes();
    assert_eq!(instances.len(), 1, "one Daytona sandbox");
    assert_eq!(
        instances[0]
            .labels
            .get("differently-sandbox-id")
            .map(String::as_str),
        Some(ext.as_str())
    );
    let (s, out) = c
        .call(
            &a.key,
            Method::POST,
            &format!("/v1/sandboxes/{ext}/exec"),
            Some(json!({"command": ["sh", "-c", "echo from daytona"]})),
        )
        .await;
    assert_eq!((s, out["exitCode"].clone()), (200, json!(0)), "{out}");
    assert_eq!(out["stdout"], "from daytona\n");
    let (_, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "daytona-us", "cheapest, every level allows it");

    // 4. Restricted (and confidential) data never leaves, whatever is asked.
    for class in ["restricted", "confidential"] {
        let (s, e) = create(
            &c,
            &a,
            json!({"classification": class, "external": "required"}),
        )
        .await;
        assert_eq!(s, 422, "{class}: {e}");
        let (id, pool) = placed_on(
            &c,
            &a,
            json!({"classification": class, "strategy": "cheapest"}),
        )
        .await;
        assert_eq!(pool, "priv-us", "{class}");
        let d = why(&c, &a, &id, "daytona-us").await;
        assert_eq!(d["eligible"], false, "{d}");
        assert!(
            d["reason"].as_str().unwrap_or("").contains(class),
            "{class}: {d}"
        );
    }

    // 5. A private outage does not spill over while the project forbids external work…
    put_policy(
        &c,
        &format!("/v1/projects/{}/policy", a.project),
        json!({"allowExternal": false}),
    )
    .await;
    osb.knobs().unavailable = true;
    wait_health(&c, "priv-us", false).await;
    let before = fake.sandboxes().len();
    let (s, b) = create(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(s, 202, "{b}");
    let held = b["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_secs(2)).await;
    waits_for(&c, &a, &held, "priv-us").await;
    assert_eq!(fake.sandboxes().len(), before, "nothing went to Daytona");
    let d = why(&c, &a, &held, "daytona-us").await;
    assert_eq!(d["eligible"], false, "{d}");
    let p = why(&c, &a, &held, "priv-us").await;
    assert_eq!(p["eligible"], false, "{p}");

    // …and spills over once policy says so: the queued sandbox goes to Daytona.
    put_policy(
        &c,
        &format!("/v1/projects/{}/policy", a.project),
        json!({"allowExternal": true}),
    )
    .await;
    let r = wait_running(&c, &a, &held).await;
    assert_eq!(r["pool"], "daytona-us", "{r}");
    let d = why(&c, &a, &held, "daytona-us").await;
    assert_eq!(d["eligible"], true, "{d}");
    let labels: Vec<BTreeMap<String, String>> =
        fake.sandboxes().into_iter().map(|s| s.labels).collect();
    assert!(
        labels
            .iter()
            .any(|l| l.get("differently-sandbox-id") == Some(&held)),
        "{labels:?}"
    );

    // Deleting it deletes the Daytona sandbox.
    let (s, e) = c
        .call(
            &a.key,
            Method::DELETE,
            &format!("/v1/sandboxes/{held}"),
            None,
        )
        .await;
    assert!(s == 202 || s == 200, "{s}: {e}");
    let gone = eventually(Duration::from_secs(20), || {
        fake.sandboxes().iter().all(|s| {
            s.labels.get("differently-sandbox-id") != Some(&held) || s.state == "destroying"
        })
    })
    .await;
    assert!(gone, "the Daytona sandbox was not deleted\n{}", c.logs());
}

/// `kill -9` of the worker after Daytona's create, before the commit: the redelivered create
/// finds the sandbox by its label, so Daytona holds exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_killed_after_the_daytona_create_leaves_one_sandbox() {
    let fake = FakeDaytona::start(KEY).await;
    let keydir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(Opts {
        ack_wait_seconds: 2,
        more_pools: daytona_pool(&fake, &keydir),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn(
        "worker1",
        "worker",
        &[("DIFFERENTLY_FAULT_PAUSE", "worker.after_create:120000")],
    );
    c.wait_ready().await;
    let a = tenant(&c, "org-a").await;
    allow_daytona(&c, &a).await;
    let (s, b) = create(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().unwrap().to_owned();
    let created = eventually(Duration::from_secs(30), || fake.sandboxes().len() == 1).await;
    assert!(created, "Daytona never got the create\n{}", c.logs());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, r) = c
        .call(&a.key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(r["status"], "provisioning", "not committed yet: {r}");
    c.kill9("worker1");
    c.spawn("worker2", "worker", &[]);
    let r = wait_running(&c, &a, &id).await;
    assert_eq!(r["pool"], "daytona-us");
    let live = fake.sandboxes();
    assert_eq!(live.len(), 1, "exactly one Daytona sandbox: {live:?}");
    assert_eq!(
        live[0]
            .labels
            .get("differently-sandbox-id")
            .map(String::as_str),
        Some(id.as_str())
    );
    assert_eq!(
        fake.record().create_bodies.len(),
        1,
        "the redelivered create found the first sandbox instead of creating"
    );
}

/// The `[[pools]]` entry of an external E2B pool (region `us`, cheaper than Daytona) on
/// `fake`, its key in a file under `dir`.
fn e2b_pool(fake: &FakeE2b, dir: &tempfile::TempDir) -> String {
    let key_path = dir.path().join("e2b.key");
    writeln!(std::fs::File::create(&key_path).unwrap(), "{E2B_KEY}").unwrap();
    format!(
        r#"
[[pools]]
name = "e2b-us"
kind = "e2b"
region = "us"
cost_per_cpu_hour = 0.005

[pools.settings]
apiURL = "{api}"
envdURL = "{envd}"
apiKeyFile = "{key}"
timeouts = {{ pollMillis = 20, readySeconds = 20, requestSeconds = 10 }}
"#,
        api = fake.api_url(),
        envd = fake.envd_url(),
        key = key_path.display(),
    )
}

const E2B_KEY: &str = "e2b_e2e_hybrid_5f4e3d2c1b0a";

/// Two external providers beside the private pool: an external pool the global policy does
/// not name gets nothing, even when it is the cheapest; once it is named, the strategy
/// chooses between the two; the private pool still wins by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_external_pool_gets_work_only_once_the_global_policy_names_it() {
    let daytona = FakeDaytona::start(KEY).await;
    let e2b = FakeE2b::start(E2B_KEY).await;
    let keydir = tempfile::tempdir().unwrap();
    let more = format!(
        "{}{}",
        daytona_pool(&daytona, &keydir),
        e2b_pool(&e2b, &keydir)
    );
    let c = Cluster::started(Opts {
        more_pools: more,
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "org-a").await;
    let osb = FakeOpenSandbox::start(Variant::Real, FakeRuntime::Docker, OSB_KEY).await;
    private_pool(&c, &osb, &keydir).await;
    let (_, e) = c
        .call(&c.key, Method::GET, "/v1/admin/pools/e2b-us", None)
        .await;
    assert_eq!(e["trust"], "external", "a provider is forced external: {e}");
    wait_health(&c, "priv-us", true).await;
    wait_health(&c, "e2b-us", true).await;

    // Every level allows external work; the global policy names Daytona only.
    allow_daytona(&c, &a).await;
    let (id, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "daytona-us", "E2B is cheaper but not named");
    let d = why(&c, &a, &id, "e2b-us").await;
    assert_eq!(d["eligible"], false, "{d}");
    assert!(
        d["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "the explanation says why E2B was passed over: {d}"
    );
    let (_, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(pool, "daytona-us");
    assert!(e2b.sandboxes().is_empty(), "nothing went to E2B");

    // Named too: the cheapest strategy now takes E2B; private-first still stays private.
    put_policy(
        &c,
        "/v1/admin/policies/global",
        json!({"allowExternal": true, "externalPools": ["daytona-us", "e2b-us"]}),
    )
    .await;
    let (id, pool) = placed_on(
        &c,
        &a,
        json!({"classification": "public", "strategy": "cheapest"}),
    )
    .await;
    assert_eq!(pool, "e2b-us", "the cheapest named external pool");
    let d = why(&c, &a, &id, "e2b-us").await;
    assert_eq!(d["eligible"], true, "{d}");
    let made = e2b.sandboxes();
    assert_eq!(made.len(), 1, "one E2B sandbox: {made:?}");
    assert_eq!(
        made[0]
            .metadata
            .get("differently-sandbox-id")
            .map(String::as_str),
        Some(id.as_str())
    );
    let (_, pool) = placed_on(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(pool, "priv-us", "private-first by default");
    // Restricted data goes to neither provider.
    let (s, e) = create(
        &c,
        &a,
        json!({"classification": "restricted", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    assert_eq!(e2b.sandboxes().len(), 1);
}
