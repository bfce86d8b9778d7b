//! Sandbox env values at rest, with a secrets key: sealed in their row, still what an exec in
//! the sandbox sees (the worker opened them to create it), gone once the sandbox ended, and
//! the trust report says so.

use std::time::Duration;

use differently_core::{SandboxId, SandboxStatus};
use serde_json::{json, Value};
use sqlx::Row;

use crate::dataplane::{post, running, FAKE_CAPS};
use crate::harness::{Cluster, Opts};

const SECRETS_KEY: &str = "7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f7a3f";
const VALUE: &str = "env-value-9c2e61b0";

/// The row of `id` as stored: its document as text and its sealed env.
async fn raw(c: &Cluster, id: &SandboxId) -> (String, Option<Vec<u8>>) {
    let row = sqlx::query("SELECT doc::text AS doc, env_sealed FROM sandboxes WHERE id = $1")
        .bind(id.as_str())
        .fetch_one(c.db.store().pool())
        .await
        .expect("sandbox row");
    (row.get("doc"), row.get("env_sealed"))
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_values_are_sealed_at_rest_yet_exec_sees_them_and_they_end_with_the_sandbox() {
    let root = tempfile::tempdir().expect("tempdir");
    let more = format!(
        r#"{FAKE_CAPS}

[[pools]]
name = "dev"
kind = "devhost"
[pools.settings]
root = "{}"
isolation = "none"
"#,
        root.path().display()
    );
    let mut c = Cluster::new(Opts {
        more_pools: more,
        ..Opts::default()
    })
    .await;
    let keys = [("DIFFERENTLY_SECRETS_KEY", SECRETS_KEY)];
    c.spawn("api", "api", &keys);
    c.spawn("scheduler", "scheduler", &keys);
    c.spawn("worker", "worker", &keys);
    c.wait_ready().await;

    let id = running(
        &c,
        json!({"capabilities": ["files"], "env": {"FROM_SANDBOX": VALUE}}),
    )
    .await;
    let (doc, blob) = raw(&c, &id).await;
    assert!(!doc.contains(VALUE), "the document holds the value: {doc}");
    assert!(doc.contains("FROM_SANDBOX"), "{doc}");
    let blob = blob.expect("a sealed env");
    assert!(!holds(&blob, VALUE));

    let (s, r) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["sh", "-c", "echo \"$FROM_SANDBOX\""]}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["stdout"], format!("{VALUE}\n"), "{r}");
    // The API shows names, never values.
    let shown = c.get(&id).await;
    assert_eq!(shown["envKeys"], json!(["FROM_SANDBOX"]));
    assert!(!shown.to_string().contains(VALUE));

    let (s, r) = c.delete(&id).await;
    assert!(s == 202 || s == 200, "{s} {r}");
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(60))
        .await;
    let (doc, blob) = raw(&c, &id).await;
    assert!(!doc.contains(VALUE), "{doc}");
    assert_eq!(blob, None, "an ended sandbox keeps no env");

    let (s, report) = c
        .call(&c.key, reqwest::Method::GET, "/v1/admin/trust-report", None)
        .await;
    assert_eq!(s, 200, "{report}");
    let lines: Vec<&str> = report["notEnforced"]
        .as_array()
        .expect("notEnforced")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        lines.iter().any(|l| l.contains("are sealed in Postgres")),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("plaintext")), "{lines:?}");
}
