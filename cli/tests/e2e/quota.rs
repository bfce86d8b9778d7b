//! Quotas and fair queueing end to end: concurrency limits hold under parallel load, a long
//! wait fails with its reason, and a small tenant is not starved behind a flood.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use differently_core::SandboxStatus;
use differently_store::prelude::*;
use differently_store::{QuotaScope, SandboxFilter};
use reqwest::Method;
use serde_json::json;

use crate::harness::{Cluster, Opts};
use crate::tenancy::{sandbox, tenant};

async fn statuses(c: &Cluster, key: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cur) => format!("/v1/sandboxes?limit=1000&cursor={cur}"),
            None => "/v1/sandboxes?limit=1000".to_owned(),
        };
        let (_, page) = c.call(key, Method::GET, &path, None).await;
        for it in page["items"].as_array().unwrap() {
            out.push((
                it["id"].as_str().unwrap().to_owned(),
                it["status"].as_str().unwrap().to_owned(),
                it["statusReason"].as_str().unwrap_or("").to_owned(),
            ));
        }
        match page["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_limit_holds_under_fifty_parallel_creates() {
    let c = Cluster::started(Opts {
        latency_ms: 300,
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "org-a").await;
    let (s, q) = c
        .call(
            &c.key,
            Method::PUT,
            &format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 5})),
        )
        .await;
    assert_eq!(s, 200, "{q}");

    // Sample active usage from Postgres every 100 ms while the load runs.
    let store = c.db.store();
    let org = differently_core::OrgId::parse(&a.org).unwrap();
    let max_seen = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (store, org, max_seen, done) =
            (store.clone(), org.clone(), max_seen.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let u = store.usage(&QuotaScope::Org(org.clone())).await.unwrap();
                max_seen.fetch_max(u.active, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let creates = (0..50).map(|_| sandbox(&c, &a));
    let ids: Vec<String> = futures::future::join_all(creates).await;
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 50);

    let mut finished = HashSet::new();
    let mut saw_reason = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while finished.len() < 50 {
        assert!(
            Instant::now() < deadline,
            "not all 50 ran: {} done\n{}",
            finished.len(),
            c.logs()
        );
        for (id, status, reason) in statuses(&c, &a.key).await {
            if status == "queued" && reason.starts_with("waiting: org active quota") {
                saw_reason = true;
            }
            if status == "running" {
                let (s, _) = c
                    .call(&a.key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
                    .await;
                assert_eq!(s, 202);
            }
            assert_ne!(status, "failed", "{id} failed: {reason}");
            if status == "terminated" {
                finished.insert(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::Relaxed);
    sampler.await.unwrap();
    let max = max_seen.load(Ordering::Relaxed);
    assert!(max <= 5, "active sandboxes reached {max} with a limit of 5");
    assert!(
        max >= 4,
        "the limit was never approached ({max}): the test proves nothing"
    );
    assert!(saw_reason, "queued sandboxes say why they wait");
    let rows = store
        .list_sandboxes(&SandboxFilter {
            org_id: Some(org),
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    let ledger = c.ledger();
    for row in rows {
        assert_eq!(row.status, SandboxStatus::Terminated);
        assert_eq!(
            differently_adapters::fake::created_count(&ledger, &row.id),
            1
        );
    }
    assert!(differently_adapters::fake::live_instances(&ledger).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_fails_with_its_reason() {
    // Every create through the leader: the warm-up below must be placed by it.
    let c = Cluster::started(Opts {
        extra_toml: crate::crash::LEADER_PLACES_ALL.into(),
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "org-a").await;
    // `wait_ready` proves the API sees the pool healthy; the scheduler syncs its own view
    // every 2 s. Until it has, sandboxes wait "for capacity: fake (unhealthy)", which with a
    // 2 s queue limit would fail the first one too. A sandbox placed by the leader and gone
    // proves the scheduler's view first (one the API placed itself would prove nothing).
    let warm = sandbox(&c, &a).await;
    for (path, want) in [
        (
            format!("/v1/sandboxes/{warm}/wait?status=running&timeoutSeconds=30"),
            "running",
        ),
        (format!("/v1/sandboxes/{warm}"), "terminating"),
        (
            format!("/v1/sandboxes/{warm}/wait?status=terminated&timeoutSeconds=30"),
            "terminated",
        ),
    ] {
        let method = if want == "terminating" {
            Method::DELETE
        } else {
            Method::GET
        };
        let (s, r) = c.call(&a.key, method, &path, None).await;
        assert!((200..300).contains(&s), "{path}: {s} {r}");
        if want != "terminating" {
            assert_eq!(r["status"], want, "{r}");
        }
    }
    let (s, _) = c
        .call(
            &c.key,
            Method::PUT,
            &format!("/v1/orgs/{}/quota", a.org),
            Some(json!({"maxActive": 1, "maxQueueSeconds": 2})),
        )
        .await;
    assert_eq!(s, 200);
    let first = sandbox(&c, &a).await;
    let second = sandbox(&c, &a).await;
    let (_, r) = c
        .call(
            &a.key,
            Method::GET,
            &format!("/v1/sandboxes/{first}/wait?status=running&timeoutSeconds=20"),
            None,
        )
        .await;
    assert_eq!(r["status"], "running", "{r}");
    let (_, r) = c
        .call(
            &a.key,
            Method::GET,
            &format!("/v1/sandboxes/{second}/wait?status=failed&timeoutSeconds=20"),
            None,
        )
        .await;
    assert_eq!(r["status"], "failed", "{r}");
    let reason = r["statusReason"].as_str().unwrap();
    assert!(
        reason.contains("maxQueueSeconds") && reason.contains("org active quota 1/1"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_org_is_not_starved_behind_a_flood() {
    let c = Cluster::started(Opts {
        pool_max_concurrent: Some(10),
        ..Opts::default()
    })
    .await;
    let a = tenant(&c, "flood").await;
    let b = tenant(&c, "small").await;
    let flood = futures::future::join_all((0..200).map(|_| sandbox(&c, &a))).await;
    assert_eq!(flood.len(), 200);
    // The pool holds 10: wait until A fills it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running = statuses(&c, &a.key)
            .await
            .iter()
            .filter(|s| s.1 == "running")
            .count();
        if running == 10 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never filled\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let small: Vec<String> = futures::future::join_all((0..5).map(|_| sandbox(&c, &b))).await;
    // B has arrived once the leader holds its sandboxes (it records why each waits); a slot
    // freed before that would go to A by right, since B would not be in the queue yet.
    let deadline = Instant::now() + Duration::from_secs(30);
    while statuses(&c, &b.key)
        .await
        .iter()
        .any(|s| s.1 == "queued" && s.2.is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "the leader never took B's sandboxes\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Free one slot at a time; record who gets it.
    let mut a_activated_after_b_arrived = 0;
    let mut b_running = 0;
    for _ in 0..8 {
        let before: HashSet<String> = statuses(&c, &a.key)
            .await
            .into_iter()
            .filter(|s| s.1 != "queued" && s.1 != "terminated")
            .map(|s| s.0)
            .collect();
        let victim = statuses(&c, &a.key)
            .await
            .into_iter()
            .find(|s| s.1 == "running")
            .unwrap()
            .0;
        assert_eq!(
            c.call(
                &a.key,
                Method::DELETE,
                &format!("/v1/sandboxes/{victim}"),
                None
            )
            .await
            .0,
            202
        );
        // Wait until the slot is taken again by someone.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let a_now: HashSet<String> = statuses(&c, &a.key)
                .await
                .into_iter()
                .filter(|s| s.1 != "queued" && s.1 != "terminated")
                .map(|s| s.0)
                .collect();
            let b_now = statuses(&c, &b.key)
                .await
                .iter()
                .filter(|s| s.1 == "running" || s.1 == "provisioning")
                .count();
            let a_new = a_now.difference(&before).count();
            if a_new > 0 {
                // Say how it got there: its explanation and what the logs say of it.
                for id in a_now.difference(&before) {
                    let (_, placement) = c
                        .call(
                            &a.key,
                            Method::GET,
                            &format!("/v1/sandboxes/{id}/placement"),
                            None,
                        )
                        .await;
                    let logs: Vec<String> = c
                        .logs()
                        .lines()
                        .filter(|l| {
                            l.contains(id.as_str())
                                || l.contains("leading")
                                || l.contains("leadership")
                        })
                        .map(str::to_owned)
                        .collect();
                    eprintln!("A's {id} took a slot: {placement}\n{}", logs.join("\n"));
                }
            }
            if b_now > b_running || a_new > 0 {
                eprintln!("slot freed: b {b_running} -> {b_now}, a new {a_new}");
                a_activated_after_b_arrived += a_new;
                b_running = b_now;
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the freed slot was never taken\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if b_running == 5 {
            break;
        }
    }
    assert_eq!(b_running, 5, "B's sandboxes all got slots");
    assert_eq!(
        a_activated_after_b_arrived, 0,
        "B, with less active CPU, goes first every time"
    );
    for id in &small {
        let (_, r) = c
            .call(&b.key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert!(
            matches!(r["status"].as_str(), Some("running" | "provisioning")),
            "{r}"
        );
    }
}
