//! Warm claims on a capped pool, against both stores: the admission may only claim (never
//! place cold), and only with a free live slot and nobody who may be waiting for the pool
//! (`DirectPlacement::claim_only`, `differently_core::wait_reason::may_want`).

use std::collections::HashSet;

use chrono::{TimeDelta, Utc};
use differently_core::{OrgId, ProjectId, Sandbox, SandboxId, SandboxStatus};
use differently_store::{Admission, Admitted, Store};

use crate::cases::tenant;
use crate::warm::{admitted, ready, records, warm_admission, warm_ids};
use crate::Env;

conformance!(
    warm_capped;
    a_capped_pool_claims_when_nobody_waits_for_it,
    a_capped_pool_never_places_cold,
    a_capped_claim_queues_behind_anyone_who_may_wait_for_the_pool,
    a_capped_claim_needs_a_free_live_slot,
    concurrent_capped_claims_keep_the_cap,
);

/// [`warm_admission`] on pool `p` capped at `cap`.
fn capped_admission(org: &OrgId, prj: &ProjectId, class: Option<&str>, cap: u32) -> Admission {
    let mut a = warm_admission(org, prj, class, false, None);
    if let Some(d) = a.direct.as_mut() {
        d.pool.max_concurrent = Some(cap);
    }
    a
}

/// A queued sandbox of a new org (not placed directly), with `reason` stored if given.
async fn queued_elsewhere(s: &dyn Store, reason: Option<&str>) -> Sandbox {
    let (org, prj) = tenant(s).await;
    let mut a = warm_admission(&org, &prj, None, false, None);
    a.direct = None;
    let row = admitted(s, a).await;
    assert_eq!(row.status, SandboxStatus::Queued);
    if let Some(r) = reason {
        s.set_queued_reason(&row.id, r, Utc::now()).await.unwrap();
    }
    row
}

async fn slots_on_p(s: &dyn Store) -> u32 {
    s.pool_slots_used()
        .await
        .unwrap()
        .get("p")
        .copied()
        .unwrap_or(0)
}

async fn a_capped_pool_claims_when_nobody_waits_for_it(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let id = ready(s, "p", "x", Utc::now()).await;
    let a = capped_admission(&org, &prj, Some("x"), 3);
    assert!(a
        .direct
        .as_ref()
        .is_some_and(|d| d.applies() && d.claim_only()));
    let row = admitted(s, a).await;
    assert_eq!(
        (row.id.clone(), row.status),
        (id.clone(), SandboxStatus::Running)
    );
    assert_eq!(row.pool.as_deref(), Some("p"));
    let recs = records(s, &id).await;
    assert_eq!(recs[1].detail["cause"], "warm");
    assert!(warm_ids(s, "p").await.is_empty());
    assert_eq!(
        slots_on_p(s).await,
        1,
        "the claimed sandbox holds a slot of the cap"
    );
    // A queued sandbox waiting for another pool's capacity, or for its own org's quota, is
    // no reason to queue: neither could take this pool's slot now.
    let reason = differently_core::wait_reason::capacity([("q", "full 1/1")]);
    queued_elsewhere(s, Some(&reason)).await;
    queued_elsewhere(s, Some("waiting: org active quota 1/1")).await;
    let second = ready(s, "p", "x", Utc::now()).await;
    let row = admitted(s, capped_admission(&org, &prj, Some("x"), 3)).await;
    assert_eq!((row.id, row.status), (second, SandboxStatus::Running));
    assert_eq!(slots_on_p(s).await, 2);
}

async fn a_capped_pool_never_places_cold(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let other_class = ready(s, "p", "y", Utc::now()).await;
    // No ready instance of its class: queued for the leader, not placed, no reason of its own.
    let a = capped_admission(&org, &prj, Some("x"), 3);
    let asked = a.sandbox.id.clone();
    let row = admitted(s, a).await;
    assert_eq!(
        (
            row.id.clone(),
            row.status,
            row.pool.clone(),
            row.status_reason.clone()
        ),
        (asked.clone(), SandboxStatus::Queued, None, None)
    );
    assert_eq!(records(s, &asked).await.len(), 1, "admitted, not activated");
    // No class at all: the placement does not even apply.
    let (org2, prj2) = tenant(s).await;
    let plain = capped_admission(&org2, &prj2, None, 3);
    assert!(plain.direct.as_ref().is_some_and(|d| !d.applies()));
    let row = admitted(s, plain).await;
    assert_eq!(row.status, SandboxStatus::Queued);
    assert_eq!(slots_on_p(s).await, 0);
    assert_eq!(warm_ids(s, "p").await, vec![other_class]);
}

