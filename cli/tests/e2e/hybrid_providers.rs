//! Hybrid placement across the newer providers, end to end: a private `agent_sandbox` pool
//! (the real adapter against the adapters' fake Kubernetes cluster, router and runtime) and
//! three external pools, `runloop`, `cloudflare` and `azure_sessions` (each the real adapter
//! against its adapter tests' fake), all on loopback and in region `us`. Through `/v1` only,
//! with the placement explanation each time: work stays private by default; `external:
//! required` lands on exactly the external pool the global policy names; a private outage
//! waits while the project forbids external work and overflows to the named pool once it
//! allows it, while `restricted` data never leaves; deleting a sandbox removes its backend
//! instance on every fake.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::fake_azure::FakePool as FakeAzure;
use crate::fake_bridge::FakeBridge;
use crate::fake_k8s::FakeCluster;
use crate::fake_runloop::FakeRunloop;
use crate::harness::{eventually, Cluster, Opts};
use crate::hybrid::{
    create, placed_on, put_policy, status, wait_health, wait_running, waits_for, why,
};
use crate::tenancy::{tenant, Tenant};

const K8S_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.e2e-hybrid-service-account.c2lnbmF0dXJl";
const RUNLOOP_KEY: &str = "ak_e2e_hybrid_7c1d9e3f5a2b";
const CF_KEY: &str = "9e2d4c6b8a0f1e3d5c7b9a1f2e4d6c8b";
const AZURE_TOKEN: &str =
    "eyJ0eXAiOiJKV1QifQ.eyJhdWQiOiJodHRwczovL2R5bmFtaWNzZXNzaW9ucy5pbyJ9.aHli";
const NS: &str = "sandboxes";
const WARM_POOL: &str = "python-pool";
const PRIV: &str = "k8s-us";
const EXTERNAL: [&str; 3] = ["runloop-us", "cloudflare-us", "azure-us"];

/// The four fakes, so a test can ask each what it holds.
struct Fakes {
    k8s: FakeCluster,
    runloop: FakeRunloop,
    cf: FakeBridge,
    azure: FakeAzure,
}

impl Fakes {
    async fn start() -> Fakes {
        let k8s = FakeCluster::start(K8S_TOKEN).await;
        // A warm pool whose template allows env, as an operator's python-runtime pool would.
        k8s.add_template_and_pool(NS, WARM_POOL, 2, Some("Overrides"), &[]);
        Fakes {
            k8s,
            runloop: FakeRunloop::start(RUNLOOP_KEY).await,
            cf: FakeBridge::start(CF_KEY).await,
            azure: FakeAzure::start(AZURE_TOKEN).await,
        }
    }

    /// How many backend instances on `pool`'s fake carry sandbox `id` (live ones only).
    fn tagged(&self, pool: &str, id: &str) -> usize {
        match pool {
            PRIV => self
                .k8s
                .objects("sandboxclaims", NS)
                .values()
                .filter(|v| {
                    v["metadata"]["labels"]["differently-sandbox-id"] == id
                        && v["metadata"].get("deletionTimestamp").is_none()
                })
                .count(),
            "runloop-us" => self
                .runloop
                .live()
                .iter()
                .filter(|d| {
                    d.metadata.get("differently-sandbox-id").map(String::as_str) == Some(id)
                })
                .count(),
            // A container is the sandbox's while it holds the marker create wrote.
            "cloudflare-us" => self
                .cf
                .assigned()
                .iter()
                .filter_map(|name| self.cf.workspace(name))
                .filter_map(|ws| std::fs::read(ws.join(".differently/sandbox.json")).ok())
                .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
                .filter(|m| m["sandboxId"] == id)
                .count(),
            // A session carries nothing but its identifier, which ends with the sandbox's ulid.
            "azure-us" => {
                let ulid = id.split_once('_').map_or(id, |(_, u)| u);
                let suffix = format!("-{ulid}");
                self.azure
                    .sessions()
                    .iter()
                    .filter(|s| s.ends_with(&suffix))
                    .count()
            }
            other => panic!("no fake for {other}"),
        }
    }

    /// Sandboxes on every external fake, whoever they belong to: devboxes not shut down,
    /// bridge containers holding a sandbox's marker (not the index container, nor an empty
    /// one a lookup started) and sessions.
    fn external_total(&self) -> usize {
        let marked = self
            .cf
            .assigned()
            .iter()
            .filter_map(|name| self.cf.workspace(name))
            .filter(|ws| ws.join(".differently/sandbox.json").exists())
            .count();
        self.runloop.live().len() + marked + self.azure.sessions().len()
    }
}

fn key_file(dir: &tempfile::TempDir, name: &str, key: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, key).unwrap();
    path.display().to_string()
}

