//! Work claims against both stores: one holder per activation (its own second try
//! refused too), renew and release by the holder only, a released claim free from its
//! back-off, a dead holder's claim taken over once it runs out, a new activation with a
//! fresh claim, and the scan seeing exactly the placed (or terminating) rows nobody holds.
//! The workers' claims (`claim_current_work`, `claim_create_reading`) are taken only while
//! the row is at the claimed change, so settled claims are never taken again and are pruned
//! in bulk.

use std::time::Duration;

use chrono::{TimeDelta, Utc};
use differently_core::{SandboxId, SandboxStatus};
use differently_store::work_claims::{ClaimKey, ClaimOutcome};
use differently_store::Quota;

use crate::cases::{activated, admit, pool, tenant};
use crate::Env;

conformance!(
    work_claims;
    a_work_claim_has_one_holder_until_it_runs_out_or_is_let_go,
    the_scan_sees_placed_and_terminating_rows_nobody_holds,
    a_current_claim_needs_its_row_at_its_change_and_settled_claims_are_pruned,
);

const HOLD: Duration = Duration::from_secs(30);

const PLACED: &[SandboxStatus] = &[SandboxStatus::Provisioning];

async fn a_work_claim_has_one_holder_until_it_runs_out_or_is_let_go(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let row = admit(s, &org, &prj).await;
    let placed = activated(s, &row.id, &pool("p", None), &Quota::default()).await;
    let key = ClaimKey::of(&placed);
    let now = Utc::now();

    assert_eq!(s.claim_work(&key, "w1", now, HOLD).await.unwrap(), Some(1));
    // Held: nobody else, and not its own holder a second time (its bus path and its scan).
    assert_eq!(s.claim_work(&key, "w2", now, HOLD).await.unwrap(), None);
    assert_eq!(s.claim_work(&key, "w1", now, HOLD).await.unwrap(), None);
    // Only the holder renews or lets go.
    assert!(s.renew_work_claim(&key, "w1", now, HOLD).await.unwrap());
    assert!(!s.renew_work_claim(&key, "w2", now, HOLD).await.unwrap());
    s.release_work_claim(&key, "w2", now).await.unwrap();
    assert_eq!(
        s.claim_work(&key, "w2", now, HOLD).await.unwrap(),
        None,
        "a release by someone else changed nothing"
    );

    // Let go after a failed try: free from its back-off on, for anyone, counting tries.
    let free_at = now + TimeDelta::seconds(2);
    s.release_work_claim(&key, "w1", free_at).await.unwrap();
    assert!(!s.renew_work_claim(&key, "w1", now, HOLD).await.unwrap());
    assert_eq!(s.claim_work(&key, "w2", now, HOLD).await.unwrap(), None);
    let later = free_at + TimeDelta::milliseconds(1);
    assert_eq!(
        s.claim_work(&key, "w2", later, HOLD).await.unwrap(),
        Some(2)
    );

    // A holder that went quiet loses it once the hold runs out.
    let past = later + TimeDelta::seconds(31);
    assert_eq!(s.claim_work(&key, "w3", past, HOLD).await.unwrap(), Some(3));
    assert!(
        !s.renew_work_claim(&key, "w2", past, HOLD).await.unwrap(),
        "the old holder learns it is no longer its"
    );

    // Another activation of the same row is a claim of its own.
    let next = ClaimKey {
        status_version: key.status_version + 1,
        ..key.clone()
    };
    assert_eq!(s.claim_work(&next, "w1", now, HOLD).await.unwrap(), Some(1));

    // Settled: forgotten, and a prune removes only claims that ran out before its cut-off.
    s.drop_work_claim(&key).await.unwrap();
    assert_eq!(s.claim_work(&key, "w4", now, HOLD).await.unwrap(), Some(1));
    let pruned = s
        .prune_work_claims(now + TimeDelta::seconds(31))
        .await
        .unwrap();
    assert_eq!(pruned, 2, "both claims ran out by then");
    assert_eq!(s.claim_work(&next, "w5", now, HOLD).await.unwrap(), Some(1));
}

