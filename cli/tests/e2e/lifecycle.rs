//! Lifecycle end to end through the pool workers: every legal transition and every illegal
//! one, conflicting concurrent changes, 501 for what a pool cannot do, snapshots and ports,
//! the idle sweep and the wake on the next call, and the reconciler.

use std::time::Duration;

use differently_adapters::fake::LedgerOp;
use differently_core::{SandboxId, SandboxStatus};
use serde_json::{json, Value};

use crate::dataplane::{cluster, post, running, FAKE_CAPS};
use crate::harness::{eventually, Cluster, Opts};

mod reconciler;

/// The reconciler's tests count its passes; one a second keeps them short.
const RECONCILE_EVERY_SECOND: &str = "reconcile_interval_seconds = 1";

async fn op(c: &Cluster, id: &SandboxId, what: &str) -> (u16, Value) {
    post(c, &format!("/v1/sandboxes/{id}/{what}"), json!({})).await
}

fn lifecycle_lines(c: &Cluster, id: &SandboxId) -> usize {
    c.ledger()
        .iter()
        .filter(|e| {
            e.sandbox_id.as_ref() == Some(id)
                && matches!(
                    e.op,
                    LedgerOp::Pause | LedgerOp::Resume | LedgerOp::Stop | LedgerOp::Start
                )
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transition_on_the_fake_and_devhost_pools() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;

    // Into the current status (running): 200 and no backend call.
    for noop in ["resume", "start"] {
        let (s, b) = op(&c, &id, noop).await;
        assert_eq!(
            (s, b["status"].as_str()),
            (200, Some("running")),
            "{noop}: {b}"
        );
    }
    assert_eq!(lifecycle_lines(&c, &id), 0);
    // running → paused, and again (200, no backend call).
    let (s, b) = op(&c, &id, "pause").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("paused")), "{b}");
    let calls = lifecycle_lines(&c, &id);
    let (s, b) = op(&c, &id, "pause").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("paused")));
    assert_eq!(
        lifecycle_lines(&c, &id),
        calls,
        "repeating a transition calls nothing"
    );
    // A caller-paused sandbox is not woken by exec.
    let (s, e) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["true"]}),
    )
    .await;
    assert_eq!(
        (s, e["error"]["details"]["status"].as_str()),
        (409, Some("paused"))
    );
    for bad in ["stop", "start"] {
        let (s, e) = op(&c, &id, bad).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (409, Some("conflict")),
            "{bad} from paused: {e}"
        );
        assert_eq!(e["error"]["details"]["status"], "paused");
    }
    // paused → running → stopped → running.
    for (what, to) in [("resume", "running"), ("stop", "stopped")] {
        let (s, b) = op(&c, &id, what).await;
        assert_eq!((s, b["status"].as_str()), (200, Some(to)), "{what}: {b}");
    }
    for bad in ["pause", "resume"] {
        let (s, _) = op(&c, &id, bad).await;
        assert_eq!(s, 409, "{bad} from stopped");
    }
    let (s, b) = op(&c, &id, "stop").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("stopped")));
    let (s, b) = op(&c, &id, "start").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("running")));
    let (_, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["echo", "back"]}),
    )
    .await;
    assert_eq!(out["stdout"], "back\n");
    let ops: Vec<_> = c
        .ledger()
        .into_iter()
        .filter(|e| e.sandbox_id.as_ref() == Some(&id))
        .map(|e| e.op)
        .filter(|o| {
            matches!(
                o,
                LedgerOp::Pause | LedgerOp::Resume | LedgerOp::Stop | LedgerOp::Start
            )
        })
        .collect();
    assert_eq!(
        ops,
        vec![
            LedgerOp::Pause,
            LedgerOp::Resume,
            LedgerOp::Stop,
            LedgerOp::Start
        ]
    );

    // Once terminating, nothing else is legal.
    let (s, _) = c.delete(&id).await;
    assert_eq!(s, 202);
    c.wait_status(&id, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;
    for bad in ["pause", "resume", "stop", "start"] {
        let (s, _) = op(&c, &id, bad).await;
        assert_eq!(s, 409, "{bad} after delete");
    }

    // devhost: pause and resume; stop is not something it can do.
    let dev = running(&c, json!({"capabilities": ["files"]})).await;
    let (s, b) = op(&c, &dev, "pause").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("paused")), "{b}");
    let (s, b) = op(&c, &dev, "resume").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("running")), "{b}");
    for unsupported in ["stop", "start"] {
        let (s, e) = op(&c, &dev, unsupported).await;
        assert_eq!(
            (s, e["error"]["code"].as_str()),
            (501, Some("unsupported_operation")),
            "{unsupported}: {e}"
        );
    }
    // Unknown or foreign sandboxes are 404.
    let (s, _) = op(&c, &SandboxId::new(), "pause").await;
    assert_eq!(s, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_concurrent_changes_and_the_202_bound() {
    // Backend calls take 11 s: longer than the API's 10 s bound.
    let c = cluster(Opts {
        latency_ms: 11_000,
        ..Opts::default()
    })
    .await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let (a, b) = tokio::join!(op(&c, &id, "pause"), op(&c, &id, "stop"));
    let mut codes = [a.0, b.0];
    codes.sort();
    assert_eq!(
        codes,
        [202, 409],
        "one is accepted, the other conflicts: {a:?} {b:?}"
    );
    let (accepted, conflict) = if a.0 == 202 { (a, b) } else { (b, a) };
    assert_eq!(
        accepted.1["status"], "running",
        "still in progress at the bound"
    );
    assert_eq!(conflict.1["error"]["code"], "conflict");
    assert!(
        conflict.1["error"]["details"]["operation"].is_string(),
        "{}",
        conflict.1
    );
    // The accepted change (the one the conflict names) completes although nobody waits.
    let target = if conflict.1["error"]["details"]["kind"] == "pause" {
        SandboxStatus::Paused
    } else {
        SandboxStatus::Stopped
    };
    c.wait_status(&id, target, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_ports_and_keepalive() {
    let c = cluster(Opts::default()).await;
    let id = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let (s, snap) = post(
        &c,
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({"name": "first"}),
    )
    .await;
    assert_eq!(s, 202, "{snap}");
    assert_eq!(snap["status"], "ready");
    // Ready after it was created: the time the worker recorded it, not a copy of `createdAt`.
    let at = |k: &str| chrono::DateTime::parse_from_rfc3339(snap[k].as_str().unwrap_or("")).ok();
    assert!(
        matches!((at("createdAt"), at("updatedAt")), (Some(c), Some(u)) if u > c),
        "{snap}"
    );
    assert_eq!(snap["pool"], "fake");
    assert!(
        snap.get("backendRef").is_none(),
        "backend refs are never served"
    );
    let sid = snap["id"].as_str().unwrap().to_owned();
    let (s, got) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    assert_eq!((s, got["name"].as_str()), (200, Some("first")));
    // Fork: a sandbox created from the snapshot runs on the pool that holds it, even though
    // the devhost pool would otherwise win the ranking.
    let (s, fork) = c.create(json!({"fromSnapshot": sid})).await;
    assert_eq!(s, 202, "{fork}");
    let fork_id = SandboxId::parse(fork["id"].as_str().unwrap()).unwrap();
    let forked = c
        .wait_status(&fork_id, SandboxStatus::Running, Duration::from_secs(30))
        .await;
    assert_eq!(forked["pool"], "fake", "{forked}");
    assert!(
        c.ledger().iter().any(|e| e.op == LedgerOp::Create
            && e.sandbox_id.as_ref() == Some(&fork_id)
            && e.snapshot.is_some()),
        "the backend was asked to restore the snapshot"
    );
    let (_, why) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{fork_id}/placement"),
            None,
        )
        .await;
    let dev = why["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "dev")
        .unwrap()
        .clone();
    assert!(
        dev["reason"]
            .as_str()
            .unwrap()
            .contains("pinned to pool fake"),
        "{why}"
    );
    let (s, e) = c
        .create(json!({"fromSnapshot": "snp_01J00000000000000000000000"}))
        .await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(e["error"]["details"]["field"], "fromSnapshot");
    let (_, list) = c
        .call(&c.key, reqwest::Method::GET, "/v1/snapshots", None)
        .await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(c
        .ledger()
        .iter()
        .any(|e| e.op == LedgerOp::Snapshot && e.sandbox_id.as_ref() == Some(&id)));
    let (s, _) = c
        .call(
            &c.key,
            reqwest::Method::DELETE,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    assert_eq!(s, 204);
    let (s, _) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    assert_eq!(s, 404);
    assert!(c.ledger().iter().any(|e| e.op == LedgerOp::DeleteSnapshot));

    let (s, port) = post(
        &c,
        &format!("/v1/sandboxes/{id}/ports"),
        json!({"port": 8080, "expiresSeconds": 120}),
    )
    .await;
    assert_eq!(s, 200, "{port}");
    assert!(port["url"].as_str().unwrap().contains("/8080"));
    let exp: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(port["expiresAt"].clone()).unwrap();
    let left = (exp - chrono::Utc::now()).num_seconds();
    assert!((100..=120).contains(&left), "{left}");
    let (s, e) = post(&c, &format!("/v1/sandboxes/{id}/ports"), json!({"port": 0})).await;
    assert_eq!(
        (s, e["error"]["details"]["field"].as_str()),
        (422, Some("port"))
    );

    let r = c
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/keepalive"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // TTL renew moves expiresAt now and the backend backstop through the workers.
    let (s, renewed) = c
        .call(
            &c.key,
            reqwest::Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"ttlSeconds": 7200})),
        )
        .await;
    assert_eq!(
        (s, renewed["ttlSeconds"].as_u64()),
        (200, Some(7200)),
        "{renewed}"
    );
    let exp: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(renewed["expiresAt"].clone()).unwrap();
    assert!(((exp - chrono::Utc::now()).num_seconds() - 7200).abs() < 30);
    let renewed_on_backend = eventually(Duration::from_secs(10), || {
        c.ledger()
            .iter()
            .any(|e| e.op == LedgerOp::Renew && e.sandbox_id.as_ref() == Some(&id))
    })
    .await;
    assert!(
        renewed_on_backend,
        "renew did not reach the backend\n{}",
        c.logs()
    );
    let (s, _) = c
        .call(
            &c.key,
            reqwest::Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"ttlSeconds": 0})),
        )
        .await;
    assert_eq!(s, 422);

    // devhost has no stop but has snapshots; the fake without snapshots capability is 501.
    let dev = running(&c, json!({"capabilities": ["files"]})).await;
    let (s, snap) = post(&c, &format!("/v1/sandboxes/{dev}/snapshots"), json!({})).await;
    assert_eq!((s, snap["status"].as_str()), (202, Some("ready")), "{snap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandbox_is_paused_and_the_next_exec_wakes_it() {
    let c = cluster(Opts::default()).await;
    let id = running(
        &c,
        json!({"capabilities": ["lifecycle.stop"], "idleTimeoutSeconds": 2}),
    )
    .await;
    let paused = c
        .wait_status(&id, SandboxStatus::Paused, Duration::from_secs(30))
        .await;
    assert_eq!(paused["statusReason"], "idle timeout");
    let (s, out) = post(
        &c,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"command": ["echo", "awake"]}),
    )
    .await;
    assert_eq!((s, out["stdout"].as_str()), (200, Some("awake\n")), "{out}");
    assert_eq!(c.get(&id).await["status"], "running");
    let ops: Vec<_> = c
        .ledger()
        .into_iter()
        .filter(|e| e.sandbox_id.as_ref() == Some(&id))
        .map(|e| e.op)
        .filter(|o| matches!(o, LedgerOp::Pause | LedgerOp::Resume))
        .collect();
    assert_eq!(&ops[..2], &[LedgerOp::Pause, LedgerOp::Resume]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandbox_on_a_pool_without_pause_is_stopped_and_started_again() {
    let c = Cluster::started(Opts {
        more_pools: r#"capabilities = ["exec", "exec.stream", "lifecycle.stop"]"#.to_owned(),
        ..Opts::default()
    })
    .await;
    let id = running(&c, json!({"idleTimeoutSeconds": 2})).await;
    let stopped = c
        .wait_status(&id, SandboxStatus::Stopped, Duration::from_secs(30))
        .await;
    assert_eq!(stopped["statusReason"], "idle timeout");
    // Pause is not something this pool does: 501, and the sandbox stays stopped.
    let (s, _) = op(&c, &id, "pause").await;
    assert_eq!(s, 501);
    let r = c
        .req(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/keepalive"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "keepalive wakes it");
    assert_eq!(c.get(&id).await["status"], "running");
}

/// Starting a stopped sandbox reserves its CPU again: with no room in the org's quota the
/// start is refused (429 `quota_exceeded`, naming the quota) and the sandbox stays stopped
/// with no backend call; with room again it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_stopped_sandbox_respects_the_cpu_quota() {
    let c = cluster(Opts::default()).await;
    let body = json!({"capabilities": ["lifecycle.stop"], "resources": {"cpu": 2}});
    let a = running(&c, body.clone()).await;
    let (s, view) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{a}"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{view}");
    let org = view["orgId"].as_str().expect("orgId").to_owned();
    let (s, b) = op(&c, &a, "stop").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("stopped")), "{b}");
    let (s, q) = c
        .call(
            &c.key,
            reqwest::Method::PUT,
            &format!("/v1/orgs/{org}/quota"),
            Some(json!({"maxCpu": 2})),
        )
        .await;
    assert_eq!(s, 200, "{q}");
    // The stopped sandbox's 2 CPUs went to another one.
    let b_id = running(&c, body).await;
    let starts_before = lifecycle_lines(&c, &a);
    let (s, e) = op(&c, &a, "start").await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (429, Some("quota_exceeded")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("org cpu quota would be 4/2")),
        "{e}"
    );
    let (_, now) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            &format!("/v1/sandboxes/{a}"),
            None,
        )
        .await;
    assert_eq!(now["status"], "stopped", "{now}");
    assert_eq!(lifecycle_lines(&c, &a), starts_before, "no backend start");
    // Room again: the start goes through.
    let (s, b) = op(&c, &b_id, "stop").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("stopped")), "{b}");
    let (s, b) = op(&c, &a, "start").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("running")), "{b}");
}