/// The `[[pools]]` entries of the three external pools, their keys in files under `dir`.
fn external_pools(f: &Fakes, dir: &tempfile::TempDir) -> String {
    format!(
        r#"
[[pools]]
name = "runloop-us"
kind = "runloop"
region = "us"
cost_per_cpu_hour = 0.01

[pools.settings]
apiURL = "{runloop}"
apiKeyFile = "{runloop_key}"
timeouts = {{ pollMillis = 20, readySeconds = 20, requestSeconds = 10 }}

[[pools]]
name = "cloudflare-us"
kind = "cloudflare"
region = "us"
cost_per_cpu_hour = 0.01

[pools.settings]
bridgeURL = "{cf}"
apiKeyFile = "{cf_key}"
timeouts = {{ requestSeconds = 20 }}

[[pools]]
name = "azure-us"
kind = "azure_sessions"
region = "us"
cost_per_cpu_hour = 0.01

[pools.settings]
poolManagementEndpoint = "{azure}"
dataDir = "{azure_data}"
tokenFile = "{azure_token}"
timeouts = {{ requestSeconds = 20 }}
"#,
        runloop = f.runloop.url(),
        runloop_key = key_file(dir, "runloop.key", RUNLOOP_KEY),
        cf = f.cf.url(),
        cf_key = key_file(dir, "cloudflare.key", CF_KEY),
        azure = f.azure.endpoint(),
        azure_data = f.azure.data_dir().display(),
        azure_token = key_file(dir, "azure.token", AZURE_TOKEN),
    )
}

/// Registers the private `agent_sandbox` pool through the API, as an operator would: claim
/// mode on the fake cluster's warm pool, through its router.
async fn private_pool(c: &Cluster, f: &Fakes, dir: &tempfile::TempDir) {
    let (s, p) = c
        .call(
            &c.key,
            Method::POST,
            "/v1/admin/pools",
            Some(json!({
                "name": PRIV, "kind": "agent_sandbox", "trust": "private", "region": "us",
                "costPerCpuHour": 1.0,
                "settings": {
                    "apiServerURL": f.k8s.api_url(),
                    "namespace": NS,
                    "warmPool": WARM_POOL,
                    "runtime": {"routerURL": f.k8s.router_url(), "baseDir": "/"},
                    "tokenFile": key_file(dir, "k8s.token", K8S_TOKEN),
                    "timeouts": {"pollMillis": 20, "readySeconds": 20, "requestSeconds": 10},
                },
            })),
        )
        .await;
    assert_eq!(s, 201, "{p}");
}

async fn project_allows(c: &Cluster, t: &Tenant, allow: bool) {
    put_policy(
        c,
        &format!("/v1/projects/{}/policy", t.project),
        json!({ "allowExternal": allow }),
    )
    .await;
}

/// The global policy allows external work on `pool` alone.
async fn name_only(c: &Cluster, pool: &str) {
    put_policy(
        c,
        "/v1/admin/policies/global",
        json!({"allowExternal": true, "externalPools": [pool]}),
    )
    .await;
}

/// Runs `echo` in `id` through `/v1` exec and checks its output.
async fn echo(c: &Cluster, t: &Tenant, id: &str, pool: &str) {
    let (s, out) = c
        .call(
            &t.key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": ["sh", "-c", format!("echo from {pool}")]})),
        )
        .await;
    assert_eq!(
        (s, out["exitCode"].clone()),
        (200, json!(0)),
        "{pool}: {out}"
    );
    assert_eq!(out["stdout"], format!("from {pool}\n"), "{pool}: {out}");
}