async fn the_scan_sees_placed_and_terminating_rows_nobody_holds(env: &Env) {
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let q = Quota::default();
    let now = Utc::now();
    let p = pool("p", None);
    let mut rows = Vec::new();
    for _ in 0..4 {
        let row = admit(s, &org, &prj).await;
        rows.push(activated(s, &row.id, &p, &q).await);
    }
    let other = admit(s, &org, &prj).await;
    activated(s, &other.id, &pool("elsewhere", None), &q).await;
    let queued = admit(s, &org, &prj).await;
    let after = Utc::now() + TimeDelta::milliseconds(1);

    let ids = |v: Vec<differently_core::Sandbox>| v.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all: Vec<_> = rows.iter().map(|r| r.id.clone()).collect();
    let seen = ids(s.unclaimed_work("p", PLACED, after, now, 10).await.unwrap());
    assert_eq!(seen, all, "every placed row on the pool, oldest first");
    assert!(!seen.contains(&other.id) && !seen.contains(&queued.id));
    assert!(
        s.unclaimed_work("p", PLACED, rows[0].updated_at, now, 10)
            .await
            .unwrap()
            .is_empty(),
        "none activated before the cut-off"
    );
    assert_eq!(
        ids(s.unclaimed_work("p", PLACED, after, now, 2).await.unwrap()),
        all[..2]
    );

    // Held: not seen; let go with a back-off: seen once it passed; ran out: seen.
    let k0 = ClaimKey::of(&rows[0]);
    let k1 = ClaimKey::of(&rows[1]);
    s.claim_work(&k0, "w1", now, HOLD).await.unwrap();
    s.claim_work(&k1, "w1", now, HOLD).await.unwrap();
    s.release_work_claim(&k1, "w1", now + TimeDelta::seconds(2))
        .await
        .unwrap();
    assert_eq!(
        ids(s.unclaimed_work("p", PLACED, after, now, 10).await.unwrap()),
        all[2..]
    );
    let in_3s = now + TimeDelta::seconds(3);
    assert_eq!(
        ids(s
            .unclaimed_work("p", PLACED, after, in_3s, 10)
            .await
            .unwrap()),
        all[1..]
    );
    let in_31s = now + TimeDelta::seconds(31);
    assert_eq!(
        ids(s
            .unclaimed_work("p", PLACED, after, in_31s, 10)
            .await
            .unwrap()),
        all
    );

    // A row that moved on is not placed work any more.
    s.mark_running(&rows[2].id, "be", Utc::now()).await.unwrap();
    let left = ids(s
        .unclaimed_work("p", PLACED, Utc::now() + TimeDelta::seconds(1), in_31s, 10)
        .await
        .unwrap());
    assert_eq!(left, vec![all[0].clone(), all[1].clone(), all[3].clone()]);

    // A delete is work of its own: a terminating row is seen when deletes are asked for, under
    // a claim of its own (its status version moved on).
    let t = s
        .transition(
            differently_store::Transition {
                id: rows[3].id.clone(),
                from: vec![SandboxStatus::Provisioning],
                to: SandboxStatus::Terminating,
                reason: Some("deleted".into()),
                actor: differently_store::Actor::System("test"),
            },
            Utc::now(),
        )
        .await
        .unwrap();
    let cut = Utc::now() + TimeDelta::seconds(1);
    let both = &[SandboxStatus::Provisioning, SandboxStatus::Terminating];
    assert_eq!(
        ids(s
            .unclaimed_work("p", PLACED, cut, in_31s, 10)
            .await
            .unwrap()),
        all[..2]
    );
    assert_eq!(
        ids(s.unclaimed_work("p", both, cut, in_31s, 10).await.unwrap()),
        vec![all[0].clone(), all[1].clone(), all[3].clone()]
    );
    let kt = ClaimKey::of(&t);
    assert_ne!(kt, ClaimKey::of(&rows[3]));
    assert_eq!(
        s.claim_work(&kt, "w1", in_31s, HOLD).await.unwrap(),
        Some(1)
    );
    assert_eq!(
        ids(s.unclaimed_work("p", both, cut, in_31s, 10).await.unwrap()),
        all[..2],
        "the delete is held"
    );
}

