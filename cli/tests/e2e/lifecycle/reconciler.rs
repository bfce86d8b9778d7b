//! The reconciler end to end: it deletes orphans, fails vanished instances, skips broken
//! listings, and follows instances that moved on their own (paused, resumed, started).

use std::time::Duration;

use differently_adapters::fake::{live_instances, FakeAdapter, FakeConfig};
use differently_adapters::Adapter;
use differently_core::{SandboxId, SandboxStatus};
use serde_json::json;

use super::{op, RECONCILE_EVERY_SECOND};
use crate::dataplane::{cluster, post, running, FAKE_CAPS};
use crate::harness::{eventually, Cluster, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_deletes_orphans_fails_vanished_and_skips_broken_listings() {
    let root = tempfile::tempdir().expect("tempdir");
    let broken_ledger = root.path().join("broken.jsonl");
    let c = Cluster::started(Opts {
        scheduler_toml: RECONCILE_EVERY_SECOND.into(),
        more_pools: format!(
            r#"{FAKE_CAPS}

[[pools]]
name = "broken"
kind = "fake"
[pools.settings]
ledger = "{}"
failList = true
capabilities = ["exec", "files"]
"#,
            broken_ledger.display()
        ),
        ..Opts::default()
    })
    .await;

    let live = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let doomed = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let on_broken = running(&c, json!({"capabilities": ["files"]})).await;
    assert_eq!(c.get(&on_broken).await["pool"], "broken");
    let ended = running(&c, json!({"capabilities": ["lifecycle.stop"]})).await;
    let (s, _) = c.delete(&ended).await;
    assert_eq!(s, 202);
    c.wait_status(&ended, SandboxStatus::Terminated, Duration::from_secs(30))
        .await;
    let installation = c
        .ledger()
        .into_iter()
        .find_map(|e| e.installation_id)
        .expect("installation id on a created line");

    // Behind Differently's back: an orphan tagged with this installation, and two instances
    // gone (one on a pool whose listing works, one on a pool whose listing fails).
    let backend = FakeAdapter::new(FakeConfig {
        ledger: Some(c.ledger.clone()),
        ..FakeConfig::default()
    });
    // Two orphans: one no row knows, one whose row has ended.
    let orphan = SandboxId::new();
    for id in [&orphan, &ended] {
        backend
            .create(&differently_adapters::CreateInstance {
                sandbox_id: id.clone(),
                installation_id: installation.clone(),
                template: None,
                resources: differently_core::Resources::DEFAULT,
                env: Default::default(),
                ttl_seconds: 60,
                from_snapshot: None,
            })
            .await
            .expect("orphan");
    }
    backend.delete(&doomed).await.expect("vanish");
    let broken = FakeAdapter::new(FakeConfig {
        ledger: Some(broken_ledger.clone()),
        ..FakeConfig::default()
    });
    broken
        .delete(&on_broken)
        .await
        .expect("vanish on broken pool");

    let gone = eventually(Duration::from_secs(30), || {
        !live_instances(&c.ledger())
            .iter()
            .any(|i| i.sandbox_id == orphan || i.sandbox_id == ended)
    })
    .await;
    assert!(gone, "orphans not deleted\n{}", c.logs());
    // Each delete is recorded, under the ended row's org when there is a row. The reconciler
    // appends the record after the backend delete the ledger shows, so wait for it.
    let store = c.db.store();
    let mut records = Vec::new();
    for _ in 0..100 {
        records = differently_store::audit::AuditStore::audit_tail(&store, 10_000)
            .await
            .expect("audit");
        let recorded = |id: &SandboxId| {
            records
                .iter()
                .any(|r| r.action == "reconcile.orphan_deleted" && r.resource == id.to_string())
        };
        if recorded(&orphan) && recorded(&ended) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let orphan_record = |id: &SandboxId| {
        records
            .iter()
            .find(|r| r.action == "reconcile.orphan_deleted" && r.resource == id.to_string())
            .unwrap_or_else(|| panic!("no orphan record for {id}"))
    };
    assert_eq!(orphan_record(&orphan).org_id, None);
    let ended_org = c.get(&ended).await["orgId"].as_str().map(str::to_owned);
    assert!(ended_org.is_some());
    assert_eq!(
        orphan_record(&ended)
            .org_id
            .as_ref()
            .map(ToString::to_string),
        ended_org
    );
    let failed = c
        .wait_status(&doomed, SandboxStatus::Failed, Duration::from_secs(30))
        .await;
    assert_eq!(failed["statusReason"], "backend instance vanished");
    assert_eq!(
        c.get(&live).await["status"],
        "running",
        "a live instance is left alone"
    );
    // Several passes later (three more skips of the broken pool's listing, counted in the
    // scheduler's log), the sandbox on the pool whose listing fails is untouched.
    let skipped = |c: &Cluster| {
        c.log_count("scheduler", |f| {
            f["action"] == "reconcile_skipped" && f["pool"] == "broken"
        })
    };
    let before = skipped(&c);
    let passes = eventually(Duration::from_secs(30), || skipped(&c) >= before + 3).await;
    assert!(passes, "the reconciler stopped passing\n{}", c.logs());
    assert_eq!(c.get(&on_broken).await["status"], "running");
    assert!(
        c.log("scheduler").contains("listing failed"),
        "the skip is logged"
    );
}

/// Instances that move on their own (the backend's idle policy, its gateway's wake, an
/// operator): the reconciler follows a pause or stop of a running sandbox as an idle one (the
/// next exec wakes it), a resume of a paused one, and a start of a stopped one only while the
/// quota has room for it (until then it says so in its log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_follows_instances_that_moved_on_their_own() {
    let c = cluster(Opts {
        scheduler_toml: RECONCILE_EVERY_SECOND.into(),
        ..Opts::default()
    })
    .await;
    let body = json!({"capabilities": ["lifecycle.pause", "lifecycle.stop"]});
    let paused_behind = running(&c, body.clone()).await;
    let stopped_behind = running(&c, body.clone()).await;
    let resumed_behind = running(&c, body.clone()).await;
    let (s, b) = op(&c, &resumed_behind, "pause").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("paused")), "{b}");
    let started_behind = running(&c, body).await;
    let (s, b) = op(&c, &started_behind, "stop").await;
    assert_eq!((s, b["status"].as_str()), (200, Some("stopped")), "{b}");
    // No room for one more CPU: the backend's start of the stopped one cannot be followed.
    let org = c.get(&started_behind).await["orgId"]
        .as_str()
        .expect("orgId")
        .to_owned();
    let set_cpu = |max: u32| {
        let c = &c;
        let path = format!("/v1/orgs/{org}/quota");
        async move {
            let (s, q) = c
                .call(
                    &c.key,
                    reqwest::Method::PUT,
                    &path,
                    Some(json!({"maxCpu": max})),
                )
                .await;
            assert_eq!(s, 200, "{q}");
        }
    };
    set_cpu(1).await;

    let backend = FakeAdapter::new(FakeConfig {
        ledger: Some(c.ledger.clone()),
        capabilities: vec!["lifecycle.pause".into(), "lifecycle.stop".into()],
        ..FakeConfig::default()
    });
    let instances = live_instances(&c.ledger());
    let at = |id: &SandboxId| differently_adapters::InstanceRef {
        sandbox_id: id.clone(),
        backend_ref: instances
            .iter()
            .find(|i| &i.sandbox_id == id)
            .map(|i| i.backend_ref.clone())
            .expect("a live instance"),
    };
    backend.pause(&at(&paused_behind)).await.expect("pause");
    backend.stop(&at(&stopped_behind)).await.expect("stop");
    backend.resume(&at(&resumed_behind)).await.expect("resume");
    backend.start(&at(&started_behind)).await.expect("start");

    for (id, status, reason) in [
        (&paused_behind, SandboxStatus::Paused, "idle timeout"),
        (&stopped_behind, SandboxStatus::Stopped, "idle timeout"),
        (
            &resumed_behind,
            SandboxStatus::Running,
            "resumed by the backend",
        ),
    ] {
        let row = c.wait_status(id, status, Duration::from_secs(30)).await;
        assert_eq!(row["statusReason"], reason, "{row}");
    }
    // Not followed while the quota has no room: still stopped after several passes (three
    // refusals to follow it, counted in the scheduler's log), and the scheduler says why;
    // with room, it follows.
    let target = started_behind.to_string();
    let refused = eventually(Duration::from_secs(30), || {
        c.log_count("scheduler", |f| {
            f["action"] == "drift_unfollowed" && f["sandbox"] == target.as_str()
        }) >= 3
    })
    .await;
    assert!(
        refused,
        "the reconciler never refused three times\n{}",
        c.logs()
    );
    assert_eq!(c.get(&started_behind).await["status"], "stopped");
    let log = c.log("scheduler");
    assert!(
        log.lines().any(|l| l.contains("drift_unfollowed")
            && l.contains(&started_behind.to_string())
            && l.contains("quota")),
        "{log}"
    );
    set_cpu(100).await;
    let started = c
        .wait_status(
            &started_behind,
            SandboxStatus::Running,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        started["statusReason"], "started by the backend",
        "{started}"
    );
    // Followed as idle: the next call wakes it through the backend.
    let (s, out) = post(
        &c,
        &format!("/v1/sandboxes/{paused_behind}/exec"),
        json!({"command": ["echo", "awake"]}),
    )
    .await;
    assert_eq!((s, out["stdout"].as_str()), (200, Some("awake\n")), "{out}");
    assert_eq!(c.get(&paused_behind).await["status"], "running");
    let log = c.log("scheduler");
    assert!(
        log.lines().filter(|l| l.contains("drift_followed")).count() >= 4,
        "{log}"
    );
    // Each followed change is on the audit chain, by the reconciler, with its reason.
    let store = c.db.store();
    let records = differently_store::audit::AuditStore::audit_tail(&store, 10_000)
        .await
        .expect("audit");
    for id in [
        &paused_behind,
        &stopped_behind,
        &resumed_behind,
        &started_behind,
    ] {
        assert!(
            records
                .iter()
                .any(|r| r.resource == id.to_string() && r.actor == "system:reconciler"),
            "no reconciler record for {id}"
        );
    }
}