async fn a_capped_claim_queues_behind_anyone_who_may_wait_for_the_pool(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let id = ready(s, "p", "x", Utc::now()).await;
    // Another org's sandbox the leader found waiting for p's capacity (among others).
    let reason = differently_core::wait_reason::capacity([("q", "unhealthy"), ("p", "full 3/3")]);
    let waiter = queued_elsewhere(s, Some(&reason)).await;
    let first = admitted(s, capped_admission(&org, &prj, Some("x"), 3)).await;
    assert_eq!(
        (first.status, first.id == id, first.status_reason.clone()),
        (SandboxStatus::Queued, false, None),
        "queued behind the waiter, the instance untouched"
    );
    assert_eq!(warm_ids(s, "p").await, vec![id.clone()]);
    // The activation's own form of a pool wait counts as well.
    let (org2, prj2) = tenant(s).await;
    let full = differently_core::wait_reason::pool_full("p", 3, 3);
    s.set_queued_reason(&waiter.id, &full, Utc::now())
        .await
        .unwrap();
    let row = admitted(s, capped_admission(&org2, &prj2, Some("x"), 3)).await;
    assert_eq!(row.status, SandboxStatus::Queued);
    // So does a queued sandbox the leader has not decided yet (it may want p): `row` itself
    // is one now. Once the waiters wait for something else, the claim applies.
    let (org3, prj3) = tenant(s).await;
    let row3 = admitted(s, capped_admission(&org3, &prj3, Some("x"), 3)).await;
    assert_eq!(row3.status, SandboxStatus::Queued);
    let quota = "waiting: org active quota 1/1";
    for q in [&waiter.id, &first.id, &row.id, &row3.id] {
        s.set_queued_reason(q, quota, Utc::now()).await.unwrap();
    }
    // Every org above has a queued row now (their first tries): a newcomer org claims.
    let (org4, prj4) = tenant(s).await;
    let claimed = admitted(s, capped_admission(&org4, &prj4, Some("x"), 3)).await;
    assert_eq!((claimed.id, claimed.status), (id, SandboxStatus::Running));
}

async fn a_capped_claim_needs_a_free_live_slot(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    // Two live sandboxes on p (placed as on an uncapped pool), p capped at 2 for the claim.
    for _ in 0..2 {
        let live = admitted(s, warm_admission(&org, &prj, None, false, None)).await;
        assert_eq!(live.status, SandboxStatus::Provisioning);
    }
    assert_eq!(slots_on_p(s).await, 2);
    let id = ready(s, "p", "x", Utc::now()).await;
    let (other, other_prj) = tenant(s).await;
    let row = admitted(s, capped_admission(&other, &other_prj, Some("x"), 2)).await;
    assert_eq!(row.status, SandboxStatus::Queued);
    assert_eq!(
        row.status_reason.as_deref(),
        Some(differently_core::wait_reason::pool_full("p", 2, 2).as_str()),
        "it waits for the pool, saying so as the leader would"
    );
    assert_eq!(warm_ids(s, "p").await, vec![id.clone()]);
    // With a slot more (cap 3), a newcomer with nobody else waiting would claim; but `row`
    // now waits for p: it stays ahead.
    let (third, third_prj) = tenant(s).await;
    let behind = admitted(s, capped_admission(&third, &third_prj, Some("x"), 3)).await;
    assert_eq!(behind.status, SandboxStatus::Queued);
    assert_eq!(slots_on_p(s).await, 2);
}

async fn concurrent_capped_claims_keep_the_cap(env: &Env) {
    const ORGS: usize = 6;
    const PER_ORG: usize = 2;
    const READY: usize = 5;
    const CAP: u32 = 4;
    let s = env.store.clone();
    // Two live sandboxes leave two slots of the cap of 4.
    let (org0, prj0) = tenant(s.as_ref()).await;
    for _ in 0..2 {
        admitted(s.as_ref(), warm_admission(&org0, &prj0, None, false, None)).await;
    }
    let t = Utc::now();
    let mut instances = HashSet::new();
    for i in 0..READY {
        instances.insert(ready(s.as_ref(), "p", "x", t + TimeDelta::milliseconds(i as i64)).await);
    }
    let mut tenants = Vec::new();
    for _ in 0..ORGS {
        tenants.push(tenant(s.as_ref()).await);
    }
    let mut tasks = Vec::new();
    for (org, prj) in &tenants {
        let handle = env.reopen().await;
        for _ in 0..PER_ORG {
            let s = handle.clone();
            let a = capped_admission(org, prj, Some("x"), CAP);
            let asked = a.sandbox.id.clone();
            tasks.push(tokio::spawn(async move { (asked, s.admit(a).await) }));
        }
    }
    let mut claimed = HashSet::new();
    let mut queued = 0;
    for task in tasks {
        let (asked, out) = task.await.unwrap();
        let row = match out {
            Ok(Admitted::New(x)) => x,
            other => panic!("expected New, got {other:?}"),
        };
        if row.status == SandboxStatus::Running {
            assert!(instances.contains(&row.id), "{row:?}");
            assert!(claimed.insert(row.id.clone()), "{} claimed twice", row.id);
        } else {
            assert_eq!(
                row.status,
                SandboxStatus::Queued,
                "never placed cold: {row:?}"
            );
            assert_eq!(row.id, asked);
            queued += 1;
        }
    }
    // The first to take the pool's lock claims (nothing waits yet); after that the queued
    // ones may be waiting for the pool, so at most the two free slots are ever claimed.
    assert!(
        (1..=2).contains(&claimed.len()),
        "claimed {} with two slots free",
        claimed.len()
    );
    assert_eq!(claimed.len() + queued, ORGS * PER_ORG);
    assert!(slots_on_p(s.as_ref()).await <= CAP);
    assert_eq!(slots_on_p(s.as_ref()).await, 2 + claimed.len() as u32);
    let left: HashSet<SandboxId> = warm_ids(s.as_ref(), "p").await.into_iter().collect();
    assert_eq!(left.len() + claimed.len(), READY);
    assert!(left.is_disjoint(&claimed));
}
