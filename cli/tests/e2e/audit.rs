//! The audit chain end to end: records from api, scheduler and worker processes (one key in
//! their configuration) chain per organization and verify; tampering in Postgres is reported
//! at exactly the changed record; an export verifies offline with `differently audit verify`;
//! a worker killed mid-flight leaves the chains contiguous; secrets are never served back.

use std::process::Command;
use std::time::Duration;

use differently_core::SandboxId;
use reqwest::Method;
use serde_json::{json, Value};

use crate::harness::{binary, Cluster, Opts};
use crate::tenancy::{sandbox, tenant};

const AUDIT_KEY: &str = "4f1d2c3b4a5968778695a4b3c2d1e0f00112233445566778899aabbccddeeff0";
const SECRETS_KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn keys() -> [(&'static str, &'static str); 2] {
    [
        ("DIFFERENTLY_AUDIT_KEY", AUDIT_KEY),
        ("DIFFERENTLY_SECRETS_KEY", SECRETS_KEY),
    ]
}

/// api, scheduler and worker as separate processes, all with the same keys.
async fn cluster() -> Cluster {
    let mut c = Cluster::new(Opts::default()).await;
    c.spawn("api", "api", &keys());
    c.spawn("scheduler", "scheduler", &keys());
    c.spawn("worker", "worker", &keys());
    c.wait_ready().await;
    c
}

/// `GET /v1/admin/audit/verify` with the admin key; the report (its answer must be 200).
pub(crate) async fn verify(c: &Cluster) -> Value {
    let (s, report) = c
        .call(&c.key, Method::GET, "/v1/admin/audit/verify", None)
        .await;
    assert_eq!(s, 200, "{report}");
    report
}

async fn export(c: &Cluster) -> String {
    let r = c
        .req(Method::GET, "/v1/admin/audit/export")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    r.text().await.unwrap()
}

