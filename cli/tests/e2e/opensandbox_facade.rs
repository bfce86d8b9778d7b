//! The OpenSandbox facade (`/opensandbox`, issue 23) driven by OpenSandbox's own clients: the
//! official Python SDK (async and sync, direct and server-proxy endpoints), the official
//! TypeScript SDK, the official CLI and one agent-framework integration
//! (`langchain-opensandbox`), against `differently dev` and against a three-process cluster;
//! plus tenancy, the quota queue and error shapes through the facade.
//!
//! Finding the clients: `DIFFERENTLY_OPENSANDBOX_PY` (a venv with `opensandbox==1.1.1`,
//! `opensandbox-cli==1.1.1` and `langchain-opensandbox==0.1.0`) and
//! `DIFFERENTLY_OPENSANDBOX_TS` (a directory whose `node_modules` has
//! `@alibaba-group/opensandbox@0.1.11`), else the directories `scripts/test` installs them into
//! (`${XDG_CACHE_HOME:-~/.cache}/differently/opensandbox-py` and `…/opensandbox-ts`). Missing
//! is a failure that says how to install them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{binary, free_port, Cluster, Opts, Proc};

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"))
        .join("differently")
}

pub fn py_venv() -> PathBuf {
    let p = std::env::var_os("DIFFERENTLY_OPENSANDBOX_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("opensandbox-py"));
    assert!(
        p.join("bin/python").is_file() && p.join("bin/osb").is_file(),
        "no OpenSandbox Python clients at {} (set DIFFERENTLY_OPENSANDBOX_PY, or run scripts/test, \
         or: python3 -m venv {0} && {0}/bin/pip install opensandbox==1.1.1 opensandbox-cli==1.1.1 \
         langchain-opensandbox==0.1.0)",
        p.display()
    );
    p
}

fn ts_dir() -> PathBuf {
    let p = std::env::var_os("DIFFERENTLY_OPENSANDBOX_TS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("opensandbox-ts"));
    assert!(
        p.join("node_modules/@alibaba-group/opensandbox/package.json").is_file(),
        "no OpenSandbox TypeScript SDK under {} (set DIFFERENTLY_OPENSANDBOX_TS, or run \
         scripts/test, or: mkdir -p {0} && cd {0} && npm install @alibaba-group/opensandbox@0.1.11)",
        p.display()
    );
    p
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e/opensandbox")
        .join(name)
}

/// Runs one client script with the facade's domain and `key`; fails with its output.
fn run_client(what: &str, mut cmd: Command, domain: &str, key: &str) -> Duration {
    let started = Instant::now();
    let out = cmd
        .env("OSB_DOMAIN", domain)
        .env("OSB_KEY", key)
        .env("OPEN_SANDBOX_DOMAIN", domain)
        .env("OPEN_SANDBOX_API_KEY", key)
        .env("OPENSANDBOX_DISABLE_METRICS", "1")
        .env("OSB_IMAGE", "default")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run the {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("PASS"),
        "{what} failed against the facade:\n{text}"
    );
    started.elapsed()
}

/// Every client's flow against `domain` (`host:port/opensandbox`) with `key`.
fn all_clients(domain: &str, key: &str, with_cli: bool) {
    let venv = py_venv();
    let py = venv.join("bin/python");
    let mut c = Command::new(&py);
    c.arg(script("sdk_flow.py"));
    let t = run_client("Python SDK flow", c, domain, key);
    eprintln!("python sdk flow: {t:?}");
    // ESM resolves packages from the script's own directory: run a copy beside node_modules.
    let ts = ts_dir();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(ts.join("node_modules"), dir.path().join("node_modules")).unwrap();
    std::fs::copy(script("sdk_flow.mjs"), dir.path().join("flow.mjs")).unwrap();
    let mut c = Command::new("node");
    c.arg(dir.path().join("flow.mjs"));
    let t = run_client("TypeScript SDK flow", c, domain, key);
    eprintln!("typescript sdk flow: {t:?}");
    let mut c = Command::new(&py);
    c.arg(script("langchain_tool.py"));
    let t = run_client("langchain-opensandbox tool", c, domain, key);
    eprintln!("langchain tool: {t:?}");
    if with_cli {
        let mut c = Command::new("bash");
        c.arg(script("cli_flow.sh"))
            .env("OSB", venv.join("bin/osb"));
        let t = run_client("OpenSandbox CLI flow", c, domain, key);
        eprintln!("cli flow: {t:?}");
    }
}

/// `differently dev` on a free port: (process, url, admin key).
fn start_dev(root: &Path) -> (Proc, String, String) {
    let port = free_port();
    let child = Command::new(binary())
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(root.join("sandboxes"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(root.join("dev.log")).unwrap())
        .spawn()
        .unwrap();
    let mut proc = Proc { child };
    let mut lines = BufReader::new(proc.child.stdout.take().unwrap()).lines();
    let url = lines.next().unwrap().unwrap();
    let key = lines.next().unwrap().unwrap();
    let url = url
        .strip_prefix("export DIFFERENTLY_URL=")
        .unwrap()
        .to_owned();
    let key = key
        .strip_prefix("export DIFFERENTLY_API_KEY=")
        .unwrap()
        .to_owned();
    (proc, url, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_clients_drive_the_facade_on_differently_dev() {
    let root = tempfile::tempdir().unwrap();
    let (_dev, url, key) = start_dev(root.path());
    let domain = format!("{}/opensandbox", url.trim_start_matches("http://"));
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http
        .get(format!("{url}/opensandbox/health"))
        .send()
        .await
        .map_or(true, |r| r.status() != 200)
    {
        assert!(Instant::now() < deadline, "dev did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let k = key.clone();
    tokio::task::spawn_blocking(move || all_clients(&domain, &k, true))
        .await
        .unwrap();
    snapshots_through_the_facade(&http, &url, &key).await;
}

/// Snapshot, list, restore into a new sandbox and delete, through the facade (devhost pool).
async fn snapshots_through_the_facade(http: &reqwest::Client, base: &str, key: &str) {
    let create = json!({"image": {"uri": "default"}, "timeout": 600});
    let (s, sbx) = osb(
        http,
        base,
        Some(key),
        Method::POST,
        "/v1/sandboxes",
        Some(create),
    )
    .await;
    assert_eq!(s, 202, "{sbx}");
    let id = sbx["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, info) = osb(
            http,
            base,
            Some(key),
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await;
        if info["status"]["state"] == "Running" {
            break;
        }
        assert!(Instant::now() < deadline, "never ran: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, snp) = osb(
        http,
        base,
        Some(key),
        Method::POST,
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(json!({"name": "facade"})),
    )
    .await;
    assert_eq!(s, 202, "{snp}");
    let sid = snp["id"].as_str().unwrap().to_owned();
    assert_eq!(snp["sandboxId"], id.as_str());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, got) = osb(
            http,
            base,
            Some(key),
            Method::GET,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
        assert_eq!(s, 200, "{got}");
        if got["status"]["state"] == "Ready" {
            break;
        }
        assert_ne!(got["status"]["state"], "Failed", "{got}");
        assert!(Instant::now() < deadline, "snapshot never ready: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, list) = osb(
        http,
        base,
        Some(key),
        Method::GET,
        &format!("/v1/snapshots?sandboxId={id}"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["items"][0]["id"], sid.as_str(), "{list}");
    let (s, restored) = osb(
        http,
        base,
        Some(key),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"snapshotId": sid, "timeout": 600})),
    )
    .await;
    assert_eq!(s, 202, "restore: {restored}");
    let rid = restored["id"].as_str().unwrap().to_owned();
    for sbx in [&id, &rid] {
        let (s, e) = osb(
            http,
            base,
            Some(key),
            Method::DELETE,
            &format!("/v1/sandboxes/{sbx}"),
            None,
        )
        .await;
        assert_eq!(s, 204, "{e}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, e) = osb(
            http,
            base,
            Some(key),
            Method::DELETE,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
        if s == 204 {
            break;
        }
        assert_eq!(s, 409, "delete snapshot: {e}");
        assert!(Instant::now() < deadline, "snapshot never deletable: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (s, e) = osb(
        http,
        base,
        Some(key),
        Method::GET,
        &format!("/v1/snapshots/{sid}"),
        None,
    )
    .await;
    assert!(s == 404 || e["status"]["state"] == "Deleting", "{s} {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_drive_the_facade_on_a_three_process_cluster() {
    // A devhost pool beside the harness's fake one (fake interprets no shell), and a global
    // policy that denies the fake pool, so every sandbox is placed on the devhost pool.
    let mut c = Cluster::new(Opts {
        more_pools: "[[pools]]\nname = \"local\"\nkind = \"devhost\"\n[pools.settings]\nroot = \"{ledger}.devhost\"\n".into(),
        ..Opts::default()
    })
    .await;
    c.spawn("api", "api", &[]);
    c.spawn("scheduler", "scheduler", &[]);
    c.spawn("worker", "worker", &[]);
    c.wait_ready().await;
    let key = c.key.clone();
    c.deny_fake_pool().await;
    let domain = format!("127.0.0.1:{}/opensandbox", c.port);
    tokio::task::spawn_blocking(move || all_clients(&domain, &key, false))
        .await
        .unwrap();
    c.assert_alive("api");
}

/// Sends an OpenSandbox-style request (key in `OPEN-SANDBOX-API-KEY`).
async fn osb(
    http: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = http.request(method, format!("{base}/opensandbox{path}"));
    if let Some(k) = key {
        r = r.header("OPEN-SANDBOX-API-KEY", k);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let s = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (s, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated_quotas_queue_and_errors_keep_opensandbox_shapes() {
    let mut c = Cluster::started(Opts::default()).await;
    c.wait_ready().await;
    let http = reqwest::Client::new();
    let base = c.url();
    let mut keys = Vec::new();
    for name in ["osb-a", "osb-b"] {
        let t = crate::tenancy::tenant(&c, name).await;
        let (s, k) = c
            .call(
                &c.key.clone(),
                Method::POST,
                "/v1/keys",
                Some(json!({"orgId": t.org, "projectId": t.project, "name": "osb",
                    "scopes": ["sandboxes:read", "sandboxes:write", "sandboxes:exec", "files:read", "files:write"]})),
            )
            .await;
        assert_eq!(s, 201, "{k}");
        keys.push((t, k["key"].as_str().unwrap().to_owned()));
    }
    let (a, ka) = &keys[0];
    let (_b, kb) = &keys[1];
    let create = json!({"image": {"uri": "default"}, "timeout": 600,
        "resourceLimits": {"cpu": "1", "memory": "512Mi"}, "entrypoint": ["tail", "-f", "/dev/null"],
        "metadata": {"team": "a"}});
    let (s, sa) = osb(
        &http,
        &base,
        Some(ka),
        Method::POST,
        "/v1/sandboxes",
        Some(create.clone()),
    )
    .await;
    assert_eq!(s, 202, "{sa}");
    let id = sa["id"].as_str().unwrap().to_owned();
    assert!(
        ["Pending", "Running"].contains(&sa["status"]["state"].as_str().unwrap()),
        "{sa}"
    );
    // B sees nothing of A's: get, endpoints, delete and list.
    for (m, p) in [
        (Method::GET, format!("/v1/sandboxes/{id}")),
        (Method::GET, format!("/v1/sandboxes/{id}/endpoints/44772")),
        (Method::DELETE, format!("/v1/sandboxes/{id}")),
        (Method::POST, format!("/v1/sandboxes/{id}/pause")),
    ] {
        let (s, e) = osb(&http, &base, Some(kb), m.clone(), &p, None).await;
        assert_eq!(s, 404, "{m} {p}: {e}");
        assert_eq!(e["code"], "DIFFERENTLY::SANDBOX_NOT_FOUND", "{e}");
        assert!(e["message"].is_string(), "{e}");
    }
    let (s, l) = osb(&http, &base, Some(kb), Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(s, 200);
    assert_eq!(l["pagination"]["totalItems"], 0, "{l}");
    let (_, l) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        "/v1/sandboxes?metadata=team%3Da&state=Running&state=Pending",
        None,
    )
    .await;
    assert_eq!(l["items"][0]["id"], id.as_str(), "{l}");
    // A's execd token works for A's sandbox only, and never as B's key.
    let (_, ep) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        &format!("/v1/sandboxes/{id}/endpoints/44772"),
        None,
    )
    .await;
    let token = ep["headers"]["x-differently-execd-token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        ep["endpoint"],
        format!("127.0.0.1:{}/opensandbox/execd/{id}", c.port)
    );
    let ping = |tok: Option<String>, sbx: String| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let mut r = http.get(format!("{base}/opensandbox/execd/{sbx}/ping"));
            if let Some(t) = tok {
                r = r.header("x-differently-execd-token", t);
            }
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, body) = ping(Some(token.clone()), id.clone()).await;
        if s == 200 {
            break;
        }
        assert_eq!(s, 409, "a starting sandbox answers 409 to /ping: {body}");
        assert!(Instant::now() < deadline, "never became pingable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, body) = ping(None, id.clone()).await;
    assert_eq!(s, 401, "{body}");
    let (s, body) = ping(Some(format!("{token}x")), id.clone()).await;
    assert_eq!(s, 401, "a tampered token: {body}");
    let (s, sb2) = osb(
        &http,
        &base,
        Some(kb),
        Method::POST,
        "/v1/sandboxes",
        Some(create.clone()),
    )
    .await;
    assert_eq!(s, 202);
    let other = sb2["id"].as_str().unwrap().to_owned();
    let (s, body) = ping(Some(token.clone()), other.clone()).await;
    assert_eq!(s, 401, "A's token on B's sandbox: {body}");

    // Quota: A may run one sandbox; a second is admitted Pending and runs once the first goes.
    let (s, q) = c
        .call(
            &c.key.clone(),
            Method::PUT,
            &format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 1, "maxCpu": 4})),
        )
        .await;
    assert_eq!(s, 200, "{q}");
    let (s, queued) = osb(
        &http,
        &base,
        Some(ka),
        Method::POST,
        "/v1/sandboxes",
        Some(create.clone()),
    )
    .await;
    assert_eq!(
        s, 202,
        "a create over the quota queues, not fails: {queued}"
    );
    let qid = queued["id"].as_str().unwrap().to_owned();
    assert_eq!(queued["status"]["state"], "Pending", "{queued}");
    let (_, info) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        &format!("/v1/sandboxes/{qid}"),
        None,
    )
    .await;
    assert_eq!(info["status"]["state"], "Pending", "{info}");
    assert!(
        info["status"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("quota"),
        "{info}"
    );
    assert_eq!(
        info["extensions"]["differently.placement"],
        format!("/v1/sandboxes/{qid}/placement")
    );
    let (_, qep) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        &format!("/v1/sandboxes/{qid}/endpoints/44772"),
        None,
    )
    .await;
    let qtoken = qep["headers"]["x-differently-execd-token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (s, _) = ping(Some(qtoken.clone()), qid.clone()).await;
    assert_eq!(s, 409, "the queued sandbox is not ready");
    let (s, _) = osb(
        &http,
        &base,
        Some(ka),
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(s, 204);
    let (s, e) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (404, Some("DIFFERENTLY::SANDBOX_NOT_FOUND")),
        "{e}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while ping(Some(qtoken.clone()), qid.clone()).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the queued sandbox never ran after the first went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Error shapes: OpenSandbox's {code, message}.
    let (s, e) = osb(&http, &base, None, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (401, Some("MISSING_API_KEY")),
        "{e}"
    );
    let (s, e) = osb(
        &http,
        &base,
        Some("dly_nope"),
        Method::GET,
        "/v1/sandboxes",
        None,
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (401, Some("INVALID_API_KEY")),
        "{e}"
    );
    let mut bad = create.clone();
    bad["networkPolicy"] =
        json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]});
    let (s, e) = osb(
        &http,
        &base,
        Some(ka),
        Method::POST,
        "/v1/sandboxes",
        Some(bad),
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("SANDBOX::INVALID_PARAMETER")),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap().starts_with("networkPolicy"),
        "{e}"
    );
    let (s, e) = osb(
        &http,
        &base,
        Some(ka),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": {"uri": "x"}, "resourceLimits": {"cpu": "9000"}})),
    )
    .await;
    assert_eq!(s, 400, "/v1's bound is a 400 naming the field: {e}");
    assert_eq!(e["code"], "SANDBOX::INVALID_PARAMETER", "{e}");
    assert!(e["message"].as_str().unwrap().contains("cpu"), "{e}");
    let (s, e) = osb(
        &http,
        &base,
        Some(ka),
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"image": {"uri": "x"}, "resourceLimits": {"cpu": "8"}})),
    )
    .await;
    assert_eq!(
        s, 429,
        "a sandbox bigger than the org's quota is refused: {e}"
    );
    assert_eq!(e["code"], "DIFFERENTLY::QUOTA_EXCEEDED", "{e}");
    let (s, e) = osb(
        &http,
        &base,
        Some(ka),
        Method::GET,
        "/v1/sandboxes?page=0",
        None,
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("SANDBOX::INVALID_PARAMETER")),
        "{e}"
    );
    // Every facade call is audited as the /v1 call it became, under the tenant's key.
    let (s, audit) = c.call(ka, Method::GET, "/v1/audit?limit=100", None).await;
    assert_eq!(s, 200, "{audit}");
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    assert!(actions.contains(&"sandbox.admit"), "{actions:?}");
    assert!(actions.contains(&"sandbox.terminating"), "{actions:?}");
}