/// `PATCH` changes labels and the idle timeout of a live sandbox: labels are replaced (the
/// reserved ones the system set stay, and a caller cannot set them), list filters see the new
/// ones, a shortened idle timeout lets the idle sweep pause it, `null` clears it, bad values
/// are refused naming the field and change nothing, and each change is audited (label keys,
/// never values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_changes_labels_and_the_idle_timeout() {
    let c = cluster(Opts::default()).await;
    let id = running(
        &c,
        json!({"capabilities": ["lifecycle.stop"], "labels": {"team": "a", "tier": "x"}}),
    )
    .await;
    let patch = |body: Value| {
        let c = &c;
        let path = format!("/v1/sandboxes/{id}");
        async move {
            c.call(&c.key, reqwest::Method::PATCH, &path, Some(body))
                .await
        }
    };
    for (bad, field) in [
        (
            json!({"labels": {"differently.dev/x": "y"}}),
            "labels.differently.dev/x",
        ),
        (json!({"labels": {"": "y"}}), "labels."),
        (json!({"idleTimeoutSeconds": 0}), "idleTimeoutSeconds"),
    ] {
        let (s, e) = patch(bad.clone()).await;
        assert_eq!(
            (s, e["error"]["details"]["field"].as_str()),
            (422, Some(field)),
            "{bad}: {e}"
        );
    }
    let (s, e) = patch(json!({"idleTimeoutSeconds": "soon"})).await;
    assert_eq!(s, 400, "{e}");
    assert_eq!(
        c.get(&id).await["labels"],
        json!({"team": "a", "tier": "x"})
    );

    let (s, v) = patch(json!({"labels": {"team": "b"}})).await;
    assert_eq!((s, &v["labels"]), (200, &json!({"team": "b"})), "{v}");
    let (s, page) = c
        .call(
            &c.key,
            reqwest::Method::GET,
            "/v1/sandboxes?label=team=b",
            None,
        )
        .await;
    assert_eq!(s, 200, "{page}");
    let ids: Vec<&str> = page["items"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![id.as_str()], "{page}");

    // A 2 s idle timeout: the sweep pauses it; null clears it again.
    let (s, v) = patch(json!({"idleTimeoutSeconds": 2})).await;
    assert_eq!((s, v["idleTimeoutSeconds"].as_u64()), (200, Some(2)), "{v}");
    let paused = c
        .wait_status(&id, SandboxStatus::Paused, Duration::from_secs(30))
        .await;
    assert_eq!(paused["statusReason"], "idle timeout");
    let (s, v) = patch(json!({"idleTimeoutSeconds": null})).await;
    assert_eq!(
        (s, v["idleTimeoutSeconds"].clone()),
        (200, Value::Null),
        "{v}"
    );

    let (s, audit) =
        crate::audit::audit_page(&c, &c.key, &format!("?resource={id}&action=sandbox.update"))
            .await;
    assert_eq!(s, 200, "{audit}");
    let details: Vec<Value> = audit["items"]
        .as_array()
        .map(|a| a.iter().map(|r| r["detail"].clone()).collect())
        .unwrap_or_default();
    assert!(details.contains(&json!({"labels": ["team"]})), "{audit}");
    assert!(
        details.contains(&json!({"idleTimeoutSeconds": null})),
        "{audit}"
    );
    assert!(
        !audit.to_string().contains("\"b\""),
        "no label values: {audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_delete_the_backend_refuses_answers_at_once_with_the_reason() {
    // The fake refuses every delete of a snapshot as "in use" (for the whole test).
    let c = Cluster::started(Opts {
        more_pools: format!("refuseSnapshotDeletes = 100000\n{FAKE_CAPS}\n"),
        ..Opts::default()
    })
    .await;
    let id = running(&c, json!({})).await;
    let (s, snap) = post(&c, &format!("/v1/sandboxes/{id}/snapshots"), json!({})).await;
    assert_eq!((s, snap["status"].as_str()), (202, Some("ready")), "{snap}");
    let sid = snap["id"].as_str().expect("snapshot id").to_owned();
    let started = std::time::Instant::now();
    let (s, body) = c
        .call(
            &c.key,
            reqwest::Method::DELETE,
            &format!("/v1/snapshots/{sid}"),
            None,
        )
        .await;
    let took = started.elapsed();
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "deleting", "{body}");
    let reason = body["statusReason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("in use") && reason.contains("retrying"),
        "the answer does not say why: {body}"
    );
    // Not the API's whole 10 s operation wait.
    assert!(
        took < Duration::from_secs(5),
        "the delete answered after {took:?}"
    );
}