async fn a_current_claim_needs_its_row_at_its_change_and_settled_claims_are_pruned(env: &Env) {
    use ClaimOutcome::{Held, Moved, Taken};
    let s = env.store.as_ref();
    let (org, prj) = tenant(s).await;
    let q = Quota::default();
    let p = pool("p", None);
    let first = admit(s, &org, &prj).await;
    let placed = activated(s, &first.id, &p, &q).await;
    let key = ClaimKey::of(&placed);
    let now = Utc::now();

    // The row's current change: one holder, as with `claim_work`.
    assert_eq!(
        s.claim_current_work(&key, "w1", now, HOLD).await.unwrap(),
        Taken(1)
    );
    assert_eq!(
        s.claim_current_work(&key, "w2", now, HOLD).await.unwrap(),
        Held
    );
    // A change the row is not at, or no row at all: nothing claimed.
    let ahead = ClaimKey {
        status_version: key.status_version + 1,
        ..key.clone()
    };
    assert_eq!(
        s.claim_current_work(&ahead, "w2", now, HOLD).await.unwrap(),
        Moved
    );
    let nobody = ClaimKey {
        sandbox: SandboxId::new(),
        status_version: 1,
    };
    assert_eq!(
        s.claim_current_work(&nobody, "w2", now, HOLD)
            .await
            .unwrap(),
        Moved
    );

    // Read and claim in one: the row comes back whatever the claim's answer.
    let (row, taken) = s
        .claim_create_reading(&placed.id, "p", "w2", now, HOLD)
        .await
        .unwrap()
        .expect("the row");
    assert_eq!((row.id.clone(), taken), (placed.id.clone(), Held));
    assert_eq!(ClaimKey::of(&row), key);
    let (_, elsewhere) = s
        .claim_create_reading(&placed.id, "elsewhere", "w2", now, HOLD)
        .await
        .unwrap()
        .expect("the row");
    assert_eq!(elsewhere, Moved, "not a create on that pool");
    assert!(s
        .claim_create_reading(&SandboxId::new(), "p", "w2", now, HOLD)
        .await
        .unwrap()
        .is_none());
    let second = admit(s, &org, &prj).await;
    let second = activated(s, &second.id, &p, &q).await;
    let (_, taken) = s
        .claim_create_reading(&second.id, "p", "w1", now, HOLD)
        .await
        .unwrap()
        .expect("the row");
    assert_eq!(taken, Taken(1), "its current change claimed");
    assert_eq!(
        s.claim_current_work(&ClaimKey::of(&second), "w2", now, HOLD)
            .await
            .unwrap(),
        Held
    );

    // A dead holder's claim is taken over once it runs out, counting tries.
    let past = now + TimeDelta::seconds(31);
    assert_eq!(
        s.claim_current_work(&key, "w3", past, HOLD).await.unwrap(),
        Taken(2)
    );

    // Settled: the row moved on, so the claim is never taken again, even once it ran out.
    let running = s.mark_running(&placed.id, "be", Utc::now()).await.unwrap();
    let later = past + TimeDelta::seconds(31);
    assert_eq!(
        s.claim_current_work(&key, "w4", later, HOLD).await.unwrap(),
        Moved
    );
    let (row, taken) = s
        .claim_create_reading(&placed.id, "p", "w4", later, HOLD)
        .await
        .unwrap()
        .expect("the row");
    assert_eq!((row.status, taken), (SandboxStatus::Running, Moved));

    // The prune forgets settled claims (and claims of changes the row never reached), and
    // keeps those of rows still at their change, held or not.
    let stray = ClaimKey {
        status_version: running.status_version + 5,
        ..ClaimKey::of(&running)
    };
    assert_eq!(
        s.claim_work(&stray, "w5", now, HOLD).await.unwrap(),
        Some(1)
    );
    assert_eq!(s.prune_settled_work_claims().await.unwrap(), 2);
    assert_eq!(s.prune_settled_work_claims().await.unwrap(), 0);
    assert_eq!(
        s.claim_current_work(&ClaimKey::of(&second), "w2", now, HOLD)
            .await
            .unwrap(),
        Held,
        "a live claim is kept"
    );
}