/// Whether pool `pool` declares capability `cap` (`GET /v1/admin/pools/{pool}`).
async fn declares(c: &Cluster, pool: &str, cap: &str) -> bool {
    let (s, p) = c
        .call(
            &c.key,
            Method::GET,
            &format!("/v1/admin/pools/{pool}"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{p}");
    p["capabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("no capabilities in {p}"))
        .iter()
        .any(|c| c == cap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_first_then_each_named_provider_then_overflow_under_policy() {
    let f = Fakes::start().await;
    let keydir = tempfile::tempdir().unwrap();
    let c = Cluster::started(Opts {
        more_pools: external_pools(&f, &keydir),
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "org-a").await;
    private_pool(&c, &f, &keydir).await;
    for pool in EXTERNAL {
        let (_, p) = c
            .call(
                &c.key,
                Method::GET,
                &format!("/v1/admin/pools/{pool}"),
                None,
            )
            .await;
        assert_eq!(p["trust"], "external", "a provider is forced external: {p}");
        wait_health(&c, pool, true).await;
    }
    wait_health(&c, PRIV, true).await;
    let mut made: Vec<(String, String)> = Vec::new();

    // 1. Nothing allows external work: private, and exec runs there.
    let (id, pool) = placed_on(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(pool, PRIV);
    assert_eq!(f.tagged(PRIV, &id), 1, "one claim on the cluster for {id}");
    let p = why(&c, &a, &id, PRIV).await;
    assert_eq!(p["eligible"], true, "{p}");
    for ext in EXTERNAL {
        let d = why(&c, &a, &id, ext).await;
        assert_eq!(d["eligible"], false, "{d}");
    }
    echo(&c, &a, &id, PRIV).await;
    let (s, e) = create(
        &c,
        &a,
        json!({"classification": "public", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "external required, nothing allows it: {e}");
    assert_eq!(f.external_total(), 0, "nothing went to a provider");
    made.push((id, pool));

    // 2. Every level allows external work; the global policy names one provider at a time,
    // and `external: required` lands on exactly that one.
    put_policy(
        &c,
        &format!("/v1/orgs/{}/policy", a.org),
        json!({"allowExternal": true}),
    )
    .await;
    project_allows(&c, &a, true).await;
    for ext in EXTERNAL {
        name_only(&c, ext).await;
        let (id, pool) = placed_on(
            &c,
            &a,
            json!({"classification": "public", "external": "required"}),
        )
        .await;
        assert_eq!(pool, ext, "the one named external pool");
        assert_eq!(f.tagged(ext, &id), 1, "{ext} holds one instance of {id}");
        let d = why(&c, &a, &id, ext).await;
        assert_eq!(d["eligible"], true, "{d}");
        for other in EXTERNAL.iter().filter(|o| **o != ext) {
            let d = why(&c, &a, &id, other).await;
            assert_eq!(d["eligible"], false, "{other} is not named: {d}");
            assert_eq!(f.tagged(other, &id), 0, "{other} got nothing of {id}");
        }
        // Each of the three declares `exec` (docs/providers.md); exec goes through `/v1`.
        assert!(declares(&c, ext, "exec").await, "{ext} declares exec");
        echo(&c, &a, &id, ext).await;
        made.push((id, pool));
    }
    // Private-first still keeps a default create private, every level allowing.
    let (id, pool) = placed_on(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(pool, PRIV, "private-first");
    made.push((id, pool));

    // 3. The private pool goes down (the cluster refuses its token) while the project
    // forbids external work: a public create waits for it.
    let overflow_to = "runloop-us";
    name_only(&c, overflow_to).await;
    project_allows(&c, &a, false).await;
    f.k8s.set_token("revoked-e2e-token");
    wait_health(&c, PRIV, false).await;
    let before = f.external_total();
    let (s, b) = create(&c, &a, json!({"classification": "public"})).await;
    assert_eq!(s, 202, "{b}");
    let held = b["id"].as_str().unwrap().to_owned();
    // Restricted data asked to leave is refused outright; asked for nothing, it waits.
    let (s, e) = create(
        &c,
        &a,
        json!({"classification": "restricted", "external": "required"}),
    )
    .await;
    assert_eq!(s, 422, "restricted never goes external: {e}");
    let (s, b) = create(&c, &a, json!({"classification": "restricted"})).await;
    assert_eq!(s, 202, "{b}");
    let secret = b["id"].as_str().unwrap().to_owned();
    // Give the scheduler a few passes to (wrongly) place either.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in [&held, &secret] {
        waits_for(&c, &a, id, PRIV).await;
        let d = why(&c, &a, id, overflow_to).await;
        assert_eq!(d["eligible"], false, "{d}");
    }
    assert_eq!(f.external_total(), before, "nothing went to a provider");

    // Once the project allows it, the public one overflows to the named pool; the
    // restricted one still waits.
    project_allows(&c, &a, true).await;
    let r = wait_running(&c, &a, &held).await;
    assert_eq!(r["pool"], overflow_to, "{r}");
    assert_eq!(f.tagged(overflow_to, &held), 1);
    let d = why(&c, &a, &held, overflow_to).await;
    assert_eq!(d["eligible"], true, "{d}");
    echo(&c, &a, &held, overflow_to).await;
    made.push((held, overflow_to.to_owned()));
    let r = status(&c, &a, &secret).await;
    assert_eq!(
        r["status"], "queued",
        "restricted data never overflows: {r}"
    );
    let d = why(&c, &a, &secret, overflow_to).await;
    assert_eq!(d["eligible"], false, "{d}");
    assert!(
        d["reason"].as_str().unwrap_or("").contains("restricted"),
        "{d}"
    );
    for ext in EXTERNAL {
        assert_eq!(f.tagged(ext, &secret), 0, "{ext} got restricted data");
    }
    // The cluster takes the token again: the restricted sandbox runs privately.
    f.k8s.set_token(K8S_TOKEN);
    let r = wait_running(&c, &a, &secret).await;
    assert_eq!(r["pool"], PRIV, "{r}");
    assert_eq!(f.tagged(PRIV, &secret), 1);
    made.push((secret, PRIV.to_owned()));

    // 4. Deleting each sandbox removes its backend instance on its fake.
    for (id, pool) in &made {
        let (s, e) = c
            .call(&a.key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert!(s == 202 || s == 200, "{id} on {pool}: {s}: {e}");
    }
    for (id, pool) in &made {
        let gone = eventually(Duration::from_secs(60), || f.tagged(pool, id) == 0).await;
        assert!(gone, "{pool} still holds {id}\n{}", c.logs());
    }
}