/// Runs `differently audit verify` on `text`; returns (exit success, stdout, stderr).
fn verify_offline(c: &Cluster, text: &str, key: &str) -> (bool, String, String) {
    let path = c.dir.path().join("export.jsonl");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(binary())
        .args(["audit", "verify", "--key-env", "E2E_AUDIT_KEY"])
        .arg(&path)
        .env("E2E_AUDIT_KEY", key)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `sql` with the append-only triggers disabled, as a database superuser could.
async fn tamper(c: &Cluster, sql: &str) {
    let mut tx = c.db.store().pool().begin().await.unwrap();
    sqlx_raw(
        &mut tx,
        &format!(
            "ALTER TABLE audit_events DISABLE TRIGGER USER; {sql}; \
             ALTER TABLE audit_events ENABLE TRIGGER USER;"
        ),
    )
    .await;
    tx.commit().await.unwrap();
}

async fn sqlx_raw(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>, sql: &str) {
    sqlx::raw_sql(sql).execute(&mut **tx).await.unwrap();
}

/// `GET /v1/audit{query}` with `key`.
pub(crate) async fn audit_page(c: &Cluster, key: &str, query: &str) -> (u16, Value) {
    c.call(key, Method::GET, &format!("/v1/audit{query}"), None)
        .await
}

/// The audit records of `action` on sandbox `id` (up to 100), read with the cluster's key.
pub(crate) async fn records_of(c: &Cluster, id: &SandboxId, action: &str) -> Vec<Value> {
    let (s, log) = audit_page(
        c,
        &c.key,
        &format!("?resource={id}&action={action}&limit=100"),
    )
    .await;
    assert_eq!(s, 200, "{log}");
    log["items"].as_array().expect("audit items").clone()
}

/// Polls `GET /v1/sandboxes/{id}` with the owner's `key` until it is running.
async fn wait_running(c: &Cluster, key: &str, id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (s, b) = c
            .call(key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        if s == 200 && b["status"] == "running" {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id} not running: {s} {b}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_verify_online_and_offline_and_tampering_is_pinpointed() {
    let c = cluster().await;
    let a = tenant(&c, "audit-a").await;
    let b = tenant(&c, "audit-b").await;
    // A client's request id is recorded with what the request changed.
    let r = c
        .req_as(&a.key, Method::POST, "/v1/sandboxes")
        .header("x-request-id", "e2e-req-1")
        .json(&json!({"projectId": a.project}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(r.headers()["x-request-id"], "e2e-req-1");
    let sa: Value = r.json().await.unwrap();
    let sa = sa["id"].as_str().unwrap().to_owned();
    let sb = sandbox(&c, &b).await;
    wait_running(&c, &a.key, &sa).await;
    wait_running(&c, &b.key, &sb).await;

    // Tenant-scoped listing: a's key sees a's chain only, with who/what/target/outcome.
    let (s, page) = audit_page(&c, &a.key, "?limit=100").await;
    assert_eq!(s, 200, "{page}");
    let items = page["items"].as_array().unwrap();
    assert!(items.iter().all(|r| r["orgId"] == a.org.as_str()), "{page}");
    let actions: Vec<&str> = items.iter().filter_map(|r| r["action"].as_str()).collect();
    for want in [
        "org.create",
        "project.create",
        "key.create",
        "sandbox.admit",
        "sandbox.activate",
        "sandbox.running",
    ] {
        assert!(actions.contains(&want), "{want} missing from {actions:?}");
    }
    let admit = items
        .iter()
        .find(|r| r["action"] == "sandbox.admit")
        .unwrap();
    assert_eq!(admit["actor"], format!("key:{}", a.key_id));
    assert_eq!(admit["projectId"], a.project.as_str());
    assert_eq!(admit["resource"], sa.as_str());
    assert_eq!(admit["outcome"], "ok");
    assert_eq!(admit["requestId"], "e2e-req-1");
    // Records of all three processes chain contiguously, in each of the org's chain shards;
    // the sandbox's own records (api, scheduler, worker) are all in one of them.
    let mut by_chain: std::collections::BTreeMap<&str, Vec<i64>> = Default::default();
    for r in items {
        let chain = r["chain"].as_str().unwrap();
        assert!(chain.starts_with(&format!("{}/", a.org)), "{chain}");
        by_chain
            .entry(chain)
            .or_default()
            .push(r["chainSeq"].as_i64().unwrap());
    }
    for seqs in by_chain.values() {
        assert_eq!(*seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    }
    let sandbox_chains: std::collections::BTreeSet<&str> = items
        .iter()
        .filter(|r| r["resource"] == sa.as_str())
        .map(|r| r["chain"].as_str().unwrap())
        .collect();
    assert_eq!(sandbox_chains.len(), 1, "{sandbox_chains:?}");
    // Filters and the cursor.
    let (_, only) = audit_page(&c, &a.key, "?action=sandbox.running").await;
    assert_eq!(only["items"].as_array().unwrap().len(), 1);
    let (_, p1) = audit_page(&c, &a.key, "?limit=2").await;
    let cursor = p1["nextCursor"].as_str().unwrap();
    let (_, p2) = audit_page(&c, &a.key, &format!("?limit=2&cursor={cursor}")).await;
    assert_eq!(p2["items"][0]["seq"], items[2]["seq"]);
    // Another tenant's records look absent; operators' routes need admin.
    let (s, _) = audit_page(&c, &a.key, &format!("?orgId={}", b.org)).await;
    assert_eq!(s, 404);
    let (s, _) = c
        .call(&a.key, Method::GET, "/v1/admin/audit/verify", None)
        .await;
    assert_eq!(s, 403);
    let (s, bad) = audit_page(&c, &a.key, "?since=yesterday").await;
    assert_eq!(
        (s, bad["error"]["details"]["field"].as_str()),
        (400, Some("since"))
    );

    // Online and offline verification agree; a wrong key fails offline.
    let (s, cp) = c
        .call(&c.key, Method::POST, "/v1/admin/audit/checkpoints", None)
        .await;
    assert_eq!(s, 201, "{cp}");
    let report = verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
    assert!(report["records"].as_u64().unwrap() >= 12, "{report}");
    let text = export(&c).await;
    assert!(text
        .lines()
        .next()
        .unwrap()
        .contains("\"type\":\"checkpoint\""));
    let (ok, out, err) = verify_offline(&c, &text, AUDIT_KEY);
    assert!(ok, "{out}\n{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["ok"], true);
    let (ok, _, err) = verify_offline(&c, &text, &"ab".repeat(32));
    assert!(!ok && err.contains("does not verify"), "{err}");

    // Postgres itself refuses to rewrite history.
    let err = sqlx::raw_sql("UPDATE audit_events SET action = 'x'")
        .execute(c.db.store().pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");

    // Edit one of b's records directly: verify names exactly that record.
    let target: (i64, i64, String) = sqlx::query_as(
        "SELECT seq, chain_seq, chain FROM audit_events
         WHERE org_id = $1 AND action = 'sandbox.admit'",
    )
    .bind(&b.org)
    .fetch_one(c.db.store().pool())
    .await
    .unwrap();
    tamper(
        &c,
        &format!(
            "UPDATE audit_events SET detail = detail || '{{\"forged\": true}}' WHERE seq = {}",
            target.0
        ),
    )
    .await;
    let report = verify(&c).await;
    assert_eq!(report["ok"], false);
    let bad = &report["firstBad"];
    assert_eq!(bad["kind"], "hash_mismatch", "{report}");
    assert_eq!(bad["chain"], target.2.as_str());
    assert!(
        target.2.starts_with(&format!("{}/", b.org)),
        "one of b's chains"
    );
    assert_eq!(
        (bad["seq"].as_i64(), bad["chainSeq"].as_i64()),
        (Some(target.0), Some(target.1))
    );
    assert_eq!(
        report["problems"].as_array().unwrap().len(),
        1,
        "a's chain is intact"
    );
    // The tampered export fails offline at the same record.
    let (ok, out, err) = verify_offline(&c, &export(&c).await, AUDIT_KEY);
    assert!(!ok, "{out}");
    let offline: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(offline["firstBad"]["seq"].as_i64(), Some(target.0), "{err}");

    // Delete one of a's records: reported as that missing position.
    let gone: (i64, i64, String) = sqlx::query_as(
        "SELECT seq, chain_seq, chain FROM audit_events
         WHERE org_id = $1 AND action = 'sandbox.activate'",
    )
    .bind(&a.org)
    .fetch_one(c.db.store().pool())
    .await
    .unwrap();
    tamper(
        &c,
        &format!("DELETE FROM audit_events WHERE seq = {}", gone.0),
    )
    .await;
    let report = verify(&c).await;
    let problem = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["chain"] == gone.2.as_str())
        .cloned()
        .unwrap();
    assert_eq!(problem["kind"], "missing", "{report}");
    assert_eq!(problem["chainSeq"].as_i64(), Some(gone.1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_stay_contiguous_across_many_orgs_and_a_killed_worker() {
    let mut c = cluster().await;
    let mut tenants = vec![];
    for i in 0..4 {
        tenants.push(tenant(&c, &format!("crash-{i}")).await);
    }
    let mut ids = vec![];
    for round in 0..3 {
        let cr = &c;
        let creates = tenants
            .iter()
            .map(|t| async move { (t.key.clone(), sandbox(cr, t).await) });
        ids.extend(futures::future::join_all(creates).await);
        if round == 0 {
            c.kill9("worker");
            c.spawn("worker2", "worker", &keys());
        }
    }
    for (key, id) in &ids {
        wait_running(&c, key, id).await;
    }
    let report = verify(&c).await;
    assert_eq!(report["ok"], true, "{report}");
    // Each org: create org, project, key, then admit/activate/running per sandbox, spread
    // over the org's chain shards; no shard has a gap.
    let chains: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT chain, count(*), max(chain_seq) FROM audit_events
         WHERE chain LIKE 'org_%' GROUP BY chain",
    )
    .fetch_all(c.db.store().pool())
    .await
    .unwrap();
    for (chain, n, max) in &chains {
        assert_eq!(n, max, "chain {chain} has gaps");
    }
    for t in &tenants {
        let n: i64 = chains
            .iter()
            .filter(|(ch, _, _)| ch.starts_with(&format!("{}/", t.org)))
            .map(|(_, n, _)| n)
            .sum();
        assert!(n >= 3 + 3 * 3, "org {} has {n} records", t.org);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_stored_sealed_and_never_served_back() {
    let c = cluster().await;
    let value = "osb-live-key-6c2f0e";
    let (s, info) = c
        .call(
            &c.key,
            Method::PUT,
            "/v1/admin/secrets/opensandbox",
            Some(json!({"value": value})),
        )
        .await;
    assert_eq!(s, 200, "{info}");
    assert!(info["fingerprint"].as_str().unwrap().starts_with("sha256:"));
    assert!(!info.to_string().contains(value));
    let (s, list) = c.call(&c.key, Method::GET, "/v1/admin/secrets", None).await;
    assert_eq!(s, 200);
    assert_eq!(list["items"][0]["name"], "opensandbox");
    assert_eq!(list["items"][0]["fingerprint"], info["fingerprint"]);
    assert!(list["items"][0]["updatedBy"]
        .as_str()
        .unwrap()
        .starts_with("key:"));
    assert!(!list.to_string().contains(value));
    // Not in the database in the clear, nor in the audit record, nor in the logs.
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT sealed FROM secrets WHERE name = 'opensandbox'")
            .fetch_one(c.db.store().pool())
            .await
            .unwrap();
    assert!(!stored.windows(value.len()).any(|w| w == value.as_bytes()));
    let text = export(&c).await;
    assert!(text.contains("secret.put") && !text.contains(value));
    assert!(!c.logs().contains(value));
    // Bad input never echoes the value.
    let (s, err) = c
        .call(
            &c.key,
            Method::PUT,
            "/v1/admin/secrets/opensandbox",
            Some(json!({"value": value, "extra": 1})),
        )
        .await;
    assert_eq!(s, 400);
    assert!(!err.to_string().contains(value));
    let (s, _) = c
        .call(
            &c.key,
            Method::PUT,
            "/v1/admin/secrets/Bad%20Name",
            Some(json!({"value": "x"})),
        )
        .await;
    assert_eq!(s, 422);
    let t = tenant(&c, "no-admin").await;
    let (s, _) = c
        .call(
            &t.key,
            Method::PUT,
            "/v1/admin/secrets/x",
            Some(json!({"value": "x"})),
        )
        .await;
    assert_eq!(s, 403);
    assert_eq!(verify(&c).await["ok"], true);
}
